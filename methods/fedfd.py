"""FedFD / FedFD-A — Feature Diversification and Adaptation for Federated
Domain Generalization (Yang et al., ECCV 2024; seed 003).

Framework SiloBN: every BN layer's running statistics stay with the client
that computed them (``client.state``) and are loaded back for its next local
training; BN affine parameters and all other weights are FedAvg-aggregated.
Clients also upload their BN statistics, which the server combines into
global statistics μ_G, σ²_G and broadcasts back.

Local step (``local_steps`` iterations per round), at every BN layer:
features f come from plain BatchNorm, features f_Δ from normalising with
μ_Δ = u·μ_inst + (1−u)·μ_G, σ_Δ likewise (u ~ U(0, 1) per channel per
iteration, instance statistics of that layer's input); the loss is
(1−λ1)·CE(C(f)) + λ1·CE(C(f_Δ)) + λ2·‖f − f_Δ‖², λ1 = 0.1, λ2 = 4.0.
FedFD-A (``fedfd_a``) adds an adapter before every BN layer, trained with CE
on the same batch, that interpolates instance and global statistics with a
per-instance α; at test time α = clamp(ε, 0, 1).

Deployed model (scored on the source val splits and the unseen target):
``fedfd`` normalises with the global statistics — SiloBN's conventional
inference, the "Global statistics" row of the paper's Table 3 — and
``fedfd_a`` with its adapter's mix of instance and global statistics
(Table 16's inference). Both hold μ_G, σ²_G in the BN running buffers, so the
selected model's state_dict is the whole deployed model.

Wire: down ``PARTIAL_MODEL`` (every tensor but BN buffers) + ``GLOBAL_STATS``;
up ``PARTIAL_MODEL`` + ``BN_STATS_ALL_LAYERS`` (running mean/var of every BN
layer) + the sample count as ``SCALARS`` (the FedAvg weights need it; counted
as its own kind as in fedavg).

Profiles: ``paper`` is the paper's recipe (ResNet-18, 40 rounds of 200
iterations, batch 64, SGD lr 0.01, momentum 0.5); ``quick`` keeps the
algorithm and the SGD settings on the cnn with 20 rounds of 20 iterations at
batch 32 (about 3 epochs of a ~225-record client, as fedavg's quick profile).

Readings of the paper and deviations from it:

* Global statistics are the pooled statistics of the clients' union,
  σ²_G = Σ w_k (σ²_k + μ_k²) − μ_G² (``fedaudit.tensor_ops.bn_statistics``). The paper gets them
  "through the global model's parameters", i.e. a FedAvg of the BN buffers,
  which averages the variances and drops the spread of client means; that
  is ``--method-option global_stats=mean``.
* f and f_Δ are the encoder outputs (pooled features before the head) of the
  *local* network: the pseudo-code's "with θ_G" is read as "with the global
  statistics", since CACL and CAFL train the local model. Both come from one
  forward of the doubled batch (``MixedBatchNorm2d`` "paired" mode), which
  equals two forwards because BN is the only layer mixing samples; gradients
  flow through both branches and through the instance statistics. The
  Δ branch does not update the running statistics.
* ‖f − f_Δ‖² is averaged over the feature dimensions (an MSE), not summed
  as Eq. 3 writes it: summed over the cnn's 256 features, λ2 = 4 makes the
  first local steps diverge (loss 1e3 to NaN within 6 steps on digits, since
  round 1's global statistics are the initial model's), while the mean puts
  λ2·CAFL on the scale of the CE terms, where the paper's λ2 range [2, 5]
  makes sense.
* The adapter and the main network are updated in one SGD step with their
  gradients kept apart (the adapter's CE runs through detached main weights;
  the main loss never reaches the adapter) instead of two consecutive steps,
  so the adapter sees the main weights of the start of the iteration rather
  than after its update. The logged train loss of ``fedfd_a`` is the main
  loss plus the adapter's CE. The adapter's hidden width is C/16 (at least
  8; C/16 gives ResNet-18 the paper's +0.22M parameters), ReLU between its
  layers, its ε output starting at 0.5 (not stated in the paper; with the
  default init some layers' α sat at the clamp's 0 with no gradient); z and
  α are per instance per layer.
* The paper uploads each client's best-val local model (validated every 20
  of its 200 iterations); here the final local model is uploaded.
* A client's local statistics start from the broadcast global statistics the
  first time it trains (the initial model's statistics in round 1).
* The paper starts from an ImageNet ResNet-18; fedaudit downloads nothing, so
  the ``paper`` profile starts from random weights unless ``--pretrained``.
  Weight decay is not stated in the paper; the engine default (5e-4) is used.
* ``u_min``/``u_max`` set u's range (Table 9 tries U(0, 0.5), U(0.5, 1),
  U(−0.1, 1.1)); ``local_epochs`` is unused, the budget is ``local_steps``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.tensor_ops.mixed_bn import adapter_parameter_names, convert_to_mixed_bn, load_global_stats_, norm_mode
from fedaudit.run.config import RunConfig
from fedaudit.tensor_ops.aggregation import clone_state, is_bn_buffer, load_state_, model_state, weighted_average_
from fedaudit.simulation.federation import ClientContext, Federation, ServerContext
from fedaudit.simulation.method import DOWN, UP, Method, sample_count, sample_weight
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind
from fedaudit.tensor_ops.bn_statistics import aggregate_bn_stats_, gather_bn_stats
from fedaudit.run.options import Option

GLOBAL_STATS_CHOICES = ("pooled", "mean")


class FedFD(Method):
    name = "fedfd"
    summary = "SiloBN + feature diversification with instance/global BN statistics mixing"
    paper = "Yang et al., ECCV 2024"
    needs_architecture = "an encoder and head split with BatchNorm layers it converts to mixed instance/global statistics (fedaudit's cnn and resnets)"
    dp_incompatible = "its feature decomposition mixes BatchNorm statistics across the records of a batch"
    shares = (
        (ArtifactKind.PARTIAL_MODEL, DOWN),
        (ArtifactKind.GLOBAL_STATS, DOWN),
        (ArtifactKind.PARTIAL_MODEL, UP),
        (ArtifactKind.BN_STATS_ALL_LAYERS, UP),
        (ArtifactKind.SCALARS, UP),
    )
    options = {"lambda1": Option(0.1, "weight λ1 of the feature-alignment loss", kind=float, low=0.0, high=1.0),
               "lambda2": Option(4.0, "weight λ2 of the statistics loss", kind=float, low=0.0, high=1000.0),
               "local_steps": Option(200, "local iterations per round", kind=int, low=1, high=1_000_000,
                                     profiles={"quick": 20}),
               "u_min": Option(0.0, "lower end of the mixing weight's range (at most u_max)", kind=float, low=-1.0,
                               high=2.0),
               "u_max": Option(1.0, "upper end of the mixing weight's range", kind=float, low=-1.0, high=2.0),
               "global_stats": Option("pooled", "how the server aggregates the clients' statistics",
                                      choices=GLOBAL_STATS_CHOICES)}
    profile_defaults = {
        # Same SGD recipe as the paper; ~20 iterations per round is what the
        # fedavg quick profile takes (3 epochs of ~225 records at batch 32).
        "quick": {"momentum": 0.5},
        "paper": {"model": "resnet18", "rounds": 40, "batch_size": 64, "lr": 0.01, "momentum": 0.5},
    }
    adapter: ClassVar[bool] = False  # FedFD-A's instance feature adapter

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        o = self.opts
        if o["u_min"] > o["u_max"]:
            raise FedauditError(f"--{self.name}-u-min must not exceed --{self.name}-u-max, got {o['u_min']} and "
                                f"{o['u_max']}".replace("_", "-"))
        if cfg.norm != "bn":
            raise FedauditError(f"{self.name} mixes BatchNorm statistics and needs --norm bn, got --norm {cfg.norm}")
        self.global_stats: dict[str, Tensor] = {}

    # -- model ---------------------------------------------------------------

    def build_model(self, fed: Federation) -> nn.Module:
        return convert_to_mixed_bn(fed.build_default_model(), adapter=self.adapter,
                                   u_range=(float(self.opts["u_min"]), float(self.opts["u_max"])))

    # -- server side ---------------------------------------------------------

    def setup(self, server: ServerContext) -> list[Artifact]:
        # The initial model's statistics are the first "global" statistics.
        state = model_state(server.model)
        self.global_state = clone_state(state, [k for k in state if not is_bn_buffer(k)])
        self.global_stats = clone_state(gather_bn_stats(server.model))
        return []

    def broadcast(self, server: ServerContext, rnd: int) -> list[Artifact]:
        out = []
        for c in server.clients:
            out.append(Artifact(ArtifactKind.PARTIAL_MODEL, SERVER, c.role, rnd, self.global_state))
            out.append(Artifact(ArtifactKind.GLOBAL_STATS, SERVER, c.role, rnd, self.global_stats))
        return out

    def aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]], rnd: int) -> None:
        states, stats, weights = [], [], []
        for arts in uploads.values():
            by_kind = {a.kind: a for a in arts}
            states.append(by_kind[ArtifactKind.PARTIAL_MODEL].tensors)
            stats.append(by_kind[ArtifactKind.BN_STATS_ALL_LAYERS].tensors)
            weights.append(sample_weight(arts))
        weighted_average_(self.global_state, states, weights)
        aggregate_bn_stats_(self.global_stats, stats, weights, pooled=self.opts["global_stats"] == "pooled")

    # -- client side ---------------------------------------------------------

    def receive(self, ctx: ClientContext, artifacts: list[Artifact]) -> None:
        client = ctx.client
        by_kind = {a.kind: a for a in artifacts}
        load_state_(ctx.model, by_kind[ArtifactKind.PARTIAL_MODEL].tensors)
        global_stats = by_kind[ArtifactKind.GLOBAL_STATS].tensors
        load_global_stats_(ctx.model, global_stats)
        if not client.state:
            client.state = {k: (global_stats[k] if k in global_stats else torch.zeros_like(v)).clone()
                            for k, v in model_state(ctx.model).items() if is_bn_buffer(k)}
        load_state_(ctx.model, client.state)  # SiloBN: this client's own running statistics

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        client = ctx.client
        ctx.train_local(rnd, self.loss, steps=self.opts["local_steps"])
        load_state_(client.state, {k: v for k, v in model_state(ctx.model).items() if is_bn_buffer(k)})

    def loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """Eq. 5: (1−λ1)·CE(f) + λ1·CE(f_Δ) + λ2·mean‖f − f_Δ‖² (+ the adapter's CE for FedFD-A)."""
        lam1, lam2 = float(self.opts["lambda1"]), float(self.opts["lambda2"])
        with norm_mode(model, "paired"):
            z = model.features(torch.cat([x, x]))
        logits, logits_mixed = model.head(z).chunk(2)
        f, f_mixed = z.chunk(2)
        loss = ((1 - lam1) * F.cross_entropy(logits, y) + lam1 * F.cross_entropy(logits_mixed, y)
                + lam2 * F.mse_loss(f, f_mixed))
        if self.adapter:
            loss = loss + self.adapter_loss(model, x, y)
        return loss

    def adapter_loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """CE through the adapter-interpolated statistics (Eq. 6–7); the main
        weights are detached so this loss trains the adapter alone."""
        adapters = adapter_parameter_names(model)
        frozen = {n: p.detach() for n, p in model.named_parameters() if n not in adapters}
        with norm_mode(model, "adapt"):
            logits = torch.func.functional_call(model, frozen, (x,))
        return F.cross_entropy(logits, y)

    def upload(self, ctx: ClientContext, rnd: int) -> list[Artifact]:
        client = ctx.client
        state = model_state(ctx.model)
        return [
            Artifact(ArtifactKind.PARTIAL_MODEL, client.role, SERVER, rnd, {k: state[k] for k in self.global_state}),
            Artifact(ArtifactKind.BN_STATS_ALL_LAYERS, client.role, SERVER, rnd, gather_bn_stats(ctx.model)),
            sample_count(client, rnd),
        ]

    # -- inference -----------------------------------------------------------

    def global_model(self, server: ServerContext) -> nn.Module:
        load_state_(server.model, self.global_state)
        load_state_(server.model, self.global_stats)  # the deployed model normalises with μ_G, σ²_G
        return server.model

    # -- checkpoint ----------------------------------------------------------

    def checkpoint(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors, extras = super().checkpoint()
        tensors.update({f"stats/{k}": v for k, v in self.global_stats.items()})
        return tensors, extras

    def restore(self, tensors: dict[str, Tensor], extras: dict[str, Any]) -> None:
        super().restore(tensors, extras)
        self.global_stats = {k[len("stats/"):]: v for k, v in tensors.items() if k.startswith("stats/")}


class FedFDA(FedFD):
    name = "fedfd_a"
    summary = "FedFD plus an instance feature adapter that mixes instance and global BN statistics at test time"
    adapter = True

    def predict(self, model: nn.Module, x: Tensor) -> Tensor:
        with norm_mode(model, "adapt"):
            return model(x)
