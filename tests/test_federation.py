"""The round loop end to end: ledger, declared shares, resume, selection, divergence."""

import json

import pytest
import torch

from fedaudit.errors import FedauditError
from fedaudit.methods import METHODS
from fedaudit.methods.fedavg import FedAvg
from fedaudit.models import build_model
from fedaudit.run import run_directory
from fedaudit.run.results import SCHEMA_VERSION
from fedaudit.tensor_ops.aggregation import state_nbytes


def test_fedavg_ledger_is_one_state_dict_per_client_per_round_each_way(tiny_run):
    rounds = 3
    result = tiny_run("fedavg", rounds=rounds)
    comm = result.metrics["communication"]
    clients = len(result.metrics["source_domains"])
    sd_bytes = state_nbytes(build_model("cnn", 10, 16).state_dict())
    assert comm["by_kind"]["full_model"] == {"up": sd_bytes * clients * rounds, "down": sd_bytes * clients * rounds}
    # The sample count FedAvg weights by crosses the wire too: one int64 per client per round.
    assert comm["by_kind"]["scalars"] == {"up": 8 * clients * rounds, "down": 0}
    assert comm["bytes_up"] == sd_bytes * clients * rounds + 8 * clients * rounds
    assert comm["bytes_down"] == sd_bytes * clients * rounds
    rows = [json.loads(line) for line in (result.run_dir / "wire.jsonl").read_text().splitlines()]
    assert len(rows) == rounds * clients * 3
    assert sum(r["bytes"] for r in rows if r["direction"] == "up") == comm["bytes_up"]


# FedFD-A's protocol is FedFD's (its adapter acts at test time only, sending nothing) and FedProx's is FedAvg's (its
# proximal term stays in the client's loss): their runs are slow-only, which keeps the default suite under its bar.
SAME_PROTOCOL_AS_ANOTHER = ("fedfd_a", "fedprox")


@pytest.mark.parametrize("name", [pytest.param(m, marks=pytest.mark.slow) if m in SAME_PROTOCOL_AS_ANOTHER else m
                                  for m in sorted(METHODS)])
def test_ledger_records_exactly_the_declared_shares(tiny_run, name):
    result = tiny_run(name)
    rows = [json.loads(line) for line in (result.run_dir / "wire.jsonl").read_text().splitlines()]
    recorded = {(r["kind"], r["direction"]) for r in rows}
    declared = {(k.value, d) for k, d in METHODS[name].shares}
    assert recorded == declared
    assert result.metrics["communication"]["declared"] == sorted(f"{k}{'↑' if d == 'up' else '↓'}" for k, d in declared)


def test_run_directory_has_the_promised_files_and_schema(tiny_run):
    result = tiny_run("fedavg")
    for name in ("config.json", "metrics.json", "history.csv", "wire.jsonl", run_directory.COMPLETE):
        assert (result.run_dir / name).exists(), name
    assert not (result.run_dir / run_directory.CHECKPOINT).exists()
    m = json.loads((result.run_dir / "metrics.json").read_text())
    assert m["schema_version"] == SCHEMA_VERSION == 3
    assert set(m["accuracy"]) >= {"unseen_domain", "source_val", "selected_round"}
    assert set(m["accuracy"]["source_val"]["per_domain"]) == set(m["source_domains"])
    assert set(m["communication"]) >= {"bytes_up", "bytes_down", "by_kind"}
    assert m["leakage"] == {}
    prov = m["provenance"]
    assert set(prov) >= {"command", "config_hash", "dataset_fingerprint", "seed", "versions", "device", "seconds"}
    assert prov["config_hash"] == json.loads((result.run_dir / "config.json").read_text())["config_hash"]


