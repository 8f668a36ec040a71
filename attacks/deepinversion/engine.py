"""Statistics inversion: one batched optimisation loop, pluggable matchers.

DeepInversion (Yin et al., CVPR 2020) optimises synthetic inputs so that the
statistics a network computes on them match the statistics it stored. Every
artifact fedaudit attacks is such a set of statistics, so one loop serves
them all; a :class:`Matcher` turns an artifact into a loss term:

* :class:`BNStatMatcher` — forward hooks on every BatchNorm layer compare the
  batch statistics of the layer's *input* with its running statistics:
  ``‖μ_run − μ_batch‖₂ + ‖σ²_run − σ²_batch‖₂`` (biased batch variance), the
  first layer weighted ``first_layer_mult``× (10 in the paper); in a trained
  model a layer whose ``num_batches_tracked`` is 0 never saw data and is
  left out;
* :class:`ClassCE` — cross-entropy of the model's logits on the target classes
  (used only when the victim's head is known).

Priors on the images: TV-L2 (per image, the sum of the L2 norms of the four
neighbour differences — horizontal, vertical and both diagonals) and the
image L2 norm, both averaged over images so weights do not depend on the
batch size. Each step rolls the batch by a random offset of up to
``jitter`` px (2 px at 32 px, scaled with the image size) and flips it when
the data allows flips; Adam (β = 0.5, 0.9) with linear warm-up then cosine
decay; pixels are clipped to the valid normalised range after every step.

Batching: every class × several images per victim, and all victims that share
an architecture in one problem. A victim is a model *state* (its BN buffers
are the statistics to match). With ``victims="vmap"`` the states are stacked
and the per-victim loss runs under :func:`torch.func.vmap` over
:func:`torch.func.functional_call` — one launch per layer for all victims,
what a GPU needs; ``"loop"`` runs the same per-victim function once per
victim (on a 2-core CPU vmap's grouped convolutions buy nothing once a victim's
batch fills the cores); ``"auto"`` picks vmap on CUDA, and on a CPU for victims
of at most :data:`CPU_VMAP_MAX_IMAGES` images (a positive control's), the loop
otherwise. Each step's gradient is
taken one launch at a time (a victim's loss depends on its own images only),
so memory holds one launch's graph: the loop's one victim, or vmap's group,
all victims until the device runs out of memory, then half as many, down to
one (``InversionResult.per_launch``). There is no host sync inside the loop:
loss components are written into a device tensor and read once at the end.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.utils.hooks import RemovableHandle

from fedaudit.attacks.image_optim import DEFAULT_ITERS, DEFAULT_LR, image_priors, warmup_cosine
from fedaudit.errors import FedauditError
from fedaudit.simulation.training import autocast
from fedaudit.tensor_ops.bn_statistics import bn_modules

VICTIM_BATCHING = ("auto", "vmap", "loop")
# On a CPU, vmap pays only where each victim's batch is too small to keep the cores busy: measured on the quick
# profile's cnn at 32 px (2-core AMD EPYC), vmap against the loop took 0.42× the time at 1 image per victim, 0.79×
# at 7, 1.06× at 14 and 1.59× at 35.
CPU_VMAP_MAX_IMAGES = 8


@dataclass(frozen=True)
class InversionSettings:
    """Hyper-parameters of one inversion (recorded in metrics.json).

    ``jitter=None`` means 2 px at 32 px, scaled with the image side (at least 1).
    """

    iters: int = DEFAULT_ITERS
    per_class: int = 4
    lr: float = DEFAULT_LR
    warmup: float = 0.05  # fraction of iterations with a linear warm-up
    bn_weight: float = 10.0
    first_bn_mult: float = 10.0
    ce_weight: float = 1.0
    tv_weight: float = 1e-3
    l2_weight: float = 1e-5
    jitter: int | None = None
    flip: bool = False
    precision: str = "fp32"
    victims: str = "auto"
    seed: int = 0
    # An artifact of records whose classes the attacker is not told (the positive control of one record): this
    # many images per victim, no class target (CE off). None: every class × ``per_class``.
    images: int | None = None
    # Run the nulls beside the attack (untrained control, prior-only control). The auditor switches
    # them off when it re-runs the attack on counterfactual artifacts (twin, power), which need none.
    nulls: bool = True
    # Latent inversion of a classifier head (CLASSIFIER_HEAD): Adam on latents,
    # same iteration count; the BN term matters more to an attacker than to
    # FedLSI's server, hence a larger weight than the paper's λ_bn = 1e-3.
    latent_lr: float = 0.05
    latent_bn_weight: float = 1.0
    latent_norm_weight: float = 1e-4

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Matcher:
    """Turns an artifact into one loss term for one victim.

    ``attach`` registers what the matcher needs on the (shared) template
    model; ``begin`` is called before each victim's forward pass; ``loss``
    returns a scalar for that victim. The engine may call these inside
    :func:`torch.func.vmap`, so a matcher keeps per-forward state only between
    ``begin`` and ``loss``.
    """

    name: str = "matcher"

    def attach(self, model: nn.Module) -> list[RemovableHandle]:
        return []

    def begin(self) -> None:
        pass

    def loss(self, x: Tensor, logits: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError


class BNStatMatcher(Matcher):
    """‖μ_run − μ_batch‖₂ + ‖σ²_run − σ²_batch‖₂ summed over BN layers, first layer × ``first_layer_mult``.

    The hook reads ``module.running_mean``/``running_var`` at call time, so
    under ``functional_call`` it sees the victim's buffers, not the template's.
    """

    name = "bn"

    def __init__(self, first_layer_mult: float = 10.0) -> None:
        self.first_layer_mult = first_layer_mult
        self._terms: list[Tensor] = []
        self._seen: list[Tensor] = []

    def attach(self, model: nn.Module) -> list[RemovableHandle]:
        layers = bn_modules(model)
        if not layers:
            raise ValueError("the model has no BatchNorm layer with running statistics to match")
        handles = []
        for i, layer in enumerate(layers):
            mult = self.first_layer_mult if i == 0 else 1.0
            handles.append(layer.register_forward_hook(self._hook(mult)))
        return handles

    def _hook(self, mult: float):
        def hook(module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
            x = inputs[0].float()
            dims = [d for d in range(x.dim()) if d != 1]
            var, mu = torch.var_mean(x, dim=dims, correction=0)  # one pass over the activations
            term = torch.linalg.vector_norm(module.running_mean.float() - mu) + torch.linalg.vector_norm(
                module.running_var.float() - var)
            seen = getattr(module, "num_batches_tracked", None)  # torchvision's FrozenBatchNorm2d has none
            self._terms.append(term * mult)
            self._seen.append(seen > 0 if seen is not None else torch.ones((), dtype=torch.bool, device=term.device))

        return hook

    def begin(self) -> None:
        self._terms = []
        self._seen = []

    def loss(self, x: Tensor, logits: Tensor, y: Tensor) -> Tensor:
        # In a trained model, a layer that never saw data (frozen at init, e.g. CCST's first block)
        # holds no statistics and is left out; an untrained model (the control) keeps every layer.
        seen = torch.stack(self._seen)
        keep = torch.where(seen.any(), seen, torch.ones_like(seen)).float()
        return (torch.stack(self._terms) * keep).sum()


class ClassCE(Matcher):
    """Cross-entropy of the victim model's logits on the target classes."""

    name = "ce"

    def loss(self, x: Tensor, logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits.float(), y)


