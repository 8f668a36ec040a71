"""The defense in force and what it covers: DP-SGD per client, client-level DP on the aggregate, or a recording's
declared central DP, with each shared artifact's coverage."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from fedaudit.run.stored.core import Stored


class CoverageRow(Stored):
    """Whether a guarantee covers one artifact the method sends, and why."""

    model_config = ConfigDict(json_schema_extra={"required": ["artifact", "direction", "covered", "why"]})

    artifact: str | None = None
    direction: Literal["up", "down"] | None = None
    covered: bool | None = None
    why: str = ""


class DPClient(Stored):
    """One client's DP-SGD mechanism and what its accountant has spent."""

    stored_nulls = frozenset({"noise_to_signal"})

    epsilon_spent: float | None = None
    epsilon_rdp: float | None = None
    accountant: str | None = None
    curve: dict[str, str | float] = Field(default_factory=dict, description="the privacy curve the accountant "
                                          "claims, as a canary audit tests it: gaussian (mu) or epsilon_delta")
    noise_multiplier: float | None = None
    batch_size: int | None = None
    lr_scale: float | None = None
    step_factor: float = 1
    noise_to_signal: float | None = None  # null: the trained parameters were not counted
    sample_rate: float | None = None
    steps: int | None = None
    planned_steps: int | None = None
    records: int | None = None


class RoundNoise(Stored):
    """A recording's round: the noise multiplier that protected its most exposed client."""

    round: int | None = None
    replies: int | None = None
    largest_share: float | None = None
    weights: str | None = None
    noise_multiplier: float | None = None


class ClippingCheck(Stored):
    """A recorded deployment's clipping, checked on the updates it recorded."""

    status: Literal["held", "violated", "not measured", "not visible"] | None = None
    updates: int | None = None
    over_norm: int | None = None
    skipped: int | None = None
    max_norm: float | None = None
    max_ratio: float | None = None
    worst: str | None = None
    largest_tensor: str | None = None
    why: str | None = None


class DP(Stored):
    """The record-level DP in force: DP-SGD per client (fedaudit's), or a recorded deployment's central DP
    (``recorded``); each mechanism stores its own fields, the rest stay None."""

    stored_nulls = frozenset({"noise_to_signal_target"})

    recorded: bool = False
    # DP-SGD (Opacus)
    epsilon_target: float | None = None
    max_grad_norm: float | None = None
    augmentations: int | None = None
    trained: str | None = None
    trained_parameters: int | None = None
    frozen_parameters: int | None = None
    noise_to_signal_target: float | None = None
    max_step_factor: int | None = None
    secure_rng: bool | None = None
    clients: dict[str, DPClient] = Field(default_factory=dict)
    # a recording's central DP
    mechanism: str | None = None
    clipping: str | None = None
    source: str | None = None
    noise_multiplier: float | None = None
    clipping_norm: float | None = None
    num_sampled_clients: int | None = None
    rounds: int | None = None
    epsilon: float | None = None
    epsilon_rdp: float | None = None
    sampling: str | None = None
    neighbours: str | None = None
    noise_std_on_sum: float | None = None
    per_round: list[RoundNoise] = Field(default_factory=list)
    clipping_check: ClippingCheck = Field(default_factory=lambda: ClippingCheck.read({}))
    weaker_rounds: str | None = None
    claim: str | None = None
    # both
    delta: float | None = None
    accountant: str | None = None
    unit: str | None = None

    @property
    def label_epsilon(self) -> float | None:
        """The ε a run is labelled with: DP-SGD's target, or a recorded deployment's accounted ε."""
        return self.epsilon_target if self.epsilon_target is not None else self.epsilon


class ClientDP(Stored):
    """Client-level DP on the aggregate (fedaudit.simulation.client_dp): its guarantee, its parameters, and what few
    clients cost."""

    epsilon: float | None = None
    epsilon_target: float | None = None
    delta: float | None = None
    mu: float | None = None
    noise_multiplier: float | None = None
    clip: float | None = None
    rounds: int | None = None
    clients: int | None = None
    noise_std_on_mean: float | None = None
    clipped_updates: int | None = None
    updates: int | None = None
    unit: str | None = None
    accountant: str | None = None
    covers: str | None = None


class Privacy(Stored):
    """The defense in force and what it covers."""

    model_config = ConfigDict(json_schema_extra={"required": ["dp", "coverage"]})
    stored_nulls = frozenset({"dp", "client_dp"})

    dp: DP | None = Field(None, description="the DP mechanism in force and its accounting (null: none)")
    coverage: list[CoverageRow] = Field(default_factory=list)
    client_dp: ClientDP | None = None
    client_coverage: list[CoverageRow] = Field(default_factory=list, description="what the client-level guarantee "
                                               "covers, per shared artifact")


__all__ = ["DP", "ClientDP", "ClippingCheck", "CoverageRow", "DPClient", "Privacy", "RoundNoise"]
