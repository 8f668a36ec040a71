"""ELCFS: the amplitude bank on the wire, the frequency-space interpolation, the episodic step."""

import copy
import json
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from fedaudit.api import evaluate
from fedaudit.errors import FedauditError
from fedaudit.methods import elcfs
from fedaudit.methods.elcfs import ELCFS, bank_size, episodic_backward
from fedaudit.models import build_model
from fedaudit.run import run_directory
from fedaudit.run.config import resolve
from fedaudit.simulation.wire import SERVER, ArtifactKind
from fedaudit.tensor_ops.fourier import amplitude_spectrum, interpolate_low_frequency, low_frequency_mask

FAST = dict(local_epochs=1, split=(0.2, 0.1, 0.7))  # ~90 training records per digits client: 2 batches per epoch


def ledger(run_dir):
    return [json.loads(line) for line in (run_dir / "wire.jsonl").read_text().splitlines()]


def uploaded_spectra(fed):
    """What each client put in the bank, as the server received it."""
    view = fed.wire.view(SERVER)
    return {c.domain: view.latest(ArtifactKind.AMPLITUDE_BANK, c.role).tensors["amplitude"] for c in fed.clients}


# -- the frequency-space interpolation ---------------------------------------------


def test_interpolation_keeps_the_phase_and_moves_only_low_frequency_amplitude_toward_the_other():
    torch.manual_seed(0)
    x = torch.rand(4, 3, 16, 16)
    other = amplitude_spectrum(torch.rand(4, 3, 16, 16) * 0.3)  # a darker, different "domain"
    # ratio 0 (empty window) or λ = 0 is the identity
    assert torch.allclose(interpolate_low_frequency(x, other, 0.0, 0.7), x, atol=1e-5)
    assert torch.allclose(interpolate_low_frequency(x, other, 0.1, 0.0), x, atol=1e-5)

    ratio, lam = torch.tensor([0.1, 0.1, 0.05, 0.1]), torch.tensor([0.5, 1.0, 1.0, 0.25])
    out = interpolate_low_frequency(x, other, ratio, lam, value_range=None)
    mask = low_frequency_mask(16, 16, ratio).expand_as(x)
    # |u|, |v| < 1.6: the 3×3 square around DC (wrapping: 0, 1, 15); r = 0.05 keeps DC only
    assert mask[0, 0].sum() == 9 and mask[0, 0, 0, 0] and mask[0, 0, 15, 15] and not mask[0, 0, 8, 8]
    assert mask[2, 0].sum() == 1
    spec_in, spec_out = torch.fft.fft2(x), torch.fft.fft2(out)
    a_in, a_out = spec_in.abs(), spec_out.abs()
    expected_low = a_in + lam.view(-1, 1, 1, 1) * (other - a_in)
    assert torch.allclose(a_out[mask], expected_low[mask], atol=1e-4)
    assert ((a_out - other).abs()[mask] <= (a_in - other).abs()[mask] + 1e-4).all()  # moved toward the other
    assert not torch.allclose(a_out[mask], a_in[mask], atol=1e-2)
    assert torch.allclose(a_out[~mask], a_in[~mask], atol=1e-4)  # high frequencies untouched
    both = (a_in > 1e-3) & (a_out > 1e-3)
    assert torch.angle(spec_out * spec_in.conj())[both].abs().max() < 1e-3  # same phase
    clamped = interpolate_low_frequency(x, other, ratio, lam)  # the default clamps to the pixel range
    assert clamped.min() >= 0 and clamped.max() <= 1 and not torch.allclose(clamped, x, atol=1e-2)


# -- the wire --------------------------------------------------------------------


