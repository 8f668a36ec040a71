"""The verdict's rows as the evidence an anonymity assessment and a DPIA ask for (issue 60).

The EDPB's Opinion 28/2024 asks whether personal data can be extracted from a model, directly or by querying it, and
lists among the elements to document the model's testing against attack families — membership inference, attribute
inference, exfiltration and regurgitation of training data, model inversion, reconstruction — and the methodological
choices made (differential privacy among them). A federation has two things to assess: the **released model** (the
Opinion's "AI model", held by whoever receives it) and **the protocol** (what each party receives while it trains).
For each, one line per family: the verdict rows that answer it (a family's line never decides a tier of its own —
it takes the highest tier its rows decided, names the row that set it, that row's deciding fact and the attack's
budget), or "not run" (fedaudit has the attack; the rows say how to run it), or "not tested" and what would test it.
The measures the run used (DP-SGD, client-level DP, secure aggregation, what is shared) each name the rows they
bear on. :func:`anonymity_evidence` builds it from the rows; the run stores it (metrics.json →
``anonymity_evidence``) and the report shows the same, from the rows it shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fedaudit.run.evidence_detail import (IdentifiabilityDetail, LiftDetail, MembershipDetail, ParticipationDetail)
from fedaudit.run.results import Evidence, RunMetrics, VerdictRow
from fedaudit.run.stored import DP, ClientDP, CoverageRow, Privacy
from fedaudit.run.stored.anonymity import (FAMILIES, NOT_RUN, NOT_TESTED, TESTED, AnonymityEvidence, AssessedObject,
                                           FamilyEvidence, LinkedRow, Measure)
from fedaudit.run.stored.leakage import Leakage

from fedaudit.audit.verdict.evidence import (CLIENT_DATA, DP_AUDIT, GLOBAL, HIGH, INVERSION, MEDIUM, MEMBERSHIP, NOT_ASSESSED,
                       PARTICIPATION, RECORDS, SECURE_AGGREGATION_ROW, TIER_ORDER, closest, strongest)
from fedaudit.audit.verdict.wording import SUBJECTS

RELEASED = SUBJECTS[GLOBAL][0]  # a row's artifact when it is about the released model

HOLDERS = {"released_model": "the released model: the AI model, held by whoever receives it after training",
           "protocol": "the protocol: what each party receives during training (uploads, broadcasts, banks, "
                       "statistics)"}

CAVEAT = ("This is evidence of resistance to the attacks listed, run at the budget stated, from the observers named, "
          "under this run's threat model. It is not a determination that the model or the data shared are anonymous, "
          "nor that the deployment complies: stronger or other attacks may succeed where these did not, and whether "
          "the residual risk is acceptable is the controller's decision. Nothing here is legal advice.")
SOURCES = [
    "EDPB, Opinion 28/2024 on certain data protection aspects related to the processing of personal data in the "
    "context of AI models, adopted 17 December 2024: a model trained on personal data is anonymous only if both the "
    "direct extraction of personal data from it and obtaining such data through queries are insignificant; among "
    "the elements to document, the methodological choices (e.g. differential privacy) and the model's testing "
    "against attacks — membership and attribute inference, exfiltration, regurgitation of training data, model "
    "inversion, reconstruction. (Cited by document: its paragraph numbers were not checked against its text.)",
    "EDPS, TechDispatch #1/2025: Federated Learning (2025), section 1: the data can leak through the model updates "
    "the parties share, e.g. to membership inference.",
    "ICO, Privacy-enhancing technologies (PETs) guidance (June 2023), 'What PETs are there?': federated learning "
    "alone may not protect personal information appropriately; combine it with other PETs.",
]

# What fedaudit does not test, per object and family, and what would test it: said where the line has no row.
NOT_TESTED_TEXT = {
    ("released_model", "attribute_inference"): (
        "Not tested by fedaudit: record-level attribute inference (a record's sensitive attribute inferred from the "
        "released model's outputs, given its other attributes) and property inference from the weights (a "
        "meta-classifier over shadow models, Ganju et al., CCS 2018). The protocol's client-data rows test what a "
        "client's upload reveals of its data as a whole, not the released model."),
    ("released_model", "reconstruction"): (
        "Not tested by fedaudit on the released model itself: deepinversion and gradinv invert what is shared during "
        "training. A model inversion of the released model (e.g. DeepInversion from its BatchNorm statistics) would "
        "test it; the broadcast rows (--attacker client:<domain>) invert the models a client receives before it."),
    ("released_model", "regurgitation"): (
        "Not tested by fedaudit: the released model is a classifier, which answers a query with class scores, not "
        "records; extraction of records from its weights is the model-inversion line's question (above)."),
    ("protocol", "regurgitation"): (
        "Not tested as an attack of its own: a bank that ships members' own entries is found by its membership row's "
        "exact-match rule (HIGH whatever the counts) — no row of this run was decided by it; extraction of records "
        "from what is shared is the reconstruction line's question."),
}
# What a tested line leaves out of its family: said beside its tier.
LEFT_OUT = {("protocol", "attribute_inference"): (
    "Record-level attribute inference (one record's sensitive attribute, given its others) is not tested by "
    "fedaudit; the client-data rows test what an artifact reveals of a client's data as a whole (its domain, its "
    "classes).")}
EXACT_MATCH = "exact_match"  # the membership rule that finds a bank shipping members' entries verbatim


def anonymity_evidence(run: RunMetrics, rows: Sequence[VerdictRow]) -> AnonymityEvidence:
    """The evidence file of one target's run from its verdict rows (see the module's doc)."""
    by_object: dict[str, list[VerdictRow]] = {"released_model": [], "protocol": []}
    for r in rows:  # the DP claim's audit and the broadcast check answer no family (belongs): a measure, integrity
        by_object["released_model" if r.artifact == RELEASED else "protocol"].append(r)
    objects = {name: AssessedObject(holder=HOLDERS[name], **{
        family: _line(name, family, [r for r in found if belongs(r, family)], run)
        for family in FAMILIES}) for name, found in by_object.items()}
    return AnonymityEvidence(caveat=CAVEAT, sources=list(SOURCES), released_model=objects["released_model"],
                             protocol=objects["protocol"], measures=measures(run, rows))


def belongs(row: VerdictRow, family: str) -> bool:
    """Whether ``row``'s question answers ``family``: membership and participation (an organisation's membership)
    are membership inference; what a client's data is like, property inference; inversion, reconstruction; a
    membership row decided by the exact-match rule, a bank that ships records (exfiltration)."""
    return {"membership_inference": row.question in (MEMBERSHIP, PARTICIPATION),
            "attribute_inference": row.question == CLIENT_DATA,
            "reconstruction": row.question == INVERSION,
            "regurgitation": row.question == MEMBERSHIP and row.rule == EXACT_MATCH}[family]


def _line(assessed: str, family: str, rows: list[VerdictRow], run: RunMetrics) -> FamilyEvidence:
    linked = [LinkedRow(row=r.row, level=r.level, tier=r.tier, observer=r.observer) for r in rows]
    left_out = LEFT_OUT.get((assessed, family))
    decided = [r for r in rows if r.tier != NOT_ASSESSED]
    if not decided:
        return FamilyEvidence(status=NOT_RUN if rows else NOT_TESTED, rows=linked,
                              untested=_why_not(rows) or NOT_TESTED_TEXT.get((assessed, family)) or left_out)
    top = max(decided, key=lambda r: TIER_ORDER[r.tier])  # the first of the highest: rows come records first
    ran = list(dict.fromkeys(e.attack for r in decided for e in r.evidence))
    return FamilyEvidence(status=TESTED, tier=top.tier, deciding_row=top.row, fact=top.short, budget=budget(top, run),
                          ran=ran, rows=linked, untested=left_out)


def _why_not(rows: list[VerdictRow]) -> str:
    """Why no row was assessed, and how to assess it: each reason once, after the rows it holds for (a row judged
    under secure aggregation says what its twin in clear says, after a lead of its own)."""
    by_reason: dict[str, list[str]] = {}
    for r in rows:
        if not r.row.endswith(SECURE_AGGREGATION_ROW):
            by_reason.setdefault(r.cause.rstrip("."), []).append(r.row)
    return "; ".join(f"{', '.join(keys)}: {reason}" for reason, keys in by_reason.items())


def budget(row: VerdictRow, run: RunMetrics) -> str | None:
    """What the deciding test of ``row`` spent: the records it scored, the reference models or domain twins it had,
    a reconstruction's count and iterations (None where its evidence names none)."""
    if not row.evidence:
        return None
    # the test the row's sentence quotes: the strongest where it is significant, else the nearest significance
    e = strongest(list(row.evidence)) if row.tier in (HIGH, MEDIUM) else closest(row.evidence)
    leakage = (run.secure_aggregation.leakage if row.row.endswith(SECURE_AGGREGATION_ROW)
               and run.secure_aggregation is not None else run.results)
    for family, words in _BUDGETS:
        if isinstance(e.detail, family):
            return words(e, leakage)
    return None


