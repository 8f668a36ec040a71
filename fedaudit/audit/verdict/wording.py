"""The verdict's vocabulary: how numbers, p-values, tests, titles, observers and advice are written, and each
test's finding in a sentence — what every rule's ``reason`` and ``short`` are written with (each rule writes its own
sentences beside its decision: :class:`~fedaudit.audit.verdict.evidence.Rule`). The report writes the canary
audit's f-DP bound and a model-inconsistency finding with the same words."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedaudit.run.audited_run import DifferentRound
from fedaudit.run.entries import CanaryAudit, Identifiability, LiftTest
from fedaudit.run.evidence_detail import MembershipDetail, ParticipationDetail, expect
from fedaudit.run.results import Evidence

from .evidence import CLIENT_DATA, DOMAIN, INVERSION, MEMBERSHIP, PARTICIPATION, closest, isnum

# What to do next, in the words of the command that made the run: `fedaudit audit` takes no training or data option
# (they come from the recording), so its advice names what it does take or how to record differently.
ADVICE = {
    "evaluate": {
        "stronger_inversion": "Raise --inversion-iters or --inversion-batch, or run --profile paper on a GPU, and "
                              "audit again.",
        "more_records": "use more records per victim (--dataset shapes:375, a folder dataset, or a larger holdout "
                        "share in --split)",
        "calibrated_references": "replayed references: --attacker server and --reference-training replay, with a "
                                 "method that declares its round recipe; from scratch: --reference-epochs, --profile "
                                 "paper",
    },
    "audit": {
        "stronger_inversion": "Raise --inversion-iters or --inversion-batch (on a GPU, --device cuda) and audit the "
                              "recording again.",
        "more_records": "give the auditor more of each client's records, those it trained on and those it did not "
                        "(members/<client>/ and holdout/<client>/ in the manifest's data.records, or a dataset whose "
                        "clients hold more)",
        "calibrated_references": "record the clients' local recipe (recipe= local_epochs, batch_size, lr, …) so "
                                 "references replay its rounds; from scratch: --reference-epochs",
    },
}


def advice_of(command: str, what: str) -> str:
    """The advice ``what`` in the words of ``command`` (evaluate, audit)."""
    return ADVICE[command][what]


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


def secure_aggregation_lead(kind: str, left_because: str | None, aggregate_round: Any,
                            aggregate_clients: Sequence[str] | None,
                            solved: dict[str, tuple[str, list[Any]]] | None = None) -> str:
    """The first sentences of a row judged from a server under secure aggregation: what that server saw of ``kind``,
    and for which clients it solved the rounds' aggregates for the single update (``solved``: client → (kind,
    rounds)); ``aggregate_clients`` None: the aggregate was not described."""
    if left_because is not None:
        return f"Secure aggregation does not cover {kind} ({left_because}): the server reads each client's as before."
    mine = {c: rounds for c, (solved_kind, rounds) in (solved or {}).items() if solved_kind == kind}
    recovered = "".join(f" For {c} it solved rounds {rounds[0]} and {rounds[1]}, whose clients differ by {c} "
                        f"alone, for {c}'s single update (disaggregation, Lam et al., ICML 2021): {c}'s test is "
                        "against the update it recovered." for c, rounds in sorted(mine.items()))
    if aggregate_clients is None:
        return f"Under secure aggregation the server sees only the sum of the clients' {kind} uploads.{recovered}"
    clients = list(aggregate_clients)
    return (f"Under secure aggregation the server sees only the sample-weighted aggregate of round "
            f"{aggregate_round}'s {kind} uploads ({len(clients)} client{'s' if len(clients) != 1 else ''}: "
            f"{', '.join(clients)}); each victim's test is against that aggregate.{recovered}")


# Each question in the words a reviewer signs: records, the client's data as a whole, or participation (issue 47).
QUESTIONS = {INVERSION: "can its training records be reconstructed?",
             MEMBERSHIP: "does it reveal which records were trained on?",
             CLIENT_DATA: "does it reveal what a client's data is like (its domain, its classes)?",
             PARTICIPATION: "does it reveal which domains took part?"}

# A membership row's subject that is not a share: (its title's label, how a sentence names it).
SUBJECTS = {"global_model": ("released model", "the released model"),
            "last_upload": ("the victim's last upload", "the victim's last upload")}


def level_title(subject: str, question: str) -> str:
    """``full_model ↑ (client → server): can its training records be reconstructed?``"""
    label = SUBJECTS[subject][0] if subject in SUBJECTS else share_title(subject) if subject[-1:] in "↑↓" else subject
    return f"{label}: {QUESTIONS[question]}"


def membership_title(subject: str) -> str:
    return level_title(subject, MEMBERSHIP)


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
               "canary_epsilon": "ε lower bound", "participation_auc": "AUC"}
TEST_SHORT = {"mia_advantage": "adv", "mia_tpr": "TPR@1%", "domain_attribution": "attrib.", "class_fidelity": "class",
              "identifiability": "ident.", "canary_epsilon": "ε≥", "participation_auc": "AUC"}
NULL_SHORT = {"95% quantile with no signal at these counts": "null", "achieved FPR (the chance line TPR = FPR)": "FPR",
              "untrained-model control": "control", "prior-only control": "prior-only", "holdout twin": "twin",
              "ε = 0 (no privacy loss)": "0", "domain twins": "twins"}


def attack_of(e: Evidence) -> str:
    """The attack behind a test, as a reader names it: ``loss``, ``tracing test``, ``domain-level attack``."""
    return e.attack


def clause(e: Evidence, m: int) -> str:
    """What decided, first: the attack, its number, the null it beat (or failed to beat) and p after correction."""
    base = f"{e.baseline_name} {fmt(e.baseline)}" if e.baseline is not None else "no baseline"
    on = f" on {e.victim}" if e.victim else ""
    return (f"{attack_of(e)}: {TEST_LABELS.get(e.test, e.test)} {fmt(e.value)}{on} vs {base}, p {p_text(e.p_value)} "
            f"({p_text(e.p_adjusted)} after Holm over {m})")


def short(e: Evidence) -> str:
    """A test in a few words, for a terminal: ``loss adv 0.26 > null 0.12, p<0.001``."""
    label = TEST_SHORT.get(e.test, e.test)
    base = NULL_SHORT.get(e.baseline_name, e.baseline_name.split(" ")[0])
    beat = ">" if e.tier in ("high", "medium") else "vs"
    ref = f" {beat} {base} {fmt(e.baseline)}" if e.baseline is not None else ""
    return f"{attack_of(e).removesuffix(' attack')} {label} {fmt(e.value)}{ref}, {p_short(e.p_adjusted)}"


# -- inversion rows ------------------------------------------------------------------------------------


def quiet_short(evidence: list[Evidence], detectable: float, seen: bool) -> str:
    """A quiet row's few words: its closest test, and the smallest effect the row could see (``seen``) or could not
    have seen (the membership and participation rows' undetectable and low rules)."""
    nearest = closest(evidence)
    return f"{short(nearest)}; sees ≥{detectable:.2f}" if seen else f"{short(nearest)}; can't see <{detectable:.2f}"


def _inversion_note(e: Evidence) -> str:
    base = f"{e.baseline_name} {fmt(e.baseline)}" if e.baseline is not None else "no baseline"
    return f"{e.test} {fmt(e.value)} vs {base}, p {p_text(e.p_adjusted)}"


def inversion_notes(evidence: list[Evidence], limit: int = 3) -> str:
    """The tests closest to significance, one short note each (all are in the row's evidence)."""
    ranked = sorted(evidence, key=lambda e: e.p_adjusted)
    text = "; ".join(_inversion_note(e) for e in ranked[:limit])
    return text + (f"; {len(ranked) - limit} more in the evidence" if len(ranked) > limit else "")


def inversion_lead(key: str, attacker: str, victims: list[str], what: str) -> str:
    """Who synthesised what from which share: the start of a distribution-level finding."""
    if attacker == "server":
        who = f"the {victims[0]} client" if len(victims) == 1 else f"the {len(victims)} source clients ({', '.join(victims)})"
        return f"From what {who} uploaded ({key}), the server synthesised {what}"
    return (f"From the {key} broadcasts it received, the {attacker.split(':', 1)[-1]} client synthesised {what} of "
            f"{', '.join(victims)}")


def lift_lead(test: str, lead: str, victims: list[str]) -> str:
    verb = ({"domain_attribution": f"attributes to {victims[0] if len(victims) == 1 else 'each victim’s own domain'}",
             "class_fidelity": "labels as the intended class"}[test])
    return f"{lead} that an independent classifier {verb}"


def lift_finding(lead: str, found: LiftTest, victims: int, lift: float, null_name: str, base: float) -> str:
    """A distribution-level test's sentence: the attack's rate, its lift over the strongest null, every null."""
    twin = f"; holdout twin {pct(found.twin)}" if found.twin is not None else ""
    return (f"{lead} {pct(found.attack)} of the time{'' if victims == 1 else ' on average'} — {points(lift)} over "
            f"the strongest null, the {null_name} ({pct(base)}; chance {pct(found.null('chance'))}, untrained "
            f"control {pct(found.null('control'))}, prior-only control {pct(found.null('prior_only'))}{twin}).")


def identifiability_finding(ident: Identifiability, what: str, victim: str, p_chance: float, p: float,
                            null_name: str, base: float, margin: float | None, margin_high: float) -> str:
    """A record-level test's sentence: how many synthesised items sit closer to a member, against every null."""
    if margin is None:
        finding = "record-level leakage beyond every null (no interval stored to show its size)"
    elif margin >= margin_high - 1e-9:
        finding = f"large record-level leakage: the interval's low end is {points(margin)} over the strongest null"
    else:
        finding = (f"record-level leakage beyond every null, not shown large: the interval's low end is "
                   f"{points(margin)} over the strongest null (high needs {points(margin_high)})")
    ci = ident.ci95
    return (f"{fmt_count(ident.attack_k)} of {ident.n} {what} synthesised for {victim} sit closer to one of its "
            f"training records than to a fresh record of the same domain ({pct(ident.attack)}, 95% CI "
            f"{pct(ci[0]) if ci else '?'}–{pct(ci[1]) if ci else '?'}; equal numbers of members "
            f"and non-members per class, chance {pct(ident.chance)} (permutation p {p_text(p_chance)}); "
            f"strongest null the {null_name} at {pct(base)}, every null beaten at p {p_text(p)}): {finding}.")


# -- membership rows ------------------------------------------------------------------------------------------


def membership_finding(e: Evidence) -> str:
    """The sentence after the deciding clause: what the test found, in the reader's words."""
    d = expect(e.detail, MembershipDetail)
    counts = f"{d.members} members vs {d.nonmembers} non-members"
    on = SUBJECTS[d.target][1] if d.target in SUBJECTS else f"the shared {d.target}"
    if e.test == "mia_tpr":
        ci = e.interval
        span = f"{pct(ci[0])}–{pct(ci[1])}" if ci else "?"
        if d.variant == DOMAIN:
            return (f"Querying {on}, the domain-level attack tells {d.victim} records (never trained on) from "
                    f"unseen-domain records: TPR {pct(e.value)} at 1% FPR (95% CI {span}; chance 1%; {counts}) — the "
                    f"model reveals that {d.victim} took part.")
        return (f"The {d.attack} on {on} flags {pct(e.value)} of {d.victim}'s training records at 1% false "
                f"positives (95% CI {span}; chance 1%; {counts}).")
    auc = f", AUC {d.auc:.2f}" if d.auc is not None and isnum(d.auc) else ""
    return (f"The {d.attack} on {on} separates {d.victim}'s members from non-members with advantage "
            f"{e.value:.2f} (max TPR − FPR; no signal gives ≥ {fmt(e.baseline)} only 5% of the time at {counts}{auc}).")


# -- the participation row ----------------------------------------------------------------------------------


def participation_finding(e: Evidence) -> str:
    """One source domain's test in a sentence: the attack's AUC on the released model, and on its domain twins."""
    d = expect(e.detail, ParticipationDetail)
    aucs = d.twin_aucs
    twins = (f"on {len(aucs)} domain twin(s) — the federation trained without {d.victim}, each with its own seed — it "
             f"reaches {', '.join(fmt(a) for a in aucs)} (mean {fmt(e.baseline)}; pooled spread "
             f"{fmt(d.spread)} over {d.df} degree(s) of freedom)" if d.twin else
             f"no domain twin to compare with ({d.twin_reason or 'one twin per domain: no spread to judge by'})")
    return (f"Querying the released model, the domain-level attack tells {d.victim}'s records (never trained on "
            f"themselves) from the unseen {d.nonmember_domain or 'domain'}'s with AUC {fmt(e.value)} "
            f"({d.members} vs {d.nonmembers} records); {twins}.")


# -- the DP audit row --------------------------------------------------------------------------------------


def canary_finding(a: CanaryAudit) -> str:
    """One audit's sentence: what was planted, what it proves, and the claim beside it."""
    counts = (f"{pct(a.confidence)} confidence, δ {a.stored_delta}; {a.correct} of {a.guesses} guesses right")
    claim = "no DP claim" if a.epsilon_spent is None else f"the accountant claims ε {a.epsilon_spent:.2f}"
    fdp = f"; the {fdp_bound(a.mu, a.mu_as_epsilon)}" if a.mu is not None and a.mu > 0 else ""
    if a.variant == "gradient":
        return (f"Of {a.canaries} gradient canaries planted in {a.victim}'s DP-SGD, the server's view of its updates "
                f"proves ε ≥ {a.bound:.2f} ({counts}; {claim}{fdp}"
                + (f"; a mechanism spending exactly that would give these canaries about ε ≥ {a.ideal_bound:.2f}"
                   + (f", μ ≥ {a.ideal_gdp_mu:.2f}" if a.ideal_gdp_mu is not None else "")
                   if a.ideal_bound is not None else "")
                + (f"; the one-shot estimate, not a bound: ε ≈ {a.estimate:.2f}" if a.estimate is not None else "")
                + f"; at most ε {a.ceiling or 0.0:.2f} certifiable).")
    return (f"Of {a.canaries} canaries planted in {a.victim}'s training split, the {a.target or '?'} reveals which "
            f"were trained on well enough to prove ε ≥ {a.bound:.2f} ({counts}; {claim}{fdp}).")


def fdp_bound(mu: float | None, as_epsilon: float | None, most: float | None = None) -> str:
    """The f-DP bound of a canary audit (its μ, and what μ is as ε for a Gaussian curve), in the words the verdict and
    the report both use; ``most``: the largest μ these canaries could certify."""
    if mu is None:
        return ""
    ceiling = f"; at most μ {most:.2f} certifiable" if most is not None else ""
    as_eps = f"ε ≥ {as_epsilon:.2f} if the privacy curve is Gaussian" if as_epsilon is not None else "ε unknown"
    return f"f-DP bound: μ ≥ {mu:.2f} ({as_eps}{ceiling})"


# -- did every client get the same model? ----------------------------------------------------------------------


def groups_text(groups: list[list[str]]) -> str:
    return " / ".join(", ".join(str(c).removeprefix("client:") for c in g) for g in groups)


def different_models(different: Sequence[DifferentRound]) -> str:
    """Rounds in which the server sent clients different models, in words, naming the clients (the verdict row's
    reason, and the first screen's line before any tier)."""
    rounds = "; ".join(f"round {x.round} ({x.message_type} {x.record}): {groups_text(x.groups)}" for x in different)
    return (f"the server sent different models to different clients in the same round — {rounds} (clients "
            "separated by / received different content, compared by digest). A server that sends one client "
            "another model isolates that client's update in the aggregate — its records then as exposed as if "
            "nothing were aggregated — the signature of a model-inconsistency "
            "attack, which secure aggregation does not stop; unless the protocol is meant to personalise what it "
            "sends, ask why")