def test_each_client_uploads_the_spectra_of_a_fraction_of_its_images_once_and_gets_the_whole_bank_once(tiny_run):
    seen = []
    result = tiny_run("elcfs", rounds=2, method_options={"fraction": 0.1}, on_round_end=lambda fed, rnd: seen.append(fed),
                      **FAST)
    fed = seen[-1]
    rows = ledger(result.run_dir)
    per_image = 3 * 16 * 16 * 4  # one float32 spectrum per image and channel
    counts = {c.domain: max(1, round(0.1 * c.num_samples)) for c in fed.clients}
    bank_bytes = sum(counts.values()) * per_image

    banks = [r for r in rows if r["kind"] == "amplitude_bank"]
    assert {r["round"] for r in banks} == {0}
    ups = {r["sender"]: r["bytes"] for r in banks if r["direction"] == "up"}
    assert ups == {f"client:{d}": n * per_image for d, n in counts.items()}
    downs = Counter(r["receiver"] for r in banks if r["direction"] == "down")
    assert downs == Counter({f"client:{d}": 1 for d in counts})
    assert {r["bytes"] for r in banks if r["direction"] == "down"} == {bank_bytes}
    assert len(banks) == 2 * len(counts)
    sent = Counter((r["kind"], r["direction"], r["round"]) for r in rows if r["kind"] != "amplitude_bank")
    assert sent == Counter({(k, d, rnd): len(counts) for rnd in (1, 2)
                            for k, d in (("full_model", "down"), ("full_model", "up"), ("scalars", "up"))})

    spectra = uploaded_spectra(fed)
    for client in fed.clients:
        up = spectra[client.domain]
        assert up.shape == (counts[client.domain], 3, 16, 16) and up.dtype == torch.float32
        # each uploaded spectrum is |FFT2| of a distinct training image of that client, in [0, 1]
        own = amplitude_spectrum(client.data.train_x.float() / 255.0)
        dist, match = torch.cdist(up.flatten(1), own.flatten(1), compute_mode="donot_use_mm_for_euclid_dist").min(1)
        assert dist.max() < 1e-3 and match.unique().numel() == up.shape[0]
        # the bank it received holds every source domain's spectra; it keeps the others'
        got = fed.wire.view(client.role).latest(ArtifactKind.AMPLITUDE_BANK, SERVER).tensors
        assert set(got) == {f"{d}/amplitude" for d in counts}
        kept = {k for k in client.state if k.startswith(elcfs.BANK)}
        assert kept == {f"{elcfs.BANK}{d}/amplitude" for d in counts if d != client.domain}
        for d in counts:
            if d != client.domain:
                assert torch.equal(client.state[f"{elcfs.BANK}{d}/amplitude"], spectra[d])


def test_bank_size_rounds_and_sends_at_least_one():
    assert bank_size(225, 1.0) == 225 and bank_size(225, 0.1) == 22 and bank_size(40, 1e-6) == 1


def test_a_killed_run_resumes_with_the_bank_it_received(tiny_run, tmp_path):
    whole = tiny_run("elcfs", rounds=2, out=str(tmp_path / "whole"), **FAST)

    def kill_after_round_1(fed, rnd):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tiny_run("elcfs", rounds=2, out=str(tmp_path / "cut"), on_round_end=kill_after_round_1, **FAST)
    (cut_dir,) = (tmp_path / "cut").iterdir()
    resumed = evaluate(resume=cut_dir)  # the bank is not sent again: round 2 must find it in client.state
    for key in ("accuracy", "communication"):
        assert resumed.metrics[key] == whole.metrics[key], key
    assert (cut_dir / "history.csv").read_text() == (whole.run_dir / "history.csv").read_text()
    assert run_directory.is_complete(cut_dir)


# -- the episodic step -------------------------------------------------------------


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_episodic_gradient_is_inner_gradient_plus_outer_gradient_on_the_transformed_batch_at_the_inner_weights():
    torch.manual_seed(0)
    model = build_model("cnn", 10, 16).train()
    x_raw, x_mixed, y = torch.randn(8, 3, 16, 16), torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    alpha = 0.5

    def grad_at(m, x):
        m.zero_grad(set_to_none=True)
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        return _grads(m), loss.item()

    g_in, l_in = grad_at(copy.deepcopy(model), x_raw)
    inner = copy.deepcopy(model)
    with torch.no_grad():
        for p, g in zip(inner.parameters(), g_in):
            p.sub_(alpha * g)
    g_out, l_out = grad_at(inner, x_mixed)
    g_out_at_theta, _ = grad_at(copy.deepcopy(model), x_mixed)
    expected = [a + b for a, b in zip(g_in, g_out)]

    model.zero_grad(set_to_none=True)
    loss = episodic_backward(model, x_raw, x_mixed, y, alpha)
    got = _grads(model)
    assert loss.item() == pytest.approx(l_in + l_out, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5, rtol=1e-4) for a, b in zip(got, expected))
    # sensitivity: evaluating the outer loss at θ, or on the raw batch, gives something else
    far = lambda ref: max((a - b).abs().max().item() for a, b in zip(got, ref))  # noqa: E731
    assert far([a + b for a, b in zip(g_in, g_out_at_theta)]) > 1e-3
    assert far([2 * a for a in g_in]) > 1e-3

    # with no inner step and no transform the update is twice the plain gradient step
    model.zero_grad(set_to_none=True)
    episodic_backward(model, x_raw, x_raw, y, 0.0)
    plain, _ = grad_at(copy.deepcopy(model), x_raw)
    assert all(torch.allclose(a, 2 * b, atol=1e-6, rtol=1e-5) for a, b in zip(_grads(model), plain))


