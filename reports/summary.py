"""The report's first screen, for a reviewer who must sign the deployment off or send it back: what was audited,
the highest tier, each HIGH and MEDIUM row with its cause and a mitigation of its level — records of individuals
first, then what the deployment reveals about each participating organisation's data and whether it took part —
what was not assessed and what would make each INCONCLUSIVE row conclusive; and the facts a data-protection impact
assessment asks for (what crosses the wire, to whom and how often, the threat models tested, the measures in place,
the residual risk per artifact and level). Everything is read from the run's stored files; nothing here is legal
advice."""

from __future__ import annotations

from fedaudit.audit.verdict import (CLIENT_DATA, LEVELS, NOT_ASSESSED, PARTICIPATION, RECORDS, SECURE_AGGREGATION_ROW,
                                    TIER_ORDER, Headline)
from fedaudit.audit.verdict import to_conclude
from fedaudit.audit.verdict.wording import different_models
from fedaudit.run.stored import AuditedRecording, CoverageRow, ModelInfo, Privacy, Verification
from fedaudit.run.stored.anonymity import FAMILIES, AnonymityEvidence, FamilyEvidence
from fedaudit.run.audited_run import BroadcastCheck
from fedaudit.reports.cells import Context
from fedaudit.reports.load import Unit, run_config
from fedaudit.simulation.secure_aggregation import MASKED
from fedaudit.run.results import RunMetrics, VerdictRow

# How each level reads on the first screen, records of individuals first.
LEVEL_HEADINGS = {RECORDS: "Records of individuals",
                  CLIENT_DATA: "What the deployment reveals about each participating organisation's data as a whole",
                  PARTICIPATION: "Whether an organisation took part"}

# A record-level mitigation fedaudit can measure, per shared artifact kind: the option, and what a re-run shows.
MITIGATIONS = {
    "full_model": "train with DP-SGD",
    "partial_model": "train with DP-SGD",
    "global_model": "train with DP-SGD",
    "amplitude_bank": "share fewer spectra: a smaller --elcfs-fraction (the bank holds that fraction of each "
                      "client's images)",
    "style_bank": "share pooled styles: --ccst-style overall (one style per client), or a smaller --ccst-k",
    "bn_stats_all_layers": "drop the artifact: a method that keeps its BatchNorm statistics local",
    "global_stats": "drop the artifact: a method that sends no global statistics",
    "classifier_head": "drop the artifact: a method that shares no classifier head",
}
# What a client's data is like, as the server sees it in each upload: record-level DP does not hide it, and noise
# on the aggregate (client-level DP) does not reach an upload the server reads before aggregating.
CLIENT_DATA_UPLOADS = {
    "amplitude_bank": "every spectrum in the bank is a whole image's amplitude: a smaller --elcfs-fraction shares "
                      "fewer of them, but any share shows the client's look",
    "style_bank": "the styles are what CCST shares: --ccst-style overall sends one pooled style per client, still "
                  "that client's look",
}
MASKED_KINDS = tuple(k.value for k in MASKED)  # what secure aggregation sums (fedaudit.simulation.secure_aggregation)
NOT_RECORD_DP = "Record-level DP (DP-SGD) bounds what one record does, not what a whole client's data is like"


def level_groups(items: list[Context]) -> list[Context]:
    """``items`` (each with a ``level``) grouped under their level's heading, records first; empty levels left out."""
    return [{"level": level, "heading": LEVEL_HEADINGS[level], "items": [i for i in items if i["level"] == level]}
            for level in LEVELS if any(i["level"] == level for i in items)]


def first_screen(u: Unit, rows: list[VerdictRow]) -> Context:
    """The summary block of one unit (one trained federation and target), from the verdict rows the page shows."""
    run = u.stored
    findings = [{"tier": r.tier, "title": r.title, "observer": r.observer, "cause": r.cause, "level": r.level,
                 "mitigation": mitigation(r, u)} for r in _by_tier(rows, ("high", "medium"))]
    return {
        "label": u.label,
        "deployment": deployment(u, run),
        "headline": Headline.of(r.tier for r in rows),
        "findings": findings,
        "by_level": level_groups(findings),
        "inconclusive": [{"title": r.title, "observer": r.observer, "cause": r.short or r.cause, "level": r.level,
                          "needs": to_conclude(r.question, r.rule, u.audited.made_by)} for r in _by_tier(rows, ("inconclusive",))],
        "not_assessed": not_assessed_groups(rows),
        "low": [r.title for r in rows if r.tier == "low"],
        "secure_aggregation": secure_aggregation_block(run, rows),
    }