class ProbeLoss(Matcher):
    """The mismatch a *probe* model computes itself.

    Artifacts that are not a network's BN statistics (style banks, amplitude
    spectra) are inverted through a small probe module whose buffers hold one
    victim's artifact and whose forward returns the mismatch of the images
    with it; victims are then states of the probe, batched like BN victims.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def loss(self, x: Tensor, logits: Tensor, y: Tensor) -> Tensor:
        return logits.float()


class StyleProbe(nn.Module):
    """Mismatch of the images' feature style with target styles (CCST's ``STYLE_BANK``).

    ``encoder`` is the frozen feature map the styles were measured with;
    buffers ``target_mean``/``target_std`` (S, C) hold the victim's styles.
    ``pooled``: one style for the whole batch (CCST's *overall* mode, S = 1),
    else image ``i`` matches style ``i mod S`` (*single* mode). The loss is
    ``‖μ − μ_t‖₂ + ‖σ − σ_t‖₂`` averaged over styles, as BN matching is.
    """

    def __init__(self, encoder: nn.Module, target_mean: Tensor, target_std: Tensor, pooled: bool, eps: float) -> None:
        super().__init__()
        self.encoder = encoder.eval().requires_grad_(False)
        self.register_buffer("target_mean", target_mean.float().clone())
        self.register_buffer("target_std", target_std.float().clone())
        self.pooled = pooled
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        f = self.encoder(x).float()
        var, mean = torch.var_mean(f, dim=(2, 3), correction=0)
        if self.pooled:
            mu = mean.mean(0, keepdim=True)
            var = ((var + mean.square()).mean(0, keepdim=True) - mu.square()).clamp_min(0.0)
            mean, tm, ts = mu, self.target_mean[:1], self.target_std[:1]
        else:
            rows = torch.arange(x.shape[0], device=x.device) % self.target_mean.shape[0]
            tm, ts = self.target_mean[rows], self.target_std[rows]
        std = (var + self.eps).sqrt()
        return (torch.linalg.vector_norm(mean - tm, dim=1) + torch.linalg.vector_norm(std - ts, dim=1)).mean()


class AmplitudeProbe(nn.Module):
    """Mismatch of the images' Fourier amplitude with target spectra (ELCFS's ``AMPLITUDE_BANK``):
    phase retrieval by gradient descent.

    Buffer ``target`` (n, C, H, W) holds the victim's spectra of [0, 1]
    images (:mod:`fedaudit.tensor_ops.fourier`); image ``i`` matches spectrum ``i`` by
    the relative L2 error ``‖A − A_t‖ / ‖A_t‖``. The raw (not log) amplitude
    lets the large low-frequency terms — brightness, colour, layout — lead,
    which is what gradient phase retrieval can recover; a log loss was
    measured to leave the mean brightness unmatched. ``mean``/``std`` map
    the engine's normalised images back to [0, 1].
    """

    def __init__(self, target: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.register_buffer("target", target.float())
        self.register_buffer("mean", torch.tensor(mean).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std).view(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        amp = torch.fft.fft2(x.float() * self.std + self.mean).abs()
        target = self.target[: x.shape[0]]
        per_image = torch.linalg.vector_norm((amp - target).flatten(1), dim=1)
        return (per_image / torch.linalg.vector_norm(target.flatten(1), dim=1).clamp_min(1e-6)).mean()


@dataclass
class InversionTarget:
    """One victim: a full model state (its BN buffers are the statistics to
    match) and per-matcher weights (0 switches a matcher off for this victim,
    e.g. CE when the head was never shared)."""

    name: str
    state: dict[str, Tensor]
    gates: dict[str, float] = field(default_factory=dict)


@dataclass
class InversionResult:
    """``images`` [V, n, C, H, W] in normalised input space; ``labels`` [n];
    ``losses`` per victim and term at the last step; ``history`` [steps, V, terms]; ``batching``: how the
    victims ran, "vmap" or "loop" (``auto`` resolved); ``per_launch``: victims per forward pass (the loop's
    one; under vmap all of them, or fewer where the device ran out of memory with more)."""

    images: Tensor
    labels: Tensor
    terms: list[str]
    losses: dict[str, dict[str, float]]
    history: Tensor
    seconds: float = 0.0
    batching: str = "loop"
    per_launch: int = 1


def target_labels(num_classes: int, per_class: int, device: torch.device) -> Tensor:
    """Every class ``per_class`` times, class-major: [0,0,…,1,1,…]."""
    return torch.arange(num_classes, device=device).repeat_interleave(per_class)


def default_jitter(image_size: int) -> int:
    return max(1, round(2 * image_size / 32))


def invert(model: nn.Module, targets: Sequence[InversionTarget], num_classes: int, image_size: int,
           settings: InversionSettings, lo: Tensor, hi: Tensor, device: torch.device, matchers: Sequence[Matcher] | None = None,
           weights: dict[str, float] | None = None, log_every: int = 10) -> InversionResult:
    """Optimise one batch of images per victim; all victims share ``model``'s architecture.

    ``lo``/``hi`` are the per-channel bounds of valid pixels in normalised
    space (shape [C]). ``matchers`` default to BN statistics + CE; their
    weights default to the settings' ``bn_weight`` and ``ce_weight``.
    """
    if settings.victims not in VICTIM_BATCHING:
        raise ValueError(f"victims must be one of {VICTIM_BATCHING}, got {settings.victims!r}")
    if not targets:
        raise ValueError("no victim to invert")
    t0 = time.perf_counter()
    matchers = list(matchers) if matchers is not None else [BNStatMatcher(settings.first_bn_mult), ClassCE()]
    weights = {"bn": settings.bn_weight, "ce": settings.ce_weight, **(weights or {})}
    if settings.images is not None:  # no class target to score the logits against
        weights["ce"] = 0.0
    names = [m.name for m in matchers]
    model = model.to(device).eval()
    handles = [h for m in matchers for h in m.attach(model)]
    try:
        return _optimise(model, list(targets), num_classes, image_size, settings, lo, hi, device, matchers, weights,
                         names, log_every, t0)
    finally:
        for h in handles:
            h.remove()


def _victims_forward(model: nn.Module, states: list[dict[str, Tensor]], gates: Tensor, matchers: list[Matcher],
                     y: Tensor, use_vmap: bool, per_launch: int) -> list[tuple[slice, Callable[[Tensor], Tensor]]]:
    """The victims in groups of ``per_launch`` (the loop: one): each group's slice of the victims and its
    forward, x [v, n, C, H, W] → the group's weighted matcher losses [v, matchers], each state loaded
    functionally — one vmapped call per group, or one call per victim."""
    param_names = {k for k, _ in model.named_parameters()}

    def split(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        params = {k: s.detach() for k, s in state.items() if k in param_names}
        buffers = {k: s for k, s in state.items() if k not in param_names}
        return params, buffers

    def per_victim(params: dict[str, Tensor], buffers: dict[str, Tensor], x: Tensor, gate: Tensor) -> Tensor:
        for m in matchers:
            m.begin()
        logits = functional_call(model, (params, buffers), (x,))
        return torch.stack([m.loss(x, logits, y) for m in matchers]) * gate

    parts = [split(s) for s in states]
    if not use_vmap:
        # channels_last outside vmap: oneDNN's (and cuDNN's) faster convolutions; 0.79x the step time of the
        # attack's batches on the quick profile's cnn (2-core AMD EPYC). Under vmap the states stay contiguous.
        parts = [({k: _channels_last(v) for k, v in p.items()}, b) for p, b in parts]
        return [(slice(i, i + 1), lambda x, p=p, b=b, i=i: per_victim(p, b, _channels_last(x[0]), gates[i])[None])
                for i, (p, b) in enumerate(parts)]
    batched = vmap(per_victim, in_dims=(0, 0, 0, 0))
    groups = []
    for start in range(0, len(parts), per_launch):
        group = parts[start:start + per_launch]
        params = {k: torch.stack([p[k] for p, _ in group]) for k in group[0][0]}
        buffers = {k: torch.stack([b[k] for _, b in group]) for k in group[0][1]}
        where = slice(start, start + len(group))
        groups.append((where, lambda x, p=params, b=buffers, w=where: batched(p, b, x, gates[w])))
    return groups


def _channels_last(t: Tensor) -> Tensor:
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def _step_gradients(x: Tensor, groups: list[tuple[slice, Callable[[Tensor], Tensor]]], augment: Callable[[Tensor], Tensor],
                    device: torch.device, precision: str) -> Tensor:
    """One step's gradient of every victim's matcher losses, accumulated into ``x.grad`` one group at a time:
    a victim's loss depends on its own images alone, so only one group's graph is held at once. Returns the
    losses [V, matchers], detached."""
    matched = []
    for where, forward in groups:
        with autocast(device, precision):
            part = forward(augment(x[where]))
        part.float().sum().backward()
        matched.append(part.detach())
    return torch.cat(matched)


def _optimise(model: nn.Module, targets: list[InversionTarget], num_classes: int, size: int, settings: InversionSettings,
              lo: Tensor, hi: Tensor, device: torch.device, matchers: list[Matcher], weights: dict[str, float],
              names: list[str], log_every: int, t0: float) -> InversionResult:
    v = len(targets)
    y = (target_labels(num_classes, settings.per_class, device) if settings.images is None else
         torch.zeros(settings.images, dtype=torch.long, device=device))  # no class: CE is gated off
    n = y.numel()
    template = model.state_dict()
    # Contiguous whatever layout a victim arrives in: a CUDA-trained state is channels_last, and cuDNN's
    # BatchNorm inside vmap asks for a layout vmap cannot answer (issue 38).
    states = [{k: (t.state[k].to(device) if k in t.state else template[k]).contiguous() for k in template}
              for t in targets]
    gates = torch.tensor([[t.gates.get(name, 1.0) * weights.get(name, 1.0) for name in names] for t in targets],
                         device=device, dtype=torch.float32)
    use_vmap = settings.victims == "vmap" or (settings.victims == "auto" and (device.type == "cuda"
                                                                              or n <= CPU_VMAP_MAX_IMAGES))
    launches = _Launches(model, states, gates, matchers, y, use_vmap, size)
    channels = lo.numel()
    g = torch.Generator(device="cpu")
    g.manual_seed(settings.seed)
    x = torch.randn(v, n, channels, size, size, generator=g).to(device)
    lo_b, hi_b = lo.to(device).view(1, 1, -1, 1, 1), hi.to(device).view(1, 1, -1, 1, 1)
    x = torch.maximum(torch.minimum(x, hi_b), lo_b).requires_grad_(True)
    opt = torch.optim.Adam([x], lr=settings.lr, betas=(0.5, 0.9), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, settings.iters, settings.warmup))
    jitter = settings.jitter if settings.jitter is not None else default_jitter(size)
    rng = random.Random(settings.seed)  # offsets are host integers: no device sync to draw them
    terms = [*names, "tv", "l2"]
    history = torch.zeros((settings.iters + log_every - 1) // log_every, v, len(terms), device=device)
    last = torch.zeros(v, len(terms), device=device)
    prior_w = torch.tensor([settings.tv_weight, settings.l2_weight], device=device)
    for step in range(settings.iters):
        dy, dx = rng.randint(-jitter, jitter), rng.randint(-jitter, jitter)
        flip = settings.flip and rng.random() < 0.5

        def augment(xs: Tensor, dy: int = dy, dx: int = dx, flip: bool = flip) -> Tensor:  # this step's draw
            xa = torch.roll(xs, shifts=(dy, dx), dims=(-2, -1))
            return xa.flip(-1) if flip else xa

        opt.zero_grad(set_to_none=True)
        matched = launches.gradients(x, augment, device, settings.precision)
        tv, l2 = image_priors(x)
        priors = torch.stack([tv, l2], 1) * prior_w
        priors.sum().backward()
        opt.step()
        sched.step()
        with torch.no_grad():
            x.copy_(torch.maximum(torch.minimum(x, hi_b), lo_b))
            if step % log_every == 0 or step == settings.iters - 1:
                last = torch.cat([matched.float(), priors.detach()], 1)
                if step % log_every == 0:
                    history[step // log_every] = last
    final = last.cpu()  # the one host sync
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    losses = {t.name: {name: float(final[i, j]) for j, name in enumerate(terms)} for i, t in enumerate(targets)}
    return InversionResult(x.detach(), y, terms, losses, history, time.perf_counter() - t0,
                           "vmap" if use_vmap else "loop", launches.per_launch)


class _Launches:
    """The victims' forward passes in launches: under vmap all victims in one, until the device runs out of
    memory, then half as many per launch, down to one; the loop's one victim each."""

    def __init__(self, model: nn.Module, states: list[dict[str, Tensor]], gates: Tensor, matchers: list[Matcher],
                 y: Tensor, use_vmap: bool, size: int) -> None:
        self.build = lambda per_launch: _victims_forward(model, states, gates, matchers, y, use_vmap, per_launch)
        self.per_launch = len(states) if use_vmap else 1
        self.groups = self.build(self.per_launch)
        self.what = f"{y.numel()} images at {size} px"

    def gradients(self, x: Tensor, augment: Callable[[Tensor], Tensor], device: torch.device,
                  precision: str) -> Tensor:
        """:func:`_step_gradients`, retried with half as many victims per launch while the device is out of memory."""
        while True:
            try:
                return _step_gradients(x, self.groups, augment, device, precision)
            except torch.cuda.OutOfMemoryError:
                pass  # recovered below, outside the except: its traceback still holds the failed graph
            x.grad = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if self.per_launch == 1:  # a victim's batch statistics need all its images in one forward pass
                raise FedauditError(f"deepinversion: one victim's {self.what} does not fit in {device.type}'s memory; "
                                    "lower --inversion-batch (or --image-size), or use --precision bf16")
            self.per_launch //= 2
            self.groups = self.build(self.per_launch)


