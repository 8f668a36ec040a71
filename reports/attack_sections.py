"""The report's attack sections: each reconstruction with its images (blurred under ``--redact`` before they are
encoded), and each membership variant's ROC plot and TPR@FPR table with what is missing or unresolved."""

from __future__ import annotations

import base64
import io
from typing import Any

from fedaudit.audit.verdict import ARTIFACT, MIA, advice_of, mia_level
from fedaudit.run.entries import made_by
from fedaudit.reports import plots
from fedaudit.reports.cells import (LEVELS, MISSING, RESOLVE_PER_LEVEL, Table, as_text, ci_text, f3, f4, is_interval,
                                    mia_count, mia_tpr_ci, p_fmt)
from fedaudit.reports.leakage_sections import victim_metrics
from fedaudit.reports.load import Unit


MAX_IMAGE_SIDE = 900  # px; the stored grids are ~200×660, this only bounds a larger --image-size
REDACT_BLUR = 0.06  # Gaussian radius as a fraction of the grid's short side: a 64-px digit cell becomes a smudge
def reconstructions(u: Unit, redact: bool) -> dict[str, Any]:
    items, notes = [], []
    for attack, key, victim, e in u.results.reconstructions():
        head = f"{attack} · {key} · victim {victim}"
        rel = e.get("image_grid")
        if e.get("status") != "attacked":
            notes.append(f"{head}: {e.get('status', 'unknown')} — {e.get('reason', 'no reason stored')}")
        elif rel is None and (e.get("metrics") or {}).get("status") == "unscored":
            notes.append(f"{head}: attacked in latent space (no images to show), not scored — "
                         f"{e['metrics'].get('reason', 'no reason stored')}")
        elif rel is None:
            notes.append(f"{head}: attacked in latent space (no images to show); its scores are in “Side by side”")
        elif rel not in u.images:
            notes.append(f"{head}: the image {rel} is missing from the run directory")
        else:
            items.append({"title": head, "uri": image_uri(u.images[rel], redact),
                          "columns": ", ".join(e.get("grid_columns") or ["real nearest member", "reconstruction",
                                                                         "untrained-model control"]),
                          "scores": " · ".join(f"{label}: {text}" for label, text in victim_metrics(e)[:2])})
    why = None
    if not u.results.reconstruction_sections():
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


def membership(u: Unit) -> dict[str, Any]:
    """Per variant: a log-log ROC plot and the TPR@FPR table with intervals; gaps and warnings spelled out."""
    if not u.results.sections.get(MIA):
        return {"blocks": [], "notes": [], "why": "no membership attack in this run; run with --attack mia"}
    by_variant: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for variant, target, victim, e in u.results.membership():
        by_variant.setdefault(variant, []).append((target, victim, e))
    notes: list[str] = []
    blocks = [b for variant, entries in by_variant.items() if (b := _membership_block(u, variant, entries, notes))]
    why = None if blocks else "the membership attack stored no scored result (see the notes)"
    return {"blocks": blocks, "notes": notes, "why": why}


def _membership_block(u: Unit, variant: str, entries: list[tuple[str, str, dict[str, Any]]],
                      notes: list[str]) -> dict[str, Any] | None:
    """One variant's table (a row per target and victim), its ROC plot, and what is missing or unresolved."""
    curves, missing, warnings, nonmembers = [], [], [], []
    table = Table(["AUC (chance band)", "advantage (KS p)", *(f"TPR @ {lv:g} FPR [95% CI]" for lv in LEVELS),
                   "members / non-members",
                   "controls: holdout twin · positive control" if variant == ARTIFACT else "reference models (calibration)"])
    for target, victim, e in entries:
        label = f"{target} · {victim}"
        if "status" in e and "advantage" not in e:
            notes.append(f"{variant} · {label}: {e['status']} — {e.get('reason', 'no reason stored')}")
            continue
        lacks = [k for k in ("auc", "advantage", "roc") if k not in e] + (["levels"] if mia_level(e, 0.01) is None else [])
        if lacks:
            missing.append(f"{label}: missing {', '.join(lacks)}")
        refs = artifact_controls(e) if variant == ARTIFACT else _references(u, e, label, warnings)
        cells = [*_mia_score_cells(e, label, warnings), f"{mia_count(e, 'members')} / {mia_count(e, 'nonmembers')}", refs]
        table.rows.append((label, cells))
        roc = e.get("roc") if isinstance(e.get("roc"), dict) else {}
        if isinstance(roc.get("fpr"), list) and isinstance(roc.get("tpr"), list) and roc["fpr"]:
            curves.append((label, roc["fpr"], roc["tpr"]))
        nonmembers.append(mia_count(e, "nonmembers"))
    if not table.rows:
        return None
    if not curves:
        missing.append(f"{variant}: no stored ROC curve to plot")
    return {"variant": variant, "svg": _roc_svg(variant, curves, nonmembers), "table": table, "warnings": warnings,
            "missing": missing}


