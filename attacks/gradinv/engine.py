"""Gradient inversion: recover training images from one model update.

Inverting Gradients (Geiping et al., NeurIPS 2020, "Inverting Gradients – How
easy is it to break privacy in federated learning?"): the attacker knows the
model a client started from and the update it sent back, simulates the
update that dummy images would have produced, and optimises the dummies
until the two point the same way:

    min_x  1 − cos(Δ_sim(x), Δ_target) + λ_TV · TV(x)

with the cosine taken over every trainable parameter flattened together,
Adam on the images (optionally on the *sign* of their gradient, the paper's
choice), a step (3/8, 5/8, 7/8 of the iterations, ×0.1) or cosine
learning-rate decay, pixels clamped to the valid range, and several random
restarts of which the lowest final loss wins.

The simulated update (:func:`simulate_update`) replays the client's local
SGD functionally (``torch.func.functional_call``, ``create_graph=True``) so
it stays differentiable with respect to the images. Labels come first, from
the sign of the last layer's update (:func:`recover_labels`, iDLG).

The engine knows no wire and no auditor: ``attacks/gradinv/__init__.py`` feeds it
from the server's view, tests feed it directly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedaudit.attacks.image_optim import DEFAULT_ITERS, DEFAULT_LR, image_priors, pixel_box, warmup_cosine

DECAYS = ("step", "cosine")
STEP_MILESTONES = (3 / 8, 5 / 8, 7 / 8)  # the paper's decay points, ×0.1 each


@dataclass(frozen=True)
class LocalRecipe:
    """How the victim trains locally, as the attacker simulates it: plain SGD
    (momentum buffer, L2 weight decay, as ``torch.optim.SGD``) for ``steps``
    steps. The dummy set is split into ``steps`` consecutive batches of
    ``batch_size`` (None: ceil(n / steps)), cycling through it if needed."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    steps: int = 1
    batch_size: int | None = None

    def batches(self, n: int) -> list[Tensor]:
        """Index batches of the simulated steps over ``n`` dummies."""
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")
        bs = self.batch_size or math.ceil(n / self.steps)
        return [torch.arange(i * bs, (i + 1) * bs) % n for i in range(self.steps)]


@dataclass(frozen=True)
class GradInvSettings:
    """Hyper-parameters of one gradient inversion (recorded in metrics.json).

    ``tv_weight`` weighs the same TV-L2 prior as DeepInversion
    (:func:`fedaudit.attacks.image_optim.image_priors`), with its own option
    (``--gradinv-tv-weight``, default 3e-5): DeepInversion's 1e-3 blurs a
    gradient inversion (about 21 dB instead of 35 on the one-image test). ``mean``/``std`` (per channel) give the box constraint:
    images are clamped, in normalised space, to what [0, 1] pixels map to;
    None leaves them unconstrained.
    """

    iters: int = DEFAULT_ITERS
    lr: float = DEFAULT_LR
    tv_weight: float = 3e-5
    signed: bool = True
    decay: str = "step"
    restarts: int = 1
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """As metrics.json stores the settings (a tuple as a JSON list)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def split_state(model: nn.Module, state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(trainable parameters, buffers) of a state dict, by the model's ``named_parameters``;
    buffers the state lacks are taken from ``model``."""
    names = {k for k, _ in model.named_parameters()}
    params = {k: t for k, t in state.items() if k in names}
    buffers = {k: state.get(k, b) for k, b in model.named_buffers()}
    return params, buffers


