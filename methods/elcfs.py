"""FedDG-ELCFS — FedDG: Federated Domain Generalization on Medical Image
Segmentation via Episodic Learning in Continuous Frequency Space (Liu, Chen,
Qin, Dou and Heng, CVPR 2021).

Once, before round 1, every client uploads the Fourier amplitude spectra
``|FFT2(x)|`` of its training images (``fraction`` of them, default all;
:mod:`fedaudit.tensor_ops.fourier` defines the spectrum: full, unshifted, of the raw
[0, 1] images, one per image and channel, shaped like the images) and the
server broadcasts the whole bank to every client.

Local training, per batch (``episodic_backward``):

1. continuous frequency-space interpolation: each image's amplitude, inside
   a low-frequency window of size ratio L ~ U(0, ``max_window``), moves toward
   a spectrum drawn from the bank of another client (that client uniformly,
   then one of its spectra uniformly) by λ ~ U(0, 1); the phase is kept and
   the inverse DFT's real part, clamped to [0, 1], is the transformed image;
2. inner step on the raw batch: θ' = θ − α·∇L_in(θ) (α = ``inner_lr``);
3. outer loss on the transformed batch at the inner weights, L_out(θ');
4. θ is updated by the optimizer with ∇L_in(θ) + ∇L_out(θ').

Aggregation is FedAvg's sample-weighted mean of every tensor.

Wire: ``AMPLITUDE_BANK`` up (one per client, ``{"amplitude": (n, C, H, W)}``
float32) and down (the same bank, ``{"<domain>/amplitude": ...}`` for every
source domain, to every client), both once at round 0; every round
``FULL_MODEL`` down and up and the sample count up as ``SCALARS``.

Profiles: ``quick`` is fedavg's quick (cnn, SGD lr 0.01, batch 32, 3 local
epochs, 20 rounds) with α = 0.01, the outer learning rate, as in the
authors' setting where both are 1e-3. ``paper``: Adam lr 1e-3, α = 1e-3,
1 local epoch, 100 rounds, no weight decay (the authors' released training
script; the paper's text is not in seeds/ and was not checked), on the
engine's paper-profile ResNet-18 at 64 px, batch 32.

Deviations from the paper and why:

* Classification, not segmentation: the loss is cross-entropy and the
  boundary-oriented episodic (contrastive) loss, which needs segmentation
  masks, is left out; ``L_out`` is the task loss alone.
* First-order meta-gradient: ∇L_in(θ) enters θ' as a constant, so
  ∂θ'/∂θ = I — the authors' code computes it the same way (no second-order
  graph). Their clamp of the inner gradient to ±100 is kept.
* The logged ``train_loss`` is L_in + L_out, the objective being minimised
  (about twice a plain CE loss).
* The window: frequencies with |u|, |v| < L·min(H, W), FDA's square except at
  integer boundaries, and empty at L = 0 (see ``fedaudit.tensor_ops.fourier``). At the
  paper's 384 px L ≤ 0.1 spans up to 77×77 frequencies; at 16 px only the DC
  term (L < 1/16) or a 3×3 window, at 32 px up to 7×7.
* The released code swaps the DC amplitude outright (L = 0, λ = 1) and samples
  1/8 of each client's spectra; the paper's continuous interpolation
  (λ ~ U(0, 1)) and docs/methods.md's random window and full bank are used here.
* The transform runs on raw images before the engine's normalisation and
  augmentation; the raw and transformed views then get the same random
  translation/flip, so they differ by the frequency transform only.
* A client keeps the other clients' spectra from the bank it received (in
  ``client.state``, so a resumed run has them); it never samples its own.
* FedAvg averages BatchNorm buffers too (the authors' script averages
  parameters only); batch 32 rather than the paper's 5 (a 384 px
  segmentation memory limit that would starve BatchNorm here).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedaudit.errors import FedauditError
from fedaudit.simulation.federation import ClientContext, ServerContext
from fedaudit.simulation.method import DOWN, UP
from fedaudit.simulation.training import Preprocess, autocast, make_optimizer
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind
from fedaudit.tensor_ops.fourier import amplitude_spectrum, interpolate_low_frequency
from fedaudit.run.options import Option

from .fedavg import FedAvg

BANK = "bank/"  # client.state: "bank/<domain>/amplitude", the other clients' spectra it received
AMPLITUDE = "amplitude"
# ctx.generator streams (stream 0 is the batch order and augmentation, as in train_local)
BANK_STREAM, FREQUENCY_STREAM = 1, 2
INNER_GRAD_CLIP = 100.0  # the authors' clamp on the inner-step gradient


def bank_size(num_train: int, fraction: float) -> int:
    """How many spectra a client with ``num_train`` records uploads: round(fraction·n), at least 1."""
    return max(1, min(num_train, round(fraction * num_train)))


def episodic_backward(model: nn.Module, x_raw: Tensor, x_mixed: Tensor, y: Tensor, inner_lr: float,
                      precision: str = "fp32") -> Tensor:
    """Accumulate ∇L_in(θ) + ∇L_out(θ') into the parameters' ``.grad``, with
    θ' = θ − α·∇L_in(θ) (first order), L_in the loss on the raw batch and
    L_out on the frequency-transformed batch; return L_in + L_out, detached."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    with autocast(x_raw.device, precision):
        inner = F.cross_entropy(model(x_raw), y)
    grads = torch.autograd.grad(inner, params, allow_unused=True)
    grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
    # The inner gradient carries no graph: θ' depends on θ through the identity only (first-order MAML).
    fast = {n: p - inner_lr * g.clamp(-INNER_GRAD_CLIP, INNER_GRAD_CLIP) for (n, p), g in zip(named, grads)}
    with autocast(x_raw.device, precision):
        outer = F.cross_entropy(functional_call(model, fast, (x_mixed,)), y)
    outer.backward()
    for p, g in zip(params, grads):
        p.grad = g if p.grad is None else p.grad.add_(g)
    return (inner.detach() + outer.detach()).float()


def same_augmentation(preprocess: Preprocess, raw: Tensor, mixed: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Both views through the engine's preprocessing (``raw`` uint8, ``mixed``
    float in [0, 1]) with the same random translation and flip."""
    if generator is None:
        return preprocess(raw), preprocess(mixed * 255.0)
    start = generator.get_state()
    x_raw = preprocess(raw, generator)
    end = generator.get_state()
    generator.set_state(start)
    x_mixed = preprocess(mixed * 255.0, generator)
    generator.set_state(end)
    return x_raw, x_mixed


class ELCFS(FedAvg):
    """FedAvg's broadcast, receive, upload and aggregate; the bank exchange and the episodic local step."""

    name = "elcfs"
    summary = "amplitude-spectrum bank shared once; episodic training on low-frequency amplitude interpolations"
    paper = "Liu et al., FedDG: Episodic Learning in Continuous Frequency Space, CVPR 2021"
    replays = False  # its clients train with amplitude interpolation and a meta-learning step: no recipe of fedaudit's replays that round yet
    client_dp_incompatible = "its amplitude bank crosses the wire outside the averaged model"
    dp_incompatible = "its episodic meta-learning loop trains outside the engine's DP-SGD loop (not yet supported)"
    shares = (
        (ArtifactKind.AMPLITUDE_BANK, UP),
        (ArtifactKind.AMPLITUDE_BANK, DOWN),
        (ArtifactKind.FULL_MODEL, DOWN),
        (ArtifactKind.FULL_MODEL, UP),
        (ArtifactKind.SCALARS, UP),
    )
    options = {  # 0 < fraction ≤ 1; at least one spectrum is sent whatever the fraction
        "fraction": Option(1.0, "share of training images whose spectra are uploaded, above 0", kind=float,
                           low=1e-9, high=1.0),
        "inner_lr": Option(1e-3, "step size α of the inner (meta-train) step", kind=float, low=0.0, high=10.0,
                           profiles={"quick": 0.01}),
        "max_window": Option(0.1, "largest low-frequency window ratio L; L ~ U(0, max_window)", kind=float, low=0.0,
                             high=0.5)}
    profile_defaults: dict[str, dict[str, Any]] = {
        "paper": {"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "local_epochs": 1, "rounds": 100},
    }

    # -- the bank (once) ----------------------------------------------------------

    def setup(self, server: ServerContext) -> list[Artifact]:
        if len(server.clients) < 2:
            raise FedauditError("elcfs mixes amplitude spectra between clients and needs at least 2 source domains; "
                                "use a dataset with 3 or more domains")
        return super().setup(server)

    def setup_upload(self, ctx: ClientContext, got: list[Artifact]) -> list[Artifact]:
        """Client side: amplitude spectra of a seeded random ``fraction`` of its raw training images."""
        client, n = ctx.client, ctx.client.num_samples
        chosen = torch.randperm(n, generator=ctx.generator(0, BANK_STREAM), device=ctx.device)
        images = client.data.train_x[chosen[:bank_size(n, self.opts["fraction"])]].float() / 255.0
        return [Artifact(ArtifactKind.AMPLITUDE_BANK, client.role, SERVER, 0, {AMPLITUDE: amplitude_spectrum(images)})]

    def setup_aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]]) -> list[Artifact]:
        """Server side: every client's spectra, keyed by domain, as one bank sent to every client."""
        bank = {f"{c.domain}/{AMPLITUDE}": uploads[c.role][0].tensors[AMPLITUDE] for c in server.clients}
        return [Artifact(ArtifactKind.AMPLITUDE_BANK, SERVER, c.role, 0, bank) for c in server.clients]

    def setup_receive(self, ctx: ClientContext, got: list[Artifact]) -> None:
        # A copy of its own (the wire keeps the received tensors, and a checkpoint refuses shared storage),
        # without its own spectra: it mixes toward other clients' only.
        own = f"{ctx.client.domain}/{AMPLITUDE}"
        ctx.client.state.update({BANK + k: v.clone() for k, v in got[0].tensors.items() if k != own})

    # -- local training ----------------------------------------------------------

    def frequency_transform(self, images: Tensor, bank: list[Tensor], generator: torch.Generator) -> Tensor:
        """Images in [0, 1] with their low-frequency amplitude interpolated toward
        a random spectrum of a random other client (``bank``: one tensor per client)."""
        n, dev = images.shape[0], images.device
        owner = torch.randint(len(bank), (n,), generator=generator, device=dev)
        amplitude = torch.zeros_like(images)
        for k, spectra in enumerate(bank):  # a few clients: gather from each, keep the owner's (no host sync)
            pick = torch.randint(spectra.shape[0], (n,), generator=generator, device=dev)
            amplitude = torch.where((owner == k).view(-1, 1, 1, 1), spectra[pick], amplitude)
        ratio = torch.rand(n, generator=generator, device=dev) * float(self.opts["max_window"])
        lam = torch.rand(n, generator=generator, device=dev)
        return interpolate_low_frequency(images, amplitude, ratio, lam)

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        client = ctx.client
        cfg = ctx.cfg
        model = ctx.model.train()
        opt = make_optimizer(model.parameters(), cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay)
        order = ctx.generator(rnd)  # batch order and augmentation, as ctx.train_local draws them
        augment = order if cfg.augment else None
        frequency = ctx.generator(rnd, FREQUENCY_STREAM)
        bank = [v for k, v in sorted(client.state.items()) if k.startswith(BANK)]
        images, labels = client.data.train_x, client.data.train_y
        inner_lr = float(self.opts["inner_lr"])
        total = torch.zeros((), device=ctx.device)
        steps = 0
        for idx in ctx.batches(order, epochs=cfg.local_epochs):
            mixed = self.frequency_transform(images[idx].float() / 255.0, bank, frequency)
            x_raw, x_mixed = same_augmentation(ctx.preprocess, images[idx], mixed, augment)
            opt.zero_grad(set_to_none=True)
            total += episodic_backward(model, x_raw, x_mixed, labels[idx], inner_lr, cfg.precision)
            opt.step()
            steps += 1
        ctx.record_loss(total, steps)
