"""How the verdict says things: every row's reason and short form, written from the facts a rule returned
(:class:`~fedaudit.audit.verdict.evidence.Decision`), and the numbers, titles, observers and advice they share —
the report writes the canary audit's f-DP bound with the same words. Rules decide (inversion.py, membership.py,
canary.py); this module only writes."""

from __future__ import annotations

from typing import Any

from fedaudit.run.results import Leakage

from .evidence import (CLIENT_DATA, DOMAIN, GLOBAL, HIGH, INVERSION, LAST_UPLOAD, MEMBERSHIP, PARTICIPATION, Decision,
                       Evidence, isnum)
from .thresholds import CORRECTION, RiskThresholds

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


def to_conclude(question: str, rule: str | None, metrics: dict[str, Any]) -> str:
    """What would turn an INCONCLUSIVE row (decided by ``rule``) into a conclusive one, in the words of the command
    that made the run — the report's summary lists it beside each such row."""
    if rule == "uninformative":
        return ("more records per client, so that a test could reach medium at all: "
                f"{advice(metrics, 'more_records')}")
    if rule == "unpowered":
        return "an attack strong enough to pass its positive control: " + advice(metrics, "stronger_inversion")
    if rule == "undetectable" and question == PARTICIPATION:
        return ("more domain twins (--domain-twins), so that their spread can show a lift of 0.05 in AUC over their "
                "mean")
    if rule == "undetectable":
        return f"enough records to detect an advantage of 0.1 after the correction: {advice(metrics, 'more_records')}"
    if rule == "no_control":
        return ("an artifact test that finds the members of its positive control: more records per victim ("
                f"{advice(metrics, 'more_records')})")
    if rule == "twin_only":
        return ("a signal the holdout twin does not share: the artifact carries no more than a model without those "
                "members would; more records per victim tell the two apart")
    if rule == "uncertifiable":
        return "more canaries (--canaries, --gradient-canaries) or a dataset with a larger holdout"
    if rule == "no_twin":
        return ("at least two federations trained without each source domain (its domain twins, --domain-twins), "
                "which fedaudit evaluate trains itself; a recording cannot supply them, since fedaudit cannot re-run "
                "the deployment's loop")
    return "see the row's reason in the verdict"


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


def secure_aggregation_lead(kind: str, left_because: str | None, aggregate: dict[str, Any] | None,
                            solved: dict[str, Any] | None = None) -> str:
    """The first sentences of a row judged from a server under secure aggregation: what that server saw of ``kind``,
    and for which clients it solved the rounds' aggregates for the single update (``solved``: client → rounds)."""
    if left_because is not None:
        return f"Secure aggregation does not cover {kind} ({left_because}): the server reads each client's as before."
    mine = {c: v for c, v in (solved or {}).items() if v.get("kind") == kind}
    recovered = "".join(f" For {c} it solved rounds {v['rounds'][0]} and {v['rounds'][1]}, whose clients differ by {c} "
                        f"alone, for {c}'s single update (disaggregation, Lam et al., ICML 2021): {c}'s test is "
                        "against the update it recovered." for c, v in sorted(mine.items()))
    if not aggregate:
        return f"Under secure aggregation the server sees only the sum of the clients' {kind} uploads.{recovered}"
    clients = list(aggregate.get("clients") or [])
    return (f"Under secure aggregation the server sees only the sample-weighted aggregate of round "
            f"{aggregate.get('round')}'s {kind} uploads ({len(clients)} client{'s' if len(clients) != 1 else ''}: "
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
NULL_SHORT = {"95% quantile with no signal at these counts": "null", "achieved FPR (the chance line TPR = FPR)": "FPR",
              "untrained-model control": "control", "prior-only control": "prior-only", "holdout twin": "twin",
              "ε = 0 (no privacy loss)": "0", "domain twins": "twins"}


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
             "class_fidelity": "class", "identifiability": "ident.", "canary_epsilon": "ε≥",
             "participation_auc": "AUC"}.get(e.test, e.test)
    base = NULL_SHORT.get(e.baseline_name, e.baseline_name.split(" ")[0])
    beat = ">" if e.tier in ("high", "medium") else "vs"
    ref = f" {beat} {base} {fmt(e.baseline)}" if e.baseline is not None else ""
    return f"{attack_of(e).removesuffix(' attack')} {label} {fmt(e.value)}{ref}, {p_short(e.p_adjusted)}"


