"""The verdict: a risk tier per shared artifact and per membership target, from stored evidence.

A reviewer signs this, so every tier is a rule over numbers the run stored,
and each row keeps the evidence that decided it: the test, its value, the
baseline it had to beat and that baseline's name, its interval, its p-value
before and after correction, and the attack's power.

**Baselines are the strongest null that fits the test.**

* Record level (``identifiability``: are reconstructions nearer to training
  records than to fresh ones?): the permutation null at the run's counts
  (chance), the untrained control, the prior-only control and the holdout
  twin. It must beat every one of them — the permutation test against
  chance, a one-sided Fisher test against each measured null — so its p-value
  is the largest of those (an intersection-union test), which must survive
  the row's correction: MEDIUM; HIGH when, in addition, its 95% interval lies
  wholly above every measured null.
* Distribution level (``domain_attribution``, ``class_fidelity``): chance (the
  best guess that ignores the victim, or the image), the untrained control and
  the prior-only control — not the twin, which carries the domain as the
  members do (twin above the controls is itself the distribution-level
  finding). The lift over the strongest null is judged against the
  thresholds, and the lift must be significant: a one-sided binomial test
  against chance, Fisher's exact test against a measured control.
* Membership (``mia_tpr``, ``mia_advantage``): TPR at 1% FPR with its exact
  hypergeometric p-value (HIGH at a resolvable level with its interval above
  ``mia_tpr_ci_low``); the advantage max(TPR − FPR) with its one-sided KS
  p-value at the run's counts (MEDIUM at ``mia_advantage_medium`` or more).

**Many tests, one row.** Every test behind a row (victims × attacks, or
victims × variants × targets) enters Holm's step-down correction at the
family-wise level ``alpha`` (default 0.05): with no leakage at all, a row reads
MEDIUM or HIGH at most 5% of the time whatever the number of tests.

**Enough evidence before LOW.** A reconstruction row that would read LOW
reads INCONCLUSIVE when no test in it could have reached MEDIUM at its counts:
a perfect result (every image right) not significant at ``alpha`` / the number
of the row's tests (Holm's first step), or, for a lift test, a strongest null
so high that even 100% is a lift below the medium threshold. The reason names
the counts and any saturated null (one already at 100%). This holds for the
image and the latent-feature versions alike (same tests, same counts).

**Power before LOW.** A reconstruction row that would read LOW reads
INCONCLUSIVE unless one of its attacks reached power — revealed the domain or
class of a handful of member images from their artifact better than its
prior-only control, at the same budget (the positive control,
:mod:`fedaudit.audit.reconstruction`). Where the attack could not also single
those records out (``record_level``), the LOW says record-level leakage was
not testable. A membership row that would
read LOW reads INCONCLUSIVE when its counts could not detect an advantage of
``mia_advantage_medium`` at the corrected level; a row of the artifact test
(``artifact``: membership from a shared bank or statistics) reads
INCONCLUSIVE, too, unless the same test found the members of its positive
control (the artifact recomputed from a few members alone) at ``alpha`` for
every victim. Its holdout twin (the members swapped out) is its null: a
victim whose twin also separates members significantly cannot raise the row
(INCONCLUSIVE when that was all). A per-record bank that holds a member's own
entry exactly (and no non-member's) reads HIGH whatever the counts: an exact
match has no false positives to estimate. A membership advantage that is
significant and reaches ``mia_advantage_high`` (0.5) reads HIGH whatever the
low-FPR figures.

Tiers: ``high``, ``medium``, ``low``, ``inconclusive``, ``not_assessed``.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError
from fedaudit.statistics.membership_statistics import holm

HIGH, MEDIUM, LOW, INCONCLUSIVE, NOT_ASSESSED = "high", "medium", "low", "inconclusive", "not_assessed"
TIER_ORDER = {HIGH: 4, MEDIUM: 3, LOW: 2, INCONCLUSIVE: 1, NOT_ASSESSED: 0}
MIA = "mia"
CANARY = "canary"  # the one-run ε audit: a bound per victim, not a reconstruction section
CANARY_GRADIENT = "canary_gradient"  # its white-box variant: gradient canaries inside the victim's DP-SGD
DOMAIN = "domain"  # the domain-level membership variant: its own row
ARTIFACT = "artifact"  # the artifact-level variant: one row per shared artifact, with its twin and power
MIA_TARGETS = {"global_model": "the final global model", "last_upload": "the victim's last upload"}
BOOKKEEPING = ("summary", "auditor", "settings")  # keys of an attack's section that are not results
NOT_RECONSTRUCTIONS = (MIA, CANARY, CANARY_GRADIENT)  # leakage sections that are not {artifact: {victim: reconstruction scores}}
NULL_NAMES = {"chance": "chance", "control": "untrained-model control", "prior_only": "prior-only control",
              "twin": "holdout twin"}
CORRECTION = "Holm"
POWER_ALPHA = 0.05  # level of the positive control (fedaudit.audit.reconstruction) after its corrections
EPSILON_MAX = 100.0  # the largest ε threshold a thresholds file may set


@dataclass(frozen=True)
class RiskThresholds:
    """Effect sizes and the significance level of the tiers (fractions in [0, 1])."""

    domain_attribution_lift_high: float = 0.30
    domain_attribution_lift_medium: float = 0.10
    class_fidelity_lift_high: float = 0.30
    class_fidelity_lift_medium: float = 0.10
    mia_tpr_ci_low: float = 0.01
    mia_advantage_medium: float = 0.10
    mia_advantage_high: float = 0.50
    canary_epsilon_high: float = 1.0
    alpha: float = 0.05

    def describe(self) -> list[tuple[str, str, str]]:
        """(key, value, meaning) rows for the report's threshold table."""
        t = self
        return [
            ("alpha", _num(t.alpha), f"family-wise significance level of each verdict row ({CORRECTION} correction "
                                     "over every test behind the row); medium and high need a significant test"),
            ("domain_attribution_lift_high", _num(t.domain_attribution_lift_high),
             "high when the macro domain attribution of reconstructions exceeds the strongest null (chance, "
             "untrained and prior-only controls) by at least this"),
            ("domain_attribution_lift_medium", _num(t.domain_attribution_lift_medium), "medium at this lift"),
            ("class_fidelity_lift_high", _num(t.class_fidelity_lift_high),
             "high when class fidelity exceeds the strongest null by at least this"),
            ("class_fidelity_lift_medium", _num(t.class_fidelity_lift_medium), "medium at this lift"),
            ("mia_tpr_ci_low", _num(t.mia_tpr_ci_low),
             "high when TPR at 1% FPR is significant at a resolvable level and its 95% lower bound exceeds this"),
            ("mia_advantage_high", _num(t.mia_advantage_high),
             "high when the membership advantage is significant and reaches this, whatever the low-FPR figures "
             "(an attacker right about membership about three times in four at 0.5)"),
            ("mia_advantage_medium", _num(t.mia_advantage_medium),
             "medium when the membership advantage max(TPR − FPR) is significant and reaches this; a row that "
             "could not detect this advantage reads inconclusive rather than low"),
            ("canary_epsilon_high", _num(t.canary_epsilon_high),
             "canary audit: high when the ε lower bound reaches this (or exceeds the DP accountant's ε), medium "
             "when it is above 0; low only when the audit could have certified this much"),
        ]