def _membership_budget(e: Evidence, leakage: Leakage) -> str:
    d = e.detail
    assert isinstance(d, MembershipDetail)
    test = leakage.mia.get(d.variant, {}).get(d.target, {}).get(d.victim)
    references = None if test is None else test.reference_models or (test.reference or {}).get("reference_models")
    refs = f", {references} reference model(s)" if isinstance(references, int) and references else ""
    return f"{e.attack} on {d.target} ({d.victim}): {d.members} members, {d.nonmembers} non-members{refs}"


def _participation_budget(e: Evidence, leakage: Leakage) -> str:
    d = e.detail
    assert isinstance(d, ParticipationDetail)
    return (f"domain-level attack ({d.victim}): {d.members} member and {d.nonmembers} non-member images, "
            f"{len(d.twin_aucs)} domain twin(s)")


def _reconstruction_budget(e: Evidence, leakage: Leakage) -> str:
    attack, _, rest = e.source.partition(" ")
    artifact, _, victim = rest.partition(" / ")
    section = leakage.reconstructions.get(attack)
    entry = None if section is None else section.artifacts.get(artifact, {}).get(victim)
    settings = (section.settings or {}) if section is not None else {}
    iterations = (entry.iterations if entry is not None and entry.iterations else None) or settings.get("iters")
    restarts = entry.restarts if entry is not None else None
    n = e.detail.n if isinstance(e.detail, (IdentifiabilityDetail, LiftDetail)) else None
    parts = [f"{n} reconstruction(s) scored" if n else "",
             f"{iterations} iterations each" if isinstance(iterations, int) else "",
             f"{restarts} restarts" if restarts and restarts > 1 else ""]
    return f"{attack} on {rest}: " + ", ".join(p for p in parts if p) if any(parts) else f"{attack} on {rest}"


