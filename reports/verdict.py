"""Risk tiers and their one-line reasons, from numbers a run already stored.

Every tier rests on a number *beside its control* or on an interval, never on
a raw number alone:

* reconstructions (``leakage.<attack>.summary.<artifact>``): the **lift** of
  the macro domain attribution and of the class fidelity over the same attack
  against an untrained model (attack − max(control, chance)), and whether a victim's
  identifiability 95% interval lies wholly above 0.5 (record-level leakage)
  while its control's does not;
* membership (``leakage.mia.<variant>.<target>.<victim>``): whether the
  TPR at 1% FPR has a 95% lower bound above 1% at a resolvable level (the
  chance line is TPR = FPR), and the membership advantage max(TPR − FPR),
  which is already a lift over chance.

The thresholds are :class:`RiskThresholds`, listed in the report and
overridable with ``--risk-thresholds FILE`` (TOML or JSON, flat keys).
An artifact no attack scored gets "not assessed" with the stored reason.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError

HIGH, MEDIUM, LOW, NOT_ASSESSED = "high", "medium", "low", "not assessed"
TIER_ORDER = {HIGH: 3, MEDIUM: 2, LOW: 1, NOT_ASSESSED: 0}
MIA = "mia"
CANARY = "canary"  # the one-run ε audit: a bound per victim, not a reconstruction section
NOT_RECONSTRUCTIONS = (MIA, CANARY)  # leakage sections that are not {artifact: {victim: reconstruction scores}}
DOMAIN = "domain"  # the domain-level membership variant: its own verdict row
MIA_TARGETS = {"global_model": "the final global model", "last_upload": "the victim's last upload"}
BOOKKEEPING = ("summary", "auditor", "settings")  # keys of an attack's section that are not results


@dataclass(frozen=True)
class RiskThresholds:
    """When a shared artifact is high, medium or low risk (fractions in [0, 1])."""

    domain_attribution_lift_high: float = 0.30
    domain_attribution_lift_medium: float = 0.10
    class_fidelity_lift_high: float = 0.30
    class_fidelity_lift_medium: float = 0.10
    identifiability_ci_low: float = 0.50
    mia_tpr_ci_low: float = 0.01
    mia_advantage_medium: float = 0.10

    def describe(self) -> list[tuple[str, str, str]]:
        """(key, value, meaning) rows for the report's threshold table."""
        t = self
        return [
            ("domain_attribution_lift_high", _num(t.domain_attribution_lift_high),
             "high when the macro domain attribution of reconstructions exceeds the larger of its control and chance by at least this"),
            ("domain_attribution_lift_medium", _num(t.domain_attribution_lift_medium), "medium at this lift"),
            ("class_fidelity_lift_high", _num(t.class_fidelity_lift_high),
             "high when class fidelity exceeds the larger of its control and chance by at least this"),
            ("class_fidelity_lift_medium", _num(t.class_fidelity_lift_medium), "medium at this lift"),
            ("identifiability_ci_low", _num(t.identifiability_ci_low),
             "high when a victim's identifiability 95% interval lies wholly above this (and its control's does not)"),
            ("mia_tpr_ci_low", _num(t.mia_tpr_ci_low),
             "high when the 95% lower bound of TPR at 1% FPR exceeds this at a resolvable level"),
            ("mia_advantage_medium", _num(t.mia_advantage_medium),
             "medium when the membership advantage max(TPR − FPR) reaches this"),
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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
            raise FedauditError(f"--risk-thresholds: {key} must be a number in [0, 1], got {value!r} in {path}; "
                                f"the default is {getattr(RiskThresholds, key)}")
        values[key] = float(value)
    out = RiskThresholds(**values)
    for stem in ("domain_attribution_lift", "class_fidelity_lift"):
        if getattr(out, f"{stem}_medium") > getattr(out, f"{stem}_high"):
            raise FedauditError(f"--risk-thresholds: {stem}_medium ({getattr(out, f'{stem}_medium')}) is above "
                                f"{stem}_high ({getattr(out, f'{stem}_high')}) in {path}; medium must not exceed high")
    return out


@dataclass
class Verdict:
    tier: str
    reason: str


# -- reconstructions -----------------------------------------------------------


def artifact_verdict(kind_dir: str, metrics: dict[str, Any], config: dict[str, Any], t: RiskThresholds) -> Verdict:
    """The tier of one declared share (``"full_model↑"``) in one run."""
    kind, arrow = kind_dir[:-1], kind_dir[-1]
    leakage = metrics.get("leakage") or {}
    attacks = {name: sec for name, sec in leakage.items() if name not in NOT_RECONSTRUCTIONS and isinstance(sec, dict)}
    if not attacks:
        return Verdict(NOT_ASSESSED, "no reconstruction attack ran in this run; run with --attack deepinversion")
    attacker = str(config.get("attacker") or "server")
    sees = "↑" if attacker == "server" else "↓"
    if arrow != sees:
        other = "--attacker client:<domain>" if attacker == "server" else "--attacker server"
        what = "uploads" if sees == "↑" else "broadcasts"
        return Verdict(NOT_ASSESSED, f"this run's attacker ({attacker}) sees {what} only; assess this direction with {other}")
    found = [(name, key, sec) for name, sec in attacks.items() for key in sec
             if key not in ("summary", "auditor", "settings") and key.split(":")[0] == kind]
    if not found:
        return Verdict(NOT_ASSESSED, f"no attack in this run targets {kind}")
    best: Verdict | None = None
    skipped: list[str] = []
    for name, key, sec in found:
        entries = {v: e for v, e in sec[key].items() if isinstance(e, dict)}
        summary = (sec.get("summary") or {}).get(key)
        if summary is None:
            for e in entries.values():
                status = e.get("status", "unknown")
                reason = e.get("reason") or (e.get("metrics") or {}).get("reason") or "no reason stored"
                if status == "attacked":
                    status = "attacked but not scored"
                if f"{status}: {reason}" not in skipped:
                    skipped.append(f"{status}: {reason}")
            continue
        verdict = _reconstruction_verdict(name, key, arrow, attacker, entries, summary, t)
        if best is None or TIER_ORDER[verdict.tier] > TIER_ORDER[best.tier]:
            best = verdict
    if best is not None:
        return best
    return Verdict(NOT_ASSESSED, "; ".join(skipped))


def _reconstruction_verdict(attack: str, key: str, arrow: str, attacker: str, entries: dict[str, dict],
                            summary: dict[str, Any], t: RiskThresholds) -> Verdict:
    attacked = {v: e for v, e in entries.items() if e.get("status") == "attacked" and isinstance(e.get("metrics"), dict)}
    victims = list((summary.get("domain_attribution") or {}).get("victims") or attacked)
    what = "images" if any("image_grid" in e for e in attacked.values()) else "latent features"
    if attacker == "server":
        who = f"the {victims[0]} client" if len(victims) == 1 else f"the {len(victims)} source clients ({', '.join(victims)})"
        lead = f"From what {who} uploaded ({key}), the server synthesised {what}"
    else:
        lead = f"From the {key} broadcasts it received, the {attacker.split(':', 1)[-1]} client synthesised {what} of {', '.join(victims)}"
    whose = victims[0] if len(victims) == 1 else "each victim's own domain"
    sizes = sorted({e["metrics"].get("identifiability", {}).get("n") for e in attacked.values()} - {None})
    per = f"; {'/'.join(str(n) for n in sizes)} {what} per victim" if sizes else ""
    avg = "" if len(victims) == 1 else " on average"
    candidates: list[Verdict] = []
    notes: list[str] = []

    macro = (summary.get("domain_attribution") or {}).get("macro") or {}
    fidelity = summary.get("class_fidelity") or {}
    lifts = (
        (macro, "domain attribution", t.domain_attribution_lift_high, t.domain_attribution_lift_medium,
         f"attributes to {whose}", _top_victim(attacked)),
        (fidelity, "class fidelity", t.class_fidelity_lift_high, t.class_fidelity_lift_medium,
         "labels as the intended class", ""),
    )
    for metric, name, high, medium, verb, tail in lifts:
        if not (_isnum(metric.get("attack")) and _isnum(metric.get("control"))):
            continue
        lift = metric["attack"] - _baseline(metric)
        # a lift equal to its threshold reaches it (0.35 − 0.25 is 0.0999… in floats)
        tier = HIGH if lift >= high - 1e-9 else MEDIUM if lift >= medium - 1e-9 else LOW
        candidates.append(Verdict(tier, f"{lead} that an independent classifier {verb} {pct(metric['attack'])} of the time{avg} "
                                        f"(chance {pct(metric.get('chance'))}; untrained-model control "
                                        f"{pct(metric['control'])}{per}){tail}."))
        notes.append(f"{name} {pct(metric['attack'])} vs control {pct(metric['control'])} and chance "
                     f"{pct(metric.get('chance'))} ({points(lift)} over the larger)")

    above = []
    for victim, e in attacked.items():
        ident = e["metrics"].get("identifiability") or {}
        ci, cci = ident.get("attack_ci95"), ident.get("control_ci95")
        if _interval(ci) and ci[0] > t.identifiability_ci_low and not (_interval(cci) and cci[0] > t.identifiability_ci_low):
            above.append((ci[0], victim, ident))
    if above:
        _, victim, ident = max(above)
        ci = ident["attack_ci95"]
        text = (f"{ident.get('attack_k', '?')} of {ident.get('n', '?')} {what} synthesised for {victim} sit closer to one of its "
                f"training records than to a fresh record of the same domain ({pct(ident.get('attack'))}, 95% CI "
                f"{pct(ci[0])}–{pct(ci[1])}, wholly above {pct(t.identifiability_ci_low)}; untrained-model control "
                f"{pct(ident.get('control'))}): record-level leakage.")
        candidates.append(Verdict(HIGH, text))
    elif attacked:
        notes.append(f"no identifiability interval lies wholly above {pct(t.identifiability_ci_low)}")

    if not candidates:
        return Verdict(NOT_ASSESSED, f"{attack} attacked {key} but stored no score with a control")
    top = max(candidates, key=lambda v: TIER_ORDER[v.tier])
    if top.tier == LOW:
        return Verdict(LOW, f"{attack} attacked {key}; no criterion crossed its threshold: {'; '.join(notes)}.")
    return top


def _baseline(metric: dict[str, Any]) -> float:
    """What the attack must beat: its control, and never less than chance (a control whose
    off-manifold images all land in one class can sit below chance, which would flatter the lift)."""
    chance = metric.get("chance")
    return max(metric["control"], chance) if _isnum(chance) else metric["control"]


def _top_victim(attacked: dict[str, dict]) -> str:
    """With several victims the average can hide one: name the most attributable (its own number and control)."""
    rows = [(d["attack"], v, d) for v, e in attacked.items()
            if isinstance(d := e["metrics"].get("domain_attribution"), dict) and _isnum(d.get("attack"))]
    if len(rows) < 2:
        return ""
    _, victim, d = max(rows, key=lambda r: r[0])
    return f"; highest: {victim} {pct(d['attack'])} (control {pct(d.get('control'))})"


# -- membership ----------------------------------------------------------------


def mia_verdict(row: str, metrics: dict[str, Any], t: RiskThresholds) -> Verdict:
    """The tier of one membership row: a target (``global_model``, ``last_upload``) for the record-level
    variants, or ``domain`` for the domain-level variant ("was this domain in the federation?")."""
    mia = (metrics.get("leakage") or {}).get(MIA)
    if not isinstance(mia, dict) or not mia:
        return Verdict(NOT_ASSESSED, "no membership attack in this run; run with --attack mia")
    what = "the domain-level attack" if row == DOMAIN else MIA_TARGETS.get(row, row)
    candidates: list[Verdict] = []
    notes: list[str] = []
    for variant, target, victim, e in mia_entries(mia, row):
        if "status" in e and "advantage" not in e:
            notes.append(f"{variant}/{victim}: {e.get('status')} — {e.get('reason', 'no reason stored')}")
            continue
        on = MIA_TARGETS.get(target, target)
        level = mia_level(e, 0.01)
        tpr, ci = (level or {}).get("tpr"), mia_tpr_ci(level or {})
        counts = f"{mia_count(e, 'members')} members vs {mia_count(e, 'nonmembers')} non-members"
        if level is not None and level.get("resolvable", True) and _interval(ci) and ci[0] > t.mia_tpr_ci_low:
            if variant == DOMAIN:
                text = (f"Querying {on}, the domain-level attack tells {victim} records (never trained on) from "
                        f"unseen-domain records: TPR {pct(tpr)} at 1% FPR (95% CI {pct(ci[0])}–{pct(ci[1])}, above "
                        f"{pct(t.mia_tpr_ci_low)}; chance 1%; {counts}) — the model reveals that {victim} took part.")
            else:
                text = (f"The {variant} attack on {on} flags {pct(tpr)} of {victim}'s training records at 1% false "
                        f"positives (95% CI {pct(ci[0])}–{pct(ci[1])}, above {pct(t.mia_tpr_ci_low)}; chance 1%; {counts}).")
            candidates.append(Verdict(HIGH, text))
        elif level is not None and not level.get("resolvable", True):
            notes.append(f"{variant}/{victim}: TPR at 1% FPR not resolvable ({level.get('warning') or 'too few non-members'})")
        adv = e.get("advantage")
        if _isnum(adv):
            auc = f", AUC {e['auc']:.2f}" if _isnum(e.get("auc")) else ""
            candidates.append(Verdict(MEDIUM if adv >= t.mia_advantage_medium else LOW, (
                f"The {variant} attack on {on} reaches membership advantage {adv:.2f} on {victim} "
                f"(max TPR − FPR; 0 is chance{auc}; {counts}).")))
            notes.append(f"{variant}/{victim}: advantage {adv:.2f}")
    if not candidates:
        why = "; ".join(notes) or "no stored result"
        return Verdict(NOT_ASSESSED, f"no membership result for {what}: {why}")
    top = max(candidates, key=lambda v: TIER_ORDER[v.tier])
    if top.tier == LOW:
        return Verdict(LOW, f"no membership criterion crossed its threshold for {what}: {'; '.join(notes)}.")
    return top


def mia_entries(mia: dict[str, Any], row: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(variant, target, victim, entry) of one verdict row; bookkeeping keys and non-tables are skipped."""
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
    """The stored operating point at FPR ``level`` (``levels`` or membership.py's ``tpr_at_fpr``; keys as strings)."""
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


def mia_tpr_ci(level: dict[str, Any]) -> Any:
    return level.get("tpr_ci95", level.get("tpr_interval"))


def mia_count(entry: dict[str, Any], what: str) -> Any:
    return entry.get(what, entry.get(f"n_{what}", "?"))


# -- formatting ----------------------------------------------------------------


def pct(x: Any) -> str:
    if not _isnum(x):
        return "n/a"
    v = 100.0 * float(x)
    return f"{v:.1f}%" if 0 < abs(v) < 10 else f"{v:.0f}%"


def points(lift: float) -> str:
    return f"{'+' if lift >= 0 else '−'}{abs(100 * lift):.0f} points"


def _num(x: float) -> str:
    return f"{x:g}"


def _isnum(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _interval(ci: Any) -> bool:
    return isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_isnum(v) for v in ci)