def _roc_svg(variant: str, curves: list[tuple[str, list, list]], nonmembers: list[Any]) -> str | None:
    """The variant's ROC curves on log-log axes. The axis reaches 1e-5 only when FPR 1e-3 is itself resolvable
    (10/FPR = 10,000 non-members); below that the curve left of 1e-3 would be a few single false positives."""
    if not curves:
        return None
    counts = [n for n in nonmembers if isinstance(n, int) and n > 0]
    xmin = 1e-5 if counts and max(counts) >= RESOLVE_PER_LEVEL / 1e-3 else 1e-3
    return plots.roc_plot(curves, xmin, f"{variant}: ROC (log-log)")


def _mia_score_cells(e: dict[str, Any], label: str, warnings: list[str]) -> list[str]:
    """AUC with its chance band, the advantage with its KS p, and TPR at each FPR level with its interval."""
    band = e.get("auc_chance_interval")
    cells = [f3(e.get("auc")) + (f" (chance {band[0]:.3f}–{band[1]:.3f})" if is_interval(band) else ""),
             f3(e.get("advantage")) + (f" (p {p_fmt(e['advantage_p_value'])})" if "advantage_p_value" in e else "")]
    for lv in LEVELS:
        level = mia_level(e, lv)
        if level is None:
            cells.append("missing")
            continue
        text = f"{f4(level.get('tpr'))} {ci_text(mia_tpr_ci(level))}"
        if not level.get("resolvable", True):
            text += " (unresolved)"
            warnings.append(f"Too few non-members to resolve this level: {label}, FPR {lv:g}: "
                            + (level.get("warning") or "too few non-members"))
        cells.append(text)
    return cells


def _references(u: Unit, e: dict[str, Any], label: str, warnings: list[str]) -> str:
    """How many reference models, and whether they stood in for the target (a warning where they did not)."""
    cal, ref = e.get("calibration"), e.get("reference") or {}
    refs = as_text(e.get("reference_models", MISSING))
    if not isinstance(cal, dict):
        return refs
    refs += (f" ({cal.get('status')}: non-members {f3(cal.get('out_gap'))} σ from the OUT models, members "
             f"{f3(cal.get('in_gap'))} σ from the IN models)")
    if cal.get("status") == "miscalibrated":
        epochs = (f"; they trained {ref['epochs']} epochs, the target saw each member "
                  f"{ref['target_exposure_epochs']} times" if ref.get("epochs") and ref.get("target_exposure_epochs")
                  else "")
        warnings.append(f"{label}: the reference models do not stand in for the target{epochs}; read this "
                        "variant's numbers as a miscalibrated attack's "
                        f"({advice_of(made_by(u.metrics), 'calibrated_references')})")
    return refs


def artifact_controls(e: dict[str, Any]) -> str:
    """The artifact test's twin (must sit in the chance band) and positive control (its power), in one cell."""
    if isinstance(e.get("controls"), str):
        return e["controls"]
    parts = []
    for case, label in (("twin", "twin"), ("power", "positive control")):
        c = e.get(case)
        if not isinstance(c, dict):
            parts.append(f"{label}: not run")
        elif "auc" in c:
            parts.append(f"{label} AUC {f3(c.get('auc'))} (KS p {p_fmt(c.get('advantage_p_value'))}"
                         + (f", {c['records']} records" if isinstance(c.get("records"), int) else "") + ")")
        else:
            parts.append(f"{label}: {c.get('status', 'not run')} — {c.get('reason', '')}")
    return " · ".join(parts)


