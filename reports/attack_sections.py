"""The report's attack sections: each reconstruction with its images (blurred under ``--redact`` before they are
encoded), and each membership variant's ROC plot and TPR@FPR table with what is missing or unresolved."""

from __future__ import annotations

import base64
import io
from typing import Any

from fedaudit.audit.verdict import ARTIFACT, advice_of
from fedaudit.run.entries import MembershipEntry, MembershipTest
from fedaudit.reports import plots
from fedaudit.reports.cells import Context, LEVELS, RESOLVE_PER_LEVEL, Table, as_text, ci_text, f3, f4, is_interval, p_fmt
from fedaudit.reports.leakage_sections import victim_metrics
from fedaudit.reports.load import Unit


MAX_IMAGE_SIDE = 900  # px; the stored grids are ~200×660, this only bounds a larger --image-size
REDACT_BLUR = 0.06  # Gaussian radius as a fraction of the grid's short side: a 64-px digit cell becomes a smudge
def reconstructions(u: Unit, redact: bool) -> Context:
    items, notes = [], []
    for table in u.audited.reconstructions:
        for victim, e in table.entries.items():
            head = f"{table.attack} · {table.artifact} · victim {victim}"
            rel = e.image_grid
            if e.stored_status != "attacked":
                notes.append(f"{head}: {e.stored_status or 'unknown'} — {e.stored_reason or 'no reason stored'}")
            elif rel is None and e.scores.status == "unscored":
                notes.append(f"{head}: attacked in latent space (no images to show), not scored — "
                             f"{e.scores.reason or 'no reason stored'}")
            elif rel is None:
                notes.append(f"{head}: attacked in latent space (no images to show); its scores are in “Side by side”")
            elif rel not in u.images:
                notes.append(f"{head}: the image {rel} is missing from the run directory")
            else:
                items.append({"title": head, "uri": image_uri(u.images[rel], redact),
                              "columns": ", ".join(e.grid_columns or ["real nearest member", "reconstruction",
                                                                      "untrained-model control"]),
                              "scores": " · ".join(f"{label}: {text}" for label, text in victim_metrics(e)[:2])})
    why = None
    if not u.audited.reconstructions:
        why = "no reconstruction attack ran in this run; run with --attack deepinversion"
    elif not items:
        why = "no attack in this run produced images (see the notes below)"
    return {"items": items, "notes": notes, "why": why}


def image_uri(png: bytes, redact: bool) -> str:
    """A PNG data URI; under ``redact`` the pixels are blurred before encoding (not by CSS)."""
    from PIL import Image, ImageFilter

    img = Image.open(io.BytesIO(png)).convert("RGB")
    if max(img.size) > MAX_IMAGE_SIDE:
        img.thumbnail((MAX_IMAGE_SIDE, MAX_IMAGE_SIDE), Image.Resampling.LANCZOS)
    if redact:
        radius = max(6.0, REDACT_BLUR * min(img.size))
        img = img.filter(ImageFilter.GaussianBlur(radius))
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def membership(u: Unit) -> Context:
    """Per variant: a log-log ROC plot and the TPR@FPR table with intervals; gaps and warnings spelled out."""
    if not u.audited.membership_ran:
        return {"blocks": [], "notes": [], "why": "no membership attack in this run; run with --attack mia"}
    by_variant: dict[str, list[MembershipTest]] = {}
    for test in u.audited.membership:
        by_variant.setdefault(test.variant, []).append(test)
    notes: list[str] = []
    blocks = [b for variant, tests in by_variant.items() if (b := _membership_block(u, variant, tests, notes))]
    why = None if blocks else "the membership attack stored no scored result (see the notes)"
    return {"blocks": blocks, "notes": notes, "why": why}


def _membership_block(u: Unit, variant: str, tests: list[MembershipTest], notes: list[str]) -> Context | None:
    """One variant's table (a row per target and victim), its ROC plot, and what is missing or unresolved."""
    curves, missing, warnings, nonmembers = [], [], [], []
    table = Table(["AUC (chance band)", "advantage (KS p)", *(f"TPR @ {lv:g} FPR [95% CI]" for lv in LEVELS),
                   "members / non-members",
                   "controls: holdout twin · positive control" if variant == ARTIFACT else "reference models (calibration)"])
    for test in tests:
        e = test.entry
        label = f"{test.target} · {test.victim}"
        if "status" in e.stored_keys and not e.scored:
            notes.append(f"{variant} · {label}: {e.status} — {e.reason}")
            continue
        lacks = ([k for k in ("auc", "advantage", "roc") if k not in e.stored_keys]
                 + (["levels"] if e.at_1pct_fpr is None else []))
        if lacks:
            missing.append(f"{label}: missing {', '.join(lacks)}")
        refs = artifact_controls(e) if variant == ARTIFACT else _references(u, e, label, warnings)
        cells = [*_mia_score_cells(e, label, warnings), f"{_count(e.members)} / {_count(e.nonmembers)}", refs]
        table.rows.append((label, cells))
        roc = e.roc
        if roc is not None and isinstance(roc.fpr, list) and isinstance(roc.tpr, list) and roc.fpr:
            curves.append((label, roc.fpr, roc.tpr))
        nonmembers.append(_count(e.nonmembers))
    if not table.rows:
        return None
    if not curves:
        missing.append(f"{variant}: no stored ROC curve to plot")
    return {"variant": variant, "svg": _roc_svg(variant, curves, nonmembers), "table": table, "warnings": warnings,
            "missing": missing}