def simulate_update(model: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor], images: Tensor,
                    labels: Tensor, recipe: LocalRecipe) -> dict[str, Tensor]:
    """θ_after − θ_before of every tensor in ``params`` after local SGD on (images, labels).

    Differentiable with respect to ``images`` (the graph of every step is
    kept). BatchNorm runs in train mode — batch statistics, as the client
    trained — on copies of ``buffers``, so the caller's running statistics
    are untouched; buffers never enter the update.
    """
    names = list(params)
    current = {k: params[k].detach() for k in names}
    bufs = {k: b.detach().clone() for k, b in buffers.items()}
    momentum: dict[str, Tensor] = {}
    was_training = model.training
    model.train()
    try:
        for idx in recipe.batches(images.shape[0]):
            idx = idx.to(images.device)
            with torch.enable_grad():
                weights = {k: current[k] if current[k].requires_grad else current[k].requires_grad_(True) for k in names}
                logits = functional_call(model, ({**weights, **bufs},), (images[idx],))
                loss = F.cross_entropy(logits.float(), labels[idx])
                grads = torch.autograd.grad(loss, [weights[k] for k in names], create_graph=True)
            for k, g in zip(names, grads):
                if recipe.weight_decay:
                    g = g + recipe.weight_decay * current[k]
                if recipe.momentum:
                    # torch.optim.SGD: the first step's buffer is the gradient itself (no dampening).
                    g = g if k not in momentum else recipe.momentum * momentum[k] + g
                    momentum[k] = g
                current[k] = current[k] - recipe.lr * g
    finally:
        model.train(was_training)
    return {k: current[k] - params[k].detach() for k in names}


def recover_labels(delta_last_weight: Tensor, delta_last_bias: Tensor | None, n: int, num_classes: int) -> Tensor:
    """The ``n`` training labels an update of the last (linear) layer gives away (iDLG).

    For cross-entropy the bias gradient of class c is mean_i(p_ic − y_ic):
    negative for a class present in the batch (while p stays small), positive
    for an absent one — so the *update* (−lr·gradient) is positive exactly for
    present classes. Without a bias the row sums of the weight update carry
    the same sign when the features are non-negative (post-ReLU).

    n = 1: the argmax, exact for one image. n > 1 (a heuristic): the classes
    with positive update, each at least once, the rest of the n apportioned
    in proportion to the update's magnitude (a class's share of the batch
    scales it); with more positive classes than n, the n largest; with none,
    the argmax n times. Returns a LongTensor [n], sorted.
    """
    score = delta_last_bias if delta_last_bias is not None else delta_last_weight.sum(dim=1)
    score = score.detach().float().flatten()
    if score.numel() != num_classes:
        raise ValueError(f"the last layer has {score.numel()} outputs, expected {num_classes} classes")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if n == 1:
        return score.argmax().view(1).long()
    present = torch.nonzero(score > 0).flatten()
    if present.numel() == 0:
        return score.argmax().repeat(n).long()
    present = present[score[present].argsort(descending=True)]
    if present.numel() >= n:
        return present[:n].sort().values.long()
    counts = torch.ones(present.numel())
    ideal = n * score[present].cpu() / score[present].sum().cpu()
    for _ in range(n - present.numel()):
        counts[int((ideal - counts).argmax())] += 1  # greedy apportionment: the largest shortfall gets the next one
    return present.cpu().repeat_interleave(counts.long()).sort().values.to(score.device).long()