def test_local_training_steps_on_the_raw_batch_and_its_transform_with_other_clients_spectra(tiny_run, monkeypatch):
    calls = []  # one per local step: (client, interpolation inputs and output, the two views given to the step)
    current = {}
    train, interpolate, step = ELCFS.local_train, elcfs.interpolate_low_frequency, elcfs.episodic_backward

    def local_train(self, ctx, rnd):
        current["domain"] = ctx.client.domain
        train(self, ctx, rnd)

    def spy_interpolate(images, amplitude, ratio, lam, **kw):
        out = interpolate(images, amplitude, ratio, lam, **kw)
        calls.append({"domain": current["domain"], "images": images, "amplitude": amplitude, "ratio": ratio,
                      "lam": lam, "out": out})
        return out

    def spy_step(model, x_raw, x_mixed, y, inner_lr, precision="fp32"):
        calls[-1].update(x_raw=x_raw, x_mixed=x_mixed, inner_lr=inner_lr)
        return step(model, x_raw, x_mixed, y, inner_lr, precision)

    monkeypatch.setattr(ELCFS, "local_train", local_train)
    monkeypatch.setattr(elcfs, "interpolate_low_frequency", spy_interpolate)
    monkeypatch.setattr(elcfs, "episodic_backward", spy_step)
    seen = []
    tiny_run("elcfs", rounds=1, augment=False, on_round_end=lambda fed, rnd: seen.append(fed), **FAST)
    fed = seen[-1]
    assert calls and all("x_mixed" in c for c in calls)  # the transform runs once per step, before it
    pre = fed.preprocess
    unnormalise = lambda x: x * pre.std + pre.mean  # noqa: E731
    spectra = uploaded_spectra(fed)
    domains = list(spectra)
    bank = torch.cat([spectra[d] for d in domains]).flatten(1)
    owner = torch.cat([torch.full((spectra[d].shape[0],), i) for i, d in enumerate(domains)])
    used = set()
    for c in calls:
        assert c["inner_lr"] == 0.01  # quick profile's α
        assert torch.allclose(unnormalise(c["x_raw"]), c["images"], atol=1e-5)  # inner: the raw batch
        assert torch.allclose(unnormalise(c["x_mixed"]), c["out"], atol=1e-5)  # outer: its transform
        assert ((c["ratio"] >= 0) & (c["ratio"] <= 0.1)).all() and ((c["lam"] >= 0) & (c["lam"] <= 1)).all()
        dist, row = torch.cdist(c["amplitude"].flatten(1), bank, compute_mode="donot_use_mm_for_euclid_dist").min(1)
        assert dist.max() < 1e-4  # every mixing partner is a spectrum from the bank ...
        partners = {domains[i] for i in owner[row].tolist()}
        assert c["domain"] not in partners  # ... of another client
        used |= {(c["domain"], p) for p in partners}
    assert len(used) == len(domains) * (len(domains) - 1)  # every client mixed with every other
    assert any(not torch.allclose(c["out"], c["images"], atol=1e-3) for c in calls)


# -- options -------------------------------------------------------------------------


@pytest.mark.parametrize("key,value", [("fraction", 0), ("fraction", 1.5), ("fraction", -0.1), ("fraction", "all"),
                                       ("inner_lr", -1e-3), ("max_window", 0.7)])
def test_bad_options_are_refused_naming_the_option(key, value):
    with pytest.raises(FedauditError, match=f"--elcfs-{key.replace('_', '-')} must be"):
        ELCFS(resolve({"method": "elcfs", "method_options": {key: value}}))
