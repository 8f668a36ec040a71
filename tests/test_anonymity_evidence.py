"""The evidence file for an anonymity assessment (fedaudit.audit.attack_families): each line's tier is its rows',
each family answered by the rows of its question, each measure linked to the rows it bears on — on stored runs with
known rows (tests/golden/), no training. The section on real runs, HTML and PDF: tests/test_report.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from fedaudit.audit.attack_families import anonymity_evidence
from fedaudit.audit.verdict import HIGH, NOT_ASSESSED, TIER_ORDER
from fedaudit.run.results import RunMetrics, VerdictRow, problems
from fedaudit.run.stored import DP, CoverageRow, Privacy
from fedaudit.run.stored.anonymity import FAMILIES, NOT_RUN, NOT_TESTED, TESTED, AnonymityEvidence

GOLDEN = Path(__file__).parent / "golden"


def stored(name: str) -> RunMetrics:
    return RunMetrics.from_json(json.loads((GOLDEN / f"{name}.json").read_text(encoding="utf-8")))


@pytest.mark.parametrize("name", ["fedavg", "gperxan", "fedlsi", "ccst"])
def test_every_line_takes_the_highest_tier_of_its_own_rows(name):
    run = stored(name)
    evidence = anonymity_evidence(run, run.verdict)
    by_key = {r.row: r for r in run.verdict}
    for key, obj in evidence.objects():
        assert [family for family, _ in obj.lines()] == list(FAMILIES)
        for _, line in obj.lines():
            rows = [by_key[r.row] for r in line.rows]
            assert all((r.artifact == "released model") == (key == "released_model") for r in rows), line
            decided = [r for r in rows if r.tier != NOT_ASSESSED]
            if decided:
                assert line.status == TESTED
                assert line.tier == max((r.tier for r in decided), key=TIER_ORDER.__getitem__)
                assert by_key[line.deciding_row].tier == line.tier and line.fact == by_key[line.deciding_row].short
                assert line.budget and line.ran
            else:
                assert line.status == (NOT_RUN if rows else NOT_TESTED) and line.untested and line.tier is None
    # the released model's membership line holds the records row and the participation row, nothing of the protocol
    assert {r.row for r in evidence.released_model.membership_inference.rows} == {
        "membership:global_model", "participation:global_model"}
    assert {r.row for r in evidence.protocol.reconstruction.rows} == {
        r.row for r in run.verdict if r.question == "inversion"}
    assert {r.row for r in evidence.protocol.attribute_inference.rows} == {
        r.row for r in run.verdict if r.question == "client_data"}
    # stored as metrics.json stores it: valid against the published schema, read back the same
    dumped = evidence.dump()
    assert not problems(dumped, "anonymity_evidence")
    assert AnonymityEvidence.read(json.loads(json.dumps(dumped))) == evidence


def test_the_highest_row_decides_the_line_and_of_equals_the_first():
    """The line's tier and deciding row are its highest row's, wherever it stands among the rows; of two at the same
    tier, the first (records before participation)."""
    run = stored("fedavg")
    tiers = {"membership:global_model": "medium", "participation:global_model": "inconclusive"}
    rows = [replace(r, tier=tiers.get(r.row, r.tier)) for r in run.verdict]
    line = anonymity_evidence(run, rows).released_model.membership_inference
    assert (line.tier, line.deciding_row) == ("medium", "membership:global_model")
    rows = [replace(r, tier="medium") if r.row in tiers else r for r in run.verdict]
    line = anonymity_evidence(run, rows).released_model.membership_inference
    assert (line.tier, line.deciding_row) == ("medium", "membership:global_model")


def test_the_budget_is_the_deciding_tests():
    """fedavg's uploads: MEDIUM by RMIA's advantage (its sentence quotes it), so the budget is RMIA's: its counts and
    its reference models, not another attack's of the same row."""
    line = anonymity_evidence(stored("fedavg"), stored("fedavg").verdict).protocol.membership_inference
    assert line.tier == "medium" and line.fact.startswith("rmia adv")
    assert line.budget == "rmia attack on last_upload (colour): 224 members, 180 non-members, 2 reference model(s)"


def test_a_bank_decided_by_the_exact_match_rule_is_the_protocols_exfiltration_line():
    run = stored("ccst")
    assert anonymity_evidence(run, run.verdict).protocol.regurgitation.status == NOT_TESTED
    rows = [replace(r, tier=HIGH, rule="exact_match", short="12 members' entries found verbatim")
            if r.row == "membership:style_bank↑" else r for r in run.verdict]
    line = anonymity_evidence(run, rows).protocol.regurgitation
    assert line.status == TESTED and line.tier == HIGH and line.deciding_row == "membership:style_bank↑"
    assert [r.row for r in line.rows] == ["membership:style_bank↑"]
    assert anonymity_evidence(run, rows).released_model.regurgitation.status == NOT_TESTED  # never the model's


def test_a_family_whose_rows_were_all_unassessed_says_how_to_run_it():
    run = stored("fedavg")
    rows = [replace(r, tier=NOT_ASSESSED, reason="no membership attack in this run; run with --attack mia. More.")
            if r.question == "membership" else r for r in run.verdict]
    line = anonymity_evidence(run, rows).protocol.membership_inference
    assert line.status == NOT_RUN and line.tier is None
    assert line.untested == ("membership:full_model↑, membership:full_model↓, membership:scalars↑: no membership "
                             "attack in this run; run with --attack mia")


def test_each_measure_links_the_rows_it_covers():
    run = stored("fedavg")
    coverage = [CoverageRow(artifact="full_model", direction="up", covered=True, why="trained weights"),
                CoverageRow(artifact="full_model", direction="down", covered=True, why="their mean"),
                CoverageRow(artifact="scalars", direction="up", covered=False, why="counts")]
    dp = DP(epsilon_target=4.0, delta=1e-5, max_grad_norm=1.0, accountant="tight", unit="one record")
    with_dp = replace(run, privacy=Privacy(dp=dp, coverage=coverage))
    measures = {m.measure: m for m in anonymity_evidence(with_dp, run.verdict).measures}
    assert measures["dp_sgd"].in_place and measures["dp_sgd"].epsilon == 4.0
    # the decided records rows of covered artifacts, the released model's among them; never the client-data rows
    assert measures["dp_sgd"].rows == ["full_model↑", "membership:full_model↑", "membership:global_model"]
    assert "target ε ≤ 4.0" in measures["dp_sgd"].text
    assert not measures["client_dp"].in_place and not measures["secure_aggregation"].in_place
    assert measures["shared"].rows == ["full_model↑", "full_model↓", "scalars↑"]
    without = {m.measure: m for m in anonymity_evidence(run, run.verdict).measures}
    assert not without["dp_sgd"].in_place and without["dp_sgd"].rows == [] and without["dp_sgd"].epsilon is None


def test_rows_of_the_dp_audit_and_the_broadcast_check_are_measures_not_families():
    run = stored("fedavg")
    extra = [VerdictRow("dp_audit", "DP claim", "dp_audit", "released model", "auditor", "low", "r.", "s."),
             VerdictRow("consistency:broadcasts", "same model", "consistency", "broadcasts", "clients", "low", "r.", "s.")]
    evidence = anonymity_evidence(run, [*run.verdict, *extra])
    linked = {r.row for _, obj in evidence.objects() for _, line in obj.lines() for r in line.rows}
    assert "dp_audit" not in linked and "consistency:broadcasts" not in linked
    assert "dp_audit" in {m.measure: m for m in evidence.measures}["dp_sgd"].rows