def load_thresholds(path: str | Path | None) -> RiskThresholds:
    """Defaults, overridden by a flat TOML or JSON file; a bad key or value is a one-line user error."""
    if path is None:
        return RiskThresholds()
    path = Path(path).expanduser()
    valid = [f.name for f in fields(RiskThresholds)]
    if not path.is_file():
        raise FedauditError(f"--risk-thresholds file {path} does not exist; give a TOML or JSON file with keys {', '.join(valid)}")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise FedauditError(f"--risk-thresholds file {path} is not valid {kind} ({exc}); "
                            f"write flat keys such as domain_attribution_lift_high = 0.3") from None
    if not isinstance(data, dict):
        raise FedauditError(f"--risk-thresholds file {path} must hold a table of keys ({', '.join(valid)})")
    values: dict[str, float] = {}
    for key, value in data.items():
        if key not in valid:
            raise FedauditError(f"--risk-thresholds: unknown key {key!r} in {path}; valid keys: {', '.join(valid)}")
        top = EPSILON_MAX if key.startswith("canary_epsilon") else 1.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= top:
            raise FedauditError(f"--risk-thresholds: {key} must be a number in [0, {top:g}], got {value!r} in {path}; "
                                f"the default is {getattr(RiskThresholds, key)}")
        values[key] = float(value)
    out = RiskThresholds(**values)
    for stem in ("domain_attribution_lift", "class_fidelity_lift"):
        if getattr(out, f"{stem}_medium") > getattr(out, f"{stem}_high"):
            raise FedauditError(f"--risk-thresholds: {stem}_medium ({getattr(out, f'{stem}_medium')}) is above "
                                f"{stem}_high ({getattr(out, f'{stem}_high')}) in {path}; medium must not exceed high")
    if not 0.0 < out.alpha < 1.0:
        raise FedauditError(f"--risk-thresholds: alpha must lie strictly between 0 and 1, got {out.alpha} in {path}")
    return out


# -- evidence -------------------------------------------------------------------------


@dataclass
class Evidence:
    """One test behind a verdict row."""

    test: str
    source: str  # "deepinversion full_model / clean", "lira_online on the final global model / clean"
    value: float
    baseline: float | None
    baseline_name: str
    p_value: float
    interval: list[float] | None = None
    nulls: dict[str, float] | None = None
    power: dict[str, Any] | None = None
    p_adjusted: float = 1.0
    tier: str = LOW
    text: str = ""  # the plain-language sentence if this test decides the row
    effect: float | None = None  # what the effect-size rule compares (lift, or the interval's low end)
    detail: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and k != "text"}


def judge(metrics: dict[str, Any], config: dict[str, Any], thresholds: RiskThresholds | None = None) -> list[dict[str, Any]]:
    """The verdict rows of one target's metrics: every declared share, then every membership row."""
    t = thresholds or RiskThresholds()
    rows = []
    for key in (metrics.get("communication") or {}).get("declared") or []:
        rows.append(artifact_row(key, metrics, config, t))
    targets = mia_rows(metrics) or ["global_model"]
    rows += [membership_row(target, metrics, t) for target in targets]
    if any(isinstance((metrics.get("leakage") or {}).get(k), dict) for k in (CANARY, CANARY_GRADIENT)):
        rows.append(canary_row(metrics, t))
    data = metrics.get("auditor_data") or {}
    if data.get("status") == "none":  # nothing was scored: every row says so first, whatever else it says
        why = str(data.get("why") or "the auditor holds none of the clients' records")
        for row in rows:
            if why not in row["reason"]:
                row["reason"] = f"{why}; {row['reason']}"
    return rows


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


def _row(row: str, title: str, tier: str, reason: str, evidence: list[Evidence], t: RiskThresholds) -> dict[str, Any]:
    return {"row": row, "title": title, "tier": tier, "reason": reason,
            "correction": f"{CORRECTION} over {len(evidence)} test(s) at family-wise alpha {_num(t.alpha)}" if evidence else None,
            "evidence": [e.to_json() for e in evidence]}


def _decide(evidence: list[Evidence], t: RiskThresholds) -> None:
    """Holm-adjust the row's p-values and set each test's tier from its significance and effect."""
    for e, adj in zip(evidence, holm([e.p_value for e in evidence])):
        e.p_adjusted = adj
        if adj > t.alpha:
            e.tier = LOW


# -- shared artifacts -----------------------------------------------------------------


def share_title(key: str) -> str:
    kind, arrow = key[:-1], key[-1]
    return f"{kind} {arrow} ({'client → server' if arrow == '↑' else 'server → client'})"