SECURE_AGGREGATION_ASSUMES = (
    "An honest-but-curious server that follows the protocol; the mask covers each training reply's parameters and its "
    "example count, as Flower's SecAgg+ masks them, so the server learns their sample-weighted sum over a round's "
    "clients and reads every other message as before. A server that sends different clients different models is "
    "not stopped by it (the consistency check of a recording asks that).")


def secure_aggregation_block(run: RunMetrics, rows: list[VerdictRow]) -> Context | None:
    """Each server row beside its twin judged from the server under secure aggregation (``--secure-aggregation``), what
    the mask leaves, and whether disaggregation was possible; None where the run did not ask."""
    section = run.secure_aggregation
    if section is None:
        return None
    by_key = {r.row: r for r in rows}
    pairs = [{"title": r.title, "without": by_key[r.row[: -len(SECURE_AGGREGATION_ROW)]].tier, "with": r.tier,
              "fact": r.short} for r in rows
             if r.row.endswith(SECURE_AGGREGATION_ROW) and r.row[: -len(SECURE_AGGREGATION_ROW)] in by_key]
    aggregate, dis = section.aggregate, section.disaggregation
    return {"assumes": SECURE_AGGREGATION_ASSUMES,
            "masked": ", ".join(section.masked),
            "aggregate": (f"round {aggregate.round}: {len(aggregate.clients)} client(s) ({', '.join(aggregate.clients)})"
                          if aggregate else "none on the wire"),
            "pairs": pairs,
            "leaves": [f"{x.kind}{'↑' if x.direction == 'up' else '↓'}: {x.why}" for x in section.leaves],
            "disaggregation": f"{dis.status}: {dis.reason}".rstrip(": ")}


def not_assessed_groups(rows: list[VerdictRow]) -> list[Context]:
    """NOT ASSESSED rows grouped by why (one line for every row a run's choice of attacker or attacks left out)."""
    groups: dict[str, list[VerdictRow]] = {}
    for r in rows:
        if r.tier == NOT_ASSESSED:
            groups.setdefault(r.reason, []).append(r)
    return [{"why": why, "titles": [r.title for r in group], "observers": sorted({r.observer for r in group})}
            for why, group in groups.items()]


def _by_tier(rows: list[VerdictRow], tiers: tuple[str, ...]) -> list[VerdictRow]:
    return sorted((r for r in rows if r.tier in tiers), key=lambda r: -TIER_ORDER[r.tier])


def mitigation(row: VerdictRow, u: Unit) -> str:
    """What would lower this row — a measure of the row's level — and the command that measures it (the accuracy
    it costs included)."""
    method = str(u.stored.method or "?")
    if row.question == "dp_audit":
        return ("the DP-SGD implementation or its accounting does not deliver the claimed ε: fix it and re-run "
                "--attack canary; until then the claim cannot be relied on")
    if row.question == "consistency":
        return ("have each client check, before it trains, that the model it received is the one every client "
                "received (a digest of each round's model published where every client can compare it, or exchanged "
                "among the clients), and record on the clients so the audit compares what they received; secure "
                "aggregation alone does not stop a server that sends different models")
    kind = "global_model" if row.artifact == "released model" else row.artifact.rstrip("↑↓").split(":")[0]
    if row.level == RECORDS:
        return _record_mitigation(kind, row, method, u)
    if row.level == CLIENT_DATA and row.artifact.endswith("↑"):
        return _upload_mitigation(kind, method, u, row.row.endswith(SECURE_AGGREGATION_ROW))
    return client_level_dp(method, u, "the released model" if row.level == PARTICIPATION else "what each client receives")