_BUDGETS: list[tuple[type, Callable[[Evidence, Leakage], str]]] = [
    (MembershipDetail, _membership_budget), (ParticipationDetail, _participation_budget),
    (IdentifiabilityDetail, _reconstruction_budget), (LiftDetail, _reconstruction_budget)]


# -- the measures -----------------------------------------------------------------------------------------------


def measures(run: RunMetrics, rows: Sequence[VerdictRow]) -> list[Measure]:
    """Record-level DP, client-level DP, secure aggregation and what is shared: each in words, with the rows it bears
    on (rows of artifacts its guarantee covers, its own audit's row, the rows judged under it)."""
    privacy = run.privacy if isinstance(run.privacy, Privacy) else Privacy()
    decided = [r for r in rows if r.tier != NOT_ASSESSED]
    declared = list(run.communication.declared)
    return [dp_measure(privacy.dp, _covered(privacy.coverage), decided),
            client_dp_measure(privacy.client_dp, _covered(privacy.client_coverage), decided),
            secure_aggregation_measure(run, rows),
            Measure(measure="shared", in_place=True, text=shared_text(declared),
                    rows=[r.row for r in rows if r.row in declared])]


def dp_measure(dp: DP | None, covered: set[str], decided: list[VerdictRow]) -> Measure:
    """Record-level DP: its ε and δ; the canary audit's row and the decided records rows of what it covers."""
    if dp is None:
        return Measure(measure="dp_sgd", in_place=False, text=dp_text(None),
                       rows=[r.row for r in decided if r.question == DP_AUDIT])
    return Measure(measure="dp_sgd", in_place=True, epsilon=dp.label_epsilon, delta=dp.delta, text=dp_text(dp),
                   rows=[r.row for r in decided if r.question == DP_AUDIT or (r.level == RECORDS and r.artifact in covered)])


def client_dp_measure(client: ClientDP | None, covered: set[str], decided: list[VerdictRow]) -> Measure:
    """Client-level DP: its ε and δ; the decided client-data and participation rows of what it covers."""
    if client is None:
        return Measure(measure="client_dp", in_place=False, text=client_dp_text(None), rows=[])
    return Measure(measure="client_dp", in_place=True, epsilon=client.epsilon, delta=client.delta,
                   text=client_dp_text(client),
                   rows=[r.row for r in decided if r.level != RECORDS and r.artifact in covered])