def artifact_row(kind_dir: str, metrics: dict[str, Any], config: dict[str, Any], t: RiskThresholds) -> dict[str, Any]:
    """The verdict row of one declared share (``"full_model↑"``)."""
    kind, arrow = kind_dir[:-1], kind_dir[-1]
    title = share_title(kind_dir)
    leakage = metrics.get("leakage") or {}
    attacks = {name: sec for name, sec in leakage.items() if name not in NOT_RECONSTRUCTIONS and isinstance(sec, dict)}
    if not attacks:
        return _row(kind_dir, title, NOT_ASSESSED, "no reconstruction attack ran in this run; run with --attack "
                    "deepinversion", [], t)
    attacker = str(config.get("attacker") or "server")
    sees = "↑" if attacker == "server" else "↓"
    if arrow != sees:
        other = "--attacker client:<domain>" if attacker == "server" else "--attacker server"
        what = "uploads" if sees == "↑" else "broadcasts"
        return _row(kind_dir, title, NOT_ASSESSED, f"this run's attacker ({attacker}) sees {what} only; assess this "
                    f"direction with {other}", [], t)
    found = [(name, key, sec) for name, sec in attacks.items() for key in sec
             if key not in BOOKKEEPING and key.split(":")[0] == kind]
    if not found:
        return _row(kind_dir, title, NOT_ASSESSED, f"no attack in this run targets {kind}", [], t)
    evidence: list[Evidence] = []
    skipped: list[str] = []
    powers: list[tuple[str, dict[str, Any]]] = []
    for name, key, sec in found:
        entries = {v: e for v, e in sec[key].items() if isinstance(e, dict)}
        summary = (sec.get("summary") or {}).get(key)
        if summary is None:
            for e in entries.values():
                status = e.get("status", "unknown")
                reason = e.get("reason") or (e.get("metrics") or {}).get("reason") or "no reason stored"
                status = "attacked but not scored" if status == "attacked" else status
                if f"{status}: {reason}" not in skipped:
                    skipped.append(f"{status}: {reason}")
            continue
        evidence += _reconstruction_evidence(name, key, attacker, entries, summary, t)
        powers += [(f"{name} {key} / {v}", e.get("power") or {}) for v, e in entries.items()
                   if isinstance(e.get("metrics"), dict) and "identifiability" in e["metrics"]]
    if not evidence:
        return _row(kind_dir, title, NOT_ASSESSED, "; ".join(skipped) or f"no score with nulls stored for {kind}", [], t)
    _decide(evidence, t)
    top = max(evidence, key=lambda e: (TIER_ORDER[e.tier], e.effect or 0.0))
    if top.tier in (HIGH, MEDIUM):
        return _row(kind_dir, title, top.tier, top.text, evidence, t)
    notes = _notes(evidence)
    if not any(_could_reach_medium(e, len(evidence), t) for e in evidence):
        # a LOW that no result at these counts could have turned into MEDIUM is not a finding
        counts = sorted({f"{e.test} on {(e.detail or {}).get('n')}" for e in evidence
                         if isinstance((e.detail or {}).get("n"), int)})
        saturated = sorted({f"{e.test} ({e.baseline_name} already at {pct(e.baseline)})" for e in evidence
                            if _saturated(e)})
        return _row(kind_dir, title, INCONCLUSIVE, (
            f"no test beat its strongest null ({notes}), and at these counts none could have: even a perfect result "
            f"would not reach medium after {CORRECTION} correction over {len(evidence)} test(s) "
            f"({', '.join(counts) or 'counts not stored'})"
            + (f"; saturated: {', '.join(saturated)}" if saturated else "")
            + f". Give each client more records, and {advice(metrics, 'stronger_inversion')[0].lower()}"
            + advice(metrics, 'stronger_inversion')[1:]), evidence, t)
    # Power, corrected across the row's victims (Holm): a positive control that fires by chance in one of
    # many victims must not turn an uninformative reading into an informative LOW.
    measured = [(src, p) for src, p in powers if p.get("status") == "measured" and _isnum(p.get("p_value"))]
    adjusted = holm([p["p_value"] for _, p in measured])
    record_adjusted = holm([p.get("p_record_level", 1.0) for _, p in measured])
    reached = [src for (src, _), a in zip(measured, adjusted) if a <= POWER_ALPHA]
    if reached:
        record = [src for (src, _), a in zip(measured, record_adjusted) if a <= POWER_ALPHA]
        scope = ("it also singled out the source records, so record-level leakage was testable" if record else
                 "it could not single out the source records even there, so record-level leakage was not testable "
                 "at this budget; this LOW covers distribution-level leakage")
        return _row(kind_dir, title, LOW, f"no test beat its strongest null after {CORRECTION} correction ({notes}). "
                    f"On the positive control ({reached[0]}) the attack did reveal the domain or class of a few member "
                    f"images from their statistics; {scope}.", evidence, t)
    why = sorted({p.get("reason") for _, p in powers if p.get("status") == "not available" and p.get("reason")})
    budget = "the attack could not recover even the artifact of a handful of member images at this budget"
    if why and not any(p.get("status") == "measured" for _, p in powers):
        budget = f"no positive control ran ({'; '.join(why)})"
    return _row(kind_dir, title, INCONCLUSIVE, f"no test beat its strongest null ({notes}), but {budget}: a low reading "
                f"cannot be told from a weak attack. {advice(metrics, 'stronger_inversion')}", evidence, t)


