"""FedSB — Federated Domain Generalization with Label Smoothing and Balanced
Decentralized Training (Soltany et al.; thesis "Federated Learning with
Generalization to New Domains", chapter 4).

Two changes to FedAvg, both on the client side, plus MixStyle:

* **Label smoothing**: the local loss is ``(1−ε)·NLL + ε·mean_c(−log p_c)``
  (thesis eq. 4.1–4.4), ε = 0.1 (``--method-option epsilon=...``; the thesis
  sweeps 0.1–0.3 with little change).
* **Training budget**: every client runs exactly S local batches per round
  (``budget``, S = 45 as in the thesis), drawing fresh shuffles when S
  exceeds one pass (a small client is oversampled) and stopping early
  otherwise (a large one is undersampled), so each client moves the global
  model by the same number of steps whatever its size. ``--local-epochs`` is
  not used.
* **MixStyle** (p = 0.5, α = 0.1) after the first two blocks of the encoder,
  CNN and ResNet alike (the thesis applies it "for each experiment based on
  CNN backbones").

The server takes the uniform mean (1/K) of every tensor, BatchNorm buffers
included (the authors' code; the budget already equalises clients, and
uniform weights need no sample counts, so none cross the wire).
Wire: ``FULL_MODEL`` down and up, nothing else.

Profiles: ``quick`` keeps fedavg's quick settings (SGD lr 0.01, batch 32,
20 rounds, CNN) and the thesis' S = 45, which is ≈3 passes over a built-in
``shapes`` client (≈525 training records) — fedavg's 3 local epochs, so the
two cost about the same (on ``digits``, ≈225 records, it is ≈6 passes).
``paper``: Adam lr 1e-4, batch 64, S = 45, ResNet-18, 50 rounds (the thesis'
count for OfficeHome, VLCS and TerraIncognita; it uses 100 for PACS — pass
``--rounds 100`` there).

Deviations from the thesis: the backbone is trained from scratch unless
``--pretrained`` gives local ImageNet weights (the thesis fine-tunes
ImageNet-pretrained ResNets); images keep the dataset's size (64 px in the
paper profile) instead of 224 px; augmentation is the engine's
translation + flip instead of CenterCrop/flip/ColorJitter/Grayscale; the
classification head is the shared linear head rather than an MLP; weight
decay is the project default 5e-4 (the thesis states none). The thesis'
Algorithm 2 resamples a fixed index list per round; cycling fresh
permutations gives the same per-round budget.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from fedaudit.models import MixStyle
from fedaudit.tensor_ops.aggregation import model_state, weighted_average_
from fedaudit.simulation.federation import ClientContext, Federation, ServerContext
from fedaudit.simulation.method import DOWN, UP
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind
from fedaudit.tensor_ops.losses import label_smoothing_loss
from fedaudit.run.options import Option

from .fedavg import FedAvg, private_mean_


class FedSB(FedAvg):
    """FedAvg's broadcast and receive; its own loss, budget, upload and uniform aggregate."""

    name = "fedsb"
    summary = "label smoothing + equal per-round step budget per client + MixStyle, uniform averaging"
    paper = "Soltany et al., FedSB (thesis ch. 4; ICASSP 2025 submission)"
    replays = False  # its clients train a label-smoothed loss for a fixed budget of batches: no recipe of fedaudit's replays that round yet
    needs_architecture = "MixStyle after the encoder's first two blocks (fedaudit inserts it into its cnn and resnets)"
    dp_incompatible = "its MixStyle layers mix feature statistics across the records of a batch, so per-record gradients do not exist"
    shares = ((ArtifactKind.FULL_MODEL, DOWN), (ArtifactKind.FULL_MODEL, UP))
    options = {"epsilon": Option(0.1, "label-smoothing weight", kind=float, low=0.0, high=0.99),
               "budget": Option(45, "local batches per round", kind=int, low=1, high=100_000)}
    profile_defaults: dict[str, dict[str, Any]] = {
        "quick": {},
        "paper": {"optimizer": "adam", "lr": 1e-4, "batch_size": 64, "rounds": 50},
    }

    def __init__(self, cfg):
        super().__init__(cfg)

    def build_model(self, fed: Federation) -> nn.Module:
        return fed.build_default_model(mixstyle=MixStyle(p=0.5, alpha=0.1))

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        eps = float(self.opts["epsilon"])

        def smoothed_loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            return label_smoothing_loss(model(x), y, eps)

        ctx.train_local(rnd, smoothed_loss, steps=int(self.opts["budget"]))

    def upload(self, ctx: ClientContext, rnd: int) -> list[Artifact]:
        client = ctx.client
        return [Artifact(ArtifactKind.FULL_MODEL, client.role, SERVER, rnd, model_state(ctx.model))]

    def aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]], rnd: int) -> None:
        if server.client_dp is not None:
            private_mean_(server, self.global_state, uploads, rnd)
            return
        states = [a.tensors for arts in uploads.values() for a in arts if a.kind == ArtifactKind.FULL_MODEL]
        weighted_average_(self.global_state, states, [1.0] * len(states))