# -- rows with nothing to judge ---------------------------------------------------------------------------


def not_assessed(question: str, d: Decision) -> tuple[str, str]:
    """Why a row has nothing to judge, and its short form, from the case its rule found (``d.rule``)."""
    f = d.facts
    reconstruction = question in (INVERSION, CLIENT_DATA)
    if d.rule == "other_view":
        other = "--attacker client:<domain>" if f["attacker"] == "server" else "--attacker server"
        if reconstruction:
            sees = "uploads" if f["attacker"] == "server" else "broadcasts"
            flags = other + ("" if f.get("attack_ran", True) else " --attack deepinversion")  # no inversion ran
            return (f"judged from {f['observer']}'s view, which this run's attacker ({f['attacker']}) does not hold (it "
                    f"sees {sees} only); assess it with {flags}", f"{f['observer']}'s view: {other}")
        return (f"judged from {f['observer']}'s view, which this run's attacker ({f['attacker']}) does not hold; assess "
                f"it with {other} --attack mia", f"{f['observer']}'s view: {other}")
    if d.rule == "no_attack":
        if reconstruction:
            return "no reconstruction attack ran in this run; run with --attack deepinversion", "no inversion attack ran"
        if question == PARTICIPATION:
            return ("no domain-level attack in this run; run with --attack mia-domain (it trains domain twins, the "
                    "federation without each source domain, as its null)", "no domain-level attack ran")
        return "no membership attack in this run; run with --attack mia", "no membership attack ran"
    if d.rule == "no_records":
        return (f"membership inference needs the clients' records: {f.get('why') or 'the auditor holds none'}",
                "no records to test")
    if d.rule == "no_target":
        return ((f"no attack in this run targets {f['subject']}", "no attack targets it") if reconstruction else
                (f"no membership attack in this run takes {subject_name(f['subject'])} as its input",
                 "no attack reads it"))
    skipped = f["skipped"]  # no_score: attacks ran on it, none stored a score with its nulls
    if reconstruction:
        return ("; ".join(skipped) or f"no score with nulls stored for {f['subject']}",
                "not applicable" if skipped and all(s.startswith("not applicable") for s in skipped) else "not scored")
    full = "; ".join(f"{u.what}: {u.status} — {u.reason}" for u in skipped)  # membership, participation: Unscored
    return f"no membership result for {subject_name(f['subject'])}: {full or 'none stored'}", _unscored_short(skipped)


def _unscored_short(skipped: list[Any]) -> str:
    """Why attacks that ran stored no score, in a few words: the first one's status and its reason's first clause
    ("no result stored" only when nothing was stored at all)."""
    if not skipped:
        return "no result stored"
    clause = skipped[0].reason.split(":")[0].split(";")[0].strip()
    return f"{skipped[0].status}: {clause}" if clause else skipped[0].status


# -- inversion rows ------------------------------------------------------------------------------------


def inversion_reason(d: Decision, evidence: list[Evidence], metrics: dict[str, Any]) -> str:
    m = len(evidence)
    if d.rule == "significant":
        return f"{clause(d.facts['top'], m)}. {d.facts['top'].text}"
    notes = inversion_notes(evidence)
    if d.rule == "uninformative":
        stronger = advice(metrics, "stronger_inversion")
        return (f"no test beat its strongest null ({notes}), and at these counts none could have: even a perfect "
                f"result would not reach medium after {CORRECTION} correction over {m} test(s) "
                f"({', '.join(d.facts['counts']) or 'counts not stored'})"
                + (f"; saturated: {', '.join(d.facts['saturated'])}" if d.facts["saturated"] else "")
                + f". Give each client more records, and {stronger[0].lower()}{stronger[1:]}")
    if d.rule == "powered":
        found = ("singled out a few member images from their statistics (reconstructions nearer them than to fresh "
                 "records of their domain), so it would have found record-level leakage of that kind here"
                 if d.facts["records"] else
                 "revealed the domain or class of a few member images from their statistics, so it would have found "
                 "what this artifact tells about the client's data as a whole")
        return (f"no test beat its strongest null after {CORRECTION} correction ({notes}). On the positive control "
                f"({d.facts['control']}) the attack {found}.")
    if d.facts["why"]:
        budget = f"no positive control ran ({'; '.join(d.facts['why'])})"
    elif d.facts["records"]:
        budget = ("the attack could not single out even the handful of member images its positive control was "
                  "built from, so record-level leakage was not testable at this budget")
    else:
        budget = "the attack could not recover even the artifact of a handful of member images at this budget"
    return (f"no test beat its strongest null ({notes}), but {budget}: a low reading cannot be told from a weak "
            f"attack. {advice(metrics, 'stronger_inversion')}")


