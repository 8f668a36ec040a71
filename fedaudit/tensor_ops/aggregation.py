"""Model-state mechanics shared by every method: copy in place, select keys,
average on flat lists of tensors.

Clients share one model object; a client's state is swapped in with
``copy_`` into the existing tensors, never by building a new module, and
averages use ``torch._foreach_*`` over the whole tensor list at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor, nn

StateDict = dict[str, Tensor]

BN_BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


def model_state(model: nn.Module) -> StateDict:
    """Live references to every parameter and buffer (no copies)."""
    return model.state_dict(keep_vars=False)


def clone_state(state: Mapping[str, Tensor], keys: Iterable[str] | None = None) -> StateDict:
    keys = state.keys() if keys is None else keys
    return {k: state[k].detach().clone() for k in keys}


@torch.no_grad()
def load_state_(model_or_state: nn.Module | StateDict, src: Mapping[str, Tensor]) -> None:
    """Copy ``src`` into the model's existing tensors (only the keys in ``src``)."""
    dst = model_state(model_or_state) if isinstance(model_or_state, nn.Module) else model_or_state
    keys = list(src.keys())
    missing = [k for k in keys if k not in dst]
    if missing:
        raise KeyError(f"state has keys the model lacks: {missing[:3]}")
    same_dtype = [k for k in keys if dst[k].dtype == src[k].dtype]
    if same_dtype:
        torch._foreach_copy_([dst[k] for k in same_dtype], [src[k] for k in same_dtype])
    for k in keys:
        if dst[k].dtype != src[k].dtype:
            dst[k].copy_(src[k])


def is_bn_buffer(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in BN_BUFFER_SUFFIXES


@torch.no_grad()
def weighted_average_(out: StateDict, states: list[Mapping[str, Tensor]], weights: list[float], keys: Iterable[str] | None = None) -> None:
    """``out[k] = Σ_i w_i · states[i][k]`` in place, for ``keys`` (default: all of ``out``).

    Weights are normalised to sum to 1. Integer buffers (BN's
    ``num_batches_tracked``) get the rounded weighted mean.
    """
    if len(states) != len(weights) or not states:
        raise ValueError("need one weight per state and at least one state")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must sum to a positive number")
    w = [float(x) / total for x in weights]
    keys = list(out.keys()) if keys is None else list(keys)
    fkeys = [k for k in keys if out[k].is_floating_point()]
    ikeys = [k for k in keys if not out[k].is_floating_point()]
    if fkeys:
        dst = [out[k] for k in fkeys]
        torch._foreach_zero_(dst)  # not × 0: a NaN or inf already there (uninitialised memory, a diverged model) would stay
        for wi, st in zip(w, states):
            torch._foreach_add_(dst, [st[k] for k in fkeys], alpha=wi)
    for k in ikeys:
        acc = sum(wi * st[k].double() for wi, st in zip(w, states))
        out[k].copy_(torch.round(acc).to(out[k].dtype))


def state_nbytes(state: Mapping[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


@torch.no_grad()
def importance_weighted_average_(out: StateDict, states: list[Mapping[str, Tensor]], importances: list[Mapping[str, Tensor]],
                                 eps: float = 1e-8, keys: Iterable[str] | None = None) -> None:
    """Element-wise importance-weighted mean, in place (FedLSI's stage 5).

    ``out[k] = Σ_i ω̂_i[k] ⊙ states[i][k]`` with ``ω̂_i[k] = (ω_i[k] + eps) / Σ_j (ω_j[k] + eps)``,
    for ``keys`` (default: every key of ``importances[0]``). The ``eps`` goes
    into every client's weight, not only the denominator, so the weights sum
    to exactly 1 and an entry no client finds important (all ω = 0) falls back
    to the plain mean instead of collapsing to zero. Equal importances give
    the plain mean.
    """
    if len(states) != len(importances) or not states:
        raise ValueError("need one importance map per state and at least one state")
    if eps <= 0:
        raise ValueError(f"eps must be positive, got {eps}")
    keys = list(importances[0].keys()) if keys is None else list(keys)
    if not keys:
        return
    if any(not out[k].is_floating_point() for k in keys):
        raise ValueError("importance weighting applies to floating-point tensors only; average integer buffers by count")
    dst = [out[k] for k in keys]
    total = [torch.zeros_like(t) for t in dst]
    torch._foreach_zero_(dst)  # not × 0: a NaN or inf already there (uninitialised memory, a diverged model) would stay
    for state, omega in zip(states, importances):
        w = torch._foreach_add([omega[k] for k in keys], eps)
        torch._foreach_add_(total, w)
        torch._foreach_add_(dst, torch._foreach_mul(w, [state[k] for k in keys]))
    torch._foreach_div_(dst, total)
