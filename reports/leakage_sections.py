"""The report's leakage figures side by side: every attack's scores beside their nulls, the canary audits, the
privacy–utility curve over ε (``--dp-sweep``) and, in ``compare``, the privacy–utility scatter."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from fedaudit.audit.verdict.wording import fdp_bound
from fedaudit.run.stored.reconstruction import POWER_SINGLE, Identified, Judges, Power, Score
from fedaudit.run.stored import DP
from fedaudit.run.entries import CanaryAudit, ClaimedCurve, ReconstructionEntry, ReconstructionTable
from fedaudit.reports import plots
from fedaudit.reports.cells import (Context, MISSING, NULL_LABELS, Table, aligned, as_text, ci_text, f3, is_finite,
                                    p_fmt, with_control)
from fedaudit.reports.load import Unit


def dp_of(u: Unit) -> DP | None:
    return u.stored.privacy.dp if u.stored.privacy else None


def dp_curve_section(units: Sequence[Unit]) -> Context | None:
    """Privacy–utility curve over the DP ε of runs that differ only in it (``--dp-sweep``): accuracy and every
    leakage metric measured in all of them, against ε (∞ = no DP, at the right); and a table with one row
    per point: the ε claimed and spent beside the canary audit's lower bound (when the run has one)."""
    eps = [dp.epsilon_target if (dp := dp_of(u)) else None for u in units]
    if len(set(eps)) < 2 or len({(u.method, u.dataset, u.target) for u in units}) != 1:
        return None
    per_unit = [_scatter_metrics(u) for u in units]
    common = [k for k in per_unit[0] if all(k in d for d in per_unit)]
    series = [(label, [_accuracy(u, key) for u in units], None)
              for label, key in (("source-val accuracy", "source_val"), ("unseen-domain accuracy", "unseen_domain"))]
    for name in common:
        controls = [d[name][1] for d in per_unit]
        series.append((name, [d[name][0] for d in per_unit],
                       controls if all(isinstance(c, (int, float)) for c in controls) else None))
    table = Table(["ε spent (accountant, max over clients)", "canary ε lower bound", "source-val accuracy",
                   "source-val at the last round (no round chosen on it)", "unseen-domain accuracy", "run"])
    for e, u in sorted(zip(eps, units), key=lambda pair: math.inf if pair[0] is None else pair[0]):
        table.rows.append(_dp_point_row(e, u))
    return {"svg": plots.epsilon_plot(eps, series, f"{units[0].method} on {units[0].dataset}: utility and leakage against ε"),
            "table": table}


def _dp_point_row(e: float | None, u: Unit) -> tuple[str, list[str]]:
    """One ε of the sweep: the ε the accountant spent beside the canaries' lower bound, and the accuracy it cost."""
    dp = dp_of(u)
    spent = [c.epsilon_spent for c in dp.clients.values()] if dp else []
    spent_text = "no DP" if e is None else f3(max(spent)) if spent and all(is_finite(x) for x in spent) else MISSING
    bounds = ([f"{victim}: {text}" for victim, text in _canary_bounds(u)]
              + [f"{victim} (gradient canaries): {text}" for victim, text in _gradient_bounds(u)])
    return (f"ε {'∞ (no DP)' if e is None else f'{e:g}'}",
            [spent_text, "; ".join(bounds) or "no canary audit in this run (add canary to --attack)",
             f3(_accuracy(u, "source_val")), f3(_last_round_source_val(u)), f3(_accuracy(u, "unseen_domain")),
             u.run_dir.name])


def _last_round_source_val(u: Unit) -> float | None:
    """The sources' validation accuracy of the last round's model: under DP the round source-val selects is
    the best of many noisy rounds, so the curve shows both."""
    final = u.stored.accuracy.final_round
    value = final.source_val_mean if final else None
    return float(value) if is_finite(value) else None  # runs from before it was recorded


def _accuracy(u: Unit, key: str) -> float:
    accuracy = u.stored.accuracy
    value = accuracy.source_val.mean if key == "source_val" else accuracy.unseen_domain
    return float(value) if is_finite(value) else float("nan")


