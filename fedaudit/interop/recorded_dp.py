"""A recorded federation's own differential privacy: the mechanism the deployment ran, its ε, and what the wire
says about the claim.

A deployment declares its mechanism in the recording's manifest (``start_recording(dp=...)``; the Flower
recorder reads it off Flower's DP strategy wrappers). Central DP with fixed clipping — each client's model
update clipped to norm C, Gaussian noise of standard deviation z·C added by the server to the sum of the m
sampled updates — is client-level DP: the unit is everything one client contributes. Its ε over R rounds is
that of R Gaussian mechanisms of noise multiplier z, exactly (they compose into one Gaussian mechanism with
μ = √(Σ 1/z_r²); RDP's looser bound is recorded beside it). No amplification by sampling is claimed:
Flower samples a fixed number of clients without replacement, not the Poisson sampling the amplification
theorems assume (Flower's own accountant makes the same choice), so the ε is an upper bound.

The server adds the noise, so it sees every update un-noised: the ε covers what leaves the server (the
broadcasts, the deployed model) against everyone but the server, and no upload. Where the clients clip, the
recording shows whether they did: every recorded update's norm is measured against C.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedaudit.errors import FedauditError
from fedaudit.run.stored import DP, ClippingCheck, CoverageRow, Privacy, RoundNoise
from fedaudit.simulation.dp_accounting import accountant_name, rdp_epsilon, spent_epsilon
from fedaudit.simulation.wire import SERVER, ArtifactKind

if TYPE_CHECKING:
    from fedaudit.interop.recording_reader import Recording

# mechanism name → who clips (the server always adds the noise)
MECHANISMS = {
    "central-dp-client-side-fixed-clipping": "the clients clip their updates (Flower's fixedclipping_mod)",
    "central-dp-server-side-fixed-clipping": "the server clips each update on arrival",
}
UNIT = "everything one client contributes (client-level DP)"
NEIGHBOURS = "add or remove one client (under replace-one, the same noise gives a larger ε)"
NO_AMPLIFICATION = ("no amplification by sampling is claimed: the clients are sampled as a fixed number without "
                    "replacement, not by Poisson sampling, so ε is an upper bound")
CLIP_TOLERANCE = 1e-3  # relative: float32 rounding of a clipped update's norm
DEFAULT_DELTA = 1e-5


def check_dp(dp: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The manifest's ``dp`` block, each field checked (one line naming the field and what it must be)."""
    out = dict(dp)
    if not isinstance(out.get("mechanism"), str) or out["mechanism"] not in MECHANISMS:
        raise FedauditError(f"{where} dp.mechanism {out.get('mechanism')!r} is not one fedaudit can account; known: "
                            f"{', '.join(MECHANISMS)}")
    for key, low in (("noise_multiplier", 0.0), ("clipping_norm", 1e-300)):
        v = out.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low:
            raise FedauditError(f"{where} dp.{key} must be a {'positive' if low else 'non-negative'} number, got {v!r}")
    m = out.get("num_sampled_clients")
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise FedauditError(f"{where} dp.num_sampled_clients must be a positive integer, got {m!r}")
    delta = out.setdefault("delta", DEFAULT_DELTA)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise FedauditError(f"{where} dp.delta must lie strictly between 0 and 1, got {delta!r}")
    weighted_by = out.setdefault("weighted_by_key", None)
    if weighted_by is not None and not isinstance(weighted_by, str):
        raise FedauditError(f"{where} dp.weighted_by_key must be the name of the metric the aggregate weights by, got "
                            f"{weighted_by!r}")
    return out


def recorded_privacy(rec: Recording, shares: tuple[tuple[ArtifactKind, str], ...]) -> Privacy | None:
    """The privacy section of an audit whose recording declares its DP mechanism (None when it declares none)."""
    declared = rec.manifest.dp
    if declared is None:
        return None
    dp = check_dp(declared.model_dump(exclude_none=True), f"{rec.root}/manifest.json")
    z, c, m = float(dp["noise_multiplier"]), float(dp["clipping_norm"]), int(dp["num_sampled_clients"])
    rounds = effective_noise(rec, z, m, dp["weighted_by_key"])
    history = [(r["noise_multiplier"], 1.0, 1) for r in rounds]
    noiseless = any(r["noise_multiplier"] == 0 for r in rounds)
    epsilon = math.inf if noiseless else spent_epsilon(history, float(dp["delta"]))
    epsilon_rdp = math.inf if noiseless else rdp_epsilon(history, float(dp["delta"]))
    weaker = [r for r in rounds if r["noise_multiplier"] < z * (1 - 1e-9)]
    checked = (clipping_check(rec, c) if dp["mechanism"] == "central-dp-client-side-fixed-clipping" else
               ClippingCheck(status="not visible",
                             why="the server clips after it receives the updates: the wire carries them unclipped"))
    found: dict[str, Any] = {}
    if weaker:
        found["weaker_rounds"] = (f"in {len(weaker)} of {len(rounds)} rounds one client weighed more than 1/{m} of the "
                                  f"average (unequal weights, or fewer than {m} replies), so the noise protected it "
                                  f"with a multiplier down to {min(r['noise_multiplier'] for r in weaker):.3g}, not "
                                  f"{z:g}; ε is accounted with the recorded multipliers")
    if z == 0:
        found["claim"] = "no noise (noise multiplier 0): the mechanism gives no differential privacy"
    if checked.status == "violated":
        found["claim"] = (f"refuted: {checked.over_norm} of {checked.updates} recorded updates exceed the clipping "
                          f"norm (largest {checked.max_ratio:.3g}× it, {checked.worst}, most of it in "
                          f"{checked.largest_tensor}); the ε above assumes every update was clipped")
    summary = DP(
        recorded=True, mechanism=dp["mechanism"], clipping=MECHANISMS[dp["mechanism"]],
        source=dp.get("source", "the recording's manifest"), noise_multiplier=z, clipping_norm=c,
        num_sampled_clients=m, rounds=len(rounds), delta=float(dp["delta"]), epsilon=epsilon,
        epsilon_rdp=epsilon_rdp, accountant=accountant_name(history, float(dp["delta"])),
        sampling=NO_AMPLIFICATION, unit=UNIT, neighbours=NEIGHBOURS,
        noise_std_on_sum=z * c, per_round=[RoundNoise(**r) for r in rounds], clipping_check=checked, **found)
    return Privacy(dp=summary, coverage=[CoverageRow(**_covered(kind, direction)) for kind, direction in shares])