def _count(n: int | None) -> int | str:
    return "?" if n is None else n


def _roc_svg(variant: str, curves: list[tuple[str, list, list]], nonmembers: list[Any]) -> str | None:
    """The variant's ROC curves on log-log axes. The axis reaches 1e-5 only when FPR 1e-3 is itself resolvable
    (10/FPR = 10,000 non-members); below that the curve left of 1e-3 would be a few single false positives."""
    if not curves:
        return None
    counts = [n for n in nonmembers if isinstance(n, int) and n > 0]
    xmin = 1e-5 if counts and max(counts) >= RESOLVE_PER_LEVEL / 1e-3 else 1e-3
    return plots.roc_plot(curves, xmin, f"{variant}: ROC (log-log)")


def _mia_score_cells(e: MembershipEntry, label: str, warnings: list[str]) -> list[str]:
    """AUC with its chance band, the advantage with its KS p, and TPR at each FPR level with its interval."""
    band = e.auc_chance_interval
    cells = [f3(e.stored_auc) + (f" (chance {band[0]:.3f}–{band[1]:.3f})" if is_interval(band) else ""),
             f3(e.stored_advantage) + (f" (p {p_fmt(e.advantage_p_value)})" if "advantage_p_value" in e.stored_keys
                                       else "")]
    for lv in LEVELS:
        level = e.at_fpr(lv)
        if level is None:
            cells.append("missing")
            continue
        text = f"{f4(level.tpr)} {ci_text(level.interval)}"
        if not level.resolvable:
            text += " (unresolved)"
            warnings.append(f"Too few non-members to resolve this level: {label}, FPR {lv:g}: "
                            + (level.warning or "too few non-members"))
        cells.append(text)
    return cells


def _references(u: Unit, e: MembershipEntry, label: str, warnings: list[str]) -> str:
    """How many reference models, and whether they stood in for the target (a warning where they did not)."""
    cal, ref = e.calibration, e.reference
    refs = as_text(e.reference_models)
    if ref.kind == "replay":
        refs += f" replayed from round {ref.round}'s start" + (f" ({ref.released_as})" if ref.released_as else "")
    elif ref.kind == "scratch":
        refs += f" from scratch (no replay: {ref.no_replay})"
    if cal is None:
        return refs
    shifted = (f", after the attack took off the target's uniform lift of {f3(cal.shift)} σ (before it "
               f"{f3(cal.raw_out_gap)} and {f3(cal.raw_in_gap)} σ)" if cal.shift is not None else "")
    refs += (f" ({cal.status}: non-members {f3(cal.out_gap)} σ from the OUT models, members "
             f"{f3(cal.in_gap)} σ from the IN models{shifted})")
    if cal.status == "miscalibrated":
        epochs = (f"; they trained {ref.epochs} epochs, the target saw each member "
                  f"{ref.target_exposure_epochs} times" if ref.epochs and ref.target_exposure_epochs else "")
        warnings.append(f"{label}: the reference models do not stand in for the target{epochs}; read this "
                        "variant's numbers as a miscalibrated attack's "
                        f"({advice_of(u.audited.made_by, 'calibrated_references')})")
    return refs


def artifact_controls(e: MembershipEntry) -> str:
    """The artifact test's twin (must sit in the chance band) and positive control (its power), in one cell."""
    if e.controls is not None and "controls" in e.stored_keys and isinstance(e.controls, str):
        return e.controls
    parts = []
    for c, label in ((e.twin, "twin"), (e.control, "positive control")):
        if c is None:
            parts.append(f"{label}: not run")
        elif c.scored:
            parts.append(f"{label} AUC {f3(c.auc)} (KS p {p_fmt(c.advantage_p_value)}"
                         + (f", {c.records} records" if isinstance(c.records, int) else "") + ")")
        else:
            parts.append(f"{label}: {c.status or 'not run'} — {c.reason or ''}")
    return " · ".join(parts)