def leakage_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        run = u.audited
        for attack, judges in run.judges.items():
            for table in (t for t in run.reconstructions if t.attack == attack):
                out += _reconstruction_cells(table)
            out += _judge_cells(attack, judges)
        for test in run.membership:
            e = test.entry
            label = f"mia · {test.variant} · {test.target} · {test.victim}"
            if "status" in e.stored_keys and not e.scored:
                out.append((label, f"{e.status} — {e.reason}"))
                continue
            level = e.at_1pct_fpr
            out.append((label, f"AUC {f3(e.stored_auc)} · advantage {f3(e.stored_advantage)} · "
                               f"TPR@1%FPR {f3(level.tpr if level else None)} {ci_text(level.interval if level else None)}"))
        out += _canary_cells(u)
        if not out:
            out.append(("leakage", "no attack ran in this run; run with --attack deepinversion, gradinv or mia"))
        return out

    return aligned(units, cells)


def _reconstruction_cells(table: ReconstructionTable) -> list[tuple[str, str]]:
    """One attack on one artifact: its summary over the victims, each victim's scores, who was not attacked."""
    head = f"{table.attack} · {table.artifact}"
    out = []
    if table.shown_attribution:
        out.append((f"{head} · domain attribution (macro over victims)", with_control(table.shown_attribution)))
    if table.shown_fidelity:
        out.append((f"{head} · class fidelity (mean over victims)", with_control(table.shown_fidelity)))
    statuses = []
    for victim, e in table.entries.items():
        if e.stored_status != "attacked" or not e.scored:
            statuses.append(f"{victim}: {e.stored_status or 'unknown'} — {e.stored_reason or 'no reason stored'}")
            continue
        if e.scores.status == "unavailable":
            statuses.append(f"{victim}: not scored — {e.scores.reason or 'no reason stored'}")
            continue
        out += [(f"{head} · {victim} · {label}", text) for label, text in victim_metrics(e)]
    if statuses:
        out.append((f"{head} · not attacked", "; ".join(statuses)))
    return out


def _judge_cells(attack: str, judges: Judges) -> list[tuple[str, str]]:
    out = []
    lpips = judges.lpips
    if lpips is not None and lpips.status != "available":
        out.append((f"{attack} · LPIPS", f"{lpips.status}: looked for {lpips.looked_for}; {lpips.fix}".strip("; ")))
    dom = judges.domain_classifier
    if dom:
        out.append((f"{attack} · judge: domain classifier accuracy", f"{f3(dom.accuracy_on_members)} "
                    f"on members (trained on {dom.trained_on})"))
    for victim, j in judges.class_classifier.items():
        out.append((f"{attack} · judge: class classifier accuracy, {victim}", f"{f3(j.accuracy_on_members)} on members"))
    return out


def _canary_cells(u: Unit) -> list[tuple[str, str]]:
    return ([(f"canary · {victim} · ε lower bound", text) for victim, text in _canary_bounds(u)]
            + [(f"gradient canaries · {victim} · ε lower bound", text) for victim, text in _gradient_bounds(u)])


def _audits(u: Unit, variant: str, describe: Callable[[CanaryAudit], str]) -> list[tuple[str, str]]:
    """(victim, sentence) for each audit of a canary variant: ``describe`` for a bound, else why there is none."""
    out = []
    for a in u.audited.canaries:
        if a.variant != variant:
            continue
        if not a.has_bound:
            out.append((a.victim, f"{a.status or 'unknown'} — {a.reason or 'no reason stored'}"))
            continue
        bound = (f"ε ≥ {f3(a.bound)}"
                 + (f" at {a.confidence:.0%} confidence, δ {a.stored_delta}" if is_finite(a.confidence) else ""))
        out.append((a.victim, bound + _fdp_bound(a) + describe(a)))
    return out