def inversion_short(d: Decision, evidence: list[Evidence]) -> str:
    closest = min(evidence, key=lambda e: e.p_adjusted)
    if d.rule == "significant":
        return short(d.facts["top"])
    if d.rule == "uninformative":
        return "too few records for any test to decide"
    if d.rule == "powered":
        return f"{short(closest)}; had power"
    return f"{short(closest)}; no power"


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


def lift_finding(lead: str, metric: dict[str, Any], victims: int, lift: float, null_name: str, base: float) -> str:
    """A distribution-level test's sentence: the attack's rate, its lift over the strongest null, every null."""
    twin = f"; holdout twin {pct(metric['twin'])}" if isnum(metric.get("twin")) else ""
    return (f"{lead} {pct(metric['attack'])} of the time{'' if victims == 1 else ' on average'} — {points(lift)} over "
            f"the strongest null, the {null_name} ({pct(base)}; chance {pct(metric.get('chance'))}, untrained "
            f"control {pct(metric.get('control'))}, prior-only control {pct(metric.get('prior_only'))}{twin}).")


def identifiability_finding(ident: dict[str, Any], n: int, what: str, victim: str, ci: list[float] | None,
                            p_chance: float, p: float, null_name: str, base: float, margin: float | None,
                            margin_high: float) -> str:
    """A record-level test's sentence: how many synthesised items sit closer to a member, against every null."""
    if margin is None:
        finding = "record-level leakage beyond every null (no interval stored to show its size)"
    elif margin >= margin_high - 1e-9:
        finding = f"large record-level leakage: the interval's low end is {points(margin)} over the strongest null"
    else:
        finding = (f"record-level leakage beyond every null, not shown large: the interval's low end is "
                   f"{points(margin)} over the strongest null (high needs {points(margin_high)})")
    return (f"{fmt_count(ident.get('attack_k'))} of {n} {what} synthesised for {victim} sit closer to one of its "
            f"training records than to a fresh record of the same domain ({pct(ident['attack'])}, 95% CI "
            f"{pct(ci[0]) if ci else '?'}–{pct(ci[1]) if ci else '?'}; equal numbers of members "
            f"and non-members per class, chance {pct(ident.get('chance'))} (permutation p {p_text(p_chance)}); "
            f"strongest null the {null_name} at {pct(base)}, every null beaten at p {p_text(p)}): {finding}.")


# -- membership rows ------------------------------------------------------------------------------------------


def membership_finding(e: Evidence) -> str:
    """The sentence after the deciding clause: what the test found, in the reader's words."""
    d = e.detail or {}
    counts = f"{d['members']} members vs {d['nonmembers']} non-members"
    on = {GLOBAL: "the released model", LAST_UPLOAD: "the victim's last upload"}.get(d["target"], f"the shared {d['target']}")
    if e.test == "mia_tpr":
        ci = e.interval
        span = f"{pct(ci[0])}–{pct(ci[1])}" if ci else "?"
        if d["variant"] == DOMAIN:
            return (f"Querying {on}, the domain-level attack tells {d['victim']} records (never trained on) from "
                    f"unseen-domain records: TPR {pct(e.value)} at 1% FPR (95% CI {span}; chance 1%; {counts}) — the "
                    f"model reveals that {d['victim']} took part.")
        return (f"The {d['attack']} on {on} flags {pct(e.value)} of {d['victim']}'s training records at 1% false "
                f"positives (95% CI {span}; chance 1%; {counts}).")
    auc = f", AUC {d['auc']:.2f}" if isnum(d.get("auc")) else ""
    return (f"The {d['attack']} on {on} separates {d['victim']}'s members from non-members with advantage "
            f"{e.value:.2f} (max TPR − FPR; no signal gives ≥ {fmt(e.baseline)} only 5% of the time at {counts}{auc}).")


