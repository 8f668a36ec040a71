"""The auditor: it holds the private records and the judges, and compares attack outputs with the records (the
scores themselves: :mod:`fedaudit.audit.scoring`).

The *auditor* (not the attacker) holds every client's records. For each
reconstruction ``r`` optimised for class ``c`` it finds ``NN_in``, the nearest
member (training record) of class ``c``, and ``NN_out``, the nearest holdout
record (never trained on) of class ``c``, by pixel L2 on [0, 1] images, and
reports (docs/attacks.md, "What the auditor measures"):

* ``psnr`` / ``ssim`` between ``r`` and ``NN_in`` (mean and best);
* ``identifiability``: the fraction of ``r`` closer to its nearest member
  than to its nearest non-member, with *equal* numbers of both per class and
  a permutation null (:mod:`fedaudit.audit.identifiability`: chance measured,
  p-value, Clopper–Pearson 95% interval);
* ``domain_attribution``: how often a domain classifier trained on real
  images of every domain assigns ``r`` to the victim's domain (headline: the
  macro average over victims of the victim × predicted-domain matrix);
* ``class_fidelity``: how often a classifier of the victim's domain assigns
  ``r`` to ``c``;
* ``lpips`` between ``r`` and ``NN_in`` when the AlexNet backbone file is on
  disk, otherwise "unavailable" with the path looked for.

The similarity measures and the classifiers are the judges (:mod:`fedaudit.audit.judges`).

Batch inversions whose images come back unordered (gradient inversion) are
also scored by :func:`matched_fidelity`: each reconstruction is matched to a
distinct member by the Hungarian algorithm on pixel MSE.

Latents synthesised from a ``CLASSIFIER_HEAD`` are scored the same way in
latent space (:func:`score_latents`): the references are the real latents of
the victim's members and holdouts through the encoder the head was trained
on, and the judges are linear probes on real latents of unscored records.

Every number is reported next to its nulls (:func:`with_nulls`): the same
attack against an untrained model of the same architecture, the same
optimisation with the artifact's matching term switched off (prior-only),
and the same attack on the artifact recomputed from holdout records (the
holdout twin, :mod:`fedaudit.audit.counterfactual`). Chance levels are
computed from the data: identifiability's from its permutation null, class
fidelity's as the best constant guess on the actual targets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaudit.audit.identifiability import identifiability_test
from fedaudit.audit.judges import AuditorClassifier, load_lpips, nearest_in_class, psnr, train_auditor_classifier
from fedaudit.audit.scoring import (MatchedFidelity, PowerScores, RawScores, VictimRecords, matched_fidelity,
                                    score_latents, score_reconstructions)
from fedaudit.run.stored.reconstruction import Judge, Judges
from fedaudit.simulation.linear_probe import LinearProbe, fit_linear_probe

if TYPE_CHECKING:
    from fedaudit.audit.counterfactual import TrainingRecipe


# -- the auditor -------------------------------------------------------------------


@dataclass
class DomainRecords:
    """One domain's real records as the auditor holds them (uint8 images on the device).

    ``members`` are what the victim trained on (the records reconstructions
    are compared with); ``reference`` are records the judges may train on
    (val + holdout of a source, the whole unseen target); ``holdout`` are the
    victim's non-members, which the auditor halves (stratified, seeded) into
    the identifiability reference and the holdout twin's source.
    """

    domain: str
    members_x: Tensor | None
    members_y: Tensor | None
    holdout_x: Tensor | None
    holdout_y: Tensor | None
    reference_x: Tensor
    reference_y: Tensor


@dataclass
class SourceRecords:
    """A source domain's records as a victim: what its client trained on and its holdout (the unseen target, a
    reference for the domain judge only, has neither)."""

    members_x: Tensor
    members_y: Tensor
    holdout_x: Tensor
    holdout_y: Tensor

    @classmethod
    def of(cls, r: DomainRecords) -> SourceRecords | None:
        if r.members_x is None or r.members_y is None or r.holdout_x is None or r.holdout_y is None:
            return None
        return cls(r.members_x, r.members_y, r.holdout_x, r.holdout_y)


@dataclass
class HoldoutHalves:
    """A victim's holdout, halved: ``reference`` for identifiability, ``twin`` for the holdout twin."""

    reference_x: Tensor
    reference_y: Tensor
    twin_x: Tensor
    twin_y: Tensor


