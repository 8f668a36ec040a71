"""The report's first screen, for a reviewer who must sign the deployment off or send it back: what was audited,
the highest tier, each HIGH and MEDIUM row with its cause and a mitigation fedaudit can measure, what was not
assessed and what would make each INCONCLUSIVE row conclusive; and the facts a data-protection impact assessment
asks for (what crosses the wire, to whom and how often, the threat models tested, the measures in place, the
residual risk per artifact). Everything is read from the run's stored files; nothing here is legal advice."""

from __future__ import annotations

from typing import Any

from fedaudit.audit.verdict import NOT_ASSESSED, TIER_ORDER
from fedaudit.audit.verdict.wording import made_by, to_conclude
from fedaudit.reports.load import Unit
from fedaudit.run.results import RunMetrics, VerdictRow

NOT_LEGAL_ADVICE = ("These are facts measured in this run, for the impact assessment; they are not legal advice. "
                    "Whether the residual risk is acceptable is the controller's decision.")

# A mitigation fedaudit can measure, per shared artifact kind: the option, and what a re-run shows.
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
GPERXAN_PARTIAL = ("keep the BN side on the client: --gperxan-upload partial (a fedaudit variant of the paper's "
                   "protocol: the BN statistics go up once, in the final round)")


def first_screen(u: Unit, verdict: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary block of one unit (one trained federation and target), from the verdict rows the page shows."""
    run = RunMetrics.from_json(u.metrics)
    rows = [VerdictRow.from_json(r) for r in verdict]
    judged = [r for r in rows if r.tier != NOT_ASSESSED]
    highest = max((r.tier for r in judged), key=TIER_ORDER.get, default=NOT_ASSESSED)
    return {
        "label": u.label,
        "deployment": deployment(u, run),
        "highest": highest,
        "findings": [{"tier": r.tier, "title": r.title, "observer": r.observer, "cause": cause(r),
                      "mitigation": mitigation(r, u)} for r in _by_tier(rows, ("high", "medium"))],
        "inconclusive": [{"title": r.title, "observer": r.observer, "cause": r.short or cause(r),
                          "needs": to_conclude(r.question, r.rule, u.metrics)} for r in _by_tier(rows, ("inconclusive",))],
        "not_assessed": [{"title": r.title, "observer": r.observer, "why": r.reason} for r in rows
                         if r.tier == NOT_ASSESSED],
        "low": [r.title for r in rows if r.tier == "low"],
    }


def _by_tier(rows: list[VerdictRow], tiers: tuple[str, ...]) -> list[VerdictRow]:
    return sorted((r for r in rows if r.tier in tiers), key=lambda r: -TIER_ORDER[r.tier])


def cause(row: VerdictRow) -> str:
    """The row's deciding fact in one sentence: its reason's first sentence (the reason leads with it)."""
    first = row.reason.split(". ", 1)[0].strip()
    return first if first.endswith(".") else first + "."


def mitigation(row: VerdictRow, u: Unit) -> str:
    """What would lower this row, and the command that measures it (the accuracy it costs included)."""
    method = str(u.metrics.get("method") or "?")
    if row.question == "dp_audit":
        return ("the DP-SGD implementation or its accounting does not deliver the claimed ε: fix it and re-run "
                "--attack canary; until then the claim cannot be relied on")
    kind = "global_model" if row.artifact == "released model" else row.artifact.rstrip("↑↓").split(":")[0]
    if method == "gperxan" and kind == "full_model" and row.artifact.endswith("↑"):
        return GPERXAN_PARTIAL
    how = MITIGATIONS.get(kind, f"drop the artifact: a method that does not send {kind} (fedaudit list methods)")
    if how != "train with DP-SGD":
        return how
    if made_by(u.metrics) == "audit":
        return ("train the deployment with DP (client-side clipping and noise), declare it in the recording "
                "(start_recording(dp=...)) and audit again: the report then states the ε and what it covers")
    from fedaudit.methods import METHODS

    blocked = getattr(METHODS.get(method), "dp_incompatible", "")
    if blocked:
        return f"{method} cannot be trained with DP-SGD ({blocked}); compare a method that can, with --dp-epsilon"
    return (f"train with DP-SGD and measure what it costs: fedaudit evaluate --method {method} --dp-sweep 1,8,inf "
            "(one run per ε, each with this verdict and its unseen-domain accuracy, and the privacy–utility curve)")


def deployment(u: Unit, run: RunMetrics) -> list[tuple[str, str]]:
    """(what, value) lines naming the federation audited and the threat model."""
    cfg = (run.provenance or {}).get("config") or u.config.get("config") or {}
    model = (run.provenance or {}).get("model") or {}
    built = model.get("factory") or model.get("architecture") or cfg.get("model", "?")
    recording = (run.provenance or {}).get("recording")
    where = f"fedaudit's simulation of {run.method}"
    if isinstance(recording, dict):
        framework = recording.get("framework")
        name = framework.get("name") if isinstance(framework, dict) else framework
        where = (f"a recording of a {name} run ({recording.get('path')})" if name not in (None, "", "none") else
                 f"a recording made with fedaudit's Recorder ({recording.get('path')})")
    attacker = str(cfg.get("attacker") or "server")
    sees = "every upload (client → server)" if attacker == "server" else "every broadcast it receives (server → client)"
    attacks = ", ".join(_attacks_run(run)) or "none"
    clients = ", ".join(run.source_domains or []) or "?"
    evidence = ([("recording", verification_text(recording.get("verification")))]
                if isinstance(recording, dict) else [])
    return [
        *evidence,
        ("method", f"{run.method}, as run by {where}"),
        ("model", f"{built} ({model.get('parameters', '?')} parameters)" if model.get("parameters") else str(built)),
        ("data", f"{run.dataset}: clients {clients}; unseen domain {run.target_domain}"),
        ("threat model", f"the {attacker} as attacker, seeing {sees}; anyone holding the released model"),
        ("attacks run", attacks),
    ]


def _attacks_run(run: RunMetrics) -> list[str]:
    found = list(run.results.reconstruction_sections())
    found += sorted({f"mia-{r.variant}" for r in run.results.membership()})
    found += [f"canary ({k})" for k in run.results.canary_sections()]
    return found


def dpia(u: Unit, verdict: list[dict[str, Any]]) -> dict[str, Any]:
    """The impact-assessment facts of one unit, each from the stored files (and the verdict rows the page shows)."""
    run = RunMetrics.from_json(u.metrics)
    comm = run.communication or {}
    rounds = comm.get("rounds") or max((int(r.get("round") or 0) for r in u.wire), default=0)
    flows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in u.wire:
        key = (str(r.get("kind")), "up" if str(r.get("receiver")) == "server" else "down")
        flow = flows.setdefault(key, {"bytes": 0, "rounds": set(), "clients": set()})
        flow["bytes"] += int(r.get("bytes") or 0)
        flow["rounds"].add(r.get("round"))
        flow["clients"].add(r.get("sender") if key[1] == "up" else r.get("receiver"))
    processing = [{"artifact": kind, "direction": "client → server" if d == "up" else "server → client",
                   "to": "the server" if d == "up" else "every client", "clients": len(f["clients"]),
                   "rounds": f"{len(f['rounds'])} of {rounds}", "mb": f"{f['bytes'] / 1e6:.2f}"}
                  for (kind, d), f in sorted(flows.items())]
    privacy = run.privacy or {}
    dp = privacy.get("dp") if isinstance(privacy, dict) else None
    coverage = [{"artifact": f"{c.get('artifact')} {'↑' if c.get('direction') == 'up' else '↓'}",
                 "covered": "yes" if c.get("covered") else "no", "why": c.get("why", "")}
                for c in (privacy.get("coverage") or [] if isinstance(privacy, dict) else [])]
    return {
        "label": u.label,
        "processing": processing,
        "threats": deployment(u, run)[3:],
        "measures": _measures(dp),
        "coverage": coverage,
        "residual": _residual([VerdictRow.from_json(r) for r in verdict]),
        "disclaimer": NOT_LEGAL_ADVICE,
    }


def _measures(dp: dict[str, Any] | None) -> str:
    if not dp:
        return "No privacy mechanism: the clients trained without DP, so no artifact carries a formal guarantee."
    if dp.get("recorded"):
        return (f"Central DP declared by the recording ({dp.get('mechanism')}): noise multiplier "
                f"{dp.get('noise_multiplier')}, clipping norm {dp.get('clipping_norm')}, ε {dp.get('epsilon')} at "
                f"δ {dp.get('delta')} over {dp.get('rounds')} rounds ({dp.get('unit')}).")
    spent = {name: c.get("epsilon_spent") for name, c in (dp.get("clients") or {}).items()}
    per_client = "; ".join(f"{k} ε {v:.2f}" if isinstance(v, (int, float)) else f"{k} ε ?" for k, v in spent.items())
    return (f"DP-SGD on every client: target ε ≤ {dp.get('epsilon_target')} at δ {dp.get('delta')}, per-record "
            f"clipping at {dp.get('max_grad_norm')}, accounted by {dp.get('accountant')} (spent: {per_client}); the "
            f"unit of privacy is {dp.get('unit')}.")


def _residual(rows: list[VerdictRow]) -> list[dict[str, str]]:
    """Per artifact: the highest tier over its questions and observers, and the row that set it."""
    best: dict[str, VerdictRow] = {}
    for r in rows:
        if r.artifact not in best or TIER_ORDER.get(r.tier, 0) > TIER_ORDER.get(best[r.artifact].tier, 0):
            best[r.artifact] = r
    return [{"artifact": a, "tier": r.tier, "question": r.title, "observer": r.observer, "fact": r.short}
            for a, r in best.items()]


def verification_text(v: dict[str, Any] | None) -> str:
    """What was verified of a recording before it was audited (fedaudit.interop.recording_verify), and its digest."""
    if not isinstance(v, dict):
        return "not verified (audited before fedaudit verified recordings)"
    found = "; ".join(f"{f['sender']} round {f['round']}: {f['record']}/{f['tensor']}" for f in v.get("non_finite") or [])
    head = {"verified": "VERIFIED: every message matches the sha256 its ledger row carries and the ledger matches the "
                        "digest sealed when the run ended",
            "unverified: no hashes": "UNVERIFIED: the recording carries no hashes (made before the recorder wrote "
                                     "them), so edits after the run cannot be detected",
            "unverified: ledger not sealed": "PARTLY VERIFIED: every message matches its ledger row's sha256, but the "
                                             "run never sealed its ledger (Recorder.close, seal_recording), so rows "
                                             "added or removed since cannot be detected",
            }.get(v.get("status"), "UNVERIFIED: audited with --unverified although " + "; ".join(v.get("mismatches") or []))
    return (f"{head}. Checked whole before the audit: {v.get('messages')} message file(s), {v.get('bytes')} bytes, "
            f"{v.get('rows')} ledger rows over {v.get('rounds')} round(s) from {v.get('clients')} client(s); ledger "
            f"sha256 {v.get('ledger_sha256')}"
            + (f". NON-FINITE values (NaN or infinity) in: {found}" if found else ""))