def _covered(coverage: list[CoverageRow]) -> set[str]:
    """The covered artifacts as rows name them (``full_model↑``); the released model with the models sent down (it
    is one of them, or their post-processing)."""
    out = {f"{c.artifact}{'↑' if c.direction == 'up' else '↓'}" for c in coverage if c.covered}
    return out | ({RELEASED} if any(k.endswith("model↓") for k in out) else set())


def _num(x: object) -> str:
    return f"{float(x):.3g}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "?"


def dp_text(dp: DP | None) -> str:
    """The record-level DP in force, in words."""
    if not dp:
        return ("No record-level DP: the clients trained without DP-SGD, so no artifact carries a record-level "
                "guarantee.")
    if dp.recorded:
        return (f"Central DP declared by the recording ({dp.mechanism}): noise multiplier "
                f"{dp.noise_multiplier}, clipping norm {dp.clipping_norm}, ε {dp.epsilon} at "
                f"δ {dp.delta} over {dp.rounds} rounds ({dp.unit}).")
    spent = {name: c.epsilon_spent for name, c in dp.clients.items()}
    per_client = "; ".join(f"{k} ε {v:.2f}" if isinstance(v, (int, float)) else f"{k} ε ?" for k, v in spent.items())
    return (f"DP-SGD on every client: target ε ≤ {dp.epsilon_target} at δ {dp.delta}, per-record "
            f"clipping at {dp.max_grad_norm}, accounted by {dp.accountant} (spent: {per_client}); the "
            f"unit of privacy is {dp.unit}.")


def client_dp_text(client: ClientDP | None) -> str:
    """Client-level DP on the aggregate, in words: its ε, what it costs in noise, what it covers."""
    if not client:
        return "No client-level DP: the aggregate carries no noise, so no guarantee bounds a whole client's influence."
    return (f"Client-level DP on the aggregate: ε {_num(client.epsilon)} at δ {client.delta} for "
            f"{client.unit}, over {client.rounds} rounds (μ {_num(client.mu)}, noise multiplier "
            f"{_num(client.noise_multiplier)}, updates clipped at {client.clip}; the noise on the mean of "
            f"{client.clients} clients has standard deviation {_num(client.noise_std_on_mean)} per "
            f"coordinate); it covers {client.covers}.")


def secure_aggregation_measure(run: RunMetrics, rows: Sequence[VerdictRow]) -> Measure:
    """Whether the server saw only the aggregate of the masked uploads — the recorded run's own protocol, or the
    server ``--secure-aggregation`` judges — what it read in clear, and the rows judged from its view."""
    recording = run.provenance.recording
    used = recording.secure_aggregation if recording is not None and recording.secure_aggregation else None
    section = run.secure_aggregation
    if section is None and used is None:
        return Measure(measure="secure_aggregation", in_place=False, rows=[], text=(
            "No secure aggregation: the server reads each client's upload before it aggregates (judge what it would "
            "see under it: --secure-aggregation)."))
    how = f"the recorded run used {used}" if used else "the server judged as one under it (--secure-aggregation)"
    left = ("" if section is None else " It reads in clear: " + (", ".join(
        f"{x.kind}{'↑' if x.direction == 'up' else '↓'}" for x in section.leaves) or "nothing") + "; each upload's "
        "rows are judged again from that server's view.")
    return Measure(measure="secure_aggregation", in_place=True,
                   text=f"Secure aggregation ({how}): the server sees the sum of the masked uploads.{left}",
                   rows=[r.row for r in rows if r.row.endswith(SECURE_AGGREGATION_ROW)])


def shared_text(declared: list[str]) -> str:
    """What the method shares, each artifact with its direction."""
    if not declared:
        return "What is shared: not declared by this run."
    said = [f"{k[:-1]} ({'client → server' if k.endswith('↑') else 'server → client'})" for k in declared]
    return "Shared during training: " + "; ".join(said) + "; and the released model, at the end."


__all__ = ["CAVEAT", "HOLDERS", "SOURCES", "anonymity_evidence", "belongs", "budget", "client_dp_measure",
           "client_dp_text", "dp_measure", "dp_text", "measures", "secure_aggregation_measure", "shared_text"]
