"""BatchNorm that can also normalise with instance statistics mixed with
global statistics (FedFD's feature diversification, FedFD-A's adapter).

:class:`MixedBatchNorm2d` is an ``nn.BatchNorm2d`` (same parameters, same
running buffers, same state_dict keys plus the adapter's weights) with three
modes, switched for a whole model by :func:`norm_mode`:

``normal``
    plain BatchNorm: batch statistics in training (updating the running
    statistics), running statistics in eval.
``paired``
    training only. The batch is ``cat([x, x])``: the first half goes through
    plain BatchNorm, the second half is normalised with mixed statistics
    μ_Δ = u·μ_inst + (1−u)·μ_G, σ_Δ likewise, u ~ U(u_min, u_max) per
    channel, drawn afresh at every call. Convolutions, activations, pooling
    and the linear head treat samples independently, so one forward of the
    doubled batch gives exactly the two forwards FedFD needs (the features f
    and f_Δ) with half the kernel launches.
``adapt``
    FedFD-A: a two-layer MLP maps [μ_inst − μ_G ; σ_inst − σ_G] to (δ, ε)
    per instance; α = clamp(z·δ + ε, 0, 1) with z ~ N(0, 1) in training and
    α = clamp(ε, 0, 1) in eval; normalise with α·inst + (1−α)·global.

Where the global statistics come from: in training, from the
``global_mean``/``global_var`` buffers, which a client fills from the
server's broadcast (the running buffers hold the client's own local
statistics then); in eval, from the running buffers, because the deployed
global model carries the global statistics there. So a state_dict of the
deployed model is self-contained.

Random draws (u, z) use torch's global generator, which the engine seeds
per round, so runs are deterministic and resumable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from fedaudit.tensor_ops.aggregation import StateDict
from fedaudit.tensor_ops.bn_statistics import MEAN, VAR, instance_stats, mix_stats

MODES = ("normal", "paired", "adapt")


def adapter_width(channels: int) -> int:
    """Hidden width of a layer's adapter MLP: C/16, at least 8.

    The paper gives only "two fully connected layers, output size 2"; C/16
    reproduces its parameter count (ResNet-18 grows by ≈0.22M, Table 4). The
    floor keeps the narrow layers of the small CNN from a 2-unit bottleneck.
    """
    return max(channels // 16, 8)


class MixedBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d with FedFD's mixed-statistics and FedFD-A's adapter modes."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, *, adapter: bool = False,
                 u_range: tuple[float, float] = (0.0, 1.0)) -> None:
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.mode = "normal"
        self.u_range = u_range
        # Not persistent: set by the client each round from the broadcast, never saved with the model.
        self.register_buffer("global_mean", torch.zeros(num_features), persistent=False)
        self.register_buffer("global_var", torch.ones(num_features), persistent=False)
        self.adapter: nn.Module | None = None
        if adapter:
            hidden = adapter_width(num_features)
            self.adapter = nn.Sequential(nn.Linear(2 * num_features, hidden), nn.ReLU(inplace=True), nn.Linear(hidden, 2))
            # Start ε at 0.5, inside the clamp's range: with PyTorch's default
            # init some layers start with z·δ + ε < 0 for every input, where the
            # clamp passes no gradient and the adapter never trains.
            with torch.no_grad():
                self.adapter[-1].bias.copy_(torch.tensor([0.0, 0.5]))

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "normal":
            return super().forward(x)
        if self.mode == "paired":
            plain, mixed = x.chunk(2)
            return torch.cat([super().forward(plain), self._mixed(mixed)])
        return self._adapted(x)

    def _global(self) -> tuple[Tensor, Tensor]:
        mean, var = (self.global_mean, self.global_var) if self.training else (self.running_mean, self.running_var)
        return mean, (var + self.eps).sqrt()

    def _mixed(self, x: Tensor) -> Tensor:
        xf = x.float()  # statistics in fp32 under bf16 autocast
        lo, hi = self.u_range
        u = torch.empty(self.num_features, device=x.device).uniform_(lo, hi)
        mean, std = mix_stats(instance_stats(xf, self.eps), self._global(), u)
        return self._normalise(xf, mean, std).to(x.dtype)

    def _adapted(self, x: Tensor) -> Tensor:
        xf = x.float()
        inst, glob = instance_stats(xf, self.eps), self._global()
        delta, eps = self.adapter(torch.cat([inst[0] - glob[0], inst[1] - glob[1]], dim=1)).float().unbind(1)
        alpha = eps + torch.randn_like(delta) * delta if self.training else eps  # E[z] = 0 at test time
        mean, std = mix_stats(inst, glob, alpha.clamp(0.0, 1.0)[:, None])
        return self._normalise(xf, mean, std).to(x.dtype)

    def _normalise(self, x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """γ·(x − mean)/std + β with per-instance [B, C] statistics, folded
        into one scale and shift so the feature map is read once."""
        scale = std.reciprocal()
        shift = -mean * scale
        if self.affine:
            scale = scale * self.weight
            shift = shift * self.weight + self.bias
        return torch.addcmul(shift[:, :, None, None], x, scale[:, :, None, None])


def convert_to_mixed_bn(model: nn.Module, *, adapter: bool, u_range: tuple[float, float] = (0.0, 1.0)) -> nn.Module:
    """Replace every ``nn.BatchNorm2d`` of ``model`` by a :class:`MixedBatchNorm2d`
    holding the same weights and statistics (so pretrained weights survive); in place."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.BatchNorm2d]
    for parent, name, bn in swaps:
        mixed = MixedBatchNorm2d(bn.num_features, bn.eps, bn.momentum, adapter=adapter, u_range=u_range)
        missing, unexpected = mixed.load_state_dict(bn.state_dict(), strict=False)
        if unexpected or any(not k.startswith("adapter.") for k in missing):
            raise ValueError(f"cannot convert {name}: missing {missing}, unexpected {unexpected}")
        setattr(parent, name, mixed.to(bn.weight.device))
    return model


def mixed_bn_layers(model: nn.Module) -> list[tuple[str, MixedBatchNorm2d]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MixedBatchNorm2d)]


@contextmanager
def norm_mode(model: nn.Module, mode: str) -> Iterator[None]:
    """Run every MixedBatchNorm2d of ``model`` in ``mode`` inside the block."""
    if mode not in MODES:
        raise ValueError(f"unknown norm mode {mode!r}; valid: {', '.join(MODES)}")
    layers = [m for _, m in mixed_bn_layers(model)]
    if mode == "adapt" and any(m.adapter is None for m in layers):
        raise ValueError("adapt mode needs layers built with adapter=True")
    previous = [m.mode for m in layers]
    for m in layers:
        m.mode = mode
    try:
        yield
    finally:
        for m, p in zip(layers, previous):
            m.mode = p


@torch.no_grad()
def load_global_stats_(model: nn.Module, stats: StateDict) -> None:
    """Copy global statistics (keyed ``<layer>.running_mean``/``running_var``)
    into the layers' ``global_mean``/``global_var`` buffers used in training."""
    for name, m in mixed_bn_layers(model):
        m.global_mean.copy_(stats[f"{name}.{MEAN}"])
        m.global_var.copy_(stats[f"{name}.{VAR}"])


def adapter_parameter_names(model: nn.Module) -> set[str]:
    """Qualified names of every adapter parameter (FedFD-A trains them apart)."""
    return {f"{name}.adapter.{p}" for name, m in mixed_bn_layers(model) if m.adapter is not None
            for p, _ in m.adapter.named_parameters()}