def _upload_mitigation(kind: str, method: str, u: Unit, under_secure_aggregation: bool = False) -> str:
    """The server reads each upload before it aggregates: keep per-client statistics out of it, or let it see only
    the sum (secure aggregation). A row judged under secure aggregation already has the sum: what is left is less
    per-client data in it, or noise on the sum; for what the mask does not cover, the upload as before."""
    if kind == "full_model" and declared(method, "upload_mitigation"):
        how = declared(method, "upload_mitigation")
    elif kind in CLIENT_DATA_UPLOADS:
        how = CLIENT_DATA_UPLOADS[kind]
    elif kind in ("full_model", "partial_model"):
        how = (f"send no per-client statistics: train without BatchNorm's running statistics (fedaudit evaluate "
               f"--method {method} --norm gn) or keep them on the client (gperxan --gperxan-upload partial), and "
               "compare this row")
    else:
        how = MITIGATIONS.get(kind, f"drop the artifact: a method that does not send {kind} (fedaudit list methods)")
    if under_secure_aggregation and kind in MASKED_KINDS:
        return (f"{how}. The server sees only the aggregate here, and the aggregate still shows it; noise on the sum "
                f"would reach it: {client_level_dp(method, u, 'the aggregate')}")
    if under_secure_aggregation:
        return f"{how}; secure aggregation does not cover {kind}. {NOT_RECORD_DP}."
    return (f"{how}; or let the server see only the aggregate (secure aggregation: --secure-aggregation measures what "
            f"the aggregate still shows). {NOT_RECORD_DP}, and noise on the aggregate does not reach an upload the "
            "server reads first.")


def declared(method: str, attribute: str) -> str:
    """What the method registered as ``method`` declares as ``attribute`` ("" for a method fedaudit does not know,
    e.g. a recording's)."""
    from fedaudit.methods import METHODS

    return str(getattr(METHODS.get(method), attribute, "") or "")


def client_level_dp(method: str, u: Unit, protects: str) -> str:
    """Client-level DP: each client's update clipped, Gaussian noise on the aggregate, accounted over the rounds for
    adding or removing one client — what bounds a whole client's influence on ``protects``."""
    if u.audited.made_by == "audit":
        return (f"client-level DP on the aggregate (clip each client's update, add Gaussian noise to their sum, account "
                f"for adding or removing one client over the rounds) bounds a whole client's influence on {protects}; "
                f"declare it in the recording and audit again. {NOT_RECORD_DP}.")
    blocked = declared(method, "client_dp_incompatible")
    if blocked:
        return (f"client-level DP would bound a whole client's influence on {protects}, but {method} cannot aggregate "
                f"with it ({blocked}); compare a method that can: fedaudit evaluate --method fedavg --client-dp-epsilon "
                f"1. {NOT_RECORD_DP}.")
    return (f"client-level DP, which bounds a whole client's influence on {protects}: fedaudit evaluate --method "
            f"{method} --client-dp-epsilon 1 (each update clipped, Gaussian noise on the aggregate; its ε and accuracy "
            f"beside this run's). With few clients the noise on their mean is large (σC/K for K clients): measure what "
            f"it costs. {NOT_RECORD_DP}.")


def _record_mitigation(kind: str, row: VerdictRow, method: str, u: Unit) -> str:
    """What bounds one record's influence on the artifact: DP-SGD for trained weights, less of the artifact else."""
    if kind == "full_model" and row.artifact.endswith("↑") and declared(method, "upload_mitigation"):
        return declared(method, "upload_mitigation")
    how = MITIGATIONS.get(kind, f"drop the artifact: a method that does not send {kind} (fedaudit list methods)")
    if how != "train with DP-SGD":
        return how
    if u.audited.made_by == "audit":
        return ("train the deployment with DP (client-side clipping and noise), declare it in the recording "
                "(start_recording(dp=...)) and audit again: the report then states the ε and what it covers")
    blocked = declared(method, "dp_incompatible")
    if blocked:
        return f"{method} cannot be trained with DP-SGD ({blocked}); compare a method that can, with --dp-epsilon"
    return (f"train with DP-SGD and measure what it costs: fedaudit evaluate --method {method} --dp-sweep 1,8,inf "
            "(one run per ε, each with this verdict and its unseen-domain accuracy, and the privacy–utility curve)")


