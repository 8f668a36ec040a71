"""Counterfactual artifacts: the holdout twin and the positive control of an attack.

An attack's reading means little alone. The auditor therefore re-runs the
*same* attack, with the same budget, on artifacts it computes itself from
records whose membership it controls:

* **holdout twin** — the victim's artifact recomputed from half of the
  victim's holdout records (same domain, never trained on). Whatever the
  attack recovers from the twin is what any sample of the domain gives away;
  the members-vs-twin comparison is the record-level test, twin-vs-control
  the distribution-level one. The other half of the holdout is what
  identifiability compares against, so no record is both a twin source and
  a reference.
* **power** (positive control) — the artifact computed from a handful of the
  victim's member images, one (and two) per class (:data:`POWER_PER_CLASS`),
  and the artifact of **one member image alone** (:data:`POWER_SINGLE`: one
  artifact per image of the one-per-class draw, its class not told to the
  attack), inverted by the same attack with the same iterations and weights
  into as many images as the artifact holds: the textbook case where recovery
  is known to be possible. If the attack cannot beat its null there, a LOW
  reading elsewhere means "too weak to tell", not "safe". The one-record
  artifact is the case record-level recovery is possible in at all for
  statistics pooled over a batch: a batch's per-channel BatchNorm statistics
  do not say which image carried which colour or where, so seven pooled
  images are matched by many other images (docs/results/inversion_power.md).

Only what depends on the records is recomputed; everything else the
observer holds stays as it was on the wire. The twin *swaps* the records: it
keeps what the victim's artifact carries beyond its members (the statistics it
started its round from, the lag of a running average over moving weights) and
trades the members' contribution for the holdout's — artifact + replay(holdout)
− replay(members), each replay the victim's round re-run on those records —
so it has the artifact's structure and differs only in whose records it
summarises. The positive control is simply its records' own statistics.

==========================  ===================================================
artifact                    recomputed from the records
==========================  ===================================================
``full_model``,             the running mean/variance of every BatchNorm layer
``partial_model``,          under the victim's own weights as the observer
``bn_stats_all_layers``     assembles them (the broadcast it received overlaid
                            by its uploads); a replay of the victim's round
                            starts from the statistics it was broadcast and
                            takes as many batches as its layers counted, with
                            the training batch size, augmentation and momentum
``classifier_head``         the head's BatchNorm1d statistics of the records'
                            latents through the encoder the head was trained on
                            (mean and unbiased variance)
``style_bank``              the records' feature style at the style encoder
                            (pooled, or one per image as the victim sent)
``amplitude_bank``          the records' Fourier amplitude spectra
==========================  ===================================================

Each counterfactual enters a copy of the observer's view as a *pseudo-client*
(``<victim>#twin``, ``<victim>#power:8``) holding the victim's uploads with
the recomputed tensors and receiving the victim's broadcasts, so the attack
runs on it unchanged and never learns it is being tested. Only the server's
view is supported: a curious client sees aggregates of several clients, whose
counterfactual would have to model the server's aggregation rule; those
entries say so.

Deviations, with reasons: the replays use the victim's final weights
throughout its round; the swap cancels most of that (both replays share it),
not all. Where the view does not show what the victim began its round with
(statistics it keeps local across rounds: gPerXAN's BN side, FedFD's
SiloBN), each replay is its records' own statistics over one augmented pass.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fedaudit.attack import AttackerPrior
from fedaudit.run.stored.reconstruction import POWER_SINGLE
from fedaudit.simulation.training import Preprocess
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, WireView, client_role
from fedaudit.simulation.wire_views import latest_weights, overlay_state, style_encoder_in_view
from fedaudit.tensor_ops.bn_statistics import bn_modules, bn_stat_keys
from fedaudit.tensor_ops.fourier import amplitude_spectrum
from fedaudit.tensor_ops.latent_inversion import head_running_stats
from fedaudit.tensor_ops.style import feature_style, pooled_feature_style

if TYPE_CHECKING:
    from fedaudit.run.config import RunConfig
    from fedaudit.simulation.federation import Federation

TWIN = "twin"
POWER = "power"
POWER_PER_CLASS = (1, 2)  # member images per class behind a positive-control artifact
PSEUDO = "#"  # pseudo-client names: "<victim>#<case>"
STATS_KINDS = (ArtifactKind.FULL_MODEL, ArtifactKind.PARTIAL_MODEL, ArtifactKind.BN_STATS_ALL_LAYERS)
CHUNK = 256  # records per forward pass when measuring statistics
VAR_FLOOR = 1e-5  # a swapped variance is floored here (BatchNorm's eps)

Encode = Callable[[Tensor], Tensor]  # uint8 images -> latents


@dataclass(frozen=True)
class TrainingRecipe:
    """What the auditor knows of how clients train, to replay a round's statistics: the federation's
    preprocessing (normalisation and augmentation), whether augmentation is on, and the batch size."""

    preprocess: Preprocess
    augment: bool
    batch_size: int


def power_case(per_class: int) -> str:
    return f"{POWER}:{per_class}"


def single_case(index: int) -> str:
    """The case of the ``index``-th one-record artifact of the positive control (that image of the one-per-class
    draw, :meth:`~fedaudit.audit.leakage.Auditor.power_records`, alone)."""
    return f"{POWER}:{POWER_SINGLE}:{index}"


def case_group(case: str) -> str:
    """The group a case belongs to: :data:`POWER_SINGLE` for each one-record case, else the case itself."""
    return POWER_SINGLE if case.startswith(f"{POWER}:{POWER_SINGLE}:") else case


def case_per_class(case: str) -> int:
    """The member images per class behind a pooled positive-control case (:func:`power_case`)."""
    return int(case.split(":")[1])


def pseudo_name(victim: str, case: str) -> str:
    return f"{victim}{PSEUDO}{case}"


def split_pseudo(name: str) -> tuple[str, str] | None:
    """(victim, case) of a pseudo-client name, None for a real one."""
    if PSEUDO not in name:
        return None
    victim, case = name.rsplit(PSEUDO, 1)
    return victim, case


@dataclass(frozen=True, eq=False)
class Counterfactual:
    """One counterfactual of one victim: the records its artifacts are recomputed from (uint8, on the device).

    With ``swap_out`` (the victim's members) the record-dependent part is *swapped*: the artifact keeps
    what it carries beyond those records (its starting statistics, the lag of a running average) and
    trades the members' contribution for ``images``' — the holdout twin. Without it the artifact is
    ``images``' own statistics — the positive control."""

    victim: str
    case: str
    images: Tensor
    swap_out: Tensor | None = None


@torch.no_grad()
def replay_statistics(model: nn.Module, images: Tensor, preprocess: Preprocess, generator: torch.Generator, *,
                      start: dict[str, Tensor] | None, steps: int | None, batch_size: int,
                      augment: bool = True) -> dict[str, Tensor]:
    """The running mean/variance every BatchNorm layer of ``model`` holds after training-mode passes over
    ``images`` (uint8), the rest of the model in eval mode.

    With ``start`` (the statistics the victim began its round with) and ``steps`` (how many batches it
    took), the layers replay that round: they start from ``start`` and take ``steps`` batches of
    ``batch_size`` records with the training augmentation, updating with their own momentum — so early in
    training, when the victim's statistics still carry much of their starting value, the counterfactual
    carries as much. Without them, the statistics are the records' own: a cumulative average over one
    augmented pass. A batch of one record is doubled (BatchNorm1d needs two values per channel)."""
    model = copy.deepcopy(model).eval()
    names = {id(m): n for n, m in model.named_modules()}
    layers = bn_modules(model)
    replay = start is not None and steps is not None and steps > 0
    for layer in layers:
        name = names[id(layer)]
        if replay:
            layer.running_mean.copy_(start[f"{name}.running_mean"])
            layer.running_var.copy_(start[f"{name}.running_var"])
        else:
            layer.reset_running_stats()
            layer.momentum = None  # cumulative average over the batches
        layer.train()
    n = images.shape[0]
    bs = max(1, min(batch_size, n))
    count = steps if replay else max(1, -(-n // bs))
    order = torch.randperm(n, generator=generator, device=generator.device)
    for step in range(count):
        at = (step * bs) % n
        if replay and at + bs > n and at > 0:  # a fresh shuffle, as each epoch begins
            order = torch.randperm(n, generator=generator, device=generator.device)
        idx = order[at:at + bs] if at + bs <= n else order[at:]
        aug = generator if augment else None
        x = preprocess(images[idx.to(images.device)], aug)
        if x.shape[0] == 1:
            x = torch.cat([x, preprocess(images[idx.to(images.device)], aug)])
        model(x)
    out = {}
    for layer in layers:
        out[f"{names[id(layer)]}.running_mean"] = layer.running_mean.detach().clone()
        out[f"{names[id(layer)]}.running_var"] = layer.running_var.detach().clone()
    return out


def _tracked(tensors: dict[str, Tensor], keys: list[str]) -> int | None:
    """The batches a state's first BatchNorm layer had tracked, if it carries the counter."""
    key = next((k[: -len("running_mean")] + "num_batches_tracked" for k in keys if k.endswith("running_mean")), None)
    t = tensors.get(key) if key else None
    return int(t) if t is not None and t.numel() == 1 else None


class Recomputer:
    """Recomputes the record-dependent tensors of a victim's uploads from chosen records (server view)."""

    def __init__(self, view: WireView, prior: AttackerPrior, device: torch.device, recipe: TrainingRecipe,
                 seed: int = 0, latent_encoders: dict[str, Encode] | None = None) -> None:
        self.view = view
        self.prior = prior
        self.device = device
        self.recipe = recipe
        self.seed = seed
        self.latent_encoders = latent_encoders or {}
        self.fresh = prior.build_model()
        self.base = {k: v.detach().to(device) for k, v in self.fresh.state_dict().items()}
        self.keys = bn_stat_keys(self.fresh)
        self.mean = torch.tensor(prior.mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(prior.std, device=device).view(1, -1, 1, 1)
        self._style: nn.Module | None = None

    def normalise(self, images: Tensor) -> Tensor:
        return (images.to(self.device).float() / 255.0 - self.mean) / self.std

    def uploads(self, victim: str) -> list[Artifact]:
        """The victim's newest upload of each kind in the view."""
        sent = [a for a in self.view if a.sender == client_role(victim)]
        return [max((a for a in sent if a.kind == kind), key=lambda a: a.round)
                for kind in sorted({a.kind for a in sent}, key=lambda k: k.value)]

    def broadcasts(self, victim: str) -> list[Artifact]:
        return [a for a in self.view if a.sender == SERVER and a.receiver == client_role(victim)]

    def _round_start(self, victim: str, art: Artifact) -> tuple[dict[str, Tensor] | None, int | None]:
        """The statistics the victim began the round of ``art`` with (the same round's broadcast, when it
        carries every layer's) and the batches it took since (the difference of the layers' counters)."""
        sent = [a for a in self.broadcasts(victim) if a.round == art.round and all(k in a.tensors for k in self.keys)]
        if not sent:
            return None, None
        start = {k: sent[0].tensors[k].to(self.device).float() for k in self.keys}
        after, before = _tracked(art.tensors, self.keys), _tracked(sent[0].tensors, self.keys)
        steps = after - before if after is not None and before is not None and after > before else None
        return start, steps

    def recompute(self, victim: str, art: Artifact, images: Tensor,
                  swap_out: Tensor | None = None) -> tuple[dict[str, Tensor], str | None]:
        """(tensors, None) with the record-dependent tensors of ``art`` recomputed from ``images`` (swapped
        for ``swap_out``'s contribution when given, see :class:`Counterfactual`), or (the original
        tensors, why not) when this artifact cannot be recomputed."""
        kind = art.kind
        if kind in STATS_KINDS and any(k in art.tensors for k in self.keys):
            new = self._bn_stats(victim, art, images, swap_out)
        elif kind == ArtifactKind.CLASSIFIER_HEAD:
            encode = self.latent_encoders.get(victim)
            if encode is None:
                return dict(art.tensors), "the method keeps no record of the encoder this head was trained on"
            mean_key, var_key = (f"head.{k}" for k in head_running_stats(self.fresh.head))
            new = _latent_stats(encode(images.to(self.device)), mean_key, var_key)
            if swap_out is not None:
                out = _latent_stats(encode(swap_out.to(self.device)), mean_key, var_key)
                new = _swapped({k: art.tensors[k].to(self.device).float() for k in new}, new, out)
        elif kind == ArtifactKind.STYLE_BANK:
            if self._style is None:
                self._style, _ = style_encoder_in_view(self.fresh, self.view, self.device)
            rows = art.tensors["mean"].shape[0]
            with torch.no_grad():
                x = self.normalise(images)
                if rows == 1:
                    mean, std = pooled_feature_style(self._style(x[i:i + CHUNK]) for i in range(0, x.shape[0], CHUNK))
                else:  # one style per image, as many as the victim sent (cycling through fewer records)
                    mean, std = feature_style(self._style(x[torch.arange(rows, device=x.device) % x.shape[0]]))
            new = {"mean": mean, "std": std}
        elif kind == ArtifactKind.AMPLITUDE_BANK:
            rows = art.tensors["amplitude"].shape[0]
            new = {"amplitude": amplitude_spectrum(images[:rows].to(self.device).float() / 255.0)}
        else:
            return dict(art.tensors), None  # context (weights without statistics, scalars): kept as sent
        return {k: (new[k].to(t.dtype) if k in new else t) for k, t in art.tensors.items()}, None

    def _bn_stats(self, victim: str, art: Artifact, images: Tensor, swap_out: Tensor | None) -> dict[str, Tensor]:
        """Every BatchNorm layer's statistics of ``images`` under the victim's weights: the artifact with the
        members' replayed round swapped for ``images``' (``swap_out``), or the records' own statistics."""
        layers = [*latest_weights(self.broadcasts(victim), receiver=client_role(victim)),
                  *latest_weights(self.uploads(victim), sender=client_role(victim)), art]
        state, _ = overlay_state(self.base, layers, self.device)
        model = copy.deepcopy(self.fresh).to(self.device)
        model.load_state_dict(state)
        r = self.recipe
        if swap_out is None:
            g = torch.Generator(device=self.device).manual_seed(self.seed)
            return replay_statistics(model, images.to(self.device), r.preprocess, g, start=None, steps=None,
                                     batch_size=r.batch_size, augment=False)
        start, steps = self._round_start(victim, art)
        replays = []
        for records in (images, swap_out):  # the same draws of augmentation for both
            g = torch.Generator(device=self.device).manual_seed(self.seed)
            replays.append(replay_statistics(model, records.to(self.device), r.preprocess, g, start=start, steps=steps,
                                             batch_size=r.batch_size, augment=r.augment))
        real = {k: art.tensors[k].to(self.device).float() for k in replays[0] if k in art.tensors}
        return _swapped(real, *replays)


def _latent_stats(z: Tensor, mean_key: str, var_key: str) -> dict[str, Tensor]:
    z = z.float()
    z = z.repeat(2, 1) if z.shape[0] == 1 else z
    return {mean_key: z.mean(0), var_key: z.var(0)}  # unbiased, as BatchNorm's running_var


def _swapped(real: dict[str, Tensor], records: dict[str, Tensor], members: dict[str, Tensor]) -> dict[str, Tensor]:
    """``real`` with the members' contribution traded for the records': real + records − members
    (variances floored just above 0)."""
    out = {}
    for k, t in real.items():
        v = t + records[k].to(t.device) - members[k].to(t.device)
        out[k] = v.clamp_min(VAR_FLOOR) if k.endswith("running_var") else v
    return out


def counterfactual_view(view: WireView, prior: AttackerPrior, cases: Sequence[Counterfactual], device: torch.device,
                        recipe: TrainingRecipe, seed: int = 0,
                        latent_encoders: dict[str, Encode] | None = None) -> tuple[WireView, dict[str, dict[str, str]]]:
    """The server's view plus one pseudo-client per case; and, per pseudo-client name, the artifacts
    (kind → reason) that could not be recomputed for it (the attack's reading of those is no counterfactual)."""
    if view.role != SERVER:
        raise ValueError("counterfactual artifacts are built for the server's view only")
    rec = Recomputer(view, prior, device, recipe, seed, latent_encoders)
    extra: list[Artifact] = []
    skipped: dict[str, dict[str, str]] = {}
    for case in cases:
        name = pseudo_name(case.victim, case.case)
        role = client_role(name)
        for art in rec.uploads(case.victim):
            tensors, why = rec.recompute(case.victim, art, case.images, case.swap_out)
            if why is not None:
                skipped.setdefault(name, {})[art.kind.value] = why
            extra.append(Artifact(art.kind, role, art.receiver, art.round, tensors, dict(art.meta)))
        extra += [Artifact(a.kind, a.sender, role, a.round, a.tensors, dict(a.meta)) for a in rec.broadcasts(case.victim)]
    return WireView(view.role, [*view, *extra]), skipped


def latent_encoders(cfg: RunConfig, fed: Federation) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Per source domain, uint8 images → latents of the encoder its shared head was trained on
    (``Method.head_encoder``; built on first use, only for methods that keep one)."""
    from fedaudit.simulation.linear_probe import extract_features

    def encoder_of(client) -> Callable[[torch.Tensor], torch.Tensor]:
        model: list[torch.nn.Module] = []

        def encode(images: torch.Tensor) -> torch.Tensor:
            if not model:
                model.append(fed.method.head_encoder(fed, client))
            return extract_features(model[0].features, images, fed.preprocess, cfg.precision)
        return encode

    from fedaudit.simulation.method import Method

    if type(fed.method).head_encoder is Method.head_encoder:
        return {}
    return {c.domain: encoder_of(c) for c in fed.clients}


__all__ = ["POWER", "POWER_PER_CLASS", "POWER_SINGLE", "TWIN", "Counterfactual", "Recomputer", "counterfactual_view", "latent_encoders", "replay_statistics",
           "power_case", "pseudo_name", "single_case", "split_pseudo"]