def effective_noise(rec: Recording, z: float, m: int, weighted_by: str | None) -> list[dict[str, Any]]:
    """Per training round: the noise multiplier that protected the most exposed client. The server adds noise of
    std z·C/m to the weighted average; a client whose weight share is w moves it by at most w·C, so its multiplier
    is z / (m·w) — z when the m sampled clients weigh equally, less with unequal weights or missing replies."""
    senders_of: dict[int, set[str]] = {}
    for row in _training_weights(rec, up=True):
        senders_of.setdefault(row["round"], set()).add(row["sender"])
    scalars = {(r["round"], r["sender"]): r for r in rec.rows  # the training reply's metrics, not an evaluation's
               if r["kind"] == ArtifactKind.SCALARS.value and r["message_type"] == "train"}
    out = []
    for rnd, senders in sorted(senders_of.items()):
        weights = {s: _weight(rec, scalars.get((rnd, s)), weighted_by) for s in senders}
        known = [w for w in weights.values() if w is not None and w > 0]
        recorded = len(known) == len(weights)
        share = max(known) / sum(known) if recorded else 1 / len(senders)
        out.append({"round": rnd, "replies": len(senders), "largest_share": share,
                    "weights": "recorded" if recorded else "equal (none recorded)",
                    "noise_multiplier": z / (m * share)})
    return out


def _training_weights(rec: Recording, up: bool) -> list[dict[str, Any]]:
    """The ledger rows of model weights sent for training: the uploads (``up``) or the broadcasts."""
    return [r for r in rec.rows if (r["receiver"] if up else r["sender"]) == SERVER and r["message_type"] == "train"
            and r["kind"] in (ArtifactKind.FULL_MODEL.value, ArtifactKind.PARTIAL_MODEL.value)]


def _weight(rec: Recording, scalars: dict[str, Any] | None, key: str | None) -> float | None:
    """The aggregation weight a client's upload carried (its ``key`` metric), or None when not recorded."""
    if key is None or scalars is None:
        return None
    value = rec.artifact(scalars).tensors.get(key)
    return float(value) if value is not None and value.numel() == 1 else None


def _covered(kind: ArtifactKind, direction: str) -> dict[str, Any]:
    if direction == "down" and kind in (ArtifactKind.FULL_MODEL, ArtifactKind.PARTIAL_MODEL):
        return {"artifact": kind.value, "direction": direction, "covered": True,
                "why": "the server's noised aggregate (against anyone who receives it, not the server that noised it)"}
    why = ("the server adds the noise after it receives this, and sees each client's update un-noised: central DP "
           "trusts the server" if direction == "up" else "not the noised aggregate")
    return {"artifact": kind.value, "direction": direction, "covered": False, "why": why}


def clipping_check(rec: Recording, clipping_norm: float) -> ClippingCheck:
    """Every recorded training upload against the broadcast it started from: the update's L2 norm over the arrays
    both carry (all of them, as Flower clips them) must be at most the clipping norm. The ε holds only if it is."""
    sent = {(r["receiver"], r["round"]): r for r in _training_weights(rec, up=False)}
    norms: list[tuple[float, str, int, str]] = []
    skipped = 0
    for row in _training_weights(rec, up=True):
        start = sent.get((row["sender"], row["round"]))
        new = rec.artifact(row).tensors
        old = rec.artifact(start).tensors if start is not None else {}
        if not new or not set(new) <= set(old):
            skipped += 1  # no broadcast this upload started from, or arrays the broadcast did not carry
            continue
        squares = {k: float((new[k].double() - old[k].double()).square().sum()) for k in new}
        norms.append((math.sqrt(sum(squares.values())), row["sender"], row["round"], max(squares, key=lambda k: squares[k])))
    if not norms:
        return ClippingCheck(status="not measured", skipped=skipped,
                             why=f"none of the {skipped} recorded uploads came with the broadcast it started from")
    worst = max(norms)
    over = [n for n in norms if n[0] > clipping_norm * (1 + CLIP_TOLERANCE)]
    return ClippingCheck(status="violated" if over else "held", updates=len(norms), over_norm=len(over), skipped=skipped,
                         max_norm=worst[0], max_ratio=worst[0] / clipping_norm, worst=f"{worst[1]} round {worst[2]}",
                         largest_tensor=worst[3])  # where most of the largest update's norm sits (e.g. a counter left unclipped)


__all__ = ["MECHANISMS", "check_dp", "clipping_check", "effective_noise", "recorded_privacy"]