def deployment(u: Unit, run: RunMetrics) -> list[tuple[str, str]]:
    """(what, value) lines naming the federation audited and the threat model."""
    provenance = u.stored.provenance
    cfg = provenance.config or run_config(u.config)
    model = provenance.model or ModelInfo()
    built = model.factory or model.architecture or (cfg["model"] if "model" in cfg else "?")
    recording = provenance.recording
    where = f"fedaudit's simulation of {run.method}"
    if recording is not None:
        name = recording.framework_name
        where = (f"a recording of a {name} run ({recording.path})" if name not in (None, "", "none") else
                 f"a recording made with fedaudit's Recorder ({recording.path})")
    attacker = str((cfg["attacker"] if "attacker" in cfg else None) or "server")
    sees = "every upload (client → server)" if attacker == "server" else "every broadcast it receives (server → client)"
    attacks = ", ".join(_attacks_run(run)) or "none"
    clients = ", ".join(run.source_domains or []) or "?"
    evidence = recording_lines(recording) if recording is not None else []
    return [
        *evidence,
        ("method", f"{run.method}, as run by {where}"),
        ("model", f"{built} ({model.parameters} parameters)" if model.parameters else str(built)),
        ("data", f"{run.dataset}: clients {clients}; unseen domain {run.target_domain}"),
        ("threat model", f"the {attacker} as attacker, seeing {sees}; anyone holding the released model"),
        ("attacks run", attacks),
    ]


def _attacks_run(run: RunMetrics) -> list[str]:
    found = list(run.results.reconstructions)
    found += sorted({f"mia-{r.variant}" for r in run.results.membership()})
    found += [f"canary ({k})" for k in ("canary", "canary_gradient") if run.results.has(k)]
    return found


def dpia(u: Unit, rows: list[VerdictRow], evidence: AnonymityEvidence) -> Context:
    """The impact-assessment facts of one unit, each from the stored files (and the verdict rows the page shows): the
    attack families per assessed object and the measures in place (``evidence``, built from those rows), what
    crosses the wire, the threat models, what each guarantee covers and the residual risk per artifact and level."""
    run = u.stored
    rounds = u.stored.communication.rounds or max((int(r.round or 0) for r in u.wire), default=0)
    flows: dict[tuple[str, str], Context] = {}
    for r in u.wire:
        key = (str(r.kind), "up" if str(r.receiver) == "server" else "down")
        flow = flows.setdefault(key, {"bytes": 0, "rounds": set(), "clients": set()})
        flow["bytes"] += int(r.bytes or 0)
        flow["rounds"].add(r.round)
        flow["clients"].add(r.sender if key[1] == "up" else r.receiver)
    processing = [{"artifact": kind, "direction": "client → server" if d == "up" else "server → client",
                   "to": "the server" if d == "up" else "every client", "clients": len(f["clients"]),
                   "rounds": f"{len(f['rounds'])} of {rounds}", "mb": f"{f['bytes'] / 1e6:.2f}"}
                  for (kind, d), f in sorted(flows.items())]
    privacy = u.stored.privacy if isinstance(u.stored.privacy, Privacy) else Privacy()
    return {
        "label": u.label,
        "families": family_lines(evidence),
        "measures": [{"measure": MEASURE_NAMES[m.measure], "in_place": m.in_place, "text": m.text, "rows": m.rows}
                     for m in evidence.measures],
        "processing": processing,
        "threats": [line for line in deployment(u, run) if line[0] in ("threat model", "attacks run")],
        "coverage": _coverage_rows(privacy.coverage),
        "client_coverage": _coverage_rows(privacy.client_coverage),
        "residual": _residual(rows),
    }


MEASURE_NAMES = {"dp_sgd": "record-level DP (DP-SGD)", "client_dp": "client-level DP",
                 "secure_aggregation": "secure aggregation", "shared": "what is shared"}


def family_lines(evidence: AnonymityEvidence) -> list[Context]:
    """Per assessed object (the released model, then the protocol), one line per attack family: its status, tier,
    deciding fact and budget, the decided rows it links to (and how many rows were not assessed), what it left out."""
    return [{"holder": obj.holder, "lines": [{
        "family": FAMILIES[family], "status": line.status, "tier": line.tier, "fact": line.fact,
        "budget": line.budget, "ran": ", ".join(line.ran),
        "rows": [r for r in line.rows if r.tier != NOT_ASSESSED],
        "unassessed": sum(r.tier == NOT_ASSESSED for r in line.rows), "untested": line.untested}
        for family, line in obj.lines()]} for _, obj in evidence.objects()]


def family_table(units: list[Unit], evidence: list[AnonymityEvidence]) -> Context:
    """``fedaudit compare``'s table: one row per unit, one column per attack family (:func:`family_cells`)."""
    return {"columns": list(FAMILIES.values()), "rows": [(u.label, family_cells(e)) for u, e in zip(units, evidence)]}


