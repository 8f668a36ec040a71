"""The verdict's rules, each held by a case with known truth (issue 14's catalogue).

Synthetic evidence isolates one rule at a time (fast); the tiny runs at the
end check the same rules on real attacks: a near-chance model with unequal
member and holdout counts is never rated HIGH on record-level evidence, and
an attack of a few steps reads INCONCLUSIVE, not LOW.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from fedaudit.run.stored.leakage import MembershipTestResult
from fedaudit.audit.verdict import (HIGH, INCONCLUSIVE, LOW, MEDIUM, NOT_ASSESSED, RiskThresholds, judge,
                                    load_thresholds, mia_level)
from fedaudit.statistics.membership_statistics import membership_metrics

SERVER = {"attacker": "server"}


def _entry(ident: dict, power_reached: bool | None = True, record_level: bool | None = None) -> dict:
    """A victim's stored reconstruction entry. Its positive control revealed the members' domain or class
    (``power_reached``) and, unless ``record_level`` says otherwise, singled out the members too."""
    record_level = power_reached if record_level is None else record_level
    p_reveals, p_record = 0.001 if power_reached else 0.6, 0.001 if record_level else 0.5
    power = ({"status": "not available", "reason": "no counterfactual"} if power_reached is None else
             {"status": "measured", "reached": bool(power_reached or record_level), "record_level": record_level,
              "p_value": min(p_reveals, p_record), "p_reveals": p_reveals, "p_record_level": p_record,
              "sizes": {"single": {"p_reveals": 0.5, "p_record_level": p_record, "identifiability": 0.9,
                                   "p_value": p_record},
                        "1": {"p_reveals": p_reveals, "p_record_level": 0.5, "identifiability": 0.5,
                              "p_value": 0.5}}})
    return {"status": "attacked", "image_grid": "images/x.png", "metrics": {"identifiability": ident}, "power": power}


def _ident(attack: float, ci: tuple[float, float], p: float, **nulls: float) -> dict:
    return {"attack": attack, "attack_ci95": list(ci), "attack_p_value": p, "attack_k": attack * 40, "n": 40,
            "chance": 0.5, **nulls}


def _metrics(entries: dict, summary: dict | None = None) -> dict:
    return {"communication": {"declared": ["full_model↑", "full_model↓"]},
            "leakage": {"deepinversion": {"full_model": entries, "summary": {"full_model": summary or {}}}}}


DATA = "client_data:full_model↑"  # the client's data as a whole; "full_model↑" is the records row


def _row(metrics: dict, key: str = "full_model↑", t: RiskThresholds | None = None) -> dict:
    return next(r for r in judge(metrics, SERVER, t) if r["row"] == key)


def _assessed(*args) -> dict:
    """The one row of a verdict that is not NOT ASSESSED (the released model's row is always there)."""
    (row,) = [r for r in judge(*args) if r["tier"] != NOT_ASSESSED]
    return row


def test_records_medium_is_significance_beyond_every_null_and_high_needs_a_margin():
    strong = _ident(0.9, (0.76, 0.97), 0.002, control=0.5, prior_only=0.55, twin=0.52)
    row = _row(_metrics({"clean": _entry(strong)}))
    assert row["tier"] == HIGH and "large record-level leakage" in row["reason"]
    assert row["level"] == "records" and row["title"].endswith("can its training records be reconstructed?")
    ev = next(e for e in row["evidence"] if e["test"] == "identifiability")
    assert ev["baseline_name"] == "prior-only control" and ev["baseline"] == 0.55 and ev["p_adjusted"] <= 0.05
    # the holdout twin recovers about as much: the members add nothing record-level beyond the domain
    assert _row(_metrics({"clean": _entry({**strong, "twin": 0.85})}))["tier"] == LOW
    # a twin at 92% of 40 images leaves no room: even 40 of 40 could not beat it — too little evidence, not LOW
    near_bound = _row(_metrics({"clean": _entry({**strong, "twin": 0.92})}))
    assert near_bound["tier"] == INCONCLUSIVE and "none could have" in near_bound["reason"]
    against = next(e for e in _row(_metrics({"clean": _entry({**strong, "twin": 0.85})}))["evidence"]
                   if e["test"] == "identifiability")["detail"]["p_against"]
    assert against["chance"] == 0.002 and against["twin"] > 0.2  # beating chance is not beating the twin
    # a high value that its permutation null reaches as often is no finding (unequal counts, dependent images)
    assert _row(_metrics({"clean": _entry({**strong, "attack_p_value": 0.4})}))["tier"] == LOW
    # Significant against every null (so the interval's low end is above each), but only 9 points above the
    # strongest: MEDIUM. Without the margin rule this is HIGH; without significance, LOW.
    detectable = _ident(0.75, (0.59, 0.87), 0.02, control=0.5, prior_only=0.5, twin=0.5)
    row = _row(_metrics({"clean": _entry(detectable)}))
    assert row["tier"] == MEDIUM and "not shown large" in row["reason"] and "+9 points" in row["reason"], row["reason"]
    assert _row(_metrics({"clean": _entry(detectable)}), t=RiskThresholds(identifiability_margin_high=0.05))["tier"] == HIGH


def test_many_victims_are_corrected_for_multiplicity():
    weak = _ident(0.75, (0.59, 0.87), 0.02, control=0.5, prior_only=0.5, twin=0.5)
    assert _row(_metrics({"clean": _entry(weak)}))["tier"] == MEDIUM  # p 0.02 alone survives alpha 0.05
    many = _metrics({f"v{i}": _entry(weak) for i in range(4)})
    row = _row(many)
    assert row["tier"] == LOW and row["correction"].startswith("Holm over 4")  # 4 × 0.02 > 0.05


def test_low_needs_power_otherwise_inconclusive():
    nothing = _ident(0.5, (0.34, 0.66), 0.5, control=0.5, prior_only=0.5, twin=0.5)
    low = _row(_metrics({"clean": _entry(nothing, power_reached=True)}))
    # the reason names the control that singled the members out: here each image's own statistics
    assert low["tier"] == LOW and "singled out member images from the statistics of each image alone" in low["reason"]
    # A control that revealed the members' domain but could not single them out gives the records row no power:
    # the LOW a reviewer reads about records is never one where records were not testable (issue 47).
    domain_only = _row(_metrics({"clean": _entry(nothing, power_reached=True, record_level=False)}))
    assert domain_only["tier"] == INCONCLUSIVE and "record-level leakage was not testable" in domain_only["reason"]
    weak_attack = _row(_metrics({"clean": _entry(nothing, power_reached=False)}))
    assert weak_attack["tier"] == INCONCLUSIVE and "--inversion-iters" in weak_attack["reason"]
    no_control = _row(_metrics({"clean": _entry(nothing, power_reached=None)}))
    assert no_control["tier"] == INCONCLUSIVE and "no positive control ran (no counterfactual)" in no_control["reason"]


def test_records_power_is_beating_the_prior_only_control_not_chance():
    """The records row's power is its positive control's record-level p: the one-image control's reconstructions
    nearer their source members than chance says (permutation p 0.002) *and* nearer than the prior-only control's.
    Here the prior alone already singles them out as well (identifiability 0.90 against the control's 0.84): the
    attack showed nothing the prior does not give, so the row reads INCONCLUSIVE. The same control above a prior-only
    control of 0.63 has power: LOW. A rule that read the control's raw p against chance would read LOW both times.
    The power is built as the auditor builds it (fedaudit.audit.reconstruction), from the sizes' own figures."""
    from fedaudit.audit.reconstruction import power_of, record_level_p
    from fedaudit.run.stored.reconstruction import PowerSize

    def entry(single_prior_only: float) -> dict:
        def size(per_class: int, images: int, ident: float, p: float, prior_only: float) -> PowerSize:
            return PowerSize(per_class=per_class, images=images, identifiability=ident, p_value=p, chance=0.5,
                             prior_only=prior_only, p_reveals=0.6, p_record_level=record_level_p(ident, p, prior_only))

        sizes = {"single": size(1, 7, 0.84, 0.002, single_prior_only).with_(records_per_artifact=1),
                 "1": size(1, 7, 0.60, 0.26, 0.63), "2": size(2, 14, 0.59, 0.20, 0.58)}
        nothing = _ident(0.5, (0.34, 0.66), 0.5, control=0.5, prior_only=0.5, twin=0.5)
        return {**_entry(nothing), "power": power_of(sizes).dump()}

    prior_as_good = _row(_metrics({"clean": entry(0.90)}))
    assert prior_as_good["tier"] == INCONCLUSIVE and "record-level leakage was not testable" in prior_as_good["reason"]
    beats_prior = _row(_metrics({"clean": entry(0.63)}))
    assert beats_prior["tier"] == LOW and "from the statistics of each image alone" in beats_prior["reason"]


def test_distribution_level_lift_is_over_the_strongest_null_and_significant():
    def summary(attack: float, control: float, prior_only: float, n: int = 120) -> dict:
        k = lambda v: [round(v * n), n]  # noqa: E731
        macro = {"attack": attack, "control": control, "prior_only": prior_only, "twin": attack, "chance": 1 / 3}
        return {"domain_attribution": {"victims": ["a", "b", "c"], "macro": macro,
                                       "counts": {"attack": k(attack), "control": k(control), "prior_only": k(prior_only)}}}

    nothing = _ident(0.5, (0.34, 0.66), 0.5)
    entries = {v: _entry(nothing) for v in ("a", "b", "c")}
    row = _row(_metrics(entries, summary(0.83, 0.20, 0.25)), DATA)
    assert row["tier"] == HIGH and "untrained control 20%" in row["reason"] and row["level"] == "client_data"
    # the records row is decided by records evidence alone: a domain revealed is not a record reconstructed
    assert _row(_metrics(entries, summary(0.83, 0.20, 0.25)))["tier"] == LOW
    # smooth images alone (the prior-only control) already reach 0.70: only the lift over them counts
    row = _row(_metrics(entries, summary(0.83, 0.20, 0.70)), DATA)
    assert row["tier"] == MEDIUM and "prior-only control (70%" in row["reason"]
    # a lift of 0.15 on 12 images is not significant
    assert _row(_metrics(entries, summary(0.5, 0.2, 0.25, n=12)), DATA)["tier"] == LOW


def test_membership_without_signal_is_medium_or_high_in_at_most_5_percent_of_runs():
    """Scores that carry no membership signal, 3 victims × 2 variants × 2 targets per run, 225
    members and 180 non-members each (a digits victim). Without the null at these counts and
    the Holm correction, "advantage ≥ 0.1 is MEDIUM" fires in most such runs."""
    rng = np.random.default_rng(0)
    runs, flagged, naive = 60, 0, 0
    for _ in range(runs):
        mia = {variant: {target: {v: membership_metrics(rng.normal(size=225), rng.normal(size=180))
                                  for v in ("a", "b", "c")} for target in ("global_model", "last_upload")}
               for variant in ("loss", "lira_online")}
        metrics = {"communication": {"declared": []}, "leakage": {"mia": mia}}
        tiers = [r["tier"] for r in judge(metrics, SERVER)]
        flagged += any(t in (HIGH, MEDIUM) for t in tiers)
        naive += any(e["advantage"] >= 0.1 for by_t in mia.values() for by_v in by_t.values() for e in by_v.values())
    assert flagged / runs <= 0.05
    assert naive / runs > 0.5  # what the rule prevents


def test_membership_with_signal_is_found_and_low_needs_enough_records():
    rng = np.random.default_rng(1)
    signal = membership_metrics(rng.normal(0.6, size=225), rng.normal(size=180))
    metrics = {"communication": {"declared": []}, "leakage": {"mia": {"loss": {"global_model": {"a": signal}}}}}
    row = _assessed(metrics, SERVER)
    assert row["tier"] == MEDIUM and "advantage" in row["reason"]
    no_signal = lambda n1, n0: membership_metrics(np.linspace(0, 1, n1), np.linspace(0, 1, n0))  # noqa: E731
    small = no_signal(225, 180)
    row = _assessed({"communication": {"declared": []}, "leakage": {"mia": {"loss": {"global_model": {"a": small}}}}}, SERVER)
    assert row["tier"] == INCONCLUSIVE and "could not have been detected" in row["reason"]
    large = no_signal(3000, 3000)
    row = _assessed({"communication": {"declared": []}, "leakage": {"mia": {"loss": {"global_model": {"a": large}}}}}, SERVER)
    assert row["tier"] == LOW


def test_rows_without_evidence_say_why():
    rows = {r["row"]: r for r in judge(_metrics({}), SERVER)}
    assert rows["full_model↓"]["tier"] == NOT_ASSESSED and "--attacker client:<domain>" in rows["full_model↓"]["reason"]
    assert rows["membership:global_model"]["tier"] == NOT_ASSESSED


def test_thresholds_change_the_tier_and_bad_files_are_named(tmp_path):
    strict = tmp_path / "t.toml"
    strict.write_text("alpha = 0.001\n")
    weak = _ident(0.75, (0.59, 0.87), 0.02, control=0.5, prior_only=0.5, twin=0.5)
    assert _row(_metrics({"clean": _entry(weak)}), t=load_thresholds(strict))["tier"] == LOW
    bad = tmp_path / "bad.toml"
    bad.write_text("identifiability_ci_low = 0.5\n")
    with pytest.raises(Exception, match="unknown key 'identifiability_ci_low'"):
        load_thresholds(bad)


# -- on real attacks ----------------------------------------------------------------------


def test_near_chance_model_with_unequal_counts_is_never_high_and_a_short_attack_is_inconclusive(tiny_run):
    """A model trained one round at a tiny learning rate (near chance), 70% of each client's records
    members and 20% holdout (a naive nearest-neighbour vote favours members 7/9 of the time), and a
    5-step inversion: no record-level finding, chance measured near 1/2, and INCONCLUSIVE — the
    attack cannot recover even the artifact of one member image — instead of LOW."""
    result = tiny_run("fedavg", rounds=1, local_epochs=1, lr=1e-4, split=(0.7, 0.1, 0.2), attack="deepinversion",
                      victim="clean", inversion_iters=5, inversion_batch=10, judge_steps=40)
    metrics = result.metrics
    assert metrics["accuracy"]["source_val"]["mean"] < 0.3
    ident = metrics["leakage"]["deepinversion"]["full_model"]["clean"]["metrics"]["identifiability"]
    assert 0.4 < ident["chance"] < 0.6 and ident["balanced"]["members"] > 3 * ident["balanced"]["nonmembers"]
    row = next(r for r in metrics["verdict"] if r["row"] == "full_model↑")
    assert row["tier"] == "inconclusive" and "single out even the member images" in row["reason"]
    evidence = [e for e in row["evidence"] if e["test"] == "identifiability"]
    assert evidence and all(e["tier"] == "low" and e["baseline_name"] for e in evidence)
    assert all(e["power"]["reached"] is False for e in evidence)


def test_the_statistics_of_a_few_member_images_are_rated_high(tiny_run):
    """Every client's last upload carries the BatchNorm statistics of four of its members and nothing
    else: the same attack and rules rate it HIGH (its reconstructions reveal each victim's domain far
    above every null). Measured with 50 iterations: macro domain attribution 1.00 against 0.33 for the
    strongest null (p 5e-10 after Holm)."""
    import torch

    from fedaudit.audit.counterfactual import replay_statistics
    from fedaudit.simulation.wire import Artifact

    def plant(fed, rnd):
        if rnd != fed.cfg.rounds:
            return
        for client in fed.clients:
            key = ("full_model", client.role, "server")
            art = fed.wire.retained[key]
            model = fed.method.build_model(fed)
            model.load_state_dict(dict(art.tensors))
            stats = replay_statistics(model, client.data.train_x[:4], fed.preprocess, torch.Generator().manual_seed(0),
                                      start=None, steps=None, batch_size=32, augment=False)
            fed.wire.retained[key] = Artifact(art.kind, art.sender, art.receiver, art.round,
                                              {k: stats.get(k, t) for k, t in art.tensors.items()})

    result = tiny_run("fedavg", dataset="shapes", rounds=2, local_epochs=1, attack="deepinversion", inversion_iters=50,
                      inversion_batch=7, on_round_end=plant)
    row = next(r for r in result.metrics["verdict"] if r["row"] == DATA)
    assert row["tier"] == HIGH, row["reason"]
    top = next(e for e in row["evidence"] if e["tier"] == HIGH)
    assert top["test"] == "domain_attribution" and top["p_adjusted"] <= 0.05 and top["value"] - top["baseline"] >= 0.3


def _artifact_metrics(entry: dict) -> dict:
    return {"communication": {"declared": []}, "leakage": {"mia": {"artifact": {"full_model": {"a": entry}}}}}


def test_an_artifact_membership_low_needs_its_positive_control():
    """The artifact test (membership from shared statistics) reads LOW only when the same test found the
    members of its positive control; without that power it is INCONCLUSIVE, whatever the counts."""
    quiet = lambda n1, n0: membership_metrics(np.linspace(0, 1, n1), np.linspace(0, 1, n0))  # noqa: E731
    rng = np.random.default_rng(2)
    found = membership_metrics(rng.normal(3.0, size=14), rng.normal(size=180))
    missed = membership_metrics(rng.normal(size=14), rng.normal(size=180))
    row = _assessed(_artifact_metrics({**quiet(3000, 3000), "power": {**found, "records": 14}}), SERVER)
    assert row["row"] == "membership:full_model↑" and row["tier"] == LOW, row["reason"]
    assert row["title"] == "full_model ↑ (client → server): does it reveal which records were trained on?"
    assert row["observer"] == "server" and row["level"] == "records"
    row = _assessed(_artifact_metrics({**quiet(3000, 3000), "power": {**missed, "records": 14}}), SERVER)
    assert row["tier"] == INCONCLUSIVE and "positive control" in row["reason"] and "14 records" in row["reason"]
    row = _assessed(_artifact_metrics({**quiet(3000, 3000), "controls": "not available: a client's view"}), SERVER)
    assert row["tier"] == INCONCLUSIVE and "not available" in row["reason"]
    # A model-based row with the same numbers has no such control to show, and reads LOW (its own rule).
    plain = {"communication": {"declared": []}, "leakage": {"mia": {"loss": {"global_model": {"a": quiet(3000, 3000)}}}}}
    assert _assessed(plain, SERVER)["tier"] == LOW


def test_an_artifact_finding_names_a_twin_that_also_separates_and_verbatim_records():
    rng = np.random.default_rng(3)
    signal = membership_metrics(rng.normal(0.6, size=225), rng.normal(size=180))
    twin_null = membership_metrics(rng.normal(size=225), rng.normal(size=180))
    entry = {**signal, "twin": twin_null, "power": signal, "exact_matches": {"members": 0, "nonmembers": 0}}
    row = _assessed(_artifact_metrics(entry), SERVER)
    assert row["tier"] == MEDIUM and "twin" not in row["reason"] and "verbatim" not in row["reason"]
    row = _assessed(_artifact_metrics({**entry, "exact_matches": {"members": 3, "nonmembers": 0}}), SERVER)
    assert row["tier"] == HIGH and "3 of a's members" in row["reason"]
    # The twin is the artifact's null: a finding its twin shares is not this artifact's.
    row = _assessed(_artifact_metrics({**entry, "twin": signal, "exact_matches": None}), SERVER)
    assert row["tier"] == INCONCLUSIVE and "so does its holdout twin" in row["reason"]


def test_a_bank_holding_members_verbatim_is_high_whatever_the_counts():
    """Three members' own entries found exactly among 3,000: the membership test cannot tell at these counts, but
    those records are in the bank verbatim — HIGH, with the count and the tolerance; an exact match of a non-member
    too (a duplicated record) proves nothing by itself."""
    quiet = membership_metrics(np.linspace(0, 1, 3000), np.linspace(0, 1, 3000))
    power = membership_metrics(np.r_[np.zeros(3) + 5, np.zeros(0)], np.zeros(180))
    entry = {**quiet, "power": power, "exact_matches": {"members": 3, "nonmembers": 0}, "exact_tolerance": 2e-4}
    row = _assessed(_artifact_metrics(entry), SERVER)
    assert row["tier"] == HIGH and "3 of a's members" in row["reason"] and "tolerance 0.0002" in row["reason"]
    assert "exact-match rule" in row["reason"]
    row = _assessed(_artifact_metrics({**entry, "exact_matches": {"members": 0, "nonmembers": 0}}), SERVER)
    assert row["tier"] == LOW
    row = _assessed(_artifact_metrics({**entry, "exact_matches": {"members": 3, "nonmembers": 1}}), SERVER)
    assert row["tier"] != HIGH
    # few non-members (5): no low-FPR figure can be resolved, and the bank's 14 verbatim members are still HIGH
    few = membership_metrics(np.linspace(0, 1, 14), np.linspace(0, 1, 5))  # and the scores alone show nothing
    row = _assessed(_artifact_metrics({**few, "power": few, "exact_matches": {"members": 14, "nonmembers": 0}}), SERVER)
    assert row["tier"] == HIGH and "14 of a's members" in row["reason"], row["reason"]


def test_a_large_significant_membership_advantage_is_high_whatever_the_low_fpr_figures():
    """Advantage 0.55 on thousands of non-members with TPR at 1% FPR near chance: HIGH by the advantage rule;
    the same advantage below the threshold (or not significant) is not."""
    rng = np.random.default_rng(3)
    # every member scores above 0.55 and none above the non-members' top 1.5%: advantage ≈ 0.55, TPR at 1% FPR ≈ 0
    members, nonmembers = rng.uniform(0.55, 0.985, 1000), rng.uniform(0, 1, 6000)
    entry = membership_metrics(members, nonmembers)
    point = mia_level(MembershipTestResult.read(entry), 0.01)
    assert entry["advantage"] >= 0.5 and point is not None and point.tpr is not None and point.tpr < 0.2
    metrics = {"communication": {"declared": []}, "leakage": {"mia": {"loss": {"last_upload": {"a": entry}}}}}
    row = _assessed(metrics, SERVER)
    assert row["tier"] == HIGH and "advantage rule" in row["reason"]
    row = _assessed(metrics, SERVER, RiskThresholds(mia_advantage_high=0.9))
    assert row["tier"] == MEDIUM


def test_a_significant_tpr_at_1pct_fpr_is_medium_and_high_needs_its_interval_above_the_threshold():
    """k of 225 members scored far above 3,000 non-members, the rest far below. 20 members: TPR 0.089 at 1% FPR,
    interval [0.055, 0.134] — HIGH (its low end above mia_tpr_ci_low, 0.05). 12 members: TPR 0.053, interval
    [0.028, 0.091], p 2e-5 — significant, not shown large: MEDIUM. 6 members (the issue's case: interval
    [0.010, 0.057], p 0.036) is not significant once the attack's two tests are corrected together: never HIGH."""
    rng = np.random.default_rng(0)

    def row(k: int) -> dict:
        entry = membership_metrics(np.r_[np.full(k, 100.0), np.linspace(-100, -50, 225 - k)], rng.normal(size=3000))
        metrics = {"communication": {"declared": []}, "leakage": {"mia": {"loss": {"global_model": {"a": entry}}}}}
        return next(r for r in judge(metrics, SERVER) if r["row"] == "membership:global_model")

    assert row(20)["tier"] == HIGH
    medium = row(12)
    assert medium["tier"] == MEDIUM and medium["evidence"][0]["test"] == "mia_tpr", medium["reason"]
    assert row(6)["tier"] not in (HIGH, MEDIUM)


def test_participation_must_beat_the_domain_twins_by_more_than_their_spread():
    """The domain-level attack's AUC on the released model against its domain twins (the federation trained
    without that domain, each with its own seed). A gap the twins show too is the domain's own difficulty; a gap
    within their spread is training noise."""
    rng = np.random.default_rng(4)
    base = membership_metrics(rng.normal(1.2, size=400), rng.normal(size=900))  # AUC ≈ 0.80

    def entry(*twins: float, reason: str = "a recording: its loop cannot be re-run") -> dict:
        twin = ({"status": "measured", "aucs": list(twins)} if twins else {"status": "not applicable", "reason": reason})
        return {**base, "domain_twin": twin}

    def row(entries: dict) -> dict:
        metrics = {"communication": {"declared": []}, "leakage": {"mia": {"domain": {"global_model": entries}}}}
        return next(r for r in judge(metrics, SERVER) if r["row"] == "participation:global_model")

    auc = base["auc"]
    high = row({"a": entry(auc - 0.31, auc - 0.29), "b": entry(auc - 0.01, auc + 0.01)})
    assert high["tier"] == HIGH and high["level"] == "participation" and "took part" in high["reason"], high["reason"]
    assert high["title"] == "released model: does it reveal which domains took part?"
    medium = row({"a": entry(auc - 0.11, auc - 0.09), "b": entry(auc - 0.01, auc + 0.01)})
    assert medium["tier"] == MEDIUM, medium["reason"]
    # the twins separate as well: the domain is easier than the unseen one, whether it took part or not
    same = row({"a": entry(auc - 0.003, auc + 0.001), "b": entry(auc - 0.002, auc + 0.002)})
    assert same["tier"] == LOW and same["evidence"][0]["baseline_name"] == "domain twins", same["reason"]
    # far above chance, but with no twin (a recording): never MEDIUM or HIGH
    no_twin = row({"a": entry()})
    assert no_twin["tier"] == INCONCLUSIVE and "own difficulty" in no_twin["reason"]
    # one twin each: no spread to tell training noise by
    assert row({"a": entry(auc - 0.3), "b": entry(auc)})["tier"] == INCONCLUSIVE
    # twins that spread widely: a lift of 0.05 could not be seen, so a quiet result is not LOW
    noisy = row({"a": entry(auc - 0.2, auc + 0.2), "b": entry(auc - 0.2, auc + 0.2)})
    assert noisy["tier"] == INCONCLUSIVE and "could not have been detected" in noisy["reason"], noisy["reason"]
    # the participation evidence never enters the released model's records row
    records = next(r for r in judge({"communication": {"declared": []},
                                     "leakage": {"mia": {"domain": {"global_model": {"a": entry(0.5, 0.5)}}}}}, SERVER)
                   if r["row"] == "membership:global_model")
    assert records["tier"] == NOT_ASSESSED


def test_advice_names_only_what_the_command_that_made_the_run_takes():
    """An audit of a recording takes no --profile, --split or --dataset: its INCONCLUSIVE rows say what it does take;
    evaluate's rows keep evaluate's options."""
    from fedaudit.audit.verdict import ADVICE

    nothing = _ident(0.5, (0.34, 0.66), 0.5, control=0.5, prior_only=0.5, twin=0.5)
    no_signal = membership_metrics(np.linspace(0, 1, 225), np.linspace(0, 1, 180))
    for made_by, provenance in (("evaluate", {}), ("audit", {"recording": {"path": "rec"}})):
        inversion = _row({**_metrics({"clean": _entry(nothing, power_reached=False)}), "provenance": provenance})
        membership = next(r for r in judge({"communication": {"declared": []}, "provenance": provenance,
                                            "leakage": {"mia": {"loss": {"global_model": {"a": no_signal}}}}}, SERVER)
                          if r["row"] == "membership:global_model")
        assert inversion["tier"] == membership["tier"] == INCONCLUSIVE
        assert ADVICE[made_by]["stronger_inversion"] in inversion["reason"]
        assert ADVICE[made_by]["more_records"] in membership["reason"]
        flags = set(re.findall(r"--[a-z][a-z-]+", inversion["reason"] + membership["reason"]))
        if made_by == "audit":
            assert flags <= {"--inversion-iters", "--inversion-batch", "--device"}, flags
        else:
            assert {"--profile", "--split", "--dataset"} <= flags


def test_tiny_counts_never_read_low_and_a_saturated_null_is_said():
    """Four images per test: even a perfect reconstruction could not be significant, so what would be LOW reads
    INCONCLUSIVE naming the counts; a null already at 100% is said to saturate the test. Without the rule both LOW."""
    tiny = {**_ident(0.5, (0.1, 0.9), 0.7, control=0.5, prior_only=0.5, twin=0.5), "n": 4, "attack_k": 2}
    row = _row(_metrics({"clean": _entry(tiny)}))
    assert row["tier"] == INCONCLUSIVE and "none could have" in row["reason"] and "identifiability on 4" in row["reason"]
    saturated = {**_ident(1.0, (0.91, 1.0), 0.001, control=1.0, prior_only=1.0, twin=1.0)}
    row = _row(_metrics({"clean": _entry(saturated)}))
    assert row["tier"] == INCONCLUSIVE and "saturated: identifiability (" in row["reason"] and "at 100%" in row["reason"]
    enough = _ident(0.5, (0.34, 0.66), 0.5, control=0.5, prior_only=0.5, twin=0.5)  # 40 images: could have
    assert _row(_metrics({"clean": _entry(enough)}))["tier"] == LOW
    # the latent-feature version (a classifier head inverted into features: no image grid) obeys the same rule
    latent = {k: v for k, v in _entry(tiny).items() if k != "image_grid"}
    row = _row(_metrics({"clean": latent}))
    assert row["tier"] == INCONCLUSIVE and "none could have" in row["reason"]


def test_a_lift_test_on_a_handful_of_images_cannot_carry_a_low():
    """Domain attribution on 2 synthesised images (a perfect 2 of 2 against chance 1/3 is p 0.11), and an
    identifiability test on 4: neither could reach MEDIUM, so neither row reads LOW; the same attribution on 40
    images could have, and the client-data row reads LOW."""
    tiny_ident = {**_ident(0.5, (0.1, 0.9), 0.7, control=0.5, prior_only=0.5, twin=0.5), "n": 4, "attack_k": 2}

    def attribution(n: int) -> dict:
        return {"domain_attribution": {"victims": ["clean"], "counts": {"attack": [round(0.34 * n), n]},
                                       "macro": {"attack": 0.34, "chance": 0.33, "control": 0.1, "prior_only": 0.1}}}

    row = _row(_metrics({"clean": _entry(tiny_ident)}, attribution(2)), DATA)
    assert row["tier"] == INCONCLUSIVE and "domain_attribution on 2" in row["reason"], row["reason"]
    assert _row(_metrics({"clean": _entry(tiny_ident)}, attribution(40)), DATA)["tier"] == LOW
    # the records row has its own counts: identifiability on 4 images can never carry a LOW, whatever the lift test
    records = _row(_metrics({"clean": _entry(tiny_ident)}, attribution(40)))
    assert records["tier"] == INCONCLUSIVE and "identifiability on 4" in records["reason"]


@pytest.mark.slow
def test_a_model_that_learned_nothing_reads_no_medium_or_high_in_19_of_20_seeds(tiny_run):
    """The null artifact, end to end: a GroupNorm model (no normalisation statistics to ship) trained at a learning
    rate too small to move a float32 weight (no update), so every upload equals the broadcast it came from. Whatever
    every attack that applies to it reports — the membership family on each target, gradient inversion of the
    uploads, the canary audit — no row may read MEDIUM or HIGH, in at least 19 of 20 seeds (the rules' 5%)."""
    flagged = []
    for seed in range(20):
        result = tiny_run("fedavg", norm="gn", lr=1e-9, seed=seed, attack="mia,gradinv,canary", inversion_iters=10, canary_cost=False,
                          reference_models=2)
        assert result.metrics["accuracy"]["source_val"]["mean"] < 0.3  # it learned nothing
        rows = [(r["row"], r["tier"]) for r in result.metrics["verdict"] if r["tier"] in (HIGH, MEDIUM)]
        flagged += [(seed, rows)] if rows else []
    assert len(flagged) <= 1, flagged


def test_a_dp_claim_is_refuted_only_by_a_corrected_test_of_the_claim():
    """Gradient canaries that give every member away (perfect scores, 2,048 canaries) reject "(1, 1e-5)-DP" far below
    α: HIGH, "the DP guarantee does not hold". The same counts against a claim of ε = 4 prove more than 0 but do not
    reject the claim: no refutation. Without the claim test the first row would read HIGH only by the bound's size,
    and never say the guarantee fails."""
    from fedaudit.statistics.one_run_audit import audit

    rng = np.random.default_rng(0)
    included = rng.random(2048) < 0.5
    entry = audit(included.astype(float) + rng.normal(0, 0.01, 2048), included, 1e-5, 0.95, [32, 64, 128, 256])

    def row(claim: float) -> dict:
        metrics = {"communication": {"declared": []},
                   "leakage": {"canary_gradient": {"clean": {**entry, "epsilon_spent": claim, "rounds": 2}}}}
        return next(r for r in judge(metrics, SERVER) if r["row"] == "membership:canary")

    assert entry["epsilon_lower_bound"] > 1.0
    refuted = row(1.0)
    assert refuted["tier"] == HIGH and "THE DP GUARANTEE DOES NOT HOLD" in refuted["reason"], refuted["reason"]
    assert "gradient canaries planted in clean's DP-SGD" in refuted["reason"]
    held = row(entry["epsilon_lower_bound"] + 1.0)
    assert "DOES NOT HOLD" not in held["reason"] and "within the claimed ε" in held["reason"]


def test_a_p_value_of_exactly_zero_refutes_the_claim_it_rejects():
    """The strongest evidence is not the absence of evidence: 6,000 of 6,000 correct guesses on 10,000 gradient
    canaries, tested as (ε, δ) at δ = 0 (a run that stored no claim curve), give the claim ε = 1 a p-value that
    underflows to exactly 0.0. It must read HIGH, "the DP guarantee does not hold" — a rule that reads ``p or 1.0``
    takes that 0.0 for 1.0 and finds nothing."""
    from fedaudit.statistics.one_run_audit import audit, p_value_of_claim

    rng = np.random.default_rng(0)
    included = rng.random(10000) < 0.5
    entry = audit(included.astype(float) + rng.normal(0, 0.01, 10000), included, 0.0, 0.95, [3000])
    assert p_value_of_claim(entry["canaries"], entry["per_k"], 1.0, 0.0) == 0.0  # scipy's binom.sf underflows
    metrics = {"communication": {"declared": []},
               "leakage": {"canary_gradient": {"clean": {**entry, "epsilon_spent": 1.0, "rounds": 2}}}}
    row = next(r for r in judge(metrics, SERVER) if r["row"] == "membership:canary")
    assert row["tier"] == HIGH and "THE DP GUARANTEE DOES NOT HOLD" in row["reason"], row["reason"]
    assert "rejected at p < 0.001" in row["reason"]


def test_a_gaussian_claim_beyond_the_delta_cap_is_refuted_by_the_fdp_test_of_its_curve():
    """ε = 8 is past what Steinke et al.'s (ε, δ) test can ever reject at δ = 1e-5 (its cap is near 6.4), so perfect
    gradient canaries (2,048, every member given away) cannot refute "(8, 1e-5)-DP"; but full-batch DP-SGD claims
    more — exactly μ-GDP with μ 1.666 (its ε 8) — and the f-DP test of that curve (Mahloujifar et al. 2025) rejects it:
    HIGH, "the DP guarantee does not hold". A claim of μ 3 (ε ≈ 17) is not rejected. Without the curve test the first
    row would stay within the claim."""
    from fedaudit.statistics.one_run_audit import audit

    rng = np.random.default_rng(0)
    included = rng.random(2048) < 0.5
    entry = audit(included.astype(float) + rng.normal(0, 0.01, 2048), included, 1e-5, 0.95, [32, 64, 128, 256, 512])

    def row(claim: dict | None) -> dict:
        e = {**entry, "epsilon_spent": 8.0, "rounds": 1, **({"claim": claim} if claim else {})}
        metrics = {"communication": {"declared": []}, "leakage": {"canary_gradient": {"clean": e}}}
        return next(r for r in judge(metrics, SERVER) if r["row"] == "membership:canary")

    assert entry["epsilon_lower_bound"] < 8.0 < entry["gdp"]["epsilon_if_gaussian"]
    refuted = row({"curve": "gaussian", "mu": 1.666})
    assert refuted["tier"] == HIGH and "THE DP GUARANTEE DOES NOT HOLD" in refuted["reason"], refuted["reason"]
    assert "the f-DP bound: μ ≥" in refuted["reason"] and "if the privacy curve is Gaussian" in refuted["reason"]
    assert "DOES NOT HOLD" not in row(None)["reason"]  # the (ε, δ) test alone cannot reach ε = 8
    assert "DOES NOT HOLD" not in row({"curve": "gaussian", "mu": 3.0})["reason"]


def test_a_claim_rejected_by_one_audit_alone_is_not_refuted_when_the_row_holds_two():
    """Holm across the row's audits holds the claim test too: 190 of 200 guesses right on 1,000 gradient canaries
    against a claimed μ-GDP with μ 0.86 gives p 0.031 — refuted when it is the row's only audit, not when a second
    victim's identical audit shares the row (Holm needs p ≤ 0.025 then). Without the correction both rows would read
    "the DP guarantee does not hold"."""
    entry = {"epsilon_lower_bound": 1.0, "canaries": 1000, "guesses": 200, "correct": 190, "k_grid": [100],
             "per_k": [{"k": 100, "guesses": 200, "correct": 190}], "delta": 1e-5, "confidence": 0.95,
             "epsilon_max_certifiable": 4.0, "epsilon_spent": 3.5, "claim": {"curve": "gaussian", "mu": 0.86},
             "rounds": 1}

    def row(victims: int) -> dict:
        metrics = {"communication": {"declared": []},
                   "leakage": {"canary_gradient": {f"v{i}": entry for i in range(victims)}}}
        return next(r for r in judge(metrics, SERVER) if r["row"] == "membership:canary")

    assert "THE DP GUARANTEE DOES NOT HOLD" in row(1)["reason"], row(1)["reason"]
    assert "DOES NOT HOLD" not in row(2)["reason"], row(2)["reason"]


def test_the_audit_pays_for_looking_at_every_k_before_it_proves_any_loss():
    """One victim's input canaries, three k tried: the best, 41 of 64 guesses right, has p 0.016 against "no privacy
    loss at all" on its own, but the audit looked at three k, so its p is 0.049 — still MEDIUM at α 0.05; with 40 of
    64 (p 0.030 alone, 0.090 for the grid) the row is not MEDIUM. Without the grid's Bonferroni factor the second
    row would read MEDIUM on a p-value picked after looking."""
    def row(correct: int) -> dict:
        entry = {"epsilon_lower_bound": 0.05, "canaries": 64, "guesses": 64, "correct": correct, "k_grid": [8, 16, 32],
                 "per_k": [{"k": 8, "guesses": 16, "correct": 9}, {"k": 16, "guesses": 32, "correct": 17},
                           {"k": 32, "guesses": 64, "correct": correct}],
                 "delta": 1e-5, "confidence": 0.95, "epsilon_max_certifiable": 2.7, "epsilon_spent": None, "target": "x"}
        metrics = {"communication": {"declared": []}, "leakage": {"canary": {"clean": entry}}}
        return next(r for r in judge(metrics, SERVER) if r["row"] == "membership:canary")

    assert row(41)["tier"] == MEDIUM, row(41)["reason"]
    assert row(40)["tier"] != MEDIUM, row(40)["reason"]


def test_a_small_canary_bound_in_one_audit_of_many_is_not_a_finding_after_correction():
    """Six victims' input canaries, 42 of 64 guesses right each: every audit alone proves ε ≥ 0.07 (p 0.026 for "no
    loss at all"), but with six audits in the row Holm needs p ≤ 0.05/6, and none has it — LOW (the audit could have
    certified more), not MEDIUM. One such victim alone is MEDIUM. Without the correction all six would be MEDIUM."""
    from fedaudit.statistics.one_run_audit import epsilon_lower_bound

    entry = {"epsilon_lower_bound": epsilon_lower_bound(64, 64, 42, 1e-5, 1 - 0.05 / 3), "canaries": 64, "guesses": 64,
             "correct": 42, "k_grid": [8, 16, 32], "per_k": [{"k": 32, "guesses": 64, "correct": 42}] * 3,
             "delta": 1e-5, "confidence": 0.95, "epsilon_max_certifiable": 2.7, "epsilon_spent": None, "target": "x"}
    assert entry["epsilon_lower_bound"] > 0

    def row(victims: int) -> dict:
        metrics = {"communication": {"declared": []}, "leakage": {"canary": {f"v{i}": entry for i in range(victims)}}}
        return next(r for r in judge(metrics, SERVER) if r["row"] == "membership:canary")

    assert row(1)["tier"] == MEDIUM
    assert row(6)["tier"] == LOW, row(6)["reason"]


# -- one answer per artifact (issue 36) ----------------------------------------------------------------------


def _tensors(evidence: dict, mia: dict) -> set[str]:
    """The wire tensors a membership test read, worked out here from the stored run alone (not from the verdict's
    grouping): a last-upload model is the kinds its weights came from, an artifact test the kind it names, and
    the released model is itself."""
    variant, rest = evidence["source"].split(" on ", 1)
    target, victim = rest.rsplit(" / ", 1)
    if variant == "domain" or target == "global_model":
        return {"released model"}
    if target == "last_upload":
        sources = mia[variant][target][victim].get("weights_from") or {}
        return {re.match(r"(\w+)@", s).group(1) + "↑" for s in sources if " from client:" in s}
    return {target.split(":")[0] + "↑"}


def _disagreements(rows: list[dict], mia: dict) -> list[str]:
    """Pairs of membership rows that read the same tensor from the same observer and give different tiers."""
    seen: dict[tuple[str, str], dict] = {}
    out = []
    for row in rows:
        if not row["row"].startswith("membership:") or row["row"] == "membership:canary":
            continue
        for tensor in {t for e in row["evidence"] for t in _tensors(e, mia)}:
            other = seen.setdefault((tensor, row["observer"]), row)
            if other["tier"] != row["tier"]:
                out.append(f"{tensor}: {other['row']} {other['tier']} vs {row['row']} {row['tier']}")
    return out


def _stored_run(shares: list[str]) -> dict:
    """A run of a method with these shares, as stored: the loss attack on the victim's last upload is significant,
    the tracing test on every shared artifact is not (and found its positive control), the released model shows
    nothing."""
    rng = np.random.default_rng(7)
    quiet = lambda: membership_metrics(rng.normal(size=225), rng.normal(size=180))  # noqa: E731
    weights = next(s[:-1] for s in shares if s.endswith("↑") and s[:-1] in ("full_model", "partial_model"))
    upload = {**membership_metrics(rng.normal(0.8, size=225), rng.normal(size=180)),
              "weights_from": {f"{weights}@r2 from client:a": 20, "full_model@r1 from server": 4}}
    found = membership_metrics(rng.normal(3.0, size=14), rng.normal(size=180))
    tracing = {s[:-1]: {"a": {**quiet(), "power": found, "signal": "whitened tracing test"}}
               for s in shares if s.endswith("↑") and s[:-1] not in ("scalars", "importance")}
    mia = {"loss": {"global_model": {"a": quiet()}, "last_upload": {"a": upload}},
           "lira_online": {"global_model": {"a": quiet()}, "last_upload": {"a": {**quiet(), "weights_from": upload["weights_from"]}}},
           "artifact": tracing, "domain": {"global_model": {"a": quiet()}}}
    return {"communication": {"declared": shares}, "leakage": {"mia": mia}}


def _method_shares() -> dict[str, list[str]]:
    from fedaudit.methods import METHODS
    from fedaudit.methods.gperxan import _PARTIAL_SHARES

    arrow = {"up": "↑", "down": "↓"}
    out = {name: sorted(f"{k.value}{arrow[d]}" for k, d in cls.shares) for name, cls in METHODS.items()}
    out["gperxan:partial"] = sorted(f"{k.value}{arrow[d]}" for k, d in _PARTIAL_SHARES)
    return out


@pytest.mark.parametrize("method", sorted(_method_shares()))
def test_no_two_rows_about_one_tensor_and_observer_disagree(method):
    """For every method's shares: the loss attack on the victim's upload is significant and the tracing test on the
    same tensor is not, so the upload's membership row reads MEDIUM or HIGH and names the loss attack first; no
    other row about that tensor, seen by the server, reads otherwise."""
    metrics = _stored_run(_method_shares()[method])
    rows = judge(metrics, SERVER)
    assert _disagreements(rows, metrics["leakage"]["mia"]) == []
    upload = next(r for r in rows if r["row"] in ("membership:full_model↑", "membership:partial_model↑"))
    assert upload["tier"] in (HIGH, MEDIUM) and upload["reason"].startswith("loss attack: advantage"), upload["reason"]
    assert upload["observer"] == "server" and "tracing test" in upload["reason"]  # the others are listed
    keys = [(r["artifact"], r["question"], r["observer"]) for r in rows]
    assert len(keys) == len(set(keys))  # one row per question, artifact and observer


def test_the_consistency_check_fails_when_upload_attacks_get_a_row_of_their_own(monkeypatch):
    """The rule removed (the attacks on the last upload judged apart from the share they read, as before issue 36):
    the upload's row and the share's row disagree, and the check above catches it."""
    from fedaudit.audit.verdict import membership

    metrics = _stored_run(["full_model↑", "full_model↓", "scalars↑"])
    monkeypatch.setattr(membership, "upload_shares", lambda entry, declared: ["last_upload"])
    rows = judge(metrics, SERVER)
    assert _disagreements(rows, metrics["leakage"]["mia"])
    assert next(r for r in rows if r["row"] == "membership:full_model↑")["tier"] not in (HIGH, MEDIUM)


@pytest.mark.parametrize("method", ["fedavg", "gperxan", "ccst", "fedlsi"])
def test_the_golden_runs_give_one_answer_per_tensor(method):
    """The same on real stored runs (tests/golden): no LOW beside a significant attack on the same tensor."""
    import json
    from pathlib import Path

    metrics = json.loads((Path(__file__).parent / "golden" / f"{method}.json").read_text())
    assert _disagreements(metrics["verdict"], metrics["leakage"]["mia"]) == []
    assert _disagreements(judge(metrics, SERVER), metrics["leakage"]["mia"]) == []


def test_every_row_says_whose_view_and_a_short_form_that_fits_a_terminal():
    metrics = _stored_run(["full_model↑", "full_model↓", "scalars↑"])
    rows = {r["row"]: r for r in judge(metrics, SERVER)}
    assert rows["membership:global_model"]["observer"] == "anyone holding the released model"
    down = rows["membership:full_model↓"]
    assert down["tier"] == NOT_ASSESSED and down["observer"] == "client:<domain>"
    assert "--attacker client:<domain>" in down["reason"]
    for row in rows.values():
        assert row["short"] and len(row["short"]) <= 60 and not row["short"].endswith("…"), row["short"]


def test_a_silent_canary_audit_reads_low_only_when_it_could_have_certified_the_high_threshold():
    """No loss proven (32 of 64 guesses right, bound 0): with canaries that could certify ε 2.7 the row is LOW; with
    canaries that could certify at most ε 0.4 (below canary_epsilon_high, 1) it is INCONCLUSIVE and says how to
    plant more."""
    def row(ceiling: float) -> dict:
        entry = {"epsilon_lower_bound": 0.0, "canaries": 64, "guesses": 64, "correct": 32, "k_grid": [32],
                 "per_k": [{"k": 32, "guesses": 64, "correct": 32}], "delta": 1e-5, "confidence": 0.95,
                 "epsilon_max_certifiable": ceiling, "epsilon_spent": None, "target": "global_model"}
        metrics = {"communication": {"declared": []}, "leakage": {"canary": {"clean": entry}}}
        return next(r for r in judge(metrics, SERVER) if r["row"] == "membership:canary")

    assert row(2.7)["tier"] == LOW and "could have certified up to ε 2.70" in row(2.7)["reason"]
    weak = row(0.4)
    assert weak["tier"] == INCONCLUSIVE and "--canaries" in weak["reason"], weak["reason"]
    assert weak["observer"] == "anyone holding the released model" and weak["question"] == "dp_audit"


def test_a_hint_names_the_view_and_the_attack_when_both_are_missing():
    """A run with no inversion at all, as the server: the broadcast's records row is judged from a client's view, so
    following "run with --attack deepinversion" alone would only lead to a second hint; it names both flags."""
    metrics = {"communication": {"declared": ["full_model↑", "full_model↓"]}, "leakage": {}}
    rows = {r["row"]: r for r in judge(metrics, SERVER)}
    down, up = rows["full_model↓"], rows["full_model↑"]
    assert down["tier"] == up["tier"] == NOT_ASSESSED
    assert "assess it with --attacker client:<domain> --attack deepinversion" in down["reason"]
    assert "run with --attack deepinversion" in up["reason"] and "--attacker" not in up["reason"]
    ran = _metrics({"clean": _entry(_ident(0.5, (0.4, 0.6), 0.5))})  # an inversion ran: the view alone is missing
    ran["communication"]["declared"] = ["full_model↑", "full_model↓"]
    down = {r["row"]: r for r in judge(ran, SERVER)}["full_model↓"]
    assert down["reason"].endswith("assess it with --attacker client:<domain>")


def test_a_membership_row_with_nothing_scored_says_why_in_its_short_form():
    """A released model whose outputs are not finite (client-level DP noise at a small ε destroys a tiny model) is
    attacked but nothing can be ranked: the terminal's short form says so, not "no result stored"."""
    why = "989 of 989 scores are not finite: the attacked model's outputs overflow"
    metrics = {"communication": {"declared": []},
               "leakage": {"mia": {"domain": {"global_model": {d: {"status": "not applicable", "reason": why}
                                                               for d in ("clean", "colour")}}}}}
    row = next(r for r in judge(metrics, SERVER) if r["row"] == "participation:global_model")
    assert row["tier"] == NOT_ASSESSED and why in row["reason"]
    assert row["short"] == "not applicable: 989 of 989 scores are not finite", row["short"]


def test_a_secure_aggregation_row_is_judged_from_that_observers_evidence_and_says_what_it_saw():
    """Known truth: the clear uploads give every member away (HIGH), the aggregate the secure-aggregation server saw
    gives nothing (a flat score). Its row must read from the aggregate's evidence — not HIGH — and lead with what the
    mask left that server; a bank the mask does not cover keeps the clear result and says so."""
    rng = np.random.default_rng(3)
    leak = membership_metrics(rng.uniform(0.55, 0.985, 1000), rng.uniform(0, 1, 6000))  # HIGH by the advantage rule
    flat = membership_metrics(np.linspace(0, 1, 1000), np.linspace(0, 1, 6000))
    clear = {"mia": {"loss": {"last_upload": {"a": leak}}}}
    metrics = {"communication": {"declared": ["full_model↑"]}, "leakage": clear,
               "secure_aggregation": {"observer": "server (secure aggregation)", "masked": ["full_model"],
                                      "leaves": [{"kind": "style_bank", "direction": "up", "why": "its own message"}],
                                      "aggregate": {"clients": ["a", "b", "c"], "round": 3},
                                      "leakage": {"mia": {"loss": {"last_upload": {"a": flat}}}}}}
    rows = {r["row"]: r for r in judge(metrics, SERVER)}
    assert rows["membership:full_model↑"]["tier"] == HIGH
    masked = rows["membership:full_model↑@secure_aggregation"]
    assert masked["tier"] not in (HIGH, MEDIUM), masked["short"]
    assert masked["observer"] == "server (secure aggregation)"
    assert masked["reason"].startswith("Under secure aggregation the server sees only the sample-weighted aggregate "
                                       "of round 3's full_model uploads (3 clients: a, b, c)")
    assert "full_model↑@secure_aggregation" in rows and "client_data:full_model↑@secure_aggregation" in rows
    assert not any(r.endswith("@secure_aggregation") for r in rows if "global_model" in r)  # the released model: once


def test_a_row_with_nothing_to_judge_says_which_of_the_missing_pieces_it_lacks():
    """Each not-assessed rule words its own case (what a reviewer reads instead of a tier): no records for the
    auditor, no attack of the row's kind, an attack that read something else — for membership and participation
    alike; removing a rule from its chain leaves the row saying the wrong thing."""
    declared = {"communication": {"declared": ["full_model↑"]}}
    held_none = judge({**declared, "auditor_data": {"status": "none", "why": "the manifest lists no records"}}, SERVER)
    for key in ("membership:global_model", "participation:global_model"):
        row = {r["row"]: r for r in held_none}[key]
        assert row["tier"] == NOT_ASSESSED and row["short"] == "no records to test", row
        assert "membership inference needs the clients' records: the manifest lists no records" in row["reason"]
        assert row["rule"] is None  # no rule judged it: nothing to judge
    assert all("the manifest lists no records" in r["reason"] for r in held_none)  # every row says why
    no_attack = {r["row"]: r for r in judge(declared, SERVER)}
    assert no_attack["membership:global_model"]["short"] == "no membership attack ran"
    assert "run with --attack mia" in no_attack["membership:global_model"]["reason"]
    assert no_attack["participation:global_model"]["short"] == "no domain-level attack ran"
    assert "--attack mia-domain" in no_attack["participation:global_model"]["reason"]
    loss_only = {**declared, "leakage": {"mia": {"loss": {"global_model": {"clean": {"status": "skipped"}}}}}}
    other = {r["row"]: r for r in judge(loss_only, SERVER)}
    assert other["participation:global_model"]["short"] == "no domain-level attack ran"  # a loss attack is not one
    assert other["membership:full_model↑"]["short"] == "no attack reads it"
    canaries = {**declared, "leakage": {"canary": {"clean": {"status": "skipped", "reason": "too few records"}}}}
    row = {r["row"]: r for r in judge(canaries, SERVER)}["membership:canary"]
    assert row["tier"] == NOT_ASSESSED and row["rule"] is None and row["short"] == "no canary result"
    assert "clean (input canaries): skipped — too few records" in row["reason"]


@pytest.mark.parametrize(("tiers", "words", "shown"), [
    (["low", "low"], "LOW", "low"),
    (["low", "inconclusive", "inconclusive", "inconclusive"], "LOW where decided; 3 questions inconclusive",
     "inconclusive"),
    (["low", "not_assessed"], "LOW where decided; 1 not assessed", "inconclusive"),
    (["medium", "low", "inconclusive"], "MEDIUM; also 1 question inconclusive", "medium"),
    (["high", "medium"], "HIGH", "high"),
    (["inconclusive", "not_assessed", "not_assessed"], "none decided: 1 question inconclusive, 2 not assessed",
     "inconclusive"),
    (["not_assessed"], "none decided: 1 not assessed", "not_assessed"),
])
def test_the_headline_is_the_highest_decided_tier_with_every_undecided_row_counted(tiers, words, shown):
    """Issue 56: the headline never reads LOW while a row is INCONCLUSIVE or NOT ASSESSED, and never shows in
    LOW's colour then."""
    from fedaudit.audit.verdict import Headline

    headline = Headline.of(tiers)
    assert (headline.words, headline.tier) == (words, shown)
    assert headline.words == headline.lead + headline.rest


def test_every_stored_membership_attack_maps_to_a_row_the_verdict_writes():
    """Tables beside the verdict (scripts/mia_table.py) read each attack's tier through membership_row_of: the
    domain-level attack answers the participation row, the loss attack the released model's records row."""
    from fedaudit.audit.verdict import membership_row_of

    rng = np.random.default_rng(5)
    entry = membership_metrics(rng.normal(0.5, size=225), rng.normal(size=180))
    metrics = {"communication": {"declared": []},
               "leakage": {"mia": {"loss": {"global_model": {"a": entry}}, "domain": {"global_model": {"a": entry}}}}}
    rows = {r["row"] for r in judge(metrics, SERVER)}
    row_of = membership_row_of(metrics, SERVER)
    assert row_of[("domain", "global_model")] == "participation:global_model"
    assert row_of[("loss", "global_model")] == "membership:global_model"
    assert set(row_of.values()) <= rows
