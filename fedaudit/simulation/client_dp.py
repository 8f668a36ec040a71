"""Client-level DP on the aggregate (issue 47): what bounds a whole client's influence on the model it helps release.

Record-level DP (DP-SGD, :mod:`.dp_sgd`) bounds what one record changes; a whole client's data — its domain, whether
it took part — is thousands of records and stays visible. Client-level DP is DP-FedAvg (McMahan et al., *Learning
Differentially Private Recurrent Language Models*, ICLR 2018): each round the server

1. takes every client's update Δ_k = w_k − w (all floating tensors of the uploaded state, BatchNorm statistics
   included: they summarise the client's data too), scaled to norm at most C (``--client-dp-clip``);
2. averages them with fixed, equal weights 1/K (sample-count weights would let a client's size leak and change the
   sensitivity), and adds Gaussian noise N(0, (σC/K)²) to every coordinate of the mean.

Adding or removing one client moves the sum of clipped updates by at most C, so each round is a Gaussian mechanism
with sensitivity-to-noise ratio 1/σ, and T rounds with every client taking part compose exactly to μ-GDP with
μ = √T/σ (Dong, Roth & Su 2019); the ε at δ is :func:`~fedaudit.statistics.gaussian_dp.gaussian_epsilon` of that μ.
Given ``--client-dp-epsilon`` the noise multiplier is the σ that spends exactly it over the run's rounds.

What it covers: what the server sends and releases (every broadcast, the released model), as seen by a client or
anyone holding the model. Not the uploads: the server reads each update before it aggregates; only secure
aggregation or noise added on the client would hide those. What few clients mean: the noise on the mean is σC/K, so
with the 3–6 clients of a FedDG federation it is large beside updates of norm ≤ C — measure what it costs
(``docs/results/client_dp.md``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedaudit.run.stored import ClientDP
from fedaudit.statistics.gaussian_dp import gaussian_epsilon

UNIT = "one client's whole data (its update added or removed)"
NOISE_STREAM = 4_747  # the server's generator stream for the noise


def mu_for(epsilon: float, delta: float) -> float:
    """The μ whose Gaussian mechanism spends exactly ``epsilon`` at ``delta`` (ε grows with μ)."""
    from scipy.optimize import brentq

    hi = 1.0
    while gaussian_epsilon(hi, delta) < epsilon:
        hi *= 2.0
    return float(brentq(lambda mu: gaussian_epsilon(mu, delta) - epsilon, 1e-9, hi, xtol=1e-12))


@dataclass
class ClientLevelDP:
    """The mechanism of one run: its target, the noise multiplier that meets it, and what each round did."""

    epsilon: float
    delta: float
    rounds: int
    clip: float
    noise_multiplier: float
    clipped: int = 0  # updates scaled down so far
    updates: int = 0
    # The fixed K the sum of clipped updates is divided by (DP-FedAvg's fixed denominator); None: the round's clients.
    # A domain twin (a federation without one client) keeps the full federation's K: it is then DP's neighbour — the
    # same mechanism on one client fewer — and the participation test asks exactly what this mechanism bounds.
    denominator: int | None = None

    @classmethod
    def for_target(cls, epsilon: float, delta: float, rounds: int, clip: float) -> ClientLevelDP:
        return cls(epsilon, delta, rounds, clip, math.sqrt(rounds) / mu_for(epsilon, delta))

    @property
    def mu(self) -> float:
        """The μ-GDP the run spends when every round ran: √T/σ."""
        return math.sqrt(self.rounds) / self.noise_multiplier

    @torch.no_grad()
    def mean_(self, global_state: dict[str, Tensor], states: list[Mapping[str, Tensor]],
              generator: torch.Generator) -> None:
        """``global_state`` ← itself + the sum of the clipped updates over K + Gaussian noise of std σC/K, in place
        (K: :attr:`denominator`, else the round's clients). Integer buffers (BatchNorm's batch counts) keep the global
        state's value: a client's count follows its number of batches, hence its data size, and a plain mean of them
        would broadcast an unnoised value that one client's presence moves. What the guarantee covers is then every
        tensor the broadcast carries: the noised floats, and integers no client's data touched."""
        keys = [k for k, t in global_state.items() if t.is_floating_point()]
        count = self.denominator or len(states)
        total = [torch.zeros_like(global_state[k]) for k in keys]
        for state in states:
            update = [state[k] - global_state[k] for k in keys]
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(u.float()) for u in update])))
            scale = min(1.0, self.clip / norm) if norm > 0 else 1.0
            self.clipped += scale < 1.0
            self.updates += 1
            torch._foreach_add_(total, update, alpha=scale / count)
        std = self.noise_multiplier * self.clip / count
        for k, t in zip(keys, total):
            noise = torch.randn(t.shape, generator=generator, device=t.device, dtype=torch.float32) * std
            global_state[k].add_(t + noise.to(t.dtype))

    def summary(self, clients: int) -> ClientDP:
        """The block stored as ``privacy.client_dp``: the guarantee, its parameters, and what few clients cost."""
        return ClientDP(epsilon=gaussian_epsilon(self.mu, self.delta), epsilon_target=self.epsilon, delta=self.delta,
                        mu=self.mu, noise_multiplier=self.noise_multiplier, clip=self.clip, rounds=self.rounds,
                        clients=clients, noise_std_on_mean=self.noise_multiplier * self.clip / max(clients, 1),
                        clipped_updates=self.clipped, updates=self.updates, unit=UNIT,
                        accountant="μ-GDP: every client in every round, T Gaussian mechanisms of sensitivity C and "
                                   "noise σC on the sum compose to μ = √T/σ exactly; ε from μ at δ (Balle & Wang 2018)",
                        covers="every broadcast and the released model; not the uploads, which the server reads "
                               "before adding noise")

    def state(self) -> dict[str, int]:
        return {"clipped": self.clipped, "updates": self.updates}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.clipped, self.updates = int(state.get("clipped", 0)), int(state.get("updates", 0))


__all__ = ["ClientLevelDP", "NOISE_STREAM", "UNIT", "mu_for"]
