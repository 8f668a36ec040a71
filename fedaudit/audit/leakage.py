"""Leakage scorers: the auditor compares attack outputs with the private data.

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
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaudit.audit.identifiability import identifiability_test
from fedaudit.audit.judges import (LPIPS, AuditorClassifier, load_lpips, nearest_in_class, psnr, ssim,
                                   train_auditor_classifier)
from fedaudit.simulation.linear_probe import LinearProbe, fit_linear_probe

if TYPE_CHECKING:
    from fedaudit.audit.counterfactual import TrainingRecipe


# -- scoring --------------------------------------------------------------------


@dataclass
class VictimRecords:
    """The auditor's reference sets for one victim, as [0, 1] images (or latents).

    ``holdout`` are the non-members identifiability compares against; the
    other half of the victim's holdout (``twin``) is what its holdout-twin
    artifact is computed from, so no record is both.
    """

    domain_index: int
    members: Tensor
    member_y: Tensor
    holdout: Tensor
    holdout_y: Tensor


def score_reconstructions(recon01: Tensor, targets: Tensor | None, ref: VictimRecords, class_clf: AuditorClassifier | None,
                          domain_clf: AuditorClassifier, lpips_fn: LPIPS | None = None, seed: int = 0) -> dict[str, Any]:
    """Raw scores of one set of reconstructions against one victim's records.

    ``targets=None`` (an inversion with no target class: styles, spectra)
    compares with the nearest record of any class and has no class fidelity.

    Returns the metric values plus ``nn_member_index`` (for image grids) and
    ``predicted_domains`` (for the victim × domain matrix).
    """
    recon01 = recon01.float().clamp(0, 1)
    classless = targets is None
    if classless:  # reconstructions with no target class (style, amplitude): nearest over every class
        targets = torch.zeros(recon01.shape[0], dtype=torch.long, device=recon01.device)
        member_y = torch.zeros_like(ref.member_y)
        class_clf = None
    else:
        member_y = ref.member_y
    d_in, i_in = nearest_in_class(recon01, targets, ref.members, member_y)
    has_nn = torch.isfinite(d_in)
    nn_in = ref.members[i_in]
    p = psnr(recon01, nn_in)[has_nn]
    s = ssim(recon01, nn_in)[has_nn]
    domains = domain_clf.predict(recon01)
    out: dict[str, Any] = {
        "n": int(recon01.shape[0]),
        "psnr_mean": float(p.mean()) if p.numel() else float("nan"),
        "psnr_best": float(p.max()) if p.numel() else float("nan"),
        "ssim_mean": float(s.mean()) if s.numel() else float("nan"),
        "ssim_best": float(s.max()) if s.numel() else float("nan"),
        "l2_to_member_mean": float(d_in[has_nn].mean()) if has_nn.any() else float("nan"),
        "identifiability": identifiability_test(recon01, None if classless else targets, ref.members, ref.member_y,
                                                ref.holdout, ref.holdout_y, seed=seed),
        "domain_attribution": float((domains == ref.domain_index).float().mean()),
        "predicted_domains": domains,
        "nn_member_index": i_in,
    }
    if class_clf is not None:
        hits = class_clf.predict(recon01) == targets
        out["class_fidelity"] = float(hits.float().mean())
        out["class_fidelity_chance"] = best_constant_guess(targets)
    if lpips_fn is not None:
        lp = lpips_fn(recon01[has_nn], nn_in[has_nn])
        out["lpips_mean"] = float(lp.mean()) if lp.numel() else float("nan")
    return out


def best_constant_guess(targets: Tensor) -> float:
    """Accuracy of the best guess that ignores the image: the most frequent target class's share."""
    return float(torch.bincount(targets.cpu()).max() / targets.numel()) if targets.numel() else float("nan")


MATCHED_METRICS = ("psnr_mean", "ssim_mean", "psnr_best", "ssim_best")