def _could_reach_medium(e: Evidence, m: int, t: RiskThresholds) -> bool:
    """Whether a perfect result at the test's counts (every image right) would read MEDIUM: significant at
    alpha / m (Holm's first step, the most a row's strongest test may need) and, for a lift test, a lift of at
    least the medium threshold. A test whose counts were not stored is given the benefit of the doubt."""
    detail = e.detail or {}
    n = detail.get("n")
    if not isinstance(n, int):
        return True
    if n <= 0:
        return False
    level = t.alpha / max(m, 1)
    if e.test == "identifiability":  # the permutation test against chance and one against each measured null
        chance = detail.get("chance")
        best = [_lift_p_value([n, n], None, float(chance))] if _isnum(chance) else []
        best += [_lift_p_value([n, n], [v * n, n], None) for v in (detail.get("measured") or {}).values()]
        return max(best, default=0.0) <= level
    return (1.0 - float(e.baseline or 0.0) >= float(detail.get("medium", 0.0)) - 1e-9
            and _lift_p_value([n, n], detail.get("null_counts"), detail.get("chance")) <= level)


def _saturated(e: Evidence) -> bool:
    """The strongest null is already at a bound the test cannot beat (100%)."""
    return _isnum(e.baseline) and float(e.baseline) >= 1.0 - 1e-9


def _note(e: Evidence) -> str:
    base = f"{e.baseline_name} {_fmt(e.baseline)}" if e.baseline is not None else "no baseline"
    return f"{e.test} {_fmt(e.value)} vs {base}, p {_p(e.p_adjusted)}"


def _notes(evidence: list[Evidence], limit: int = 3) -> str:
    """The tests closest to significance, one short note each (all are in the row's evidence)."""
    ranked = sorted(evidence, key=lambda e: e.p_adjusted)
    text = "; ".join(_note(e) for e in ranked[:limit])
    return text + (f"; {len(ranked) - limit} more in the evidence" if len(ranked) > limit else "")


def _strongest(nulls: dict[str, float]) -> tuple[str, float]:
    """(name, value) of the largest finite null."""
    finite = {k: v for k, v in nulls.items() if _isnum(v)}
    name = max(finite, key=lambda k: finite[k])
    return name, float(finite[name])


def _reconstruction_evidence(attack: str, key: str, attacker: str, entries: dict[str, dict], summary: dict[str, Any],
                             t: RiskThresholds) -> list[Evidence]:
    attacked = {v: e for v, e in entries.items() if e.get("status") == "attacked" and isinstance(e.get("metrics"), dict)
                and "identifiability" in e["metrics"]}
    what = "images" if any("image_grid" in e for e in attacked.values()) else "latent features"
    victims = list((summary.get("domain_attribution") or {}).get("victims") or attacked)
    if attacker == "server":
        who = f"the {victims[0]} client" if len(victims) == 1 else f"the {len(victims)} source clients ({', '.join(victims)})"
        lead = f"From what {who} uploaded ({key}), the server synthesised {what}"
    else:
        lead = f"From the {key} broadcasts it received, the {attacker.split(':', 1)[-1]} client synthesised {what} of {', '.join(victims)}"
    out: list[Evidence] = []
    for test, metric, high, medium, verb in (
            ("domain_attribution", summary.get("domain_attribution", {}).get("macro") or {},
             t.domain_attribution_lift_high, t.domain_attribution_lift_medium,
             f"attributes to {victims[0] if len(victims) == 1 else 'each victim’s own domain'}"),
            ("class_fidelity", summary.get("class_fidelity") or {}, t.class_fidelity_lift_high,
             t.class_fidelity_lift_medium, "labels as the intended class")):
        if not _isnum(metric.get("attack")):
            continue
        counts = ((summary.get(test) or {}).get("counts") if test == "domain_attribution" else metric.get("counts")) or {}
        nulls = {k: metric[k] for k in ("chance", "control", "prior_only") if _isnum(metric.get(k))}
        if not nulls:
            continue
        name, base = _strongest(nulls)
        p = _lift_p_value(counts.get("attack"), counts.get(name), base if name == "chance" else None)
        lift = metric["attack"] - base
        tier = HIGH if lift >= high - 1e-9 else MEDIUM if lift >= medium - 1e-9 else LOW
        twin = f"; holdout twin {pct(metric['twin'])}" if _isnum(metric.get("twin")) else ""
        text = (f"{lead} that an independent classifier {verb} {pct(metric['attack'])} of the time"
                f"{'' if len(victims) == 1 else ' on average'} — {points(lift)} over the strongest null, the "
                f"{NULL_NAMES[name]} ({pct(base)}; chance {pct(metric.get('chance'))}, untrained control "
                f"{pct(metric.get('control'))}, prior-only control {pct(metric.get('prior_only'))}{twin}).")
        out.append(Evidence(test, f"{attack} {key} (macro over {len(victims)} victim(s))" if test == "domain_attribution"
                            else f"{attack} {key} (mean over {len(victims)} victim(s))", float(metric["attack"]), base,
                            NULL_NAMES[name], p, nulls={**nulls, **({"twin": metric["twin"]} if _isnum(metric.get("twin")) else {})},
                            tier=tier, text=text, effect=lift,
                            detail={"n": round(counts["attack"][1]) if _pair(counts.get("attack")) else None,
                                    "null_counts": counts.get(name), "chance": base if name == "chance" else None,
                                    "medium": medium}))
    for victim, e in attacked.items():
        ident = e["metrics"]["identifiability"]
        if not _isnum(ident.get("attack")) or not _isnum(ident.get("attack_p_value")):
            continue
        nulls = {k: ident[k] for k in ("chance", "control", "prior_only", "twin") if _isnum(ident.get(k))}
        measured = {k: v for k, v in nulls.items() if k != "chance"}
        name, base = _strongest(nulls)
        ci = ident.get("attack_ci95")
        n = int(ident.get("n") or 0)
        # Record-level leakage beyond *every* null: the permutation test against chance and a one-sided test
        # against each measured null must all reject (an intersection-union test: its p-value is the largest).
        p_each = {"chance": float(ident["attack_p_value"]),
                  **{k: _lift_p_value([ident["attack"] * n, n], [v * n, n], None) for k, v in measured.items()}}
        p = max(p_each.values())
        above_all = _interval(ci) and all(ci[0] > v for v in measured.values())
        tier = HIGH if above_all else MEDIUM
        finding = ("record-level leakage" if tier == HIGH else "a record-level signal above every null, though its "
                   "interval does not clear them all")
        text = (f"{_fmt_count(ident.get('attack_k'))} of {n} {what} synthesised for {victim} sit closer to one of its "
                f"training records than to a fresh record of the same domain ({pct(ident['attack'])}, 95% CI "
                f"{pct(ci[0]) if _interval(ci) else '?'}–{pct(ci[1]) if _interval(ci) else '?'}; equal numbers of members "
                f"and non-members per class, chance {pct(ident.get('chance'))} (permutation p {_p(p_each['chance'])}); "
                f"strongest null the {NULL_NAMES[name]} at {pct(base)}, every null beaten at p {_p(p)}): {finding}.")
        out.append(Evidence("identifiability", f"{attack} {key} / {victim}", float(ident["attack"]), base, NULL_NAMES[name],
                            p, interval=ci if _interval(ci) else None, nulls=nulls,
                            power=_power_summary(e.get("power")), tier=tier, text=text,
                            effect=(ci[0] - max(measured.values(), default=base)) if _interval(ci) else None,
                            detail={"p_against": p_each, "balanced": ident.get("balanced"),
                                    "null_q95": ident.get("null_q95"), "n": n, "chance": ident.get("chance"),
                                    "measured": measured}))
    return out


