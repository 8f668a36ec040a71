"""FedGaLA: SimCLR without labels, local and global gradient alignment, the linear probe."""

import pytest
import torch
import torch.nn.functional as F

from fedaudit.data import load_dataset, lodo_split
from fedaudit.errors import FedauditError
from fedaudit.methods.fedgala import FedGaLA, align_gradients_, align_updates
from fedaudit.run.config import resolve
from fedaudit.tensor_ops.aggregation import clone_state
from fedaudit.simulation.federation import Federation
from fedaudit.simulation.method import Scores
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, Wire
from fedaudit.tensor_ops.augment import SimCLRAugment
from fedaudit.simulation.linear_probe import fit_linear_probe, probe_on_fraction
from fedaudit.tensor_ops.losses import nt_xent_loss

DIGITS = load_dataset("digits", 16, seed=0)


def federation(train_records: int | None = None, **options) -> Federation:
    """A set-up digits federation; ``train_records`` keeps only that many training records per client (speed)."""
    opts = {"method": "fedgala", "dataset": "digits", "image_size": 16, "device": "cpu", "batch_size": 32,
            "local_epochs": 1, **options}
    cfg = resolve(opts, None, FedGaLA.profile_defaults)
    fed = Federation(cfg, FedGaLA(cfg), DIGITS, lodo_split(DIGITS, DIGITS.domains[-1], cfg.split, cfg.seed),
                     torch.device("cpu"), Wire())
    for c in fed.clients if train_records else ():
        c.data.train_x, c.data.train_y = c.data.train_x[:train_records], c.data.train_y[:train_records]
    fed.setup()
    return fed


@pytest.fixture
def no_probe(monkeypatch):
    """Skip the auditor's linear probe in tests that only look at training."""
    monkeypatch.setattr(FedGaLA, "score", lambda self, fed, model: Scores({c.domain: 0.0 for c in fed.clients}, 0.0))


def test_nt_xent_is_cross_entropy_over_the_similarity_row_without_self():
    torch.manual_seed(0)
    z1, z2 = torch.randn(4, 8), torch.randn(4, 8)
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    tau, total = 0.5, 0.0
    for i in range(8):
        partner = (i + 4) % 8
        others = [j for j in range(8) if j != i]
        logits = torch.stack([z[i] @ z[j] / tau for j in others])
        total += -(logits[others.index(partner)] - logits.logsumexp(0))
    assert nt_xent_loss(z1, z2, tau).item() == pytest.approx(total.item() / 8, rel=1e-5)
    assert nt_xent_loss(z1, z1 + 1e-3 * z2, tau) < nt_xent_loss(z1, z2, tau)  # matching views score better


def test_local_alignment_drops_a_tensor_gradient_that_opposes_the_reference_and_keeps_an_aligned_one():
    ref = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0, 1.0]), torch.tensor([1.0])]
    grads = [torch.tensor([-1.0, 0.2]), torch.tensor([0.3, 0.5, 0.1]), torch.tensor([0.0])]
    keep = align_gradients_(grads, ref, 0.0)
    assert keep.tolist() == [False, True, True]  # a zero gradient has cosine 0, which is not below 0
    assert torch.equal(grads[0], torch.zeros(2))
    assert torch.equal(grads[1], torch.tensor([0.3, 0.5, 0.1]))
    strict = [torch.tensor([0.3, 0.5, 0.1])]
    assert align_gradients_(strict, [torch.tensor([0.0, 1.0, 1.0])], 0.9).tolist() == [False]  # cos ≈ 0.76


def test_global_alignment_equals_averaging_for_agreeing_clients_and_down_weights_an_opposing_one():
    v = torch.tensor([1.0, 2.0, -1.0])
    same = torch.stack([v, v, v])
    assert torch.allclose(align_updates(same, 3), v)
    assert torch.allclose(align_updates(torch.stack([v, 2 * v, 3 * v]), 3), 2 * v)  # parallel: plain mean
    opposed = torch.stack([v, v, -v])
    assert torch.allclose(opposed.mean(0), v / 3)
    assert torch.allclose(align_updates(opposed, 3), v)  # the opposing client gets weight 0
    assert torch.allclose(align_updates(opposed, 0), v / 3)  # 0 iterations is FedAvg


def test_server_adds_the_aligned_update_per_tensor_to_the_previous_global():
    method = FedGaLA(resolve({"method": "fedgala"}))
    method.global_state = {"a": torch.ones(2), "b": torch.zeros(2), "n": torch.tensor(0)}
    ups = [{"a": torch.tensor([2.0, 2.0]), "b": torch.tensor([1.0, 0.0]), "n": torch.tensor(3)},
           {"a": torch.tensor([2.0, 2.0]), "b": torch.tensor([-1.0, 0.0]), "n": torch.tensor(3)},
           {"a": torch.tensor([0.0, 0.0]), "b": torch.tensor([1.0, 0.0]), "n": torch.tensor(6)}]
    uploads = {f"c{i}": [Artifact(ArtifactKind.FULL_MODEL, f"c{i}", SERVER, 1, s)] for i, s in enumerate(ups)}
    method.aggregate(None, uploads, 1)
    assert torch.allclose(method.global_state["a"], torch.full((2,), 2.0))  # the opposing third client is ignored
    expected_b = align_updates(torch.stack([u["b"] for u in ups]), 3)  # each tensor weighted on its own
    assert torch.allclose(method.global_state["b"], expected_b)
    assert method.global_state["n"].item() == 4