def random_update(target: Mapping[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
    """A Gaussian update with the shapes and per-tensor L2 norms of ``target`` (the control:
    what inverting an update that carries no data gives)."""
    out = {}
    for k, t in target.items():
        r = torch.randn(t.shape, generator=generator, device=generator.device).to(t.device, torch.float32)
        out[k] = r * (t.float().norm() / r.norm().clamp_min(1e-12))
    return out


def last_linear(model: nn.Module, num_classes: int) -> tuple[str, str | None]:
    """State-dict names of the weight and bias (None if it has none) of the last
    ``nn.Linear`` with ``num_classes`` outputs: where the label signal sits."""
    found = None
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and m.out_features == num_classes:
            found = (name, m)
    if found is None:
        raise ValueError(f"the model has no nn.Linear layer with {num_classes} outputs")
    prefix = f"{found[0]}." if found[0] else ""
    return f"{prefix}weight", (f"{prefix}bias" if found[1].bias is not None else None)


def _cosine_loss(sim: dict[str, Tensor], target: dict[str, Tensor], target_norm: Tensor) -> tuple[Tensor, Tensor]:
    """(1 − cos, cos) over every tensor flattened together."""
    dot = sum((sim[k].float() * target[k]).sum() for k in target)
    norm = torch.sqrt(sum(sim[k].float().pow(2).sum() for k in target))
    cos = dot / (norm * target_norm).clamp_min(1e-20)
    return 1.0 - cos, cos


def _lr_factor(decay: str, step: int, total: int) -> float:
    if decay == "cosine":
        return warmup_cosine(step, total, 0.0)
    return 0.1 ** sum(step >= int(m * total) for m in STEP_MILESTONES)


def _descend(model: nn.Module, params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, labels: Tensor,
             recipe: LocalRecipe, target: dict[str, Tensor], target_norm: Tensor, settings: GradInvSettings,
             lo: Tensor | None, hi: Tensor | None) -> Tensor:
    """One restart: Adam on the images (sign of the gradient if ``signed``) toward the target update's direction,
    kept inside the pixel box; returns the detached images."""
    if lo is not None:
        x = torch.maximum(torch.minimum(x, hi), lo)
    x.requires_grad_(True)
    opt = torch.optim.Adam([x], lr=settings.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(settings.decay, s, settings.iters))
    for _step in range(settings.iters):
        sim = simulate_update(model, params, buffers, x, labels, recipe)
        loss, _ = _cosine_loss(sim, target, target_norm)
        if settings.tv_weight:
            loss = loss + settings.tv_weight * image_priors(x[None])[0][0]
        opt.zero_grad(set_to_none=True)
        (grad,) = torch.autograd.grad(loss, [x])
        x.grad = grad.sign() if settings.signed else grad
        opt.step()
        sched.step()
        if lo is not None:
            with torch.no_grad():
                x.copy_(torch.maximum(torch.minimum(x, hi), lo))
    with torch.no_grad():
        return x.detach()


def invert_update(model: nn.Module, params_before: Mapping[str, Tensor], target_delta: Mapping[str, Tensor],
                  labels: Tensor, recipe: LocalRecipe, shape: tuple[int, ...], settings: GradInvSettings,
                  generator: torch.Generator | None = None) -> tuple[Tensor, dict[str, Any]]:
    """Images of ``shape`` [n, C, H, W] (normalised space) whose simulated update matches ``target_delta``.

    ``params_before``: the state the victim started from (parameters, and
    buffers for BatchNorm; missing buffers come from ``model``). Only the
    tensors named in ``target_delta`` enter the cosine. Runs on ``model``'s
    device. Returns the images of the restart with the lowest final loss and
    ``info`` (final loss, cosine, iterations, restarts, per-restart losses, seconds).
    """
    if settings.decay not in DECAYS:
        raise ValueError(f"decay must be one of {DECAYS}, got {settings.decay!r}")
    if labels.numel() != shape[0]:
        raise ValueError(f"{labels.numel()} labels for {shape[0]} images")
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    params, buffers = split_state(model, {k: v.to(device) for k, v in params_before.items()})
    missing = [k for k in target_delta if k not in params]
    if missing:
        raise ValueError(f"target_delta names tensors that are not parameters of the model: {missing[:3]}")
    params = {k: params[k].float() for k in target_delta}  # only what the target carries is simulated
    target = {k: t.detach().to(device, torch.float32) for k, t in target_delta.items()}
    target_norm = torch.sqrt(sum(t.pow(2).sum() for t in target.values()))
    labels = labels.to(device)
    lo = hi = None
    if settings.mean is not None and settings.std is not None:
        lo, hi = (b.to(device).view(1, -1, 1, 1) for b in pixel_box(settings.mean, settings.std))
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    best: tuple[float, float, Tensor] | None = None
    trials = []
    for _ in range(max(1, settings.restarts)):
        x = torch.randn(shape, generator=g, device=g.device).to(device)
        x = _descend(model, params, buffers, x, labels, recipe, target, target_norm, settings, lo, hi)
        # Score the final images themselves (the loop's last loss belongs to the images before the last step).
        sim = simulate_update(model, params, buffers, x, labels, recipe)
        with torch.no_grad():
            rec, cos = _cosine_loss(sim, target, target_norm)
            tv = settings.tv_weight * image_priors(x[None])[0][0] if settings.tv_weight else torch.zeros((), device=device)
            final = float(rec + tv)
        trials.append(final)
        if best is None or final < best[0]:
            best = (final, float(cos), x)
    assert best is not None
    info = {"final_loss": best[0], "cosine": best[1], "iterations": settings.iters, "restarts": len(trials),
            "restart_losses": trials, "seconds": time.perf_counter() - t0}
    return best[2], info