def _power_summary(power: Any) -> dict[str, Any] | None:
    if not isinstance(power, dict):
        return None
    if power.get("status") != "measured":
        return {"reached": False, "status": power.get("status"), "reason": power.get("reason")}
    sizes = {k: {**{m: v[m] for m in ("domain_attribution", "class_fidelity") if m in v},
                 "identifiability": v.get("identifiability"), "identifiability_p_value": v.get("p_value")}
             for k, v in (power.get("sizes") or {}).items() if isinstance(v, dict) and "p_reveals" in v}
    return {"reached": bool(power.get("reached")), "record_level": bool(power.get("record_level")),
            "p_value": power.get("p_value"), "sizes": sizes}


def _lift_p_value(attack: Any, null: Any, chance: float | None) -> float:
    """One-sided p-value of the attack's count beating the null: binomial against a chance level,
    Fisher's exact test against a measured control's count."""
    from scipy.stats import binomtest, fisher_exact

    if not _pair(attack):
        return 1.0
    k, n = round(attack[0]), round(attack[1])
    if n <= 0:
        return 1.0
    if chance is not None:
        return float(binomtest(k, n, min(max(chance, 0.0), 1.0), alternative="greater").pvalue)
    if not _pair(null) or round(null[1]) <= 0:
        return 1.0
    kb, nb = round(null[0]), round(null[1])
    return float(fisher_exact([[k, n - k], [kb, nb - kb]], alternative="greater")[1])


# -- membership -------------------------------------------------------------------------


def membership_title(row: str) -> str:
    if row == DOMAIN:
        return "membership: was each source domain in the federation?"
    return f"membership: {MIA_TARGETS[row]}" if row in MIA_TARGETS else f"membership: records behind the shared {row}"