def test_local_training_never_reads_labels(no_probe):
    plain, shuffled = federation(64, rounds=2), federation(64, rounds=2)
    for c in shuffled.clients:  # permuted labels: wrong for most records, so any use of them would show
        perm = torch.randperm(c.num_samples, generator=torch.Generator().manual_seed(c.index))
        c.data.train_y = c.data.train_y[perm]
        assert (c.data.train_y != plain.clients[c.index].data.train_y).float().mean() > 0.5
    for rnd in (1, 2):  # round 2 runs the local alignment too
        plain.run_round(rnd)
        shuffled.run_round(rnd)
    a, b = plain.method.global_state, shuffled.method.global_state
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_score_is_a_linear_probe_on_the_encoder_with_a_30pct_extra():
    fed = federation()
    scores = fed.method.score(fed, fed.deployed_model())
    assert set(scores.val) == {c.domain for c in fed.clients} and set(scores.extra) == {"probe_30pct"}
    assert all(0 <= v <= 1 for v in [*scores.val.values(), scores.target, *scores.extra.values()])
    # Even a random encoder's features carry class information a probe can read; chance is 0.1.
    assert scores.target > 0.2


def test_alignment_uses_the_previous_global_from_round_two_and_can_freeze_every_tensor(no_probe):
    # A threshold of 1 drops every gradient whose cosine is below 1, i.e. all of them, once a reference exists.
    fed = federation(64, rounds=2, weight_decay=0.0, method_options={"align_threshold": 1.0})
    names = [n for n, p in fed.model.named_parameters()]

    def moved(rnd: int) -> bool:
        fed.run_round(rnd)
        up = fed.wire.retained[(ArtifactKind.FULL_MODEL.value, fed.clients[0].role, SERVER)].tensors
        down = fed.wire.retained[(ArtifactKind.FULL_MODEL.value, SERVER, fed.clients[0].role)].tensors
        return any(not torch.equal(up[n], down[n]) for n in names)

    assert moved(1)  # round 1: no reference, no alignment
    prev = clone_state({n: fed.clients[0].state["prev_global/" + n] for n in names})
    assert moved(2) is False  # round 2: Adam with zeroed gradients and fresh moments does not move
    assert any(not torch.equal(prev[n], fed.clients[0].state["prev_global/" + n]) for n in names)


def test_options_are_validated_early():
    with pytest.raises(FedauditError, match="--fedgala-align-threshold must be between -1 and 1"):
        FedGaLA(resolve({"method": "fedgala", "method_options": {"align_threshold": 2}}))
    with pytest.raises(FedauditError, match="--fedgala-global-iters must be between 0 and 100"):
        FedGaLA(resolve({"method": "fedgala", "method_options": {"global_iters": -1}}))


def test_probe_scores_separable_features_near_one_and_splits_by_class():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(5).repeat(40)
    centres = torch.randn(5, 16, generator=g) * 4
    feats = centres[y] + torch.randn(200, 16, generator=g)
    probe = fit_linear_probe(feats[:100], y[:100], 5)
    assert probe.accuracy(feats[100:], y[100:]) > 0.97
    assert probe_on_fraction(feats, y, 5, 0.1, seed=1) > 0.95  # 20 records (4 per class) suffice
    noise = torch.randn(200, 16, generator=g)
    assert probe_on_fraction(noise, y, 5, 0.3, seed=1) < 0.5


def test_simclr_views_are_deterministic_per_generator_and_respect_options():
    x = torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    aug = SimCLRAugment(hflip=False)
    a = aug(x, torch.Generator().manual_seed(3))
    assert torch.equal(a, aug(x, torch.Generator().manual_seed(3)))
    assert not torch.equal(a, aug(x, torch.Generator().manual_seed(4)))
    assert a.shape == x.shape and a.min() >= 0 and a.max() <= 1
    still = SimCLRAugment(hflip=False, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), jitter_p=0.0, gray_p=0.0)
    assert torch.allclose(still(x, torch.Generator()), x, atol=1e-5)  # every transform off: identity
    gray = SimCLRAugment(gray_p=1.0)(x, torch.Generator())
    assert torch.allclose(gray[:, 0], gray[:, 1]) and torch.allclose(gray[:, 1], gray[:, 2])
    flipped = SimCLRAugment(hflip=True, crop_scale=(1.0, 1.0), crop_ratio=(1.0, 1.0), jitter_p=0.0, gray_p=0.0)
    out = flipped(x, torch.Generator().manual_seed(0))
    is_flip = [torch.allclose(o, xi.flip(2), atol=1e-5) for o, xi in zip(out, x)]
    is_same = [torch.allclose(o, xi, atol=1e-5) for o, xi in zip(out, x)]
    assert all(f or s for f, s in zip(is_flip, is_same)) and any(is_flip)
