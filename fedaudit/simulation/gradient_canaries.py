"""White-box canaries inside DP-SGD: the auditor's gradient canaries, how they enter a step, how either side
regenerates their directions.

Shared by the auditor (:mod:`fedaudit.audit.canary` plants them in a victim's DP-SGD, :mod:`fedaudit.simulation.dp_sgd` adds
them to each step's sum of clipped gradients) and the attacker (``fedaudit.attacks.canary`` projects the
victim's updates onto their directions). Nothing here reads data: a canary is a seed, a direction and a coin.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fedaudit.run.seeds import derive_seed, stable_int

GRADIENT_STREAM = 11_002  # derive_seed stream: directions (per canary) and inclusion coins (per victim)
STEP_STREAM = 11_003  # derive_seed stream: which included canaries a Poisson step samples
MATRIX_FLOATS = 2**26  # 256 MB of float32: below it a subsampled run keeps its included directions as a matrix
RAW_NORM = 10.0  # a canary's raw gradient, in clipping norms: an order of magnitude past it, so clipping must act
GRADIENT_KIND = ("white-box gradient canaries: random unit directions in the trained weights' space, each a record "
                 "of the victim's DP-SGD whose raw gradient is the direction at 10 × the clipping norm, clipped by "
                 "DP-SGD's own per-sample clipping")

# one raw per-sample row over the space ↦ the factor DP-SGD's clipping scales it by (0-d, on the training device)
ClipFactor = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class GradientCanaries:
    """A victim's m gradient canaries: what the auditor plants in its DP-SGD (Steinke, Nasr & Jagielski 2023,
    §white-box; Andrew et al. 2024 insert random-direction updates the same way).

    Canary i is the unit vector ``direction(i)`` over ``space`` (the trained parameters, by name and shape, in
    that order), drawn from a seed of its own so either side can regenerate it without holding m × d numbers.
    ``included[i]`` (a fair coin, the auditor's secret) says whether it is one of the victim's records. An
    included canary is sampled at each DP-SGD step with the victim's Poisson rate; its raw gradient is
    :data:`RAW_NORM` × the clipping norm along its direction, DP-SGD's own per-sample clipping brings it to the
    clipping norm, and it joins the sum of clipped gradients before the noise: a record like any other, so the
    accountant's ε covers it exactly, and a DP-SGD that skips clipping lets it through ten times too strong.
    """

    victim: str
    seed: int
    included: torch.Tensor  # bool [m]
    space: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def count(self) -> int:
        return int(self.included.numel())

    @property
    def dim(self) -> int:
        return sum(math.prod(shape) for _, shape in self.space)

    def direction(self, i: int) -> torch.Tensor:
        return unit_direction(self.seed, i, self.dim)

    def slices(self) -> dict[str, tuple[slice, tuple[int, ...]]]:
        """Each trained parameter's slice of the flat space, and its shape."""
        out, start = {}, 0
        for name, shape in self.space:
            out[name] = (slice(start, start + math.prod(shape)), shape)
            start += math.prod(shape)
        return out


def unit_direction(seed: int, i: int, dim: int) -> torch.Tensor:
    """Canary ``i``'s direction: a standard normal vector of ``dim`` entries from its own seed, scaled to norm 1."""
    g = torch.Generator().manual_seed(derive_seed(seed, GRADIENT_STREAM, i) % 2**63)
    u = torch.randn(dim, generator=g, dtype=torch.float32)
    return u / u.norm()


def parameter_space(model: torch.nn.Module) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The space gradient canaries live in: the parameters DP-SGD trains, by name and shape, in the model's order."""
    return tuple((name, tuple(p.shape)) for name, p in model.named_parameters() if p.requires_grad)


def draw_gradient_canaries(victims: Sequence[str], m: int, seed: int,
                            space: tuple[tuple[str, tuple[int, ...]], ...]) -> dict[str, GradientCanaries]:
    """``m`` gradient canaries per victim, each included with probability ½ (the coins from the run seed)."""
    if m < 2:
        raise ValueError(f"the gradient canary audit needs at least 2 canaries, got {m}")
    out = {}
    for victim in victims:
        victim_seed = derive_seed(seed, GRADIENT_STREAM, stable_int(victim))
        g = torch.Generator().manual_seed(victim_seed % 2**63)
        out[victim] = GradientCanaries(victim, victim_seed, torch.randint(0, 2, (m,), generator=g).bool(), space)
    return out


class CanaryGradients:
    """Adds a victim's sampled, included gradient canaries to DP-SGD's sum of clipped gradients, step by step.

    ``add(params, names, clip_factor)`` runs after the records' clipping and before the noise (Opacus'
    ``summed_grad``), so each canary is one more record of the step: present with the Poisson rate
    ``sample_rate`` (every step at rate 1), raw norm :data:`RAW_NORM` × ``clip``, clipped by DP-SGD's own
    per-sample clipping (``clip_factor``). Flat per-sample clipping scales each row by a factor of its norm alone, and
    every canary's raw norm is the same, so the clipped canaries sum to that one factor × their raw sum: one row
    through the clipping gives it (m rows of the space would be gigabytes a step: 2,000 × 391,466 weights on
    digits). At rate 1 the included set never changes, so its sum is built once."""

    def __init__(self, canaries: GradientCanaries, clip: float, sample_rate: float, seed: int):
        self.canaries, self.clip, self.sample_rate = canaries, float(clip), float(sample_rate)
        self.slices = canaries.slices()
        self.generator = torch.Generator().manual_seed(derive_seed(seed, STEP_STREAM) % 2**63)
        self._always: torch.Tensor | None = None
        self._included = canaries.included.nonzero().flatten()
        self._matrix: torch.Tensor | None = None  # the included directions as rows, where they fit MATRIX_FLOATS
        if sample_rate < 1.0 and self._included.numel() * canaries.dim <= MATRIX_FLOATS:
            self._matrix = torch.stack([canaries.direction(int(i)) for i in self._included])
        self.steps = 0
        self.added = 0  # canary-steps: how many (canary, step) pairs went into a sum

    def reseed(self, seed: int) -> None:
        """A round's own stream of step samples (a resumed run draws the same ones)."""
        self.generator.manual_seed(derive_seed(seed, STEP_STREAM) % 2**63)

    def _sum(self, which: torch.Tensor) -> torch.Tensor:
        if self._matrix is not None:  # one matrix-vector product instead of regenerating each direction
            pick = which[self._included].to(self._matrix.dtype)
            return (pick @ self._matrix) * self.clip
        total = torch.zeros(self.canaries.dim)
        for i in which.nonzero().flatten().tolist():
            total += self.canaries.direction(i)
        return total * self.clip

    def vector(self) -> torch.Tensor:
        """This step's canary sum: C × the sum of the directions of the included canaries it samples."""
        included = self.canaries.included
        if self.sample_rate >= 1.0:
            if self._always is None:
                self._always = self._sum(included)
            present = included
            vec = self._always
        else:
            present = included & (torch.rand(included.numel(), generator=self.generator) < self.sample_rate)
            vec = self._sum(present)
        self.steps += 1
        self.added += int(present.sum())
        return vec

    def add(self, params: Sequence[torch.nn.Parameter], names: Sequence[str], clip_factor: ClipFactor) -> None:
        """Add this step's clipped canaries into each trained parameter's ``summed_grad`` (its slice of the space):
        the raw sum times the factor ``clip_factor`` gives a row of their raw norm (1 / :data:`RAW_NORM` where
        DP-SGD clips). The sum is built on the host; the factor stays on the training device (no sync)."""
        vec = self.vector()
        norm = float(vec.norm())  # a host tensor: no device sync
        if norm == 0.0:  # no canary in this step
            return
        scale = clip_factor(vec * (RAW_NORM * self.clip / norm)) * RAW_NORM
        for p, name in zip(params, names):
            piece = vec[self.slices[name][0]].view_as(p.summed_grad).to(p.summed_grad.device, p.summed_grad.dtype)
            p.summed_grad += piece * scale.to(p.summed_grad.dtype)


__all__ = ["GRADIENT_KIND", "RAW_NORM", "CanaryGradients", "GradientCanaries", "parameter_space", "draw_gradient_canaries",
           "unit_direction"]
