"""The thresholds of the verdict's tiers, and the file a user overrides them with."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from fedaudit.errors import FedauditError

CORRECTION = "Holm"
EPSILON_MAX = 100.0  # the largest ε threshold a thresholds file may set


@dataclass(frozen=True)
class RiskThresholds:
    """Effect sizes and the significance level of the tiers (fractions in [0, 1])."""

    domain_attribution_lift_high: float = 0.30
    domain_attribution_lift_medium: float = 0.10
    class_fidelity_lift_high: float = 0.30
    class_fidelity_lift_medium: float = 0.10
    identifiability_margin_high: float = 0.20
    mia_tpr_ci_low: float = 0.05  # five times the 1% false positives: significance alone already clears 1%
    mia_advantage_medium: float = 0.10
    mia_advantage_high: float = 0.50
    participation_auc_lift_high: float = 0.20
    participation_auc_lift_medium: float = 0.05
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
            ("identifiability_margin_high", _num(t.identifiability_margin_high),
             "records: medium when reconstructions sit nearer the victim's training records than every null allows "
             "(significant after correction); high when the 95% interval's low end also exceeds the strongest null "
             "by at least this"),
            ("mia_tpr_ci_low", _num(t.mia_tpr_ci_low),
             "records: TPR at 1% FPR significant at a resolvable level is medium; high when its 95% lower bound also "
             "exceeds this (at 0.05: one member in twenty flagged at one false positive in a hundred)"),
            ("mia_advantage_high", _num(t.mia_advantage_high),
             "high when the membership advantage is significant and reaches this, whatever the low-FPR figures "
             "(an attacker right about membership about three times in four at 0.5)"),
            ("mia_advantage_medium", _num(t.mia_advantage_medium),
             "medium when the membership advantage max(TPR − FPR) is significant and reaches this; a row that "
             "could not detect this advantage reads inconclusive rather than low"),
            ("participation_auc_lift_high", _num(t.participation_auc_lift_high),
             "participation: high when the domain-level attack's AUC on the released model exceeds the mean of its "
             "AUCs on the domain twins (the federation trained without that domain) by at least this, significantly "
             "(a t test against the twins' spread)"),
            ("participation_auc_lift_medium", _num(t.participation_auc_lift_medium), "medium at this lift"),
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
    for stem in ("domain_attribution_lift", "class_fidelity_lift", "participation_auc_lift"):
        if getattr(out, f"{stem}_medium") > getattr(out, f"{stem}_high"):
            raise FedauditError(f"--risk-thresholds: {stem}_medium ({getattr(out, f'{stem}_medium')}) is above "
                                f"{stem}_high ({getattr(out, f'{stem}_high')}) in {path}; medium must not exceed high")
    if not 0.0 < out.alpha < 1.0:
        raise FedauditError(f"--risk-thresholds: alpha must lie strictly between 0 and 1, got {out.alpha} in {path}")
    return out


def _num(x: float) -> str:
    return f"{x:g}"