def matched_fidelity(recon01: Tensor, records01: Tensor) -> dict[str, Any]:
    """PSNR/SSIM of reconstructions matched one-to-one to distinct real records.

    A batch inversion (gradient inversion) returns the batch's images in no
    particular order and with no trustworthy class, so each reconstruction is
    paired with a *distinct* record by the Hungarian algorithm
    (``scipy.optimize.linear_sum_assignment``) on pixel MSE; with more records
    than reconstructions the assignment is rectangular (every reconstruction
    gets a record), with fewer only ``len(records01)`` reconstructions are
    matched. Returns mean and best PSNR/SSIM over the matched pairs, their
    count ``n`` and ``assignment`` ([reconstruction, record] index pairs).
    """
    from scipy.optimize import linear_sum_assignment

    r, m = recon01.float().clamp(0, 1), records01.float()
    if r.shape[0] == 0 or m.shape[0] == 0:
        nan = float("nan")
        return {"n": 0, "psnr_mean": nan, "psnr_best": nan, "ssim_mean": nan, "ssim_best": nan, "assignment": []}
    mse = torch.cdist(r.flatten(1), m.flatten(1).to(r.device)).pow(2) / r[0].numel()
    rows, cols = linear_sum_assignment(mse.cpu().double().numpy())
    ri = torch.as_tensor(rows, dtype=torch.long, device=r.device)
    ci = torch.as_tensor(cols, dtype=torch.long, device=m.device)
    a, b = r[ri], m[ci].to(r.device)
    p, s = psnr(a, b), ssim(a, b)
    return {"n": int(ri.numel()), "psnr_mean": float(p.mean()), "psnr_best": float(p.max()),
            "ssim_mean": float(s.mean()), "ssim_best": float(s.max()),
            "assignment": [[int(i), int(j)] for i, j in zip(rows, cols)]}


def score_latents(latents: Tensor, targets: Tensor, ref: VictimRecords, class_probe: LinearProbe,
                  domain_probe: LinearProbe, head: nn.Module, seed: int = 0) -> dict[str, Any]:
    """Raw scores of synthesised latents against one victim's real latents.

    ``ref`` holds latents (the victim's encoder applied to its members and
    holdouts) instead of images; the probes were fitted on real latents of
    records that are not scored as members. ``head_agreement`` is how often
    the victim's own head assigns a synthesised latent its target class;
    ``moment_gap`` how far the synthesised latents' mean lies from the
    members' latent mean, relative to the members' spread (0 = exact).
    """
    z = latents.float()
    d_in, _ = nearest_in_class(z, targets, ref.members, ref.member_y)
    has_nn = torch.isfinite(d_in)
    domains = domain_probe.logits(z).argmax(1)
    with torch.no_grad():
        head_pred = head.eval()(z).argmax(1)
    spread = ref.members.float().std(0).norm().clamp_min(1e-12)
    return {
        "n": int(z.shape[0]),
        "l2_to_member_mean": float(d_in[has_nn].mean()) if has_nn.any() else float("nan"),
        "identifiability": identifiability_test(z, targets, ref.members, ref.member_y, ref.holdout, ref.holdout_y,
                                                seed=seed),
        "domain_attribution": float((domains == ref.domain_index).float().mean()),
        "class_fidelity": float((class_probe.logits(z).argmax(1) == targets).float().mean()),
        "class_fidelity_chance": best_constant_guess(targets),
        "head_agreement": float((head_pred == targets).float().mean()),
        "moment_gap": float((z.mean(0) - ref.members.float().mean(0)).norm() / spread),
        "predicted_domains": domains,
    }


SCALAR_METRICS = ("psnr_mean", "psnr_best", "ssim_mean", "ssim_best", "l2_to_member_mean", "lpips_mean",
                  "domain_attribution", "class_fidelity", "head_agreement", "moment_gap")


NULLS = ("control", "prior_only", "twin")  # the untrained control keeps its historical key, "control"
IDENTIFIABILITY_KEYS = ("value", "ci95", "p_value", "k")