def family_cells(evidence: AnonymityEvidence) -> list[str]:
    """One unit's cell per attack family: each assessed object's tier, or its status where nothing was decided."""
    by_object = [(key.replace("_", " "), dict(obj.lines())) for key, obj in evidence.objects()]
    return [" · ".join(f"{name}: {_said(lines[family])}" for name, lines in by_object) for family in FAMILIES]


def _said(line: FamilyEvidence) -> str:
    return line.tier.replace("_", " ") if line.tier else line.status


def _coverage_rows(rows: list[CoverageRow]) -> list[dict[str, str]]:
    return [{"artifact": f"{c.artifact} {'↑' if c.direction == 'up' else '↓'}",
             "covered": "yes" if c.covered else "no", "why": c.why} for c in rows]


def _residual(rows: list[VerdictRow]) -> list[dict[str, str]]:
    """Per artifact and level (records first): the highest tier over its questions and observers, and the row that
    set it."""
    best: dict[tuple[str, str], VerdictRow] = {}
    for r in rows:
        key = (r.artifact, r.level)
        if key not in best or TIER_ORDER.get(r.tier, 0) > TIER_ORDER.get(best[key].tier, 0):
            best[key] = r
    order = {level: i for i, level in enumerate(LEVELS)}
    return [{"artifact": a, "level": LEVEL_HEADINGS[level], "tier": r.tier, "question": r.title, "observer": r.observer,
             "fact": r.short} for (a, level), r in sorted(best.items(), key=lambda kv: order[kv[0][1]])]


def recording_lines(recording: AuditedRecording) -> list[tuple[str, str]]:
    """What a reviewer must know of an audited recording before any verdict: what was verified, which model was
    judged as the deployed one, and which clients failed to answer in which rounds."""
    lines = [("recording", verification_text(recording.verification))]
    if recording.deployed_model.what:
        lines.append(("model judged", str(recording.deployed_model.what)))
    if recording.participation.missed:
        lines.append(("clients that failed", missed_text(recording.participation.missed)))
    if recording.secure_aggregation:
        lines.append(("secure aggregation", f"the run used {recording.secure_aggregation} (recognised from its stage "
                                            "messages): the server received masked uploads; its rows are judged under "
                                            "secure aggregation, beside what it would read of each upload without it"))
    checked = recording.verification.broadcasts if recording.verification else None
    different = BroadcastCheck.of(checked).different if checked is not None else ()
    if different:  # also a HIGH verdict row (consistency:broadcasts); said here first, before any tier
        lines.append(("NOT THE SAME MODEL", different_models(different)))
    return lines


def missed_text(missed: dict[str, list[int]]) -> str:
    """``{client: [rounds]}`` in words: who was sent a model to train and sent nothing back, when."""
    parts = [f"{str(c).removeprefix('client:')} in round{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
             for c, r in sorted(missed.items())]
    return ("sent a model to train and sent no update back (failed, dropped or timed out): " + "; ".join(parts)
            + " — the attacks on those rounds see fewer clients than the deployment has")


VERIFICATION_HEADS = {
    "verified": "VERIFIED: every message matches the sha256 its ledger row carries and the ledger matches the digest "
                "sealed when the run ended",
    "unverified: no hashes": "UNVERIFIED: the recording carries no hashes (made before the recorder wrote them), so "
                             "edits after the run cannot be detected",
    "unverified: ledger not sealed": "PARTLY VERIFIED: every message matches its ledger row's sha256, but the run "
                                     "never sealed its ledger (Recorder.close, seal_recording), so rows added or "
                                     "removed since cannot be detected",
}


def verification_text(v: Verification | None) -> str:
    """What was verified of a recording before it was audited (fedaudit.interop.recording_verify), and its digest."""
    if v is None:
        return "not verified (audited before fedaudit verified recordings)"
    found = "; ".join(f"{f.sender} round {f.round}: {f.record}/{f.tensor}" for f in v.non_finite)
    head = (VERIFICATION_HEADS[v.status] if v.status in VERIFICATION_HEADS else
            "UNVERIFIED: audited with --unverified although " + "; ".join(v.mismatches or []))
    return (f"{head}. Checked whole before the audit: {v.messages} message file(s), {v.bytes} bytes, "
            f"{v.rows} ledger rows over {v.rounds} round(s) from {v.clients} client(s); ledger "
            f"sha256 {v.ledger_sha256}"
            + (f". NON-FINITE values (NaN or infinity) in: {found}" if found else ""))