def _other_attacks(evidence: list[Evidence], top: Evidence | None) -> str:
    """Every other attack on the artifact with its best advantage and corrected p: the reviewer sees them all."""
    best: dict[str, Evidence] = {}
    for e in evidence:
        name = attack_of(e)
        if e.test == "mia_advantage" and (top is None or name != attack_of(top)):
            if name not in best or e.p_adjusted < best[name].p_adjusted:
                best[name] = e
    return "; ".join(f"{name} {e.value:.2f} on {(e.detail or {}).get('victim')} (p {p_text(e.p_adjusted)})"
                     for name, e in best.items())


def membership_reason(d: Decision, subject: str, evidence: list[Evidence], artifact_tests: list[tuple[str, dict]],
            metrics: dict[str, Any], t: RiskThresholds) -> str:
    what, m = subject_name(subject), len(evidence)
    top = d.facts.get("top")
    others = _other_attacks(evidence, top)
    also = f" Other attacks on {what}: {others}." if others else ""
    closest = min(evidence, key=lambda e: e.p_adjusted)
    verbatim = _verbatim(artifact_tests)
    if d.rule == "exact_match":
        return (f"{_matched(d.facts['found'])}: {what} carries members' records verbatim (HIGH by the exact-match rule, "
                f"whatever the counts).{also}")
    if d.rule == "significant":
        rule = (f" HIGH by the advantage rule: significant after {CORRECTION} correction and at least "
                f"{t.mia_advantage_high:g}, whatever the low-FPR figures." if top.tier == HIGH and top.test == "mia_advantage"
                else "")
        return f"{clause(top, m)}. {top.text}{rule}{also}{verbatim}"
    if d.rule == "twin_only":
        return (f"{clause(closest, m)}, but the test separates members for {', '.join(d.facts['victims'])} and so does "
                f"its holdout twin (the artifact with those members swapped out): the signal is not this artifact's, "
                f"and what the artifact adds cannot be told apart — {twin_readings(artifact_tests, d.facts['victims'])}."
                f"{also}")
    lead = f"no attack on {what} was significant after {CORRECTION} correction over {m} tests (closest {clause(closest, m)})"
    if d.rule == "no_control":
        shown = "; ".join(f"{victim}: " + (f"AUC {fmt((e.get('power') or {}).get('auc'))}, KS p "
                                           f"{p_text((e.get('power') or {}).get('advantage_p_value'))} on "
                                           f"{(e.get('power') or {}).get('records', '?')} records"
                                           if "advantage" in (e.get("power") or {})
                                           else str((e.get("power") or {}).get("reason") or e.get("controls") or "not run"))
                          for victim, e in d.facts["weak"])
        return (f"{lead}, but the artifact test did not find the members of its positive control (the artifact "
                f"recomputed from a few members alone, significant at {t.alpha:g} needed) — {shown}: a silence from a "
                f"test without power says nothing.{also}{verbatim}")
    caveat = _miscalibrated(subject, metrics)
    if d.rule == "undetectable":
        return (f"{lead}, but at these counts an advantage below {d.facts['detectable']:.2f} could not have been "
                f"detected across {d.facts['tests']} tests (the medium threshold is {t.mia_advantage_medium:g}): "
                f"{advice(metrics, 'more_records')}.{also}{caveat}{verbatim}")
    return (f"{lead}; every attack had its power: an advantage of {d.facts['detectable']:.2f} or more would have been "
            f"detected.{also}{caveat}{verbatim}")