def test_selected_round_is_the_best_mean_source_val_round(tiny_run):
    result = tiny_run("fedavg", rounds=4)
    lines = (result.run_dir / "history.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, line.split(","))) for line in lines[1:]]
    best = max(rows, key=lambda r: (float(r["val_mean"]), -int(r["round"])))
    acc = result.metrics["accuracy"]
    assert acc["selected_round"] == int(best["round"])
    assert acc["unseen_domain"] == pytest.approx(float(best["target"]))


def test_killed_run_resumes_to_the_same_metrics(tiny_run, tmp_path):
    whole = tiny_run("fedprox", rounds=4, out=str(tmp_path / "whole"))

    def kill_after_round_2(fed, rnd):
        if rnd == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tiny_run("fedprox", rounds=4, out=str(tmp_path / "cut"), on_round_end=kill_after_round_2)
    (cut_dir,) = (tmp_path / "cut").iterdir()
    assert not run_directory.is_complete(cut_dir)  # a partial run is never marked complete
    assert (cut_dir / "history.csv").read_text().count("\n") == 3  # header + 2 rounds kept

    from fedaudit.api import evaluate

    resumed = evaluate(resume=cut_dir)
    assert run_directory.is_complete(cut_dir)
    for key in ("accuracy", "communication"):
        assert resumed.metrics[key] == whole.metrics[key], key
    assert (cut_dir / "history.csv").read_text() == (whole.run_dir / "history.csv").read_text()
    assert (cut_dir / "wire.jsonl").read_text() == (whole.run_dir / "wire.jsonl").read_text()


def test_fedprox_with_mu_zero_is_fedavg_and_large_mu_anchors_clients(tiny_run, tmp_path):
    avg = tiny_run("fedavg", out=str(tmp_path / "a"))
    free = tiny_run("fedprox", out=str(tmp_path / "c"), keep_artifacts=True, method_option=["mu=0"])
    assert free.metrics["accuracy"] == avg.metrics["accuracy"]  # keeping the artifacts changes no number

    def drift(result):
        # how far a client's round-2 upload moved from the round-2 broadcast
        from safetensors.torch import load_file

        files = sorted((result.run_dir / "artifacts").glob("*r002-full_model*"))
        down = load_file(str(next(f for f in files if "-server-" in f.name)))
        up = load_file(str(next(f for f in files if f.name.endswith("-server.safetensors"))))
        return sum(((up[k] - down[k]).float() ** 2).sum() for k in up if k.endswith("weight")).sqrt().item()

    anchored = tiny_run("fedprox", out=str(tmp_path / "d"), keep_artifacts=True, method_option=["mu=10"])
    assert drift(anchored) < 0.7 * drift(free)


class _Diverging(FedAvg, register=False):
    name = "diverging"

    def local_train(self, ctx, rnd):
        if rnd == 2:
            ctx.train_local(rnd, loss_fn=lambda m, x, y: m(x).sum() * float("nan"))
        else:
            ctx.train_local(rnd)


def test_non_finite_loss_stops_with_a_clear_error_and_keeps_earlier_rounds(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setitem(METHODS, "diverging", _Diverging)
    with pytest.raises(FedauditError, match="diverged in round 2"):
        tiny_run("diverging", rounds=3)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not run_directory.is_complete(run_dir)
    assert (run_dir / "history.csv").read_text().count("\n") == 2  # round 1 kept
    assert (run_dir / run_directory.CHECKPOINT / "state.json").exists()


def test_target_all_runs_every_domain_and_averages(tiny_run):
    result = tiny_run("fedavg", rounds=1, target_domain="all")
    per = result.metrics["accuracy"]["per_target"]
    assert set(per) == {"clean", "colour", "rotated", "textured"}
    assert all((result.run_dir / f"target-{t}" / run_directory.COMPLETE).exists() for t in per)
    mean = sum(v["unseen_domain"] for v in per.values()) / len(per)
    assert result.metrics["accuracy"]["unseen_domain"] == pytest.approx(mean)
    # the evidence for an anonymity assessment: each target's, as that target's own run stored it
    assert set(result.metrics["anonymity_evidence"]) == set(per)
    own = json.loads((result.run_dir / "target-clean" / "metrics.json").read_text())["anonymity_evidence"]
    assert result.metrics["anonymity_evidence"]["clean"] == own
    assert run_directory.is_complete(result.run_dir)


def test_same_seed_same_numbers_different_seed_different_numbers(tiny_run, tmp_path):
    a = tiny_run("fedavg", out=str(tmp_path / "a"), seed=3)
    b = tiny_run("fedavg", out=str(tmp_path / "b"), seed=3)
    c = tiny_run("fedavg", out=str(tmp_path / "c"), seed=4)
    assert a.metrics["accuracy"] == b.metrics["accuracy"]
    assert (a.run_dir / "history.csv").read_text() == (b.run_dir / "history.csv").read_text()
    assert (a.run_dir / "history.csv").read_text() != (c.run_dir / "history.csv").read_text()


def test_a_step_budget_on_a_one_record_client_fails_clearly_instead_of_hanging():
    from fedaudit.simulation.training import index_batches

    with pytest.raises(FedauditError, match="at least 2"):
        next(index_batches(1, 32, torch.Generator(), torch.device("cpu"), steps=5))
    batches = list(index_batches(5, 2, torch.Generator(), torch.device("cpu"), steps=7))
    assert len(batches) == 7 and all(b.numel() == 2 for b in batches)  # cycles past one pass


def _reachable_from(root: object) -> set[int]:
    """ids of every object reachable from ``root`` by reference, not through modules, classes or functions
    (a function's globals reach everything; the question is what the object itself holds)."""
    import gc
    import types

    seen, stack = set(), [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
            continue
        seen.add(id(obj))
        stack.extend(gc.get_referents(obj))
    return seen


def test_a_server_hook_reaches_no_client_data(tiny_run):
    """The threat model for methods: a server hook gets a ServerContext, and nothing reachable from it is a
    client's split, its private state, the target domain, the wire or the federation. The control: the same
    walk from a client's silo finds that silo's data, and no other client's."""
    from fedaudit.simulation.federation import ClientContext, ServerContext

    feds = []
    tiny_run("ccst", rounds=1, on_round_end=lambda fed, rnd: feds.append(fed))  # ccst: clients hold a style bank
    fed = feds[0]

    def private(client) -> set[int]:
        d = client.data
        return {id(t) for t in (d, d.train_x, d.train_y, d.val_x, d.val_y, client.state, *client.state.values())}

    everyone = set().union(*(private(c) for c in fed.clients)) | {id(fed), id(fed.wire), id(fed.target_x), id(fed.target_y)}
    server = ServerContext(fed)
    assert not hasattr(server, "__dict__")  # slots: nothing can be hung on it later
    assert not _reachable_from(server) & everyone
    own, other = fed.clients[0], fed.clients[1]
    client_view = _reachable_from(ClientContext(fed, own).client)  # (the context also holds the engine, privately)
    assert private(own) <= client_view and not private(other) & client_view
