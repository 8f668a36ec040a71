"""CCST: the style definition and AdaIN, the one-off style exchange on the wire,
styles measured through the frozen round-0 first block, bank styles applied
in local training, option checks, resume."""

import json
from collections import Counter

import pytest
import torch

from fedaudit.api import evaluate
from fedaudit.errors import FedauditError
from fedaudit.methods import ccst
from fedaudit.methods.ccst import CCST, BankStyleTransfer
from fedaudit.models import build_model
from fedaudit.models.cnn import WIDTHS
from fedaudit.run import run_directory
from fedaudit.run.config import resolve
from fedaudit.run.seeds import derive_seed
from fedaudit.simulation.wire import SERVER
from fedaudit.tensor_ops.style import adain, feature_style, pooled_feature_style

TINY = dict(attack="none", dataset="digits", image_size=16, rounds=2, local_epochs=1, batch_size=32, device="cpu")
C = WIDTHS[0]  # channels of the CNN's first block: the style's width


def ledger(run_dir):
    return [json.loads(line) for line in (run_dir / "wire.jsonl").read_text().splitlines()]


# -- the style definition and AdaIN ---------------------------------------------------


def test_feature_style_is_the_biased_channel_statistics_and_pooling_spans_all_images():
    torch.manual_seed(0)
    x = torch.randn(5, 4, 6, 7) * torch.rand(5, 4, 1, 1) * 3 + torch.randn(5, 4, 1, 1)
    mean, std = feature_style(x)
    assert mean.shape == std.shape == (5, 4) and mean.dtype == torch.float32
    assert torch.allclose(mean, x.mean((2, 3)), atol=1e-6)
    assert torch.allclose(std, (x.var((2, 3), unbiased=False) + 1e-5).sqrt(), atol=1e-6)
    # overall: one style over N·H·W, whatever the batching
    pooled = pooled_feature_style([x[:2], x[2:]])
    assert torch.allclose(pooled[0][0], x.mean((0, 2, 3)), atol=1e-5)
    assert torch.allclose(pooled[1][0], (x.var((0, 2, 3), unbiased=False) + 1e-5).sqrt(), atol=1e-5)
    assert not torch.allclose(pooled[1][0], std.mean(0), atol=1e-2)  # not the mean of per-image stds


def test_adain_output_carries_the_target_style_and_alpha_zero_leaves_features_unchanged():
    torch.manual_seed(0)
    content = torch.randn(3, 8, 10, 10) * 2 + 1
    target_mean, target_std = torch.randn(3, 8), torch.rand(3, 8) + 0.5
    out = adain(content, target_mean, target_std)
    got_mean, got_std = feature_style(out)
    assert torch.allclose(got_mean, target_mean, atol=1e-4)
    assert torch.allclose(got_std, target_std, atol=1e-3)
    # the content (the instance-normalised map) is kept
    norm = lambda t: (t - t.mean((2, 3), keepdim=True)) / t.std((2, 3), keepdim=True)  # noqa: E731
    assert torch.allclose(norm(out), norm(content), atol=1e-3)
    # α interpolates per image; α = 0 is the identity, bit for bit
    alpha = torch.tensor([0.0, 0.5, 1.0])
    mixed = adain(content, target_mean, target_std, alpha=alpha)
    assert torch.equal(mixed[0], content[0])
    assert torch.allclose(mixed[1], (content[1] + out[1]) / 2, atol=1e-5)
    assert torch.allclose(mixed[2], out[2], atol=1e-6)
    assert torch.equal(adain(content, target_mean, target_std, alpha=0.0), content)


def test_transfer_slot_is_identity_unless_a_bank_is_loaded_and_never_uses_the_own_style():
    torch.manual_seed(0)
    x = torch.rand(64, 4, 5, 5)
    slot = BankStyleTransfer().train()
    assert torch.equal(slot(x), x)  # no bank: identity, even in train mode
    m, s = 3, 2
    mean = torch.arange(m * s * 4, dtype=torch.float32).view(m, s, 4) * 10  # every entry distinguishable
    std = torch.ones(m, s, 4)
    slot.load(mean, std, own=1, generator=torch.Generator().manual_seed(0))
    seen = []
    real = ccst.adain

    def spy(content, style_mean, style_std, eps, alpha):
        seen.append((style_mean, alpha))
        return real(content, style_mean, style_std, eps, alpha)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ccst, "adain", spy)
        out = slot(x)
    (style_mean, alpha), = seen
    own_rows = mean[1]
    assert not any(torch.equal(row, own) for row in style_mean for own in own_rows)
    unchanged = alpha == 0
    assert 0 < unchanged.sum() < 64  # about 1/M of the samples keep their own style
    assert torch.equal(out[unchanged], x[unchanged]) and not torch.allclose(out[~unchanged], x[~unchanged])
    slot.unload()
    assert torch.equal(slot(x), x)