def membership_short(d: Decision, evidence: list[Evidence]) -> str:
    closest = min(evidence, key=lambda e: e.p_adjusted)
    if d.rule == "exact_match":
        return f"{sum(e['exact_matches']['members'] for _, e in d.facts['found'])} members' entries found verbatim"
    if d.rule == "significant":
        return short(d.facts["top"])
    if d.rule == "twin_only":
        return f"{short(closest)}; its twin too"
    if d.rule == "no_control":
        return f"{short(closest)}; control missed"
    return _detectable_short(d, closest)


def _detectable_short(d: Decision, closest: Evidence) -> str:
    """A quiet row's short form: the closest test, and the smallest effect the row could (or could not) see."""
    if d.rule == "undetectable":
        return f"{short(closest)}; can't see <{d.facts['detectable']:.2f}"
    return f"{short(closest)}; sees ≥{d.facts['detectable']:.2f}"


def _miscalibrated(subject: str, metrics: dict[str, Any]) -> str:
    bad = sorted({f"{r.variant}/{r.victim}" for r in Leakage.of(metrics).membership()
                  if (r.entry.get("calibration") or {}).get("status") == "miscalibrated"})
    return (f" The reference models did not stand in for the target ({', '.join(bad)}: see the membership section), "
            "so those variants' silence says little." if bad else "")


def _verbatim(artifact_tests: list[tuple[str, dict]]) -> str:
    """A note naming the records a per-record bank carries verbatim (their own entry, found exactly, within the
    float error of recomputing it)."""
    found = [(victim, e) for victim, e in artifact_tests if isinstance(e.get("exact_matches"), dict)
             and e["exact_matches"].get("members")]
    return f" The bank carries records verbatim: {_matched(found)}." if found else ""


def _matched(found: list[tuple[str, dict[str, Any]]]) -> str:
    return "; ".join(
        f"{e['exact_matches']['members']} of {victim}'s members have their own entry in it exactly (non-members: "
        f"{e['exact_matches'].get('nonmembers', 0)}"
        + (f"; tolerance {e['exact_tolerance']:.2g}" if isnum(e.get("exact_tolerance")) else "") + ")"
        for victim, e in found)


def twin_readings(artifact_tests: list[tuple[str, dict[str, Any]]], victims: list[str]) -> str:
    return "; ".join(f"{victim}: twin AUC {fmt(e['twin'].get('auc'))}, KS p {p_text(e['twin'].get('advantage_p_value'))}"
                     for victim, e in artifact_tests if victim in victims)


# -- the participation row ----------------------------------------------------------------------------------


def participation_finding(e: Evidence) -> str:
    """One source domain's test in a sentence: the attack's AUC on the released model, and on its domain twins."""
    d = e.detail or {}
    aucs = d.get("twin_aucs") or []
    twins = (f"on {len(aucs)} domain twin(s) — the federation trained without {d['victim']}, each with its own seed — it "
             f"reaches {', '.join(fmt(a) for a in aucs)} (mean {fmt(e.baseline)}; pooled spread "
             f"{fmt(d.get('spread'))} over {d.get('df')} degree(s) of freedom)" if d.get("twin") else
             f"no domain twin to compare with ({d.get('twin_reason') or 'one twin per domain: no spread to judge by'})")
    return (f"Querying the released model, the domain-level attack tells {d['victim']}'s records (never trained on "
            f"themselves) from the unseen {d.get('nonmember_domain') or 'domain'}'s with AUC {fmt(e.value)} "
            f"({d['members']} vs {d['nonmembers']} records); {twins}.")