def with_nulls(attack: dict[str, Any], nulls: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """Every metric as ``{"attack": a, "control": c, "prior_only": p, "twin": t, "chance": ...}``.

    ``nulls`` maps a null's name (:data:`NULLS`) to its raw scores, or None
    when that null did not run (its key is then absent). Chance levels are
    the computed ones: class fidelity's best constant guess on the targets,
    identifiability's permutation mean (with its 95% quantile and the
    attack's p-value beside it).
    """
    ran = {k: v for k, v in nulls.items() if v is not None}
    out: dict[str, Any] = {}
    for key in SCALAR_METRICS:
        if key in attack:
            out[key] = {"attack": attack[key], **{k: v.get(key, float("nan")) for k, v in ran.items()}}
    if "class_fidelity" in out:
        out["class_fidelity"]["chance"] = attack["class_fidelity_chance"]
    ia = attack["identifiability"]
    ident = {"attack": ia["value"], "attack_ci95": ia["ci95"], "attack_k": ia["k"], "attack_p_value": ia["p_value"],
             "n": ia["n"], "excluded": ia["excluded"], "chance": ia["chance"], "null_q95": ia["null_q95"],
             "balanced": {"per_class": ia["per_class"], "permutations": ia["permutations"],
                          "members": ia["members"], "nonmembers": ia["nonmembers"]}}
    for name, scores in ran.items():
        other = scores["identifiability"]
        ident.update({name: other["value"], f"{name}_ci95": other["ci95"], f"{name}_p_value": other["p_value"]})
    out["identifiability"] = ident
    return out


def domain_matrix(rows: dict[str, Tensor], domains: list[str]) -> list[list[float]]:
    """Victim × predicted-domain matrix: row v = distribution of the predicted domain of v's reconstructions."""
    out = []
    for pred in rows.values():
        counts = torch.bincount(pred.cpu(), minlength=len(domains)).float()
        out.append((counts / counts.sum().clamp_min(1)).tolist())
    return out


def macro_diagonal(matrix: list[list[float]], victim_domain_index: list[int]) -> float:
    """Mean over victims of the fraction of their reconstructions attributed to their own domain."""
    if not matrix:
        return float("nan")
    return sum(row[i] for row, i in zip(matrix, victim_domain_index)) / len(matrix)


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
        self.judges: dict[str, Any] = {}
        # victim -> uint8 images -> latents of the encoder its CLASSIFIER_HEAD was trained on
        self.latent_encoders = latent_encoders or {}
        self._latent: dict[str, tuple[VictimRecords, LinearProbe, LinearProbe]] = {}
        self.halves = {r.domain: halve_holdout(r.holdout_x, r.holdout_y, seed + i)
                       for i, r in enumerate(records) if r.holdout_x is not None}

    def twin_records(self, victim: str) -> Tensor:
        """uint8 records the victim's holdout twin is computed from (never a reference for identifiability)."""
        return self.halves[victim].twin_x

    def members(self, victim: str) -> Tensor:
        """uint8: the victim's members (what its artifacts summarise)."""
        return self.records[victim].members_x

    def power_records(self, victim: str, per_class: int) -> Tensor:
        """uint8: ``per_class`` of the victim's members of every class (a seeded draw, the same for every
        attack and ordered by class) — the records behind a positive control."""
        return self.records[victim].members_x[self._power_index(victim, per_class)]

    def power_labels(self, victim: str, per_class: int) -> Tensor:
        """The classes of :meth:`power_records`, in their order."""
        return self.records[victim].members_y[self._power_index(victim, per_class)]

    def _power_index(self, victim: str, per_class: int) -> Tensor:
        y = self.records[victim].members_y
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
            held = [(r.members_x, i) for i, r in enumerate(self.records.values()) if r.members_x is not None]
            hx = torch.cat([m for m, _ in held]).float() / 255.0
            hy = torch.cat([torch.full((m.shape[0],), i, dtype=torch.long, device=m.device) for m, i in held])
            self.judges["domain_classifier"] = {"trained_on": "val+holdout of sources, all of the target",
                                                "accuracy_on_members": self._domain_clf.accuracy(hx, hy)}
        return self._domain_clf

    def class_classifier(self, victim: str) -> AuditorClassifier:
        if victim not in self._class_clf:
            r = self.records[victim]
            clf = train_auditor_classifier(r.reference_x, r.reference_y, self.num_classes, *self._norm,
                                           hflip=self.hflip, seed=self.seed + 1 + self.domains.index(victim),
                                           steps=self.judge_steps)
            self._class_clf[victim] = clf
            self.judges.setdefault("class_classifier", {})[victim] = {
                "trained_on": "val+holdout of the victim", "accuracy_on_members": clf.accuracy(r.members_x.float() / 255.0, r.members_y)}
        return self._class_clf[victim]

    def victim_records(self, victim: str) -> VictimRecords:
        r, half = self.records[victim], self.halves[victim]
        return VictimRecords(self.domains.index(victim), r.members_x.float() / 255.0, r.members_y,
                             half.reference_x.float() / 255.0, half.reference_y)

    def score(self, victim: str, images: Tensor, targets: Tensor | None) -> dict[str, Any]:
        """Raw scores of normalised-space ``images`` optimised for ``targets`` (None: no class) against ``victim``'s records."""
        class_clf = self.class_classifier(victim) if targets is not None else None
        return score_reconstructions(self.to_unit(images), targets, self.victim_records(victim),
                                     class_clf, self.domain_classifier(), self.lpips, seed=self.seed)

    def score_power(self, victim: str, per_class: int, recon: Tensor, targets: Tensor | None,
                    latent: bool = False) -> dict[str, Any]:
        """Reconstructions (normalised images, or latents with ``latent``) against the members a positive
        control's artifact was computed from (``per_class`` of each class): identifiability against as many
        of the victim's reference non-members of the same class (classless when ``targets`` is None), with
        its permutation null; and, for images, the PSNR to the nearest of those members."""
        idx = self._power_index(victim, per_class)
        r = self.records[victim]
        sources, source_y = r.members_x[idx], r.members_y[idx]
        if latent:
            ref, _, _ = self.latent_judges(victim)
            x, src = recon.float(), self.latent_encoders[victim](sources).float()
        else:
            ref = self.victim_records(victim)
            x, src = self.to_unit(recon), sources.float() / 255.0
        out: dict[str, Any] = {"identifiability": identifiability_test(x, targets, src, source_y, ref.holdout,
                                                                       ref.holdout_y, seed=self.seed)}
        if not latent:
            t = targets if targets is not None else torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
            dist, nearest = nearest_in_class(x, t, src, source_y if targets is not None else torch.zeros_like(source_y))
            ok = torch.isfinite(dist)
            out["psnr"] = psnr(x[ok], src[nearest[ok]]).cpu()
        return out

    def score_matched(self, victim: str, images: Tensor) -> dict[str, Any]:
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
            r = self.records[victim]
            refs = [encode(d.reference_x) for d in self.records.values()]
            domain_y = torch.cat([torch.full((f.shape[0],), i, dtype=torch.long, device=f.device) for i, f in enumerate(refs)])
            domain_probe = fit_linear_probe(torch.cat(refs), domain_y, len(self.domains))
            class_probe = fit_linear_probe(refs[self.domains.index(victim)], r.reference_y, self.num_classes)
            members = encode(r.members_x)
            half = self.halves[victim]
            ref = VictimRecords(self.domains.index(victim), members, r.members_y, encode(half.reference_x),
                                half.reference_y)
            self._latent[victim] = (ref, class_probe, domain_probe)
            self.judges.setdefault("latent_probes", {})[victim] = {
                "trained_on": "latents of val+holdout records (class: the victim's; domain: every domain's)",
                "class_accuracy_on_members": class_probe.accuracy(members, r.members_y),
                "domain_accuracy_on_members": domain_probe.accuracy(
                    members, torch.full_like(r.members_y, self.domains.index(victim)))}
        return self._latent[victim]

    def score_latents(self, victim: str, latents: Tensor, targets: Tensor, head: nn.Module) -> dict[str, Any] | None:
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
