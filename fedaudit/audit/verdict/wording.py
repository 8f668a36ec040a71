"""How the verdict says things: numbers, titles, the advice for what to run next, and the short forms a
terminal shows. Rules decide; this module only writes."""

from __future__ import annotations

from typing import Any

from .evidence import Evidence, isnum

# What to do next, in the words of the command that made the run: `fedaudit audit` takes no training or data option
# (they come from the recording), so its advice names what it does take or how to record differently.
ADVICE = {
    "evaluate": {
        "stronger_inversion": "Raise --inversion-iters or --inversion-batch, or run --profile paper on a GPU, and "
                              "audit again.",
        "more_records": "use more records per victim (--dataset shapes:375, a folder dataset, or a larger holdout "
                        "share in --split)",
        "calibrated_references": "--reference-epochs, --profile paper",
    },
    "audit": {
        "stronger_inversion": "Raise --inversion-iters or --inversion-batch (on a GPU, --device cuda) and audit the "
                              "recording again.",
        "more_records": "give the auditor more of each client's records, those it trained on and those it did not "
                        "(members/<client>/ and holdout/<client>/ in the manifest's data.records, or a dataset whose "
                        "clients hold more)",
        "calibrated_references": "--reference-epochs",
    },
}


def made_by(metrics: dict[str, Any]) -> str:
    """Which command made the run: ``audit`` (a recording's) or ``evaluate``."""
    return "audit" if "recording" in (metrics.get("provenance") or {}) else "evaluate"


def advice(metrics: dict[str, Any], what: str) -> str:
    return ADVICE[made_by(metrics)][what]


# -- titles and observers -------------------------------------------------------------------


def direction(key: str) -> str:
    return "client → server" if key.endswith("↑") else "server → client"


def share_title(key: str) -> str:
    """``full_model↑`` → ``full_model ↑ (client → server)``."""
    return f"{key[:-1]} {key[-1]} ({direction(key)})"


def observer_of(key: str, attacker: str) -> str:
    """Who sees a share: the server sees uploads; a client sees broadcasts (this run's client, if it is one)."""
    if key.endswith("↑"):
        return "server"
    return attacker if attacker.startswith("client:") else "client:<domain>"


def inversion_title(key: str) -> str:
    return f"{share_title(key)}: can it be inverted?"


# A membership row's subject that is not a share: (its title's label, how a sentence names it).
SUBJECTS = {"global_model": ("released model", "the released model"),
            "last_upload": ("the victim's last upload", "the victim's last upload")}


def membership_title(subject: str) -> str:
    label = SUBJECTS[subject][0] if subject in SUBJECTS else share_title(subject) if subject[-1:] in "↑↓" else subject
    return f"{label}: does it reveal membership?"


def subject_name(subject: str) -> str:
    """The artifact a membership row is about, as a sentence names it."""
    if subject in SUBJECTS:
        return SUBJECTS[subject][1]
    return f"the shared {subject[:-1]} {subject[-1]}" if subject[-1:] in "↑↓" else f"the shared {subject}"


# -- numbers ----------------------------------------------------------------------------------


def pct(x: Any) -> str:
    if not isnum(x):
        return "n/a"
    v = 100.0 * float(x)
    return f"{v:.1f}%" if 0 < abs(v) < 10 else f"{v:.0f}%"


def points(lift: float) -> str:
    return f"{'+' if lift >= 0 else '−'}{abs(100 * lift):.0f} points"


def p_text(p: Any) -> str:
    return "n/a" if not isnum(p) else (f"{p:.2g}" if p >= 0.001 else "< 0.001")


def p_short(p: Any) -> str:
    return "p n/a" if not isnum(p) else (f"p {p:.2g}" if p >= 0.001 else "p<0.001")


def fmt(x: Any) -> str:
    return "n/a" if not isnum(x) else f"{float(x):.2f}"


def fmt_count(k: Any) -> str:
    return f"{k:.0f}" if isnum(k) else "?"


# -- one test, in a clause and in a few words --------------------------------------------------

TEST_LABELS = {"domain_attribution": "attribution", "class_fidelity": "class fidelity",
               "identifiability": "identifiability", "mia_advantage": "advantage", "mia_tpr": "TPR@1%FPR",
               "canary_epsilon": "ε lower bound"}
NULL_SHORT = {"95% quantile with no signal at these counts": "null", "achieved FPR (the chance line TPR = FPR)": "FPR",
              "untrained-model control": "control", "prior-only control": "prior-only", "holdout twin": "twin",
              "ε = 0 (no privacy loss)": "0"}


def attack_of(e: Evidence) -> str:
    """The attack behind a test, as a reader names it: ``loss``, ``tracing test``, ``domain-level attack``."""
    return str((e.detail or {}).get("attack") or e.source.split(" ")[0])


def clause(e: Evidence, m: int) -> str:
    """What decided, first: the attack, its number, the null it beat (or failed to beat) and p after correction."""
    base = f"{e.baseline_name} {fmt(e.baseline)}" if e.baseline is not None else "no baseline"
    victim = (e.detail or {}).get("victim")
    on = f" on {victim}" if victim else ""
    return (f"{attack_of(e)}: {TEST_LABELS.get(e.test, e.test)} {fmt(e.value)}{on} vs {base}, p {p_text(e.p_value)} "
            f"({p_text(e.p_adjusted)} after Holm over {m})")


def short(e: Evidence) -> str:
    """A test in a few words, for a terminal: ``loss adv 0.26 > null 0.12, p<0.001``."""
    label = {"mia_advantage": "adv", "mia_tpr": "TPR@1%", "domain_attribution": "attrib.",
             "class_fidelity": "class", "identifiability": "ident.", "canary_epsilon": "ε≥"}.get(e.test, e.test)
    base = NULL_SHORT.get(e.baseline_name, e.baseline_name.split(" ")[0])
    beat = ">" if e.tier in ("high", "medium") else "vs"
    ref = f" {beat} {base} {fmt(e.baseline)}" if e.baseline is not None else ""
    return f"{attack_of(e).removesuffix(' attack')} {label} {fmt(e.value)}{ref}, {p_short(e.p_adjusted)}"