def participation_reason(d: Decision, evidence: list[Evidence], t: RiskThresholds) -> str:
    m = len(evidence)
    closest = min(evidence, key=lambda e: e.p_adjusted)
    if d.rule == "significant":
        top = d.facts["top"]
        return (f"{clause(top, m)}. {top.text} The released model's AUC is {top.effect:+.2f} over its twins': it "
                f"reveals that {top.detail['victim']} took part, beyond that domain's own difficulty and the training "
                "noise of the federation.")
    if d.rule == "no_twin":
        names = ", ".join(str(e.detail["victim"]) for e in d.facts["missing"])
        why = d.facts["missing"][0].detail.get("twin_reason") or "one twin per domain: no spread to judge by"
        seen = ", ".join(f"{fmt(e.value)} on {e.detail['victim']}" for e in evidence)
        return (f"the domain-level attack: AUC {seen}, but no domain twins for {names} ({why}): a gap between a "
                "source domain and the unseen one may be that domain's own difficulty, not its participation, and "
                "cannot be told apart without federations trained without it.")
    if d.rule == "undetectable":
        return (f"no domain's AUC beat its twins' after {CORRECTION} correction over {m} test(s) (closest "
                f"{clause(closest, m)}), but the twins spread so widely that an AUC lift below "
                f"{d.facts['detectable']:.2f} could not have been detected (the medium threshold is "
                f"{t.participation_auc_lift_medium:g}): more twins (--domain-twins) narrow it.")
    return (f"no domain's AUC beat its twins' after {CORRECTION} correction over {m} test(s) (closest "
            f"{clause(closest, m)}); a lift of {d.facts['detectable']:.2f} in AUC over the twins would have been "
            "detected.")


def participation_short(d: Decision, evidence: list[Evidence]) -> str:
    closest = min(evidence, key=lambda e: e.p_adjusted)
    if d.rule == "significant":
        return short(d.facts["top"])
    if d.rule == "no_twin":
        return f"{short(closest)}; no domain twin"
    return _detectable_short(d, closest)


# -- the DP audit row --------------------------------------------------------------------------------------


def canary_reason(d: Decision, evidence: list[Evidence]) -> str:
    m = len(evidence)
    top = d.facts.get("top")
    if d.rule == "refuted":
        return (f"THE DP GUARANTEE DOES NOT HOLD: {clause(top, m)}; the claimed ε {top.detail['epsilon_spent']:.2f} is "
                f"rejected at p {p_text(top.detail['p_claim_adjusted'])} after {CORRECTION} correction over {m} "
                f"audit(s). {top.text} The DP-SGD implementation, its accounting or the audit is broken (or the target "
                "carries something ε does not cover: see the coverage table).")
    if d.rule == "significant":
        within = (f" The bound is within the claimed ε {float(top.detail['epsilon_spent']):.2f} (not rejected, p "
                  f"{p_text(top.detail['p_claim_adjusted'])} after {CORRECTION}): the guarantee holds as far as this "
                  "audit can tell, and the loss it proves is loss that ε allows." if isnum(top.detail.get("epsilon_spent"))
                  else "")
        return f"{clause(top, m)}. {top.text}{within}"
    if d.rule == "uncertifiable":
        return (f"no canary audit proved any privacy loss, but with these canaries it could certify at most ε "
                f"{d.facts['ceiling']:.2f} (below {d.facts['high']:g}): plant more canaries (--canaries, "
                "--gradient-canaries) or use a dataset with a larger holdout.")
    return (f"no canary audit proved any privacy loss (all bounds 0 after {CORRECTION} correction), though it could "
            f"have certified up to ε {d.facts['ceiling']:.2f}.")


def canary_short(d: Decision, evidence: list[Evidence]) -> str:
    top = d.facts.get("top")
    if d.rule == "refuted":
        return f"claimed ε {top.detail['epsilon_spent']:.2f} refuted, p {p_text(top.detail['p_claim_adjusted'])}"
    if d.rule == "significant":
        return short(top)
    if d.rule == "uncertifiable":
        return f"no loss proved; ceiling ε {d.facts['ceiling']:.2f}"
    return f"no loss proved; could certify ε {d.facts['ceiling']:.2f}"