@pytest.mark.parametrize("arch", ["cnn", "resnet18"])
def test_model_keeps_every_state_key_and_freezes_only_the_first_block(arch):
    plain = build_model(arch, 10, 16)

    class Fed:  # build_model only asks the federation for the default model
        def build_default_model(self):
            return build_model(arch, 10, 16)

    model = CCST(resolve({"method": "ccst"})).build_model(Fed())
    assert list(model.state_dict()) == list(plain.state_dict())
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    expected = {"cnn": {"encoder.blocks.0.0.weight", "encoder.blocks.0.1.weight", "encoder.blocks.0.1.bias"},
                "resnet18": {"encoder.backbone.conv1.weight", "encoder.backbone.bn1.weight", "encoder.backbone.bn1.bias"}}
    assert frozen == expected[arch]
    assert sum(isinstance(m, BankStyleTransfer) for m in model.modules()) == 1


# -- a whole (tiny) run: wire, styles, local training -----------------------------------


@pytest.fixture(scope="module")
def overall_run(tmp_path_factory):
    """A 2-round run with style=overall, spying on every AdaIN call (and which client made it)."""
    torch.set_num_threads(2)
    calls, current, feds = [], [], []
    real_adain, real_train = ccst.adain, CCST.local_train

    def spy(content, style_mean, style_std, eps, alpha):
        calls.append((current[-1], style_mean.detach().clone(), style_std.detach().clone(), alpha.detach().clone()))
        return real_adain(content, style_mean, style_std, eps, alpha)

    def train(self, ctx, rnd):
        current.append(ctx.client.domain)
        real_train(self, ctx, rnd)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ccst, "adain", spy)
        mp.setattr(CCST, "local_train", train)
        result = evaluate("ccst", out=str(tmp_path_factory.mktemp("ccst")), on_round_end=lambda fed, rnd: feds.append(fed),
                          **TINY)
    return result, feds[-1], calls


def _check_style_bank_rows(rows, clients, styles_per_client):
    bank = [r for r in rows if r["kind"] == "style_bank"]
    up = [r for r in bank if r["direction"] == "up"]
    down = [r for r in bank if r["direction"] == "down"]
    one_style = 2 * C * 4  # mean and std, C float32 each
    assert sorted(r["sender"] for r in up) == sorted(clients)  # each client uploads once ...
    assert {r["round"] for r in bank} == {0}  # ... before round 1, never again
    assert all(r["receiver"] == SERVER and r["bytes"] == styles_per_client * one_style and r["tensors"] == 2 for r in up)
    assert sorted(r["receiver"] for r in down) == sorted(clients)  # and receives the whole bank once
    assert all(r["bytes"] == len(clients) * styles_per_client * one_style and r["tensors"] == 2 * len(clients)
               for r in down)
    sent = Counter((r["kind"], r["sender"], r["receiver"], r["round"]) for r in rows)
    for c in clients:
        for rnd in (1, 2):
            assert sent[("full_model", SERVER, c, rnd)] == sent[("full_model", c, SERVER, rnd)] == 1
            assert sent[("scalars", c, SERVER, rnd)] == 1


def test_overall_style_goes_up_once_per_client_and_the_whole_bank_comes_down_once(overall_run):
    result, fed, _ = overall_run
    clients = [c.role for c in fed.clients]
    _check_style_bank_rows(ledger(result.run_dir), clients, styles_per_client=1)
    bank = {k: v for k, v in fed.wire.retained.items() if k[0] == "style_bank"}
    for c in fed.clients:
        up = bank[("style_bank", c.role, SERVER)].tensors
        assert up["mean"].shape == up["std"].shape == (1, C) and up["mean"].dtype == torch.float32
        down = bank[("style_bank", SERVER, c.role)].tensors
        for other in fed.clients:  # what each client holds is every client's upload
            sent = bank[("style_bank", other.role, SERVER)].tensors
            assert torch.equal(down[f"{other.domain}/mean"], sent["mean"])
            assert torch.equal(c.state[f"{ccst.BANK}{other.domain}/std"], sent["std"])


