"""Membership inference against shared artifacts (``mia-artifact``, the ``artifact`` variant of mia):
the two tests' statistics with known truth, and end to end on the methods that ship banks and statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedaudit.audit.verdict import HIGH, INCONCLUSIVE, MEDIUM
from fedaudit.statistics.membership_statistics import membership_metrics
from fedaudit.attacks.mia.scorers import nearest_entry_scores, tracing_scores


def _tracing_auc(n: int, d: int, reps: int, seed: int, outside: bool = False) -> float:
    """Mean AUC of the tracing test: n members behind a shared mean of d statistics, 256 non-members.
    With ``outside`` the shared mean comes from n other records (no member is behind it: the null)."""
    g = torch.Generator().manual_seed(seed)
    aucs = []
    for _ in range(reps):
        members, others = torch.randn(n, d, generator=g), torch.randn(256, d, generator=g)
        behind = torch.randn(n, d, generator=g) if outside else members
        scores = tracing_scores(torch.cat([members, others]), behind.mean(0))
        aucs.append(membership_metrics(scores[:n], scores[n:])["auc"])
    return float(np.mean(aucs))


def test_tracing_power_falls_with_the_records_behind_a_mean_and_rises_with_the_statistics_shared():
    """What tracing attacks predict (Dwork et al. 2015): signal ~ d/n against noise ~ sqrt(d)."""
    few = {n: _tracing_auc(n, 16, 4, seed=n) for n in (1, 4, 16, 64, 256)}
    assert few[1] > 0.95 and few[256] < 0.7
    assert all(few[a] >= few[b] - 0.03 for a, b in zip((1, 4, 16, 64), (4, 16, 64, 256))), few
    assert few[4] - few[256] > 0.25
    many = {d: _tracing_auc(64, d, 3, seed=d) for d in (16, 256, 4096)}
    assert many[16] < many[256] < many[4096] and many[4096] > 0.98, many


def test_tracing_without_members_behind_the_mean_stays_at_chance():
    for d in (32, 1024):
        assert abs(_tracing_auc(32, d, 12, seed=7, outside=True) - 0.5) < 0.06


def test_a_record_in_the_bank_is_its_own_nearest_entry():
    bank = torch.randn(5, 8)
    scores = nearest_entry_scores(torch.cat([bank[:2], torch.randn(3, 8) + 5]), bank)
    assert torch.equal(scores[:2], torch.zeros(2, dtype=scores.dtype)) and (scores[2:] < -1).all()


def _artifact(result, name="artifact") -> tuple[dict, dict]:
    metrics = json.loads((result.run_dir / "metrics.json").read_text())
    rows = {r["row"]: r for r in metrics["verdict"]}
    return metrics["leakage"]["mia"][name], rows


def test_elcfs_amplitude_bank_identifies_its_members_and_its_twin_does_not(tiny_run):
    """Acceptance: ELCFS uploads every training image's amplitude spectrum (fraction 1): the nearest-spectrum
    test finds the members (AUC ≥ 0.95, resolvable TPR at low FPR); on the holdout twin it sits in the null band."""
    result = tiny_run("elcfs", attack="mia-artifact", rounds=1)
    section, rows = _artifact(result)
    bank = section["amplitude_bank"]
    assert len(bank) == 3
    for victim, e in bank.items():
        assert e["auc"] >= 0.95
        level = e["tpr_at_fpr"]["0.1"]
        assert level["resolvable"] and level["tpr"] > 0.9
        lo, hi = e["twin"]["auc_chance_interval"]
        assert lo <= e["twin"]["auc"] <= hi, (victim, e["twin"]["auc"])
        assert e["power"]["auc"] > 0.95 and e["power"]["advantage_p_value"] < 0.05
        assert e["exact_matches"] == {"members": e["members"], "nonmembers": 0}
    assert rows["membership:amplitude_bank↑"]["tier"] in (HIGH, MEDIUM)
    assert "verbatim" in rows["membership:amplitude_bank↑"]["reason"]
    assert "membership:full_model↑" in rows  # the model's BN statistics get the aggregate test beside it


def test_statistics_artifacts_are_tested_beside_model_membership(tiny_run, caplog):
    """gPerXAN's BN statistics (server) and FedFD-A's broadcast global statistics (a curious client, as they
    are and differenced) get the tracing test in the same run as the loss attack on the global model."""
    with caplog.at_level("INFO", logger="fedaudit"):
        result = tiny_run("gperxan", attack="mia-loss,mia-artifact", rounds=1)
    # neither variant trains reference models, and the log does not say it would
    assert not any("reference" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    section, rows = _artifact(result)
    stats = {k: v for k, v in section.items() if any("auc" in e for e in v.values())}
    assert stats, section
    for by_victim in stats.values():
        for e in by_victim.values():
            assert e["statistics"] > 0 and "tracing" in e["signal"] and "twin" in e
            # the whitened test finds the members of a few-record artifact (standardising alone did not)
            assert e["power"]["advantage_p_value"] < 0.05
    loss, _ = _artifact(result, "loss")
    assert "global_model" in loss
    assert {f"membership:{k.split(':')[0]}↑" for k in stats} <= set(rows) and "membership:global_model" in rows

    result = tiny_run("fedfd_a", attack="mia-artifact", rounds=1, attacker="client:clean")
    section, rows = _artifact(result)
    assert {"global_stats", "global_stats:differencing"} <= set(section)
    for key in ("global_stats", "global_stats:differencing"):
        for e in section[key].values():
            assert 0.0 <= e["auc"] <= 1.0 and "server's view only" in e["controls"]
    # Both readings of the broadcast statistics are one row (one tensor, one observer); no counterfactual for a
    # client's view, so no power: never LOW.
    row = rows["membership:global_stats↓"]
    assert row["tier"] in (INCONCLUSIVE, MEDIUM, HIGH) and row["observer"] == "client:clean"


@pytest.mark.parametrize("style", ["single", "overall"])
def test_ccst_styles_single_is_a_bank_and_overall_an_aggregate(tiny_run, style):
    result = tiny_run("ccst", attack="mia-artifact", rounds=1, method_options={"style": style})
    section, rows = _artifact(result)
    for e in section["style_bank"].values():
        if style == "single":  # k = 3 chosen images per client: exactly those members are in the bank
            assert e["exact_matches"] == {"members": 3, "nonmembers": 0} and "nearest bank entry" in e["signal"]
            assert e["power"]["records"] == 3 and e["power"]["advantage_p_value"] < 0.05
        else:
            assert "tracing" in e["signal"] and "exact_matches" not in e
    assert "membership:style_bank↑" in rows
