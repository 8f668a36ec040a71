"""gPerXAN and the XAN norm layer: the mix, the personalised BN side on the
wire (the paper's full upload vs fedaudit's partial variant), the
frozen-global-head guidance, honest model selection, and resume."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from fedaudit.api import check_names, evaluate
from fedaudit.errors import FedauditError
from fedaudit.methods.gperxan import GPerXAN, guided_loss
from fedaudit.models import XAN, build_model, keep_xan_in_early_stages, xan_bn_side_keys, xan_layers
from fedaudit.run.config import resolve
from fedaudit.simulation.federation import ClientContext, ServerContext
from fedaudit.simulation.wire import ArtifactKind

ROUNDS = 2
# As conftest's tiny_run, with one local epoch: these tests look at the protocol, not at accuracy.
TINY = dict(attack="none", dataset="digits", image_size=16, batch_size=32, local_epochs=1, device="cpu")


def _run(out: Path, rounds: int = ROUNDS, on_round_end=None, **options):
    """A tiny gperxan run into ``out``."""
    return evaluate("gperxan", rounds=rounds, out=str(out), on_round_end=on_round_end, **TINY, **options)


def _history(run_dir: Path) -> list[dict]:
    """history.csv rows without the byte columns (those differ between upload modes)."""
    lines = (run_dir / "history.csv").read_text().splitlines()
    header = lines[0].split(",")
    return [{k: v for k, v in zip(header, line.split(",")) if not k.startswith("bytes")} for line in lines[1:]]


def _run_with_fed(out: Path, **options):
    """A tiny run, artifacts kept; returns (result, its Federation, per round: did the server deploy a model)."""
    feds, deployed = [], []

    def after(fed, rnd):
        feds.append(fed)
        deployed.append(fed.deployed_model() is not None)

    result = _run(out, on_round_end=after, keep_artifacts=True, **options)
    return result, feds[-1], deployed


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """The default run (upload=full, the paper's protocol)."""
    return _run_with_fed(tmp_path_factory.mktemp("full"))


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory):
    """fedaudit's upload=partial variant."""
    return _run_with_fed(tmp_path_factory.mktemp("partial"), method_option=["upload=partial"])


def _artifacts(run_dir: Path) -> list[tuple[int, str, str, str, dict]]:
    """(round, kind, sender, receiver, tensors) of every persisted artifact."""
    out = []
    for f in sorted((run_dir / "artifacts").glob("*.safetensors")):
        _, rnd, kind, sender, receiver = f.stem.split("-")
        out.append((int(rnd[1:]), kind, sender.replace("_", ":", 1), receiver.replace("_", ":", 1), load_file(str(f))))
    return out


def _clients(result) -> list[str]:
    return [f"client:{d}" for d in result.metrics["source_domains"]]


def _ledger(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "wire.jsonl").read_text().splitlines()]


# -- the XAN layer --------------------------------------------------------------


def test_xan_output_is_the_softmax_mix_of_its_bn_and_in_outputs():
    torch.manual_seed(0)
    layer = XAN(4)
    with torch.no_grad():
        layer.bn_score.fill_(2.0)
        layer.in_score.fill_(-1.0)
        for p in (layer.bn.weight, layer.bn.bias, layer.inorm.weight, layer.inorm.bias):
            p.normal_()
    x = torch.randn(6, 4, 5, 5) * 3 + 1
    w_bn = math.exp(2) / (math.exp(2) + math.exp(-1))
    bn_ref = F.batch_norm(x, None, None, layer.bn.weight, layer.bn.bias, training=True)
    in_ref = F.instance_norm(x, weight=layer.inorm.weight, bias=layer.inorm.bias)
    assert torch.allclose(layer(x), w_bn * bn_ref + (1 - w_bn) * in_ref, atol=1e-5)
    # Eval: the BN side switches to its running statistics, the IN side stays per-image.
    layer.eval()
    bn_eval = F.batch_norm(x, layer.bn.running_mean, layer.bn.running_var, layer.bn.weight, layer.bn.bias, training=False)
    assert torch.allclose(layer(x), w_bn * bn_eval + (1 - w_bn) * in_ref, atol=1e-5)
    assert torch.allclose(XAN(4).mix_weights(), torch.tensor([0.5, 0.5]))  # scores start equal