def test_single_style_sends_k_styles_per_client(tiny_run):
    result = tiny_run("ccst", local_epochs=1, method_options={"style": "single", "k": 2})
    rows = ledger(result.run_dir)
    clients = [f"client:{d}" for d in result.metrics["source_domains"]]
    _check_style_bank_rows(rows, clients, styles_per_client=2)


def test_uploaded_style_is_the_clients_images_through_the_frozen_round0_first_block(overall_run):
    _, fed, _ = overall_run
    cfg = fed.cfg
    torch.manual_seed(derive_seed(cfg.seed, 0))  # the federation's initialisation, rebuilt independently
    round0 = build_model(cfg.model, len(fed.dataset.classes), cfg.image_size, norm=cfg.norm)
    block = round0.encoder.blocks[0].eval()
    for c in fed.clients:
        with torch.no_grad():
            f = block(fed.preprocess(c.data.train_x))
        mean, std = f.mean((0, 2, 3)), (f.var((0, 2, 3), unbiased=False) + 1e-5).sqrt()
        up = fed.wire.retained[("style_bank", c.role, SERVER)].tensors
        assert torch.allclose(up["mean"][0], mean, atol=1e-5) and torch.allclose(up["std"][0], std, atol=1e-5)
    # The first block never moved (weights and BN buffers: it ran in eval mode), neither in what the clients
    # uploaded after their last local training nor at the server, so the bank stays meaningful; the rest trained.
    final = fed.method.global_state
    uploads = [fed.wire.retained[("full_model", c.role, SERVER)].tensors for c in fed.clients]
    for k, v in round0.state_dict().items():
        if k.startswith("encoder.blocks.0."):
            assert torch.equal(final[k], v), k
            assert all(torch.equal(up[k], v) for up in uploads), k
    assert not torch.allclose(final["encoder.blocks.1.0.weight"], round0.state_dict()["encoder.blocks.1.0.weight"])


def test_local_training_restyles_toward_the_other_clients_bank_styles(overall_run):
    _, fed, calls = overall_run
    ups = {c.domain: fed.wire.retained[("style_bank", c.role, SERVER)].tensors for c in fed.clients}
    assert calls, "local training never applied AdaIN"
    used = Counter()
    restyled = total = 0
    for domain, style_mean, style_std, alpha in calls:
        for row_mean, row_std in zip(style_mean, style_std):
            match = [d for d, up in ups.items()
                     if torch.equal(row_mean, up["mean"][0]) and torch.equal(row_std, up["std"][0])]
            assert len(match) == 1 and match[0] != domain  # a bank style, of another client
            used[domain, match[0]] += 1
        restyled += int((alpha > 0).sum())
        total += alpha.numel()
    others = {(c.domain, o.domain) for c in fed.clients for o in fed.clients if o is not c}
    assert set(used) == others  # every client restyles toward every other client
    assert 0.5 < restyled / total < 0.8  # CCST keeps the own style for 1/M of the samples (M = 3)


# -- options and resume ---------------------------------------------------------------


@pytest.mark.parametrize("opts, name", [({"style": "mixed"}, "style"), ({"style": 3}, "style"), ({"k": 0}, "k"),
                                        ({"k": 1.5}, "k"), ({"k": "three"}, "k"), ({"bank": 1}, "bank")])
def test_bad_options_are_refused_naming_the_option(opts, name):
    with pytest.raises(FedauditError, match=rf"\b{name}\b"):
        CCST(resolve({"method": "ccst", "method_options": opts}))


def test_k_larger_than_a_clients_training_set_is_refused_before_anything_is_sent(tiny_run):
    with pytest.raises(FedauditError, match=r"option k of ccst .* has only \d+ training images"):
        tiny_run("ccst", method_options={"style": "single", "k": 100_000})


def test_killed_run_resumes_with_the_bank_it_received(overall_run, tmp_path):
    whole, _, _ = overall_run
    torch.set_num_threads(2)  # as the whole run trained: a sum over 1 thread and over 2 differ in the last digit

    def cut(fed, rnd):
        if rnd == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate("ccst", out=str(tmp_path / "cut"), on_round_end=cut, **TINY)
    (cut_dir,) = (tmp_path / "cut").iterdir()
    resumed = evaluate(resume=cut_dir)
    assert run_directory.is_complete(cut_dir)
    assert (cut_dir / "history.csv").read_text() == (whole.run_dir / "history.csv").read_text()
    assert (cut_dir / "wire.jsonl").read_text() == (whole.run_dir / "wire.jsonl").read_text()
    assert resumed.metrics["accuracy"] == whole.metrics["accuracy"]
