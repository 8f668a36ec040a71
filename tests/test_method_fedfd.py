"""FedFD / FedFD-A: statistics mechanics, the SiloBN protocol, the losses and the adapter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedaudit.errors import FedauditError
from fedaudit.methods.fedfd import FedFD, FedFDA
from fedaudit.models import bn_layers, build_model
from fedaudit.tensor_ops.mixed_bn import MixedBatchNorm2d, adapter_parameter_names, convert_to_mixed_bn, load_global_stats_, norm_mode
from fedaudit.run.config import RunConfig
from fedaudit.tensor_ops.aggregation import is_bn_buffer
from fedaudit.simulation.wire import SERVER, ArtifactKind
from fedaudit.tensor_ops.bn_statistics import aggregate_bn_stats_, bn_stat_keys, gather_bn_stats, instance_stats, mix_stats

FAST = ["local_steps=3"]  # the protocol, not the accuracy, is under test


def _model(adapter: bool, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = convert_to_mixed_bn(build_model("cnn", 10, 16), adapter=adapter)
    # Global statistics far from any batch's, so instance and global normalisation differ.
    stats = {k: (torch.rand_like(v) * 3 + 0.5 if k.endswith("var") else torch.randn_like(v)) for k, v in gather_bn_stats(model).items()}
    load_global_stats_(model, stats)
    with torch.no_grad():
        for k, v in gather_bn_stats(model).items():
            v.copy_(stats[k])
    return model


# -- statistics mechanics ------------------------------------------------------


def test_mixing_at_u0_gives_global_and_at_u1_instance_statistics():
    inst = (torch.randn(4, 6), torch.rand(4, 6) + 0.1)
    glob = (torch.randn(6), torch.rand(6) + 0.1)
    for u, (mean, std) in ((0.0, (glob[0].expand(4, 6), glob[1].expand(4, 6))), (1.0, inst)):
        got = mix_stats(inst, glob, torch.full((6,), u))
        assert torch.allclose(got[0], mean) and torch.allclose(got[1], std)
    half = mix_stats(inst, glob, torch.full((6,), 0.5))
    assert torch.allclose(half[0], (inst[0] + glob[0]) / 2)


@pytest.mark.parametrize("u", [0.0, 1.0])
def test_mixed_half_of_a_paired_batch_is_normalised_with_the_mixed_statistics(u):
    torch.manual_seed(0)
    bn = MixedBatchNorm2d(5, u_range=(u, u))
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2)
        bn.bias.normal_()
        bn.global_mean.normal_()
        bn.global_var.uniform_(0.5, 3)
    plain = torch.nn.BatchNorm2d(5)
    plain.load_state_dict(bn.state_dict())
    x = torch.randn(8, 5, 4, 4) * 3 + 1
    bn.mode = "paired"
    out = bn(torch.cat([x, x]))
    # First half: plain BatchNorm, running statistics updated from it alone.
    assert torch.allclose(out[:8], plain(x), atol=1e-5)
    assert torch.allclose(bn.running_mean, plain.running_mean) and torch.allclose(bn.running_var, plain.running_var)
    if u == 0.0:
        expected = F.batch_norm(x, bn.global_mean, bn.global_var, bn.weight, bn.bias, training=False, eps=bn.eps)
    else:
        expected = F.instance_norm(x, weight=bn.weight, bias=bn.bias, eps=bn.eps)
    assert torch.allclose(out[8:], expected, atol=1e-4)


def test_pooled_global_statistics_are_those_of_the_concatenated_data():
    torch.manual_seed(0)
    data = [torch.randn(n, 3) * s + m for n, s, m in ((50, 1.0, -2.0), (120, 0.5, 0.0), (30, 2.0, 3.0))]
    stats = [{"bn.running_mean": d.mean(0), "bn.running_var": d.var(0, unbiased=False)} for d in data]
    weights = [float(len(d)) for d in data]
    out = {"bn.running_mean": torch.zeros(3), "bn.running_var": torch.zeros(3)}
    aggregate_bn_stats_(out, stats, weights)
    union = torch.cat(data)
    assert torch.allclose(out["bn.running_mean"], union.mean(0), atol=1e-5)
    assert torch.allclose(out["bn.running_var"], union.var(0, unbiased=False), atol=1e-4)
    # A FedAvg of the buffers misses the spread of the client means.
    averaged = {k: torch.zeros(3) for k in out}
    aggregate_bn_stats_(averaged, stats, weights, pooled=False)
    assert (averaged["bn.running_var"] < out["bn.running_var"] - 1).all()


def test_instance_statistics_are_per_image_per_channel():
    x = torch.randn(3, 4, 5, 5)
    mean, std = instance_stats(x, 1e-5)
    assert mean.shape == std.shape == (3, 4)
    assert torch.allclose(std, (x.var(dim=(2, 3), unbiased=False) + 1e-5).sqrt())


# -- protocol ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["fedfd", "fedfd_a"])
def test_running_statistics_travel_only_as_bn_stats_and_global_stats(tiny_run, name):
    seen = {}
    tiny_run(name, rounds=1, method_option=FAST, on_round_end=lambda fed, rnd: seen.setdefault("fed", fed))
    fed = seen["fed"]
    stat_keys = set(bn_stat_keys(fed.model))
    weight_keys = {k for k in fed.model.state_dict() if not is_bn_buffer(k)}
    arts = fed.wire.view(SERVER).artifacts
    by_kind = {}
    for a in arts:
        by_kind.setdefault((a.kind, a.sender == SERVER), []).append(a)
    for (kind, down), sent in by_kind.items():
        keys = {frozenset(a.tensors) for a in sent}
        assert len(keys) == 1, kind
        (keys,) = keys
        if kind == ArtifactKind.PARTIAL_MODEL:
            assert keys == weight_keys and not any(is_bn_buffer(k) for k in keys)
            assert {f"{n}.{p}" for n, _ in bn_layers(fed.model) for p in ("weight", "bias")} <= keys  # BN affine is shared
        elif kind in (ArtifactKind.BN_STATS_ALL_LAYERS, ArtifactKind.GLOBAL_STATS):
            assert keys == stat_keys and len(stat_keys) == 8  # 4 BN layers × mean, var
            assert kind == (ArtifactKind.GLOBAL_STATS if down else ArtifactKind.BN_STATS_ALL_LAYERS)
    assert {(k, d) for k, d in by_kind} >= {(ArtifactKind.GLOBAL_STATS, True), (ArtifactKind.BN_STATS_ALL_LAYERS, False)}
    adapters = adapter_parameter_names(fed.model)
    assert bool(adapters) == (name == "fedfd_a") and adapters <= weight_keys


def test_silobn_each_client_trains_with_its_own_running_statistics(tiny_run, monkeypatch):
    at_start, after_round_1, uploads = {}, {}, {}
    original = FedFD.local_train

    def spy(self, ctx, rnd):
        at_start[ctx.client.domain, rnd] = {k: v.clone() for k, v in gather_bn_stats(ctx.model).items()}
        original(self, ctx, rnd)

    def on_round_end(fed, rnd):
        if rnd == 1:
            for c in fed.clients:
                after_round_1[c.domain] = {k: c.state[k].clone() for k in bn_stat_keys(fed.model)}
                uploads[c.domain] = fed.wire.view(SERVER).latest(ArtifactKind.BN_STATS_ALL_LAYERS, c.role).tensors

    monkeypatch.setattr(FedFD, "local_train", spy)
    tiny_run("fedfd", rounds=2, method_option=FAST, on_round_end=on_round_end)
    domains = sorted(after_round_1)
    key = "encoder.blocks.0.1.running_mean"
    for a, b in zip(domains, domains[1:]):
        assert not torch.allclose(after_round_1[a][key], after_round_1[b][key], atol=1e-3)  # local, not shared
    for d in domains:
        for k, v in after_round_1[d].items():
            assert torch.equal(at_start[d, 2][k], v), (d, k)  # restored for that client's round-2 training
            assert torch.equal(uploads[d][k], v), (d, k)  # and what it uploaded


def test_fedfd_a_resumes_to_the_same_run(tiny_run, tmp_path):
    whole = tiny_run("fedfd_a", rounds=2, method_option=FAST, out=str(tmp_path / "whole"))

    def cut(fed, rnd):
        if rnd == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tiny_run("fedfd_a", rounds=2, method_option=FAST, out=str(tmp_path / "cut"), on_round_end=cut)
    (cut_dir,) = (tmp_path / "cut").iterdir()
    from fedaudit.api import evaluate

    evaluate(resume=cut_dir)
    assert (cut_dir / "history.csv").read_text() == (whole.run_dir / "history.csv").read_text()


# -- losses and adapter --------------------------------------------------------


def _grads(method: FedFD, model: torch.nn.Module, x, y, seed: int = 1) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    method.loss(model, x, y).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch():
    torch.manual_seed(3)
    return torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))


@pytest.mark.parametrize("option", ["lambda1", "lambda2"])
def test_each_client_agnostic_loss_changes_the_gradient(option):
    model, (x, y) = _model(adapter=False).train(), _batch()
    full = _grads(FedFD(RunConfig(method="fedfd")), model, x, y)
    without = _grads(FedFD(RunConfig(method="fedfd", method_options={option: 0.0})), model, x, y)
    name = "encoder.blocks.0.0.weight"
    assert not torch.allclose(full[name], without[name], atol=1e-6)


def test_without_both_losses_the_objective_is_plain_cross_entropy():
    model, (x, y) = _model(adapter=False).train(), _batch()
    method = FedFD(RunConfig(method="fedfd", method_options={"lambda1": 0.0, "lambda2": 0.0}))
    loss = method.loss(model, x, y)
    reference = _model(adapter=False).train()
    assert torch.allclose(loss, F.cross_entropy(reference(x), y), atol=1e-5)


def test_adapter_loss_trains_only_the_adapter():
    model, (x, y) = _model(adapter=True).train(), _batch()
    main = _grads(FedFD(RunConfig(method="fedfd")), model, x, y)
    both = _grads(FedFDA(RunConfig(method="fedfd_a")), model, x, y)
    adapters = adapter_parameter_names(model)
    assert set(both) - set(main) == adapters  # the main loss never reaches the adapter
    assert all(both[k].abs().sum() > 0 for k in adapters)
    assert all(torch.allclose(main[k], both[k], atol=1e-6) for k in main)  # nor the adapter's CE the main weights


def _set_adapters(model, delta: float, eps: float) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MixedBatchNorm2d):
                m.adapter[-1].weight.zero_()
                m.adapter[-1].bias.copy_(torch.tensor([delta, eps]))


def test_fedfd_a_predicts_with_the_adapter_and_deterministically_at_test_time():
    model, (x, _) = _model(adapter=True).eval(), _batch()
    plain = FedFD(RunConfig(method="fedfd")).predict(model, x)
    adapted = FedFDA(RunConfig(method="fedfd_a"))
    _set_adapters(model, delta=5.0, eps=0.5)
    first = adapted.predict(model, x)
    assert not torch.allclose(first, plain, atol=1e-3)  # α = 0.5: instance statistics enter
    assert torch.equal(first, adapted.predict(model, x))  # z is not drawn at test time
    _set_adapters(model, delta=5.0, eps=-1.0)
    assert torch.allclose(adapted.predict(model, x), plain, atol=1e-5)  # α = clamp(ε) = 0: global statistics only
    model.train()
    with norm_mode(model, "adapt"):
        assert not torch.allclose(model(x), model(x))  # in training α = clamp(z·δ + ε) is random


def test_invalid_options_and_norms_are_refused_by_name():
    with pytest.raises(FedauditError, match="fedfd-global-stats 'median'; valid choices: mean, pooled"):
        FedFD(RunConfig(method="fedfd", method_options={"global_stats": "median"}))
    with pytest.raises(FedauditError, match="--fedfd-lambda1 must be between 0 and 1, got 2"):
        FedFD(RunConfig(method="fedfd", method_options={"lambda1": 2}))
    with pytest.raises(FedauditError, match="--fedfd-a-local-steps must be between 1 and"):
        FedFDA(RunConfig(method="fedfd_a", method_options={"local_steps": 0}))
    with pytest.raises(FedauditError, match="--norm bn"):
        FedFD(RunConfig(method="fedfd", norm="gn"))
    with pytest.raises(FedauditError, match="--fedfd-u-min must not exceed --fedfd-u-max"):
        FedFD(RunConfig(method="fedfd", method_options={"u_min": 0.8, "u_max": 0.2}))