def _fdp_bound(a: CanaryAudit) -> str:
    """The f-DP bound beside Steinke et al.'s, and the test of the accountant's claimed curve."""
    text = ""
    if a.mu is not None:
        text += " · " + fdp_bound(a.mu, a.mu_as_epsilon, a.mu_ceiling)
    if a.p_claim is not None:
        claim = a.curve or ClaimedCurve(None, None, None, None)
        curve = (f"μ-GDP, μ {f3(claim.mu)}" if claim.curve == "gaussian" else
                 f"(ε {f3(claim.epsilon)}, δ {as_text(claim.delta)})")
        text += f" · test of the accountant's claim ({curve}): p {p_fmt(a.p_claim)} (before correction across audits)"
    return text


def _gradient_bounds(u: Unit) -> list[tuple[str, str]]:
    """The white-box audit per victim: the bound with its confidence, what a mechanism spending exactly the
    accountant's ε would give the same canaries, the audit's ceiling, and the one-shot estimate (not a bound)."""
    def describe(a: CanaryAudit) -> str:
        text = (f" · {as_text(a.correct)}/{as_text(a.guesses)} correct guesses on {as_text(a.canaries)} "
                f"gradient canaries over {as_text(a.rounds)} rounds of updates")
        if a.epsilon_spent is not None:
            text += f" · accountant's ε {f3(a.epsilon_spent)}"
            if a.ideal_bound is not None:
                text += f" · a mechanism spending exactly that would show about ε ≥ {f3(a.ideal_bound)} here"
        text += f" · at most {f3(a.ceiling)} certifiable"
        if a.estimate is not None:
            text += f" · one-shot estimate (not a bound) ε ≈ {f3(a.estimate)}"
        return text + (" · EXCEEDS THE CLAIM" if a.exceeds_claimed else "")

    return _audits(u, "gradient", describe)


def _canary_bounds(u: Unit) -> list[tuple[str, str]]:
    """The one-run audit per victim: the ε lower bound beside its power and the accountant's ε."""
    def describe(a: CanaryAudit) -> str:
        text = (f" · {as_text(a.correct)}/{as_text(a.guesses)} correct guesses on {as_text(a.canaries)} "
                f"canaries ({as_text(a.target)}) · at most {f3(a.ceiling)} certifiable")
        text += " · no DP: nothing claimed" if a.epsilon_spent is None else f" · accountant's ε {f3(a.epsilon_spent)}"
        if a.exceeds_claimed:
            text += f" · EXCEEDS THE CLAIM: {as_text(a.warning)}"
        elif a.can_refute_claim is False:
            text += " · too few canaries to test the claim"
        return text

    return _audits(u, "input", describe)


def victim_metrics(e: ReconstructionEntry) -> list[tuple[str, str]]:
    """One victim's scores, each beside every null that ran, then its power."""
    m = e.scores
    out = _identifiability_line(m.identifiability)
    for score, label in ((m.domain_attribution, "domain attribution"), (m.class_fidelity, "class fidelity"),
                         (m.psnr_mean, "PSNR to nearest member, mean (dB)"), (m.ssim_mean, "SSIM to nearest member, mean"),
                         (m.lpips_mean, "LPIPS to nearest member, mean")):
        if score is not None and score.has("attack"):
            out.append((label, with_control(score)))
        elif score is not None:  # e.g. LPIPS without its backbone: the status is shown once per attack
            out.append((label, str(score.status)))
    matched = m.matched  # batch inversions (gradinv): each reconstruction paired with a distinct member
    if matched is not None and matched.has("attack") and matched.has("control"):
        for key, label in (("psnr_mean", "PSNR to its Hungarian-matched member, mean (dB)"),
                           ("ssim_mean", "SSIM to its Hungarian-matched member, mean"),
                           ("psnr_best", "PSNR to its Hungarian-matched member, best (dB)")):
            out.append((label, with_control(Score.read({"attack": getattr(matched.attack, key),
                                                      "control": getattr(matched.control, key)}))))
    if e.power_shown is not None:
        out.append(("power (positive control)", _power_text(e.power_shown)))
    if e.twin is not None and e.twin.status != "scored":
        out.append(("holdout twin", f"{e.twin.status}: {e.twin.reason}"))
    return out