def membership_row(row: str, metrics: dict[str, Any], t: RiskThresholds) -> dict[str, Any]:
    """The verdict of one membership row: a target (``global_model``, ``last_upload``) over the
    record-level variants, or ``domain`` for the domain-level variant."""
    key = f"membership:{row}"
    title = membership_title(row)
    mia = (metrics.get("leakage") or {}).get(MIA)
    if not isinstance(mia, dict) or not mia:
        data = metrics.get("auditor_data") or {}
        why = ("no membership attack in this run; run with --attack mia" if data.get("status") != "none" else
               f"membership inference needs the clients' records: {data.get('why', 'the auditor holds none')}")
        return _row(key, title, NOT_ASSESSED, why, [], t)
    what = ("the domain-level attack" if row == DOMAIN else MIA_TARGETS[row] if row in MIA_TARGETS
            else f"the shared {row}")
    evidence: list[Evidence] = []
    notes: list[str] = []
    sizes: list[tuple[int, int]] = []
    for variant, target, victim, e in mia_entries(mia, row):
        if "advantage" not in e:
            notes.append(f"{variant}/{victim}: {e.get('status', 'not run')} — {e.get('reason', 'no reason stored')}")
            continue
        on = MIA_TARGETS.get(target, target)
        n1, n0 = int(e.get("n_members", e.get("members", 0)) or 0), int(e.get("n_nonmembers", e.get("nonmembers", 0)) or 0)
        sizes.append((n1, n0))
        counts = f"{n1} members vs {n0} non-members"
        level = mia_level(e, 0.01)
        if level is not None and _isnum(level.get("p_value")):
            ci = level.get("tpr_interval", level.get("tpr_ci95"))
            resolvable = bool(level.get("resolvable", True))
            effect_ok = resolvable and _interval(ci) and ci[0] > t.mia_tpr_ci_low
            if variant == DOMAIN:
                text = (f"Querying {on}, the domain-level attack tells {victim} records (never trained on) from "
                        f"unseen-domain records: TPR {pct(level.get('tpr'))} at 1% FPR (95% CI {pct(ci[0])}–{pct(ci[1])}, "
                        f"exact p {_p(level['p_value'])}; chance 1%; {counts}) — the model reveals that {victim} took part.")
            else:
                text = (f"The {variant} attack on {on} flags {pct(level.get('tpr'))} of {victim}'s training records at 1% "
                        f"false positives (95% CI {pct(ci[0]) if _interval(ci) else '?'}–"
                        f"{pct(ci[1]) if _interval(ci) else '?'}, exact p {_p(level['p_value'])}; chance 1%; {counts}).")
            evidence.append(Evidence("mia_tpr", f"{variant} on {target} / {victim}", float(level.get("tpr", 0.0)),
                                     float(level.get("fpr_achieved", 0.01)), "achieved FPR (the chance line TPR = FPR)",
                                     float(level["p_value"]), interval=ci if _interval(ci) else None,
                                     tier=HIGH if effect_ok else LOW, text=text,
                                     effect=(ci[0] if _interval(ci) else None),
                                     detail={"resolvable": resolvable, "warning": level.get("warning") or None}))
        adv, p = e.get("advantage"), e.get("advantage_p_value")
        if _isnum(adv) and _isnum(p):
            auc = f", AUC {e['auc']:.2f}" if _isnum(e.get("auc")) else ""
            text = (f"The {variant} attack on {on} reaches membership advantage {adv:.2f} on {victim} (max TPR − FPR, "
                    f"KS p {_p(p)} at {counts}; no signal gives ≥ {e.get('advantage_null_95', float('nan')):.2f} only 5% "
                    f"of the time{auc}).")
            tier = HIGH if adv >= t.mia_advantage_high else MEDIUM if adv >= t.mia_advantage_medium else LOW
            if tier == HIGH:
                text += (f" HIGH by the advantage rule: significant after {CORRECTION} correction and at least "
                         f"{t.mia_advantage_high:g}, whatever the low-FPR figures.")
            evidence.append(Evidence("mia_advantage", f"{variant} on {target} / {victim}", float(adv),
                                     e.get("advantage_null_95"), "95% quantile with no signal at these counts", float(p),
                                     tier=tier, text=text, effect=float(adv)))
    if not evidence:
        return _row(key, title, NOT_ASSESSED, f"no membership result for {what}: {'; '.join(notes) or 'none stored'}", [], t)
    _decide(evidence, t)
    artifact = [(victim, e) for variant, _, victim, e in mia_entries(mia, row) if variant == ARTIFACT and "advantage" in e]
    # The holdout twin is the artifact's null: where it separates members as well (the signal survives swapping the
    # members out of this artifact, e.g. it comes from the weights), a finding cannot be credited to this artifact.
    twin_off = _twin_separates(artifact, t)
    discounted = [e for e in evidence if e.tier in (HIGH, MEDIUM) and e.source.rsplit(" / ", 1)[-1] in twin_off]
    for e in discounted:
        e.tier = LOW
    top = max(evidence, key=lambda e: (TIER_ORDER[e.tier], e.effect or 0.0))
    verbatim = _verbatim(artifact)
    shipped = [(victim, e) for victim, e in artifact if isinstance(e.get("exact_matches"), dict)
               and e["exact_matches"].get("members") and not e["exact_matches"].get("nonmembers")]
    if shipped:
        # a member's own entry, found exactly (and no non-member's), is identification whatever the counts: an
        # exact match has no false positives to estimate, so it is HIGH however few the non-members
        return _row(key, title, HIGH, f"{what[0].upper()}{what[1:]} carries members' records verbatim (HIGH by the "
                                      f"exact-match rule, whatever the counts): {_matched(shipped)}.", evidence, t)
    if top.tier in (HIGH, MEDIUM):
        return _row(key, title, top.tier, top.text + verbatim, evidence, t)
    if discounted:
        return _row(key, title, INCONCLUSIVE, (
            f"the test separates members for {', '.join(sorted(twin_off))}, but so does its holdout twin (the artifact "
            f"with those members swapped out): the signal is not this artifact's, and what the artifact adds cannot "
            f"be told apart — {_twin_readings(artifact, twin_off)}."), evidence, t)
    if artifact:  # power before LOW: the same test must have found the members of its positive control
        weak = [(victim, e.get("power") or {}) for victim, e in artifact
                if not (_isnum((e.get("power") or {}).get("advantage_p_value"))
                        and e["power"]["advantage_p_value"] <= t.alpha)]
        if weak:
            controls = {victim: e.get("controls") for victim, e in artifact}
            shown = "; ".join(f"{victim}: " + (f"AUC {_fmt(p.get('auc'))}, KS p {_p(p.get('advantage_p_value'))} on "
                                                f"{p.get('records', '?')} records" if "advantage" in p
                                                else str(p.get("reason") or controls.get(victim) or "not run"))
                              for victim, p in weak)
            return _row(key, title, INCONCLUSIVE, (
                f"no membership test was significant for {what} after {CORRECTION} correction, but the same test did "
                f"not find the members of its positive control (the artifact recomputed from a few members alone, "
                f"significant at {t.alpha:g} needed) — {shown}: a silence from a test without power says nothing."
                f"{verbatim}"), evidence, t)
    from fedaudit.statistics.membership_statistics import advantage_null_quantile

    miscalibrated = sorted({f"{variant}/{victim}" for variant, _, victim, e in mia_entries(mia, row)
                            if (e.get("calibration") or {}).get("status") == "miscalibrated"})
    caveat = (f" The reference models did not stand in for the target ({', '.join(miscalibrated)}: see the membership "
              "section), so those variants' silence says little." if miscalibrated else "")
    m = sum(1 for e in evidence if e.test == "mia_advantage") or 1
    detectable = min(advantage_null_quantile(n1, n0, t.alpha / m) for n1, n0 in sizes) if sizes else float("inf")
    summary = _notes([e for e in evidence if e.test == "mia_advantage"])
    if detectable > t.mia_advantage_medium:
        return _row(key, title, INCONCLUSIVE, (
            f"no membership test was significant for {what} after {CORRECTION} correction ({summary}), but at these "
            f"counts an advantage below {detectable:.2f} could not have been detected across {m} tests (the medium "
            f"threshold is {t.mia_advantage_medium:g}): {advice(metrics, 'more_records')}.{caveat}{verbatim}"), evidence, t)
    return _row(key, title, LOW, (f"no membership test was significant for {what} after {CORRECTION} correction "
                                  f"({summary}); an advantage of {detectable:.2f} or more would have been detected."
                                  f"{caveat}{verbatim}"), evidence, t)