def test_bn_side_keys_and_early_stages():
    model = build_model("cnn", 10, 16, norm="xan")
    assert len(xan_layers(model)) == 4
    keys = xan_bn_side_keys(model)
    assert set(keys) == {f"encoder.blocks.{i}.1.{k}" for i in range(4) for k in
                         ("bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "bn_score")}
    keep_xan_in_early_stages(model, 2)
    assert [type(model.encoder.blocks[i][1]) for i in range(4)] == [XAN, XAN, nn.BatchNorm2d, nn.BatchNorm2d]
    # A plain BN layer of a later stage is not part of the personalised side.
    assert {k.split(".")[2] for k in xan_bn_side_keys(model)} == {"0", "1"}
    resnet = build_model("resnet18", 10, 16, norm="xan")
    keep_xan_in_early_stages(resnet, 1)
    assert [n for n, _ in xan_layers(resnet)][0] == "encoder.backbone.bn1"
    assert all(n.startswith(("encoder.backbone.bn1", "encoder.backbone.layer1.")) for n, _ in xan_layers(resnet))
    assert resnet(torch.randn(2, 3, 16, 16)).shape == (2, 10)


def test_norm_xan_is_accepted_for_any_method_and_trains():
    check_names(resolve({"method": "fedavg", "norm": "xan"}))  # what evaluate/the CLI validate
    torch.manual_seed(0)
    model = build_model("cnn", 10, 16, norm="xan")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    layers = xan_layers(model)
    # The mixing scores train with the rest of the model; the BN side tracks statistics.
    assert all(not torch.allclose(m.mix_weights(), torch.tensor([0.5, 0.5])) for _, m in layers)
    assert all(int(m.bn.num_batches_tracked) == 3 and m.bn.running_mean.abs().sum() > 0 for _, m in layers)


# -- the wire -------------------------------------------------------------------


def test_default_uploads_the_whole_model_bn_side_included_every_round(full_run):
    """Algorithm 1, line 12: the server averages the whole client models every round; line 7: the
    broadcast leaves the BN side out. The ledger shows the BN side going up in every round."""
    result, fed, deployed = full_run
    assert GPerXAN.options["upload"].default == "full" and fed.method.declared_shares() == GPerXAN.shares
    clients = _clients(result)
    bn_keys = set(fed.method.bn_keys)
    every_key = set(fed.model.state_dict())
    rows = _ledger(result.run_dir)
    assert {(r["kind"], r["direction"]) for r in rows} == {(k.value, d) for k, d in GPerXAN.shares}
    assert result.metrics["communication"]["declared"] == ["full_model↑", "partial_model↓", "scalars↑"]
    ups = sorted((r["round"], r["sender"]) for r in rows if r["kind"] == "full_model")
    assert ups == sorted((rnd, c) for rnd in range(1, ROUNDS + 1) for c in clients)
    arts = _artifacts(result.run_dir)
    for rnd, kind, sender, receiver, tensors in arts:
        if kind == ArtifactKind.FULL_MODEL.value:
            assert set(tensors) == every_key, (rnd, sender)  # BN side and its running statistics included
        elif kind == ArtifactKind.PARTIAL_MODEL.value:
            assert receiver in clients and not bn_keys & set(tensors), (rnd, receiver)
    bn_up = {(rnd, sender) for rnd, kind, sender, _, t in arts if kind == ArtifactKind.FULL_MODEL.value and bn_keys <= set(t)}
    assert bn_up == {(rnd, c) for rnd in range(1, ROUNDS + 1) for c in clients}
    # The server holds the whole average from the wire every round: every round is scored.
    assert deployed == [True] * ROUNDS
    assert all(row["val_mean"] and row["target"] for row in _history(result.run_dir))
    assert "rounds_without_deployed_model" not in result.metrics["accuracy"]


def test_partial_mode_sends_the_bn_side_only_in_the_final_round(partial_run):
    result, fed, _ = partial_run
    clients = _clients(result)
    bn_keys = set(fed.method.bn_keys)
    arts = _artifacts(result.run_dir)
    assert arts
    for rnd, kind, sender, _, tensors in arts:
        has_stats = any(k.endswith(("running_mean", "running_var")) for k in tensors)
        if kind == ArtifactKind.BN_STATS_ALL_LAYERS.value:
            assert rnd == ROUNDS and sender in clients
            assert set(tensors) == bn_keys
        else:
            assert not has_stats and not bn_keys & set(tensors), (rnd, kind, sender)
    final = [sender for rnd, kind, sender, _, _ in arts if kind == ArtifactKind.BN_STATS_ALL_LAYERS.value]
    assert sorted(final) == sorted(clients)  # exactly once per client
    kinds = {(r["kind"], r["direction"]) for r in _ledger(result.run_dir)}
    assert kinds == {(k.value, d) for k, d in fed.method.declared_shares()}
    assert ("bn_stats_all_layers", "up") in kinds and ("full_model", "up") not in kinds


def test_partial_mode_scores_and_selects_only_the_model_the_wire_assembled(partial_run):
    """Before the final round the partial-mode server holds no BN side: no model is deployed,
    no accuracy is reported for those rounds, and selection falls on the final round."""
    result, _, deployed = partial_run
    assert deployed == [False] * (ROUNDS - 1) + [True]
    history = _history(result.run_dir)
    for row in history[:-1]:
        assert all(v == "" for k, v in row.items() if k == "val_mean" or k == "target" or k.startswith("val/")), row
        assert float(row["train_loss"]) > 0  # the round trained; only its evaluation is missing
    final = history[-1]
    assert int(final["round"]) == ROUNDS and float(final["val_mean"]) > 0 and float(final["target"]) > 0
    acc = result.metrics["accuracy"]
    assert acc["selected_round"] == ROUNDS
    assert acc["rounds_without_deployed_model"] == list(range(1, ROUNDS))
    assert acc["unseen_domain"] == pytest.approx(float(final["target"]))
    assert acc["source_val"]["mean"] == pytest.approx(float(final["val_mean"]))
    # The report renders the missing rounds as "—" (and says why) instead of crashing or plotting zeros.
    page = (result.run_dir / "report.html").read_text(encoding="utf-8")
    assert "val — · unseen —" in page
    assert "rounds with no deployable model (not scored, never selected)" in page


def test_progress_line_shows_a_round_without_a_deployed_model(caplog):
    from fedaudit.cli import RichReporter

    with caplog.at_level(logging.INFO, logger="fedaudit"):
        RichReporter(quiet=True).round_done("textured", {"round": 1, "val_mean": None, "target": None, "train_loss": 0.5})
    assert "val —  unseen —  loss 0.500" in caplog.text


@pytest.mark.parametrize("mode,kind", [("full", ArtifactKind.FULL_MODEL), ("partial", ArtifactKind.BN_STATS_ALL_LAYERS)])
def test_deployed_bn_side_is_the_sample_weighted_average_of_the_final_uploads(request, mode, kind):
    result, fed, _ = request.getfixturevalue(f"{mode}_run")
    uploads = {s: t for r, k, s, _, t in _artifacts(result.run_dir) if k == kind.value and r == ROUNDS}
    weights = {c.role: c.num_samples for c in fed.clients}
    total = sum(weights.values())
    server = fed.method.global_state  # the server's own state: only the wire can have filled its BN side
    for key in fed.method.bn_keys:
        if server[key].is_floating_point():
            expected = sum(uploads[role][key] * (w / total) for role, w in weights.items())
            assert torch.allclose(server[key], expected, atol=1e-6), key
    # After the last round the deployed model is exactly that server state.
    deployed = fed.deployed_model().state_dict()
    assert all(torch.equal(deployed[k], v) for k, v in server.items())


def test_bn_side_is_personal_and_shared_tensors_are_identical_after_broadcast(full_run):
    _, fed, _ = full_run
    method = fed.method
    key = next(k for k in method.bn_keys if k.endswith("running_mean"))
    sides = [c.state[key] for c in fed.clients]
    assert not torch.allclose(sides[0], sides[1]) and not torch.allclose(sides[1], sides[2])
    broadcasts = method.broadcast(ServerContext(fed), ROUNDS + 1)
    assert {a.kind for a in broadcasts} == {ArtifactKind.PARTIAL_MODEL}
    for client in fed.clients:
        method.receive(ClientContext(fed, client), [a for a in broadcasts if a.receiver == client.role])
        state = fed.model.state_dict()
        assert all(torch.equal(state[k], method.global_state[k]) for k in method.shared_keys)
        assert all(torch.equal(state[k], client.state[k]) for k in method.bn_keys)  # its own, not the average


def test_partial_mode_trains_like_full_and_deploys_the_same_final_model(full_run, partial_run):
    """The upload mode changes what crosses the wire, not training: same losses every round and,
    in the final round, the same deployed model (both average the same BN sides)."""
    full, _, _ = full_run
    partial, _, _ = partial_run
    f_rows, p_rows = _history(full.run_dir), _history(partial.run_dir)
    assert [r["train_loss"] for r in f_rows] == [r["train_loss"] for r in p_rows]
    assert f_rows[-1] == p_rows[-1]
    assert partial.metrics["accuracy"]["final_round"] == full.metrics["accuracy"]["final_round"]
    f_bytes = full.metrics["communication"]["by_kind"]
    p_bytes = partial.metrics["communication"]["by_kind"]
    assert p_bytes["partial_model"]["down"] == f_bytes["partial_model"]["down"]  # the same broadcast
    assert p_bytes["partial_model"]["up"] + p_bytes["bn_stats_all_layers"]["up"] * ROUNDS == f_bytes["full_model"]["up"]


# -- the guidance regulariser ---------------------------------------------------


def test_guidance_term_reaches_the_encoder_only():
    torch.manual_seed(0)
    model = build_model("cnn", 5, 16, norm="xan")
    global_head = {k: torch.randn_like(v) for k, v in model.head.state_dict().items()}
    frozen = {k: v.clone() for k, v in global_head.items()}
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 5, (8,))

    def grads(lam: float) -> dict[str, torch.Tensor]:
        model.zero_grad()
        guided_loss(global_head, lam)(model, x, y).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    with_term, without = grads(0.5), grads(0.0)
    for name in ("head.weight", "head.bias"):
        assert torch.allclose(with_term[name], without[name], atol=1e-6)  # h_k gets nothing from the λ term
    assert not torch.allclose(with_term["encoder.blocks.0.0.weight"], without["encoder.blocks.0.0.weight"])
    assert all(v.grad is None and not v.requires_grad for v in global_head.values())
    assert all(torch.equal(global_head[k], frozen[k]) for k in frozen)


def test_removing_lambda_changes_training(tmp_path, full_run):
    guided, _, _ = full_run
    plain = _run(tmp_path, rounds=1, keep_artifacts=True, method_option=["lam=0"])

    def round1_upload(result) -> dict:
        first = _clients(result)[0]
        return next(t for r, k, s, _, t in _artifacts(result.run_dir) if r == 1 and k == "full_model" and s == first)

    a, b = round1_upload(guided), round1_upload(plain)
    assert not torch.allclose(a["encoder.blocks.0.0.weight"], b["encoder.blocks.0.0.weight"])


# -- options and resume -----------------------------------------------------------


@pytest.mark.parametrize("explicit,needle", [
    ({"method_options": {"upload": "everything"}}, "unknown gperxan-upload 'everything'; valid choices: full, partial"),
    ({"method_options": {"lam": -1}}, "--gperxan-lam must be between 0 and 100, got -1"),
    ({"method_options": {"xan_blocks": 7}}, "--gperxan-xan-blocks must be between 1 and 4, got 7"),
    ({"method_options": {"xan_blocks": 2.5}}, "--gperxan-xan-blocks must be an integer"),
    ({"norm": "gn"}, "needs --norm xan"),
])
def test_bad_options_are_named(explicit, needle):
    cfg = resolve({"method": "gperxan", **explicit}, method_defaults=GPerXAN.profile_defaults)
    with pytest.raises(FedauditError, match=needle):
        GPerXAN(cfg)


def test_declared_shares_follow_the_upload_option():
    def configured(**options) -> GPerXAN:
        return GPerXAN(resolve({"method": "gperxan", "method_options": options}, method_defaults=GPerXAN.profile_defaults))

    default = configured()
    assert default.declared_shares() == GPerXAN.shares  # what `fedaudit list methods` prints
    assert (ArtifactKind.FULL_MODEL, "up") in default.declared_shares()
    assert ArtifactKind.BN_STATS_ALL_LAYERS not in {k for k, _ in default.declared_shares()}
    partial = {k: d for k, d in configured(upload="partial").declared_shares() if d == "up"}
    assert ArtifactKind.FULL_MODEL not in partial and partial[ArtifactKind.BN_STATS_ALL_LAYERS] == "up"


def test_killed_run_resumes_to_the_same_numbers(tmp_path, partial_run):
    """Partial mode: the resumed run carries its unscored round 1 across the checkpoint."""
    whole, _, _ = partial_run

    def kill_after_round_1(fed, rnd):
        if rnd == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path, on_round_end=kill_after_round_1, keep_artifacts=True, method_option=["upload=partial"])
    (cut_dir,) = tmp_path.iterdir()
    resumed = evaluate(resume=cut_dir)
    assert resumed.metrics["accuracy"] == whole.metrics["accuracy"]
    assert (cut_dir / "history.csv").read_text() == (whole.run_dir / "history.csv").read_text()
    assert (cut_dir / "wire.jsonl").read_text() == (whole.run_dir / "wire.jsonl").read_text()