def canary_finding(variant: str, victim: str, e: dict[str, Any]) -> str:
    """One audit's sentence: what was planted, what it proves, and the claim beside it."""
    bound, spent, m = float(e["epsilon_lower_bound"]), e.get("epsilon_spent"), int(e["canaries"])
    counts = (f"{pct(e.get('confidence'))} confidence, δ {e.get('delta')}; {e['correct']} of {e['guesses']} guesses "
              "right")
    claim = "no DP claim" if not isnum(spent) else f"the accountant claims ε {float(spent):.2f}"
    gdp = e.get("gdp") if isinstance(e.get("gdp"), dict) else {}
    fdp = f"; the {fdp_bound(gdp)}" if isnum(gdp.get("mu_lower_bound")) and float(gdp["mu_lower_bound"]) > 0 else ""
    if variant == "gradient":
        ideal = e.get("ideal_bound")
        estimate = (e.get("estimate") or {}).get("epsilon")
        return (f"Of {m} gradient canaries planted in {victim}'s DP-SGD, the server's view of its updates proves "
                f"ε ≥ {bound:.2f} ({counts}; {claim}{fdp}"
                + (f"; a mechanism spending exactly that would give these canaries about ε ≥ {float(ideal):.2f}"
                   + (f", μ ≥ {float(e['ideal_gdp_mu']):.2f}" if isnum(e.get("ideal_gdp_mu")) else "")
                   if isnum(ideal) else "")
                + (f"; the one-shot estimate, not a bound: ε ≈ {float(estimate):.2f}" if isnum(estimate) else "")
                + f"; at most ε {float(e.get('epsilon_max_certifiable') or 0):.2f} certifiable).")
    return (f"Of {m} canaries planted in {victim}'s training split, the {e.get('target', '?')} reveals which were "
            f"trained on well enough to prove ε ≥ {bound:.2f} ({counts}; {claim}{fdp}).")


def fdp_bound(gdp: dict[str, Any], ceiling: bool = False) -> str:
    """The f-DP bound of a canary audit (``gdp``: its μ, and what μ is as ε for a Gaussian curve), in the words the
    verdict and the report both use; ``ceiling`` adds the largest μ these canaries could certify."""
    mu, eps = gdp.get("mu_lower_bound"), gdp.get("epsilon_if_gaussian")
    if not isnum(mu):
        return ""
    most = (f"; at most μ {float(gdp['mu_max_certifiable']):.2f} certifiable"
            if ceiling and isnum(gdp.get("mu_max_certifiable")) else "")
    as_eps = f"ε ≥ {float(eps):.2f} if the privacy curve is Gaussian" if isnum(eps) else "ε unknown"
    return f"f-DP bound: μ ≥ {float(mu):.2f} ({as_eps}{most})"


# -- did every client get the same model? ----------------------------------------------------------------------


def _clients(groups: list[list[str]]) -> str:
    return " / ".join(", ".join(str(c).removeprefix("client:") for c in g) for g in groups)


def different_models(different: list[dict[str, Any]]) -> str:
    """Rounds in which the server sent clients different models, in words, naming the clients (the verdict row's
    reason, and the first screen's line before any tier)."""
    rounds = "; ".join(f"round {x['round']} ({x['message_type']} {x['record']}): {_clients(x['groups'])}"
                       for x in different)
    return (f"the server sent different models to different clients in the same round — {rounds} (clients "
            "separated by / received different content, compared by digest). A server that sends one client "
            "another model isolates that client's update in the aggregate — its records then as exposed as if "
            "nothing were aggregated — the signature of a model-inconsistency "
            "attack, which secure aggregation does not stop; unless the protocol is meant to personalise what it "
            "sends, ask why")


def consistency_reason(d: Decision) -> str:
    if d.rule == "different":
        return different_models(d.facts["different"])
    if d.rule == "none_compared":
        return "no round sent a model to two clients or more, so there was nothing to compare"
    if d.rule == "server_copies":
        return (f"every client of a round received the same model by the server's own record ({d.facts['compared']} "
                "broadcast(s) compared by content), but no client recorded what it received, and a server that sends "
                "different models could record one; record on the clients (recording_mod, or each site's shard)")
    return (f"every client of a round received the same model: the clients' own copies of {d.facts['compared']} "
            "broadcast(s) are identical by content")


def consistency_short(d: Decision) -> str:
    if d.rule == "different":
        first = d.facts["different"][0]
        return f"round {first['round']}: {_clients(first['groups'])}"[:60]
    return {"none_compared": "nothing to compare", "server_copies": "server's own copies only"}.get(
        d.rule, f"{d.facts.get('compared')} broadcast(s) identical")
