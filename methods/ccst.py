"""CCST — Federated Domain Generalization for Image Recognition via
Cross-Client Style Transfer (Chen, Jiang, Dou & Chen, WACV 2023).

Before training, every client computes its *style* — the channel mean and
standard deviation of its images' features at a fixed encoder layer — and
uploads it once; the server gathers the styles into a bank and broadcasts the
whole bank to every client. During local training a client restyles its own
images toward the other clients' styles with AdaIN, so each silo sees every
source domain's style without any image leaving it. Aggregation is FedAvg.

Option ``style``:

* ``overall`` (default): one (μ, σ) per client, pooled over all its training
  images and positions (N·H·W);
* ``single``: the (μ, σ) of ``k`` individual training images per client
  (default 3), picked once with the client's seeded generator.

``k`` is the number of single-image styles a client shares; it is *not* the
paper's "augmentation level" K (see the second deviation below). The style
definition (std = sqrt(biased var + 1e-5)) is :mod:`fedaudit.tensor_ops.style`'s.

Wire: ``STYLE_BANK`` up (one artifact per client in round 0: ``mean`` and
``std``, (S, C) float32 with S = 1 or k) and down (one artifact per client in
round 0 holding ``<domain>/mean`` and ``<domain>/std`` for every source
domain); every round ``FULL_MODEL`` down and up and the sample count up as
``SCALARS``, as FedAvg.

Deviations from the paper and its released code, and why:

* **Feature-level AdaIN.** The paper encodes images with an ImageNet VGG-19
  (relu4_1), AdaINs the features and decodes them back to images with a
  trained AdaIN decoder, offline. No pretrained weights exist offline, so the
  style encoder here is the *first block of the round-0 global model* (the
  CNN's first conv-norm-ReLU-pool block; the ResNet stem), and AdaIN is
  applied to that block's output inside the model, with no decoder. The
  block is frozen for the whole run (``requires_grad`` off, norm layers kept
  in eval mode, the server keeps it bit-exact) because the bank's statistics
  only mean something in the feature space they were measured in; it still
  travels inside ``FULL_MODEL``. Like CCST's public VGG it crosses no wire
  of its own: every client builds the round-0 model from the shared seed (or
  the public ``--pretrained`` file).
* **Online augmentation instead of an enlarged dataset.** The released code
  writes, for each image, K restyled copies whose styles are K distinct
  source domains drawn at random; drawing the image's own domain keeps the
  original. Here each training sample draws its domain on the fly, per batch:
  with probability 1/M (M source clients) it stays unchanged, otherwise it is
  restyled toward a uniformly drawn *other* client's bank entry — CCST's
  K = 1 distribution, at FedAvg's cost. The paper's best setting (K = M, every
  image in every source style once per round) is matched in expectation by M
  local passes; the ``paper`` profile runs 3 (K = 3 on PACS/OfficeHome).
  With a single source client there is no other style and training is
  FedAvg's.
* **Interpolated strength.** Each restyled sample uses
  ``α·AdaIN(f, style) + (1 − α)·f`` with α ~ U(0, 1) per sample (the design
  spec); the released code always transfers fully (α = 1).
* ``single`` picks k images once; the released code draws a fresh random
  style image of the other domain for every content batch.
* Content statistics in AdaIN use the biased variance (the released code uses
  the unbiased one there and the biased one for the bank); the difference is
  a factor (n−1)/n on H·W positions.
* Aggregation is sample-weighted FedAvg (the design spec); the released code
  weights clients uniformly.
* The paper fine-tunes an ImageNet ResNet-50 (PACS) or ResNet-18 (OfficeHome)
  at 222 px with random-resized-crop + flip; here the backbone is ``--model``
  trained from scratch unless ``--pretrained`` is given, at the dataset's
  size, with the engine's translation + flip.

Profiles: ``quick`` is fedavg's (CNN, SGD 0.01 with momentum 0.9, batch 32,
20 rounds × 3 local epochs) with the option defaults. ``paper`` follows the
released code's training (plain SGD — no momentum, no weight decay — lr 1e-3,
batch 32 as in its ResNet-18 command, 500 rounds, its default ``--iters``),
with 3 local epochs standing in for augmentation level K = 3 (above), on the
project's ResNet-18 at 64 px.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.models.cnn import CNNEncoder
from fedaudit.simulation.federation import Client, ClientContext, Federation, ServerContext
from fedaudit.simulation.method import DOWN, UP
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind
from fedaudit.tensor_ops.style import EPS, adain, feature_style, pooled_feature_style, style_encoder
from fedaudit.run.options import Option

from .fedavg import FedAvg

STYLES = ("overall", "single")
BANK = "style_bank/"  # client.state: the bank the client received, "<prefix><domain>/mean" and ".../std"
PICK_STREAM, TRANSFER_STREAM = 1, 2  # fed.generator streams (0 is the engine's batch order and augmentation)
STYLE_BATCH = 256  # images per forward when measuring a client's overall style


class BankStyleTransfer(nn.Module):
    """CCST's cross-client restyling, at the feature level: a parameter-free
    slot after the style encoder.

    Active only while a client trains with a bank loaded (:meth:`load`);
    otherwise — evaluation, setup, an attacker's copy of the model — the
    identity. For each sample of the batch: with probability 1/M it is left
    unchanged (CCST drawing the image's own domain), otherwise it is AdaIN'd
    toward a random entry of a uniformly drawn other client, with strength
    α ~ U(0, 1).
    """

    def __init__(self, eps: float = EPS) -> None:
        super().__init__()
        self.eps = eps
        self.bank_mean: Tensor | None = None  # (M, S, C)
        self.bank_std: Tensor | None = None
        self.own = 0
        self.generator: torch.Generator | None = None

    def load(self, mean: Tensor, std: Tensor, own: int, generator: torch.Generator) -> None:
        self.bank_mean, self.bank_std, self.own, self.generator = mean, std, own, generator

    def unload(self) -> None:
        self.bank_mean = self.bank_std = self.generator = None

    def forward(self, x: Tensor) -> Tensor:
        if self.bank_mean is None or self.bank_mean.shape[0] < 2:
            return x
        m, s, _ = self.bank_mean.shape
        b, g, dev = x.shape[0], self.generator, x.device
        other = (self.own + torch.randint(1, m, (b,), generator=g, device=dev)) % m  # never the own domain
        entry = torch.randint(0, s, (b,), generator=g, device=dev)
        restyle = torch.rand(b, generator=g, device=dev) >= 1.0 / m
        alpha = torch.rand(b, generator=g, device=dev) * restyle
        return adain(x, self.bank_mean[other, entry], self.bank_std[other, entry], self.eps, alpha)

    def extra_repr(self) -> str:
        return f"eps={self.eps}"


def insert_after_style_encoder(model: nn.Module, slot: nn.Module) -> None:
    """Put ``slot`` on the first block's output. The slot has no parameters and
    sits inside a parameter-free module (the block's last pool), so every
    state_dict key is unchanged."""
    encoder = model.encoder
    if isinstance(encoder, CNNEncoder):
        encoder.blocks[0].append(slot)
    else:
        encoder.backbone.maxpool = nn.Sequential(encoder.backbone.maxpool, slot)


def _frozen_keys(model: nn.Module) -> set[str]:
    """state_dict keys of the style encoder's parameters and buffers."""
    encoder = style_encoder(model)
    mine = {id(t) for part in (encoder.parameters(), encoder.buffers()) for t in part}
    return {k for k, v in model.state_dict(keep_vars=True).items() if id(v) in mine}


class CCST(FedAvg):
    """FedAvg's broadcast, receive and upload; a style exchange in round 0 (``setup_upload``,
    ``setup_aggregate``, ``setup_receive``); restyled local training."""

    name = "ccst"
    summary = ("style bank (channel mean/std of each client's features, sent once) + AdaIN toward other clients' "
               "styles, FedAvg; feature-level AdaIN on the frozen round-0 first block, not the paper's VGG image restyling")
    paper = "Chen et al., Cross-Client Style Transfer (CCST), WACV 2023"
    replays = False  # its clients train on style-transferred images (the bank's styles): no recipe of fedaudit's replays that round yet
    client_dp_incompatible = ("its style bank crosses the wire outside the averaged model, and its aggregation keeps "
                              "frozen layers")
    needs_architecture = "the encoder's first block as its frozen style encoder (fedaudit's cnn and resnets)"
    shares = (
        (ArtifactKind.STYLE_BANK, UP),
        (ArtifactKind.STYLE_BANK, DOWN),
        (ArtifactKind.FULL_MODEL, DOWN),
        (ArtifactKind.FULL_MODEL, UP),
        (ArtifactKind.SCALARS, UP),
    )
    options = {"style": Option("overall", "overall: one pooled style per client; single: k single-image styles",
                               choices=STYLES),
               "k": Option(3, "single-image styles per client with style=single", kind=int, low=1, high=100_000)}
    profile_defaults: dict[str, dict[str, Any]] = {
        "quick": {},
        "paper": {"model": "resnet18", "optimizer": "sgd", "lr": 1e-3, "momentum": 0.0, "weight_decay": 0.0,
                  "batch_size": 32, "local_epochs": 3, "rounds": 500},
    }

    def build_model(self, fed: Federation) -> nn.Module:
        model = fed.build_default_model()
        style_encoder(model).requires_grad_(False)  # frozen for the whole run: the bank lives in its feature space
        insert_after_style_encoder(model, BankStyleTransfer())
        return model

    # -- the style exchange (once, round 0) ----------------------------------------

    def setup_upload(self, ctx: ClientContext, got: list[Artifact]) -> list[Artifact]:
        """Client side: the style(s) of its training images through the frozen first block, (S, C) mean
        and std (no augmentation), measured on the shared initial model."""
        client, k = ctx.client, self.opts["k"]
        if self.opts["style"] == "single" and client.num_samples < k:
            raise FedauditError(f"method option k of ccst is {k}, but client {client.domain} has only "
                                f"{client.num_samples} training images; use k <= {client.num_samples}")
        mean, std = self.client_style(ctx)
        return [Artifact(ArtifactKind.STYLE_BANK, client.role, SERVER, 0, {"mean": mean, "std": std})]

    @torch.no_grad()
    def client_style(self, ctx: ClientContext) -> tuple[Tensor, Tensor]:
        encoder = style_encoder(ctx.model).eval()
        images, n = ctx.client.data.train_x, ctx.client.num_samples
        if self.opts["style"] == "single":
            pick = torch.randperm(n, generator=ctx.generator(0, PICK_STREAM), device=ctx.device)
            return feature_style(encoder(ctx.preprocess(images[pick[: self.opts["k"]]])))
        chunks = (encoder(ctx.preprocess(images[i:i + STYLE_BATCH])) for i in range(0, n, STYLE_BATCH))
        return pooled_feature_style(chunks)

    def setup_aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]]) -> list[Artifact]:
        """Server side: every client's style, keyed by domain, as one bank sent to every client."""
        bank: dict[str, Tensor] = {}
        for client in server.clients:
            style = next(a for a in uploads[client.role] if a.kind == ArtifactKind.STYLE_BANK).tensors
            bank[f"{client.domain}/mean"], bank[f"{client.domain}/std"] = style["mean"], style["std"]
        return [Artifact(ArtifactKind.STYLE_BANK, SERVER, c.role, 0, bank) for c in server.clients]

    def setup_receive(self, ctx: ClientContext, got: list[Artifact]) -> None:
        bank = next(a for a in got if a.kind == ArtifactKind.STYLE_BANK)
        ctx.client.state.update({BANK + k: v.clone() for k, v in bank.tensors.items()})  # the wire keeps its own copy

    # -- local training ------------------------------------------------------------

    def client_bank(self, client: Client) -> tuple[Tensor, Tensor, int]:
        """The bank this client received, stacked (M, S, C), and the row of its own domain."""
        domains = sorted({k[len(BANK):].rsplit("/", 1)[0] for k in client.state if k.startswith(BANK)})
        if client.domain not in domains:
            raise RuntimeError(f"{client.role} holds no style bank with its own domain (got {domains})")
        mean = torch.stack([client.state[f"{BANK}{d}/mean"] for d in domains])
        std = torch.stack([client.state[f"{BANK}{d}/std"] for d in domains])
        return mean, std, domains.index(client.domain)

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        client = ctx.client
        encoder = style_encoder(ctx.model)
        slot = next(m for m in ctx.model.modules() if isinstance(m, BankStyleTransfer))
        mean, std, own = self.client_bank(client)

        def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            encoder.eval()  # train_steps puts the whole model in train mode; the frozen block keeps its round-0 behaviour
            return F.cross_entropy(model(x), y)

        slot.load(mean, std, own, ctx.generator(rnd, TRANSFER_STREAM))
        try:
            ctx.train_local(rnd, loss_fn)
        finally:
            slot.unload()

    # -- server --------------------------------------------------------------------

    def aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]], rnd: int) -> None:
        # The style encoder stays exactly at round 0 (averaging identical copies would only add rounding).
        frozen = _frozen_keys(server.model)
        self.average_full_models(uploads, keys=[k for k in self.global_state if k not in frozen])


__all__ = ["CCST", "BankStyleTransfer"]
