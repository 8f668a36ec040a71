"""Batch-norm statistics: gather them, aggregate them, compute them per
instance, and mix them.

Shared by methods that exchange BN statistics (FedFD/FedFD-A upload every
layer's running statistics and get global statistics back) and by attacks
that invert such statistics. Statistics are keyed like the model's
state_dict (``<layer>.running_mean``, ``<layer>.running_var``), so an
artifact's tensors map straight onto the BN layers that produced them.

Variances, not standard deviations, are stored and aggregated, because that
is what BatchNorm keeps; a standard deviation is ``sqrt(var + eps)`` at the
point of use, as BatchNorm itself computes it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from fedaudit.models.classifier import bn_layers
from fedaudit.tensor_ops.aggregation import StateDict, model_state, weighted_average_

MEAN, VAR = "running_mean", "running_var"


def bn_modules(model: nn.Module) -> list[nn.Module]:
    """Batch-norm layers that keep running statistics, in registration (= forward) order."""
    return [m for _, m in bn_layers(model)]


def bn_stat_keys(model: nn.Module) -> list[str]:
    """``<layer>.running_mean`` and ``<layer>.running_var`` of every BN layer
    that tracks running statistics, in forward order."""
    return [f"{name}.{kind}" for name, _ in bn_layers(model) for kind in (MEAN, VAR)]


def gather_bn_stats(model: nn.Module) -> StateDict:
    """Every BN layer's running mean and variance (live references, no copies)."""
    state = model_state(model)
    return {k: state[k] for k in bn_stat_keys(model)}


@torch.no_grad()
def aggregate_bn_stats_(out: StateDict, stats: list[Mapping[str, Tensor]], weights: list[float], pooled: bool = True) -> None:
    """``out`` ← the clients' statistics combined into global statistics, in place.

    ``pooled`` (default) gives the mean and variance of the union of the
    clients' data, treating client k's statistics as those of a share
    ``w_k`` of it: μ_G = Σ w_k μ_k and σ²_G = Σ w_k (σ²_k + μ_k²) − μ_G².
    The second moment E[a²] = σ² + μ² is what averages linearly over a
    union; averaging the variances alone (``pooled=False``, a FedAvg of the
    BN buffers) drops the spread of the client means, Σ w_k (μ_k − μ_G)²,
    and so underestimates the global variance exactly when domains differ.
    """
    if not pooled:
        weighted_average_(out, stats, weights)
        return
    mean_keys = [k for k in out if k.endswith(MEAN)]
    var_keys = [k[: -len(MEAN)] + VAR for k in mean_keys]
    if sorted(mean_keys + var_keys) != sorted(out):
        raise ValueError("BN statistics must come as running_mean/running_var pairs")
    second = [{v: st[v] + st[m].square() for m, v in zip(mean_keys, var_keys)} for st in stats]
    weighted_average_(out, stats, weights, keys=mean_keys)
    weighted_average_(out, second, weights, keys=var_keys)
    for m, v in zip(mean_keys, var_keys):
        out[v].sub_(out[m].square()).clamp_(min=0.0)  # rounding can push a zero variance just below 0


def instance_stats(x: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Per-instance, per-channel mean and standard deviation ``sqrt(var + eps)``
    of a ``[B, C, *spatial]`` tensor, each ``[B, C]`` (biased variance, as
    instance normalisation uses)."""
    dims = tuple(range(2, x.dim()))
    var, mean = torch.var_mean(x, dim=dims, correction=0)
    return mean, (var + eps).sqrt()


def mix_stats(instance: tuple[Tensor, Tensor], global_: tuple[Tensor, Tensor], u: Tensor) -> tuple[Tensor, Tensor]:
    """FedFD's mixed statistics μ_Δ = u·μ_inst + (1−u)·μ_G, σ_Δ = u·σ_inst + (1−u)·σ_G.

    ``instance`` and ``global_`` are (mean, std) pairs; ``u`` broadcasts
    against them (``[C]``: one weight per channel; ``[B, 1]``: one per
    instance, as FedFD-A's adapter produces). u = 0 gives the global
    statistics, u = 1 the instance statistics.
    """
    return torch.lerp(global_[0], instance[0], u), torch.lerp(global_[1], instance[1], u)