def _verbatim(artifact: list[tuple[str, dict[str, Any]]]) -> str:
    """A note naming the records a per-record bank carries verbatim (their own entry, found exactly, within the
    float error of recomputing it)."""
    found = [(victim, e) for victim, e in artifact if isinstance(e.get("exact_matches"), dict)
             and e["exact_matches"].get("members")]
    return f" The bank carries records verbatim: {_matched(found)}." if found else ""


def _matched(found: list[tuple[str, dict[str, Any]]]) -> str:
    return "; ".join(
        f"{e['exact_matches']['members']} of {victim}'s members have their own entry in it exactly (non-members: "
        f"{e['exact_matches'].get('nonmembers', 0)}"
        + (f"; tolerance {e['exact_tolerance']:.2g}" if _isnum(e.get("exact_tolerance")) else "") + ")"
        for victim, e in found)


def _twin_separates(artifact: list[tuple[str, dict[str, Any]]], t: RiskThresholds) -> set[str]:
    """Victims whose holdout twin (the artifact with the members swapped out) separates members significantly."""
    return {victim for victim, e in artifact if isinstance(e.get("twin"), dict)
            and _isnum(e["twin"].get("advantage_p_value")) and e["twin"]["advantage_p_value"] <= t.alpha}


def _twin_readings(artifact: list[tuple[str, dict[str, Any]]], victims: set[str]) -> str:
    return "; ".join(f"{victim}: twin AUC {_fmt(e['twin'].get('auc'))}, KS p {_p(e['twin'].get('advantage_p_value'))}"
                     for victim, e in artifact if victim in victims)


def canary_row(metrics: dict[str, Any], t: RiskThresholds) -> dict[str, Any]:
    """The one-run canary audit (Steinke, Nasr & Jagielski 2023): a proven ε lower bound per victim and variant
    (input canaries scored by the model; gradient canaries read off the victim's updates under DP-SGD).

    Each audit's test is "the training is 0-DP for its records" (no privacy loss at all): the smallest p-value of
    its correct guesses at ε = 0 over the audit's k grid, Bonferroni-corrected for the grid; Holm across audits. Where a DP
    claim exists, a second test per audit is the f-DP test of the accountant's claimed curve (Mahloujifar et al.
    2025; μ-GDP for full-batch DP-SGD, else (ε, δ)), corrected the same way; runs stored before the curve was
    recorded are tested as (ε, δ) by Steinke et al.'s bound. The claim is refuted only when that test rejects after
    Holm over every audit of the row. HIGH when the claim is
    refuted, or a significant bound reaches ``canary_epsilon_high``; MEDIUM when a bound is significant but
    smaller; LOW only when some audit could have certified ``canary_epsilon_high`` (its ceiling), else
    INCONCLUSIVE."""
    from fedaudit.statistics.one_run_audit import p_value_of_claim, p_value_of_curve

    key, title = "membership:canary", "membership: canary audit (proven ε lower bound)"
    leakage = metrics.get("leakage") or {}
    audits = [("input", v, e) for v, e in (leakage.get(CANARY) or {}).items()]
    audits += [("gradient", v, e) for v, e in (leakage.get(CANARY_GRADIENT) or {}).items()]
    evidence: list[Evidence] = []
    notes: list[str] = []
    powers: list[float] = []
    claims: list[float] = []
    for variant, victim, e in audits:
        if not isinstance(e, dict) or not _isnum(e.get("epsilon_lower_bound")):
            notes.append(f"{victim} ({variant} canaries): {(e or {}).get('status', 'not run')} — "
                         f"{(e or {}).get('reason', 'no reason stored')}")
            continue
        m, r, v = int(e["canaries"]), int(e["guesses"]), int(e["correct"])
        delta = float(e.get("delta", 1e-5))
        per_k = e.get("per_k") or [{"guesses": r, "correct": v}] * len(e.get("k_grid") or [1])
        p = p_value_of_claim(m, per_k, 0.0, delta)  # "no privacy loss at all" is the claim ε = 0
        bound, spent = float(e["epsilon_lower_bound"]), e.get("epsilon_spent")
        claim = e.get("claim")
        p_claim = (1.0 if not _isnum(spent) else p_value_of_curve(m, per_k, claim) if isinstance(claim, dict)
                   else p_value_of_claim(m, per_k, float(spent), delta))
        claims.append(p_claim)
        powers.append(float(e.get("epsilon_max_certifiable") or 0.0))
        tier = HIGH if bound >= t.canary_epsilon_high else MEDIUM if bound > 0 else LOW
        evidence.append(Evidence("canary_epsilon", f"{variant} canaries / {victim}", bound, 0.0, "ε = 0 (no privacy loss)",
                                 p, tier=tier, effect=bound, text=_canary_text(variant, victim, e),
                                 detail={"epsilon_spent": spent, "epsilon_max_certifiable": e.get("epsilon_max_certifiable"),
                                         "p_claim": p_claim, "variant": variant, "ideal_bound": e.get("ideal_bound"),
                                         "estimate": (e.get("estimate") or {}).get("epsilon")}))
    if not evidence:
        return _row(key, title, NOT_ASSESSED, "; ".join(notes) or "no canary result stored", [], t)
    _decide(evidence, t)
    refuted = [ev for ev, adj in zip(evidence, holm(claims)) if adj <= t.alpha]
    for ev, adj in zip(evidence, holm(claims)):
        ev.detail["p_claim_adjusted"] = adj
    if refuted:
        top = max(refuted, key=lambda ev: ev.value)
        top.tier = HIGH
        return _row(key, title, HIGH, (
            f"THE DP GUARANTEE DOES NOT HOLD: {top.text} The claimed ε {top.detail['epsilon_spent']:.2f} is rejected at "
            f"p {_p(top.detail['p_claim_adjusted'])} after {CORRECTION} correction over {len(evidence)} audit(s): the "
            "DP-SGD implementation, its accounting or the audit is broken (or the target carries something ε does "
            "not cover: see the coverage table)."), evidence, t)
    top = max(evidence, key=lambda ev: (TIER_ORDER[ev.tier], ev.effect or 0.0))
    if top.tier in (HIGH, MEDIUM):
        within = (f" The bound is within the claimed ε {float(top.detail['epsilon_spent']):.2f} (not rejected, p "
                  f"{_p(top.detail['p_claim_adjusted'])} after {CORRECTION}): the guarantee holds as far as this audit "
                  "can tell, and the loss it proves is loss that ε allows." if _isnum(top.detail.get("epsilon_spent")) else "")
        return _row(key, title, top.tier, top.text + within, evidence, t)
    power = max(powers, default=0.0)
    if power < t.canary_epsilon_high:
        return _row(key, title, INCONCLUSIVE, (
            f"no canary audit proved any privacy loss, but with these canaries it could certify at most ε {power:.2f} "
            f"(below {t.canary_epsilon_high:g}): plant more canaries (--canaries, --gradient-canaries) or use a dataset "
            "with a larger holdout."), evidence, t)
    return _row(key, title, LOW, (f"no canary audit proved any privacy loss (all bounds 0 after {CORRECTION} correction), "
                                  f"though it could have certified up to ε {power:.2f}."), evidence, t)


