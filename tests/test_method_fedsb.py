"""FedSB: label smoothing, the per-round step budget, MixStyle, uniform averaging."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fedaudit.errors import FedauditError
from fedaudit.methods import fedsb
from fedaudit.methods.fedsb import FedSB
from fedaudit.models import MixStyle
from fedaudit.run.config import resolve
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind
from fedaudit.tensor_ops.losses import label_smoothing_loss


def test_label_smoothing_is_the_formula_and_differs_from_cross_entropy():
    torch.manual_seed(0)
    logits, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 3, 4, 0])
    eps = 0.2
    by_hand = 0.0
    for row, c in zip(logits, y):
        log_p = row.log_softmax(0)
        by_hand += (1 - eps) * -log_p[c] + eps * -log_p.mean()
    got = label_smoothing_loss(logits, y, eps)
    assert got.item() == pytest.approx(by_hand.item() / 6, rel=1e-6)
    assert got.item() == pytest.approx(F.cross_entropy(logits, y, label_smoothing=eps).item(), rel=1e-6)
    assert got.item() != pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-3)
    assert label_smoothing_loss(logits, y, 0.0).item() == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)


def test_mixstyle_is_identity_in_eval_and_mixes_instance_statistics_in_train():
    torch.manual_seed(0)
    # four samples with very different per-channel styles
    x = torch.randn(4, 3, 8, 8) * torch.tensor([0.5, 1.0, 2.0, 4.0]).view(4, 1, 1, 1) + torch.arange(4.0).view(4, 1, 1, 1) * 3
    ms = MixStyle(p=1.0, alpha=0.1)
    assert torch.equal(ms.eval()(x), x)
    assert torch.equal(MixStyle(p=0.0).train()(x), x)
    out = ms.train()(x)
    mu_in, mu_out = x.mean((2, 3)), out.mean((2, 3))
    sd_in, sd_out = x.std((2, 3)), out.std((2, 3))
    assert not torch.allclose(mu_out, mu_in, atol=1e-2)  # statistics moved ...
    assert (mu_out >= mu_in.min(0).values - 1e-4).all() and (mu_out <= mu_in.max(0).values + 1e-4).all()  # ... as mixes
    # the content (the instance-normalised map) is untouched
    norm = lambda t, m, s: (t - m[..., None, None]) / s[..., None, None]  # noqa: E731
    assert torch.allclose(norm(out, mu_out, sd_out), norm(x, mu_in, sd_in), atol=1e-3)


def test_options_are_validated_early():
    with pytest.raises(FedauditError, match="epsilon"):
        FedSB(resolve({"method": "fedsb", "method_options": {"epsilon": 1.0}}))
    with pytest.raises(FedauditError, match="budget"):
        FedSB(resolve({"method": "fedsb", "method_options": {"budget": 2.5}}))


@pytest.mark.parametrize("budget", [3, 9])  # under one pass of a ~225-record client (7 batches of 32), and over one
def test_every_client_runs_exactly_the_budget_each_round_with_mixstyle_and_only_full_models(tiny_run, monkeypatch, budget):
    calls: list[int] = []
    per_client: list[int] = []
    counting = lambda *a: calls.append(1) or label_smoothing_loss(*a)  # noqa: E731
    monkeypatch.setattr(fedsb, "label_smoothing_loss", counting)
    train = FedSB.local_train

    def counted(self, ctx, rnd):
        before = len(calls)
        train(self, ctx, rnd)
        per_client.append(len(calls) - before)

    monkeypatch.setattr(FedSB, "local_train", counted)
    seen = []
    result = tiny_run("fedsb", rounds=1, method_option=[f"budget={budget}"],
                      on_round_end=lambda fed, rnd: seen.append(fed))
    fed = seen[-1]
    assert per_client == [budget] * len(fed.clients)
    assert isinstance(fed.model.encoder.mixstyle, MixStyle)
    assert set(result.metrics["communication"]["by_kind"]) == {"full_model"}


def test_aggregation_is_the_uniform_mean_whatever_the_client_sizes():
    method = FedSB(resolve({"method": "fedsb"}))
    method.global_state = {"w": torch.zeros(3), "n": torch.zeros((), dtype=torch.long)}
    states = [{"w": torch.full((3,), float(v)), "n": torch.tensor(v)} for v in (1, 2, 6)]
    uploads = {f"client:{i}": [Artifact(ArtifactKind.FULL_MODEL, f"client:{i}", SERVER, 1, s)] for i, s in enumerate(states)}
    method.aggregate(SimpleNamespace(client_dp=None), uploads, 1)  # a server without client-level DP
    assert torch.allclose(method.global_state["w"], torch.full((3,), 3.0))
    assert method.global_state["n"].item() == 3