def halve_holdout(x: Tensor, y: Tensor, seed: int) -> HoldoutHalves:
    """Split a holdout in two class-stratified halves with a fixed seed."""
    from fedaudit.data.split import stratified_split

    ref, _, twin = stratified_split(y.cpu(), (0.5, 0.0, 0.5), torch.Generator().manual_seed(seed))
    ref, twin = ref.to(x.device), twin.to(x.device)
    return HoldoutHalves(x[ref], y[ref], x[twin], y[twin])


class Auditor:
    """Holds the private records and the judges; scores reconstructions with their nulls.

    The judges are trained once per run on records that are *not* scored as
    members: the domain classifier on the reference records of every domain,
    each victim's class classifier on that victim's reference records. Their
    accuracy on the victims' members (which they never saw) is reported
    beside the scores.
    """

    def __init__(self, records: list[DomainRecords], num_classes: int, mean: tuple[float, ...], std: tuple[float, ...],
                 hflip: bool, seed: int, device: torch.device, *, judge_steps: int, lpips_weights: str | None = None,
                 latent_encoders: dict[str, Callable[[Tensor], Tensor]] | None = None,
                 recipe: TrainingRecipe | None = None) -> None:
        self.recipe = recipe  # how clients train, to replay a round's statistics for the twin
        self.records = {r.domain: r for r in records}
        self.domains = [r.domain for r in records]
        self.num_classes = num_classes
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)
        self._norm = (mean, std)
        self.hflip = hflip
        self.seed = seed
        self.device = device
        self.judge_steps = judge_steps
        self.lpips, self.lpips_status = load_lpips(lpips_weights, device)
        self._domain_clf: AuditorClassifier | None = None
        self._class_clf: dict[str, AuditorClassifier] = {}
        self._judged: dict[str, Judge] = {}  # the domain classifier's accuracy, once trained
        self._judged_per_victim: dict[str, dict[str, Judge]] = {}  # class classifiers and latent probes
        # victim -> uint8 images -> latents of the encoder its CLASSIFIER_HEAD was trained on
        self.latent_encoders = latent_encoders or {}
        self._latent: dict[str, tuple[VictimRecords, LinearProbe, LinearProbe]] = {}
        # the victims' records (a source domain's), apart from the references every domain lends the judges
        self.sources = {r.domain: found for r in records if (found := SourceRecords.of(r)) is not None}
        self.halves = {r.domain: halve_holdout(found.holdout_x, found.holdout_y, seed + i)
                       for i, r in enumerate(records) if (found := self.sources.get(r.domain)) is not None}

    def twin_records(self, victim: str) -> Tensor:
        """uint8 records the victim's holdout twin is computed from (never a reference for identifiability)."""
        return self.halves[victim].twin_x

    def members(self, victim: str) -> Tensor:
        """uint8: the victim's members (what its artifacts summarise)."""
        return self.sources[victim].members_x

    def power_records(self, victim: str, per_class: int) -> Tensor:
        """uint8: ``per_class`` of the victim's members of every class (a seeded draw, the same for every
        attack and ordered by class) — the records behind a positive control."""
        return self.sources[victim].members_x[self._power_index(victim, per_class)]

    def power_labels(self, victim: str, per_class: int) -> Tensor:
        """The classes of :meth:`power_records`, in their order."""
        return self.sources[victim].members_y[self._power_index(victim, per_class)]

    def _power_index(self, victim: str, per_class: int) -> Tensor:
        y = self.sources[victim].members_y
        g = torch.Generator().manual_seed(self.seed + 17 * (1 + self.domains.index(victim)))
        order = torch.randperm(y.shape[0], generator=g).to(y.device)
        picks = [order[y[order] == c][:per_class] for c in range(self.num_classes)]
        return torch.cat(picks)

    def to_unit(self, images: Tensor) -> Tensor:
        """Normalised input-space images → [0, 1]."""
        return (images.float() * self.std + self.mean).clamp(0, 1)

    def domain_classifier(self) -> AuditorClassifier:
        if self._domain_clf is None:
            x = torch.cat([r.reference_x for r in self.records.values()])
            y = torch.cat([torch.full((r.reference_x.shape[0],), i, dtype=torch.long, device=x.device)
                           for i, r in enumerate(self.records.values())])
            self._domain_clf = train_auditor_classifier(x, y, len(self.domains), *self._norm, hflip=self.hflip,
                                                        seed=self.seed, steps=self.judge_steps)
            held = [(found.members_x, i) for i, r in enumerate(self.records.values())
                    if (found := self.sources.get(r.domain)) is not None]
            hx = torch.cat([m for m, _ in held]).float() / 255.0
            hy = torch.cat([torch.full((m.shape[0],), i, dtype=torch.long, device=m.device) for m, i in held])
            self._judged["domain_classifier"] = Judge(trained_on="val+holdout of sources, all of the target",
                                                      accuracy_on_members=self._domain_clf.accuracy(hx, hy))
        return self._domain_clf

    def class_classifier(self, victim: str) -> AuditorClassifier:
        if victim not in self._class_clf:
            r, mine = self.records[victim], self.sources[victim]
            clf = train_auditor_classifier(r.reference_x, r.reference_y, self.num_classes, *self._norm,
                                           hflip=self.hflip, seed=self.seed + 1 + self.domains.index(victim),
                                           steps=self.judge_steps)
            self._class_clf[victim] = clf
            self._judged_per_victim.setdefault("class_classifier", {})[victim] = Judge(
                trained_on="val+holdout of the victim",
                accuracy_on_members=clf.accuracy(mine.members_x.float() / 255.0, mine.members_y))
        return self._class_clf[victim]

    def judges(self) -> Judges:
        """The judges trained so far, with their accuracy on the members they never saw, and LPIPS's status."""
        return Judges.model_validate({**self._judged, **self._judged_per_victim, "lpips": self.lpips_status})

    def victim_records(self, victim: str) -> VictimRecords:
        r, half = self.sources[victim], self.halves[victim]
        return VictimRecords(self.domains.index(victim), r.members_x.float() / 255.0, r.members_y,
                             half.reference_x.float() / 255.0, half.reference_y)

    def score(self, victim: str, images: Tensor, targets: Tensor | None) -> RawScores:
        """Raw scores of normalised-space ``images`` optimised for ``targets`` (None: no class) against ``victim``'s records."""
        class_clf = self.class_classifier(victim) if targets is not None else None
        return score_reconstructions(self.to_unit(images), targets, self.victim_records(victim),
                                     class_clf, self.domain_classifier(), self.lpips, seed=self.seed)

    def score_power(self, victim: str, per_class: int, recon: Tensor, targets: Tensor | None,
                    latent: bool = False) -> PowerScores:
        """Reconstructions (normalised images, or latents with ``latent``) against the members a positive
        control's artifact was computed from (``per_class`` of each class): identifiability against as many
        of the victim's reference non-members of the same class (classless when ``targets`` is None), with
        its permutation null; and, for images, the PSNR to the nearest of those members."""
        idx = self._power_index(victim, per_class)
        r = self.sources[victim]
        sources, source_y = r.members_x[idx], r.members_y[idx]
        if latent:
            judges = self.latent_judges(victim)
            assert judges is not None  # a latent control is run only for a victim whose encoder the auditor holds
            ref = judges[0]
            x, src = recon.float(), self.latent_encoders[victim](sources).float()
        else:
            ref = self.victim_records(victim)
            x, src = self.to_unit(recon), sources.float() / 255.0
        ident = identifiability_test(x, targets, src, source_y, ref.holdout, ref.holdout_y, seed=self.seed)
        if latent:
            return PowerScores(ident)
        t = targets if targets is not None else torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        dist, nearest = nearest_in_class(x, t, src, source_y if targets is not None else torch.zeros_like(source_y))
        ok = torch.isfinite(dist)
        return PowerScores(ident, psnr(x[ok], src[nearest[ok]]).cpu())

    def score_matched(self, victim: str, images: Tensor) -> MatchedFidelity:
        """:func:`matched_fidelity` of normalised-space ``images`` against ``victim``'s members
        (every member was in its local training of the attacked round)."""
        return matched_fidelity(self.to_unit(images), self.victim_records(victim).members)

    def latent_judges(self, victim: str) -> tuple[VictimRecords, LinearProbe, LinearProbe] | None:
        """The victim's real latents (members, holdouts) and two linear probes on
        latents of unscored records: class (the victim's reference records) and
        domain (every domain's reference records through the victim's encoder)."""
        if victim not in self.latent_encoders:
            return None
        if victim not in self._latent:
            encode = self.latent_encoders[victim]
            r, mine = self.records[victim], self.sources[victim]
            refs = [encode(d.reference_x) for d in self.records.values()]
            domain_y = torch.cat([torch.full((f.shape[0],), i, dtype=torch.long, device=f.device) for i, f in enumerate(refs)])
            domain_probe = fit_linear_probe(torch.cat(refs), domain_y, len(self.domains))
            class_probe = fit_linear_probe(refs[self.domains.index(victim)], r.reference_y, self.num_classes)
            members = encode(mine.members_x)
            half = self.halves[victim]
            ref = VictimRecords(self.domains.index(victim), members, mine.members_y, encode(half.reference_x),
                                half.reference_y)
            self._latent[victim] = (ref, class_probe, domain_probe)
            self._judged_per_victim.setdefault("latent_probes", {})[victim] = Judge(
                trained_on="latents of val+holdout records (class: the victim's; domain: every domain's)",
                class_accuracy_on_members=class_probe.accuracy(members, mine.members_y),
                domain_accuracy_on_members=domain_probe.accuracy(
                    members, torch.full_like(mine.members_y, self.domains.index(victim))))
        return self._latent[victim]

    def score_latents(self, victim: str, latents: Tensor, targets: Tensor, head: nn.Module) -> RawScores | None:
        """Raw latent-space scores against ``victim``'s real latents; None without its encoder."""
        judges = self.latent_judges(victim)
        if judges is None:
            return None
        ref, class_probe, domain_probe = judges
        return score_latents(latents, targets, ref, class_probe, domain_probe, head, seed=self.seed)


def image_grid(columns: list[Tensor], scale: int = 1, gap: int = 2) -> Tensor:
    """uint8 [H, W, C] grid: column j shows ``columns[j]`` ([rows, C, h, w] in [0, 1]) top to bottom."""
    rows, c, h, w = columns[0].shape
    hs, ws = h * scale, w * scale
    out = torch.full((rows * (hs + gap) + gap, len(columns) * (ws + gap) + gap, c), 255, dtype=torch.uint8)
    for j, col in enumerate(columns):
        big = F.interpolate(col.float().cpu(), scale_factor=scale, mode="nearest") if scale > 1 else col.float().cpu()
        pix = (big.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
        for i in range(rows):
            y0, x0 = gap + i * (hs + gap), gap + j * (ws + gap)
            out[y0:y0 + hs, x0:x0 + ws] = pix[i]
    return out