def _identifiability_line(ident: Identified | None) -> list[tuple[str, str]]:
    if ident is None:
        return []
    nulls = " · ".join(f"{name} {f3(getattr(ident, key))}" for key, name in NULL_LABELS if ident.has(key))
    return [("identifiability (balanced; chance measured)",
             f"attack {f3(ident.attack)} {ci_text(ident.attack_ci95)}, permutation p "
             f"{p_fmt(ident.attack_p_value)} · chance {f3(ident.chance)} · {nulls} · "
             f"n {as_text(ident.n)}")]


def _power_text(power: Power) -> str:
    """The positive control: reached or not, record-level or not, and what it recovered at each size."""
    if power.status != "measured":
        return f"{power.status}: {power.reason}"
    sizes = []
    for k, v in power.sizes.items():
        if not v.has("p_reveals"):
            continue
        parts = [f"{name.replace('_', ' ')} {f3(score.attack)} vs prior-only {f3(score.prior_only)} "
                 f"(p {p_fmt(score.p_value)})" for name, score in (("domain_attribution", v.domain_attribution),
                                                                   ("class_fidelity", v.class_fidelity))
                 if v.has(name) and score is not None]
        parts.append(f"identifiability {f3(v.identifiability)} (p {p_fmt(v.p_value)})")
        case = f"one image alone ({v.images} artifacts)" if k == POWER_SINGLE else f"{k}/class ({v.images} images)"
        sizes.append(f"{case}: " + ", ".join(parts))
    verdict = "reached" if power.reached else "NOT reached"
    verdict += ", record-level" if power.record_level else ", not record-level"
    verdict += f" (p {p_fmt(power.p_value)})"
    return f"{verdict} — " + "; ".join(sizes)


def scatter_section(units: Sequence[Unit]) -> Context:
    """One plot per leakage metric every unit has: x = the metric (and its control), y = unseen accuracy.

    Reconstruction metrics are per artifact and methods share different
    artifacts, so each unit contributes its most-leaking shared artifact (the
    highest stored attack value); the artifact is named beside its point.
    """
    per_unit = [_scatter_metrics(u) for u in units]
    common = [k for k in per_unit[0] if all(k in d for d in per_unit)] if per_unit else []
    everywhere = {k for d in per_unit for k in d}
    methods = [u.method for u in units]
    plots_out = []
    for name in common:
        pts = []
        for u, d in zip(units, per_unit):
            attack, control, where = d[name]
            label = u.method if methods.count(u.method) == 1 else f"{u.method}/{u.target}"
            pts.append((f"{label} ({where})" if where else label, attack, control,
                        float("nan") if (acc := u.stored.accuracy.unseen_domain) is None else float(acc)))
        plots_out.append({"name": name, "svg": plots.scatter_plot(name, pts, name.split(": ", 1)[-1])})
    missing = sorted(everywhere - set(common))
    why = None
    if not plots_out:
        why = ("no leakage metric was measured in every run" + (f" (measured in some only: {', '.join(missing)})" if missing else
               "; run them with --attack deepinversion, gradinv or mia"))
    return {"plots": plots_out, "why": why, "partial": missing if plots_out else []}


def _scatter_metrics(u: Unit) -> dict[str, tuple[float, float | None, str]]:
    out: dict[str, tuple[float, float | None, str]] = {}
    for table in u.audited.reconstructions:
        for name, d in ((f"{table.attack}: domain attribution (macro)", table.shown_attribution),
                        (f"{table.attack}: class fidelity", table.shown_fidelity)):
            if d is not None and is_finite(d.attack) and (name not in out or d.attack > out[name][0]):
                out[name] = (float(d.attack), d.control, table.artifact)
    for test in u.audited.membership:
        name = f"mia {test.variant} on {test.target}: AUC"
        auc = test.entry.stored_auc
        if is_finite(auc) and (name not in out or auc > out[name][0]):
            out[name] = (float(auc), 0.5, test.victim)
    return out
