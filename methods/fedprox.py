"""FedProx — Federated Optimization in Heterogeneous Networks (Li et al.,
MLSys 2020).

FedAvg with a proximal term μ/2·‖θ − θ_global‖² in each client's local loss,
which keeps local models near the global one under heterogeneous data.
μ = 0.01 by default (``--method-option mu=...``). Same wire as FedAvg.

The proximal gradient μ·(θ − θ_global) is added to the parameter gradients
after each backward pass (one fused ``_foreach`` op) instead of building the
term into the autograd graph: the update is identical and cheaper.
"""

from __future__ import annotations

import torch

from fedaudit.simulation.federation import Client, ClientContext, Federation
from fedaudit.simulation.recipes import ProximalRecipe, SGDRecipe, TrainOne
from fedaudit.simulation.wire import Artifact, ArtifactKind
from fedaudit.run.options import Option

from .fedavg import FedAvg


class FedProx(FedAvg):
    name = "fedprox"
    summary = "FedAvg plus a proximal term toward the global model (baseline)"
    paper = "Li et al., MLSys 2020"
    options = {"mu": Option(0.01, "proximal weight μ", kind=float, low=0.0, high=100.0)}

    def __init__(self, cfg):
        super().__init__(cfg)
        self._anchor: list[torch.Tensor] = []

    def receive(self, ctx: ClientContext, artifacts: list[Artifact]) -> None:
        super().receive(ctx, artifacts)
        # θ_global for this round, in the order of the trainable parameters.
        names = [n for n, p in ctx.model.named_parameters() if p.requires_grad]
        full = next(a for a in artifacts if a.kind == ArtifactKind.FULL_MODEL).tensors
        self._anchor = [full[n] for n in names]

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        mu = float(self.opts["mu"])

        @torch.no_grad()
        def add_proximal_gradient() -> None:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            torch._foreach_add_(grads, torch._foreach_sub(params, self._anchor), alpha=mu)
            for p, g in zip(params, grads):
                p.grad = g

        ctx.train_local(rnd, after_backward=add_proximal_gradient)

    def round_recipe(self, fed: Federation, client: Client) -> TrainOne | None:
        """One round of local SGD with the proximal term toward the weights it starts from (the round's broadcast);
        under DP-SGD none is declared (the proximal gradient is added after the noise there)."""
        recipe = self.engine_recipe(fed, client, rounds=1)
        if type(recipe) is not SGDRecipe:
            return None
        return ProximalRecipe(**vars(recipe), mu=float(self.opts["mu"]))