def _canary_text(variant: str, victim: str, e: dict[str, Any]) -> str:
    """One audit's sentence: what was planted, what it proves, and the claim beside it."""
    bound, spent, m = float(e["epsilon_lower_bound"]), e.get("epsilon_spent"), int(e["canaries"])
    counts = (f"{pct(e.get('confidence'))} confidence, δ {e.get('delta')}; {e['correct']} of {e['guesses']} guesses "
              "right")
    claim = "no DP claim" if not _isnum(spent) else f"the accountant claims ε {float(spent):.2f}"
    gdp = e.get("gdp") if isinstance(e.get("gdp"), dict) else {}
    fdp = (f"; the f-DP bound: not μ-GDP for μ below {float(gdp['mu_lower_bound']):.2f}, which is ε ≥ "
           f"{float(gdp['epsilon_if_gaussian']):.2f} if its privacy curve is Gaussian"
           if _isnum(gdp.get("mu_lower_bound")) and float(gdp["mu_lower_bound"]) > 0 else "")
    if variant == "gradient":
        ideal = e.get("ideal_bound")
        estimate = (e.get("estimate") or {}).get("epsilon")
        return (f"Of {m} gradient canaries planted in {victim}'s DP-SGD, the server's view of its updates proves "
                f"ε ≥ {bound:.2f} ({counts}; {claim}{fdp}"
                + (f"; a mechanism spending exactly that would give these canaries about ε ≥ {float(ideal):.2f}"
                   + (f", μ ≥ {float(e['ideal_gdp_mu']):.2f}" if _isnum(e.get("ideal_gdp_mu")) else "")
                   if _isnum(ideal) else "")
                + (f"; the one-shot estimate, not a bound: ε ≈ {float(estimate):.2f}" if _isnum(estimate) else "")
                + f"; at most ε {float(e.get('epsilon_max_certifiable') or 0):.2f} certifiable).")
    return (f"Of {m} canaries planted in {victim}'s training split, the {e.get('target', '?')} reveals which were "
            f"trained on well enough to prove ε ≥ {bound:.2f} ({counts}; {claim}{fdp}).")


def mia_entries(mia: dict[str, Any], row: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(variant, target, victim, entry) of one membership row; bookkeeping keys and non-tables are skipped."""
    out = []
    for variant, by_target in mia.items():
        if variant in BOOKKEEPING or not isinstance(by_target, dict) or (variant == DOMAIN) != (row == DOMAIN):
            continue
        for target, by_victim in by_target.items():
            if (row == DOMAIN or target == row) and isinstance(by_victim, dict):
                out += [(variant, target, v, e) for v, e in by_victim.items() if isinstance(e, dict)]
    return out


def mia_rows(metrics: dict[str, Any]) -> list[str]:
    """The membership rows a run has: its record-level targets, then ``domain`` if that variant ran."""
    mia = (metrics.get("leakage") or {}).get(MIA)
    seen: list[str] = []
    if isinstance(mia, dict):
        for variant, by_target in mia.items():
            if variant in BOOKKEEPING or not isinstance(by_target, dict):
                continue
            keys = [DOMAIN] if variant == DOMAIN else [k for k in by_target if isinstance(by_target[k], dict)]
            seen += [k for k in keys if k not in seen]
    return sorted(seen, key=lambda k: k == DOMAIN)


def mia_level(entry: dict[str, Any], level: float) -> dict[str, Any] | None:
    """The stored operating point at FPR ``level`` (``tpr_at_fpr``; keys as strings)."""
    for name in ("levels", "tpr_at_fpr"):
        table = entry.get(name)
        if isinstance(table, dict):
            for key, value in table.items():
                try:
                    if math.isclose(float(key), level) and isinstance(value, dict):
                        return value
                except ValueError:
                    continue
    return None


# -- formatting -------------------------------------------------------------------------


def pct(x: Any) -> str:
    if not _isnum(x):
        return "n/a"
    v = 100.0 * float(x)
    return f"{v:.1f}%" if 0 < abs(v) < 10 else f"{v:.0f}%"


def points(lift: float) -> str:
    return f"{'+' if lift >= 0 else '−'}{abs(100 * lift):.0f} points"


def _p(p: Any) -> str:
    return "n/a" if not _isnum(p) else (f"{p:.2g}" if p >= 0.001 else "< 0.001")


def _fmt(x: Any) -> str:
    return "n/a" if not _isnum(x) else f"{float(x):.2f}"


def _fmt_count(k: Any) -> str:
    return f"{k:.0f}" if _isnum(k) else "?"


def _num(x: float) -> str:
    return f"{x:g}"


def _isnum(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _interval(ci: Any) -> bool:
    return isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_isnum(v) for v in ci)


def _pair(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and len(x) == 2 and all(_isnum(v) for v in x)
