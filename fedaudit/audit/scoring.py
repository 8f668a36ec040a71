"""The auditor's scores of one set of reconstructions against one victim's records (:class:`RawScores`): PSNR and
SSIM to the nearest member, identifiability, domain attribution, class fidelity, LPIPS; in latent space the same
against the victim's real latents (:func:`score_latents`); a batch inversion's one-to-one matches
(:func:`matched_fidelity`); and every metric beside its nulls (:func:`with_nulls`), as metrics.json stores it. The
auditor that holds the records and the judges is :class:`fedaudit.audit.leakage.Auditor`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedaudit.audit.identifiability import IdentifiabilityTest, identifiability_test
from fedaudit.audit.judges import LPIPS, AuditorClassifier, nearest_in_class, psnr, ssim
from fedaudit.run.stored.reconstruction import Balanced, Identified, MatchedScores, Score, VictimScores
from fedaudit.simulation.linear_probe import LinearProbe


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


@dataclass
class RawScores:
    """Raw scores of one set of reconstructions (images, or latents) against one victim's records: each metric
    (None where it does not apply), the predicted domain of each reconstruction (for the victim × domain matrix)
    and, for images, the index of each one's nearest member (for the grid)."""

    n: int
    identifiability: IdentifiabilityTest
    domain_attribution: float
    predicted_domains: Tensor
    l2_to_member_mean: float
    psnr_mean: float | None = None
    psnr_best: float | None = None
    ssim_mean: float | None = None
    ssim_best: float | None = None
    lpips_mean: float | None = None
    class_fidelity: float | None = None
    class_fidelity_chance: float | None = None
    head_agreement: float | None = None
    moment_gap: float | None = None
    nn_member_index: Tensor | None = None

    def metric(self, name: str) -> float | None:
        """One of :data:`SCALAR_METRICS`, None where it does not apply."""
        value = getattr(self, name)
        return None if value is None else float(value)


def score_reconstructions(recon01: Tensor, targets: Tensor | None, ref: VictimRecords, class_clf: AuditorClassifier | None,
                          domain_clf: AuditorClassifier, lpips_fn: LPIPS | None = None, seed: int = 0) -> RawScores:
    """Raw scores of one set of reconstructions against one victim's records.

    ``targets=None`` (an inversion with no target class: styles, spectra)
    compares with the nearest record of any class and has no class fidelity.
    """
    recon01 = recon01.float().clamp(0, 1)
    if targets is None:  # reconstructions with no target class (style, amplitude): nearest over every class
        classes = torch.zeros(recon01.shape[0], dtype=torch.long, device=recon01.device)
        member_y = torch.zeros_like(ref.member_y)
        class_clf = None
    else:
        classes, member_y = targets, ref.member_y
    d_in, i_in = nearest_in_class(recon01, classes, ref.members, member_y)
    has_nn = torch.isfinite(d_in)
    nn_in = ref.members[i_in]
    p = psnr(recon01, nn_in)[has_nn]
    s = ssim(recon01, nn_in)[has_nn]
    domains = domain_clf.predict(recon01)
    out = RawScores(
        n=int(recon01.shape[0]),
        psnr_mean=float(p.mean()) if p.numel() else float("nan"),
        psnr_best=float(p.max()) if p.numel() else float("nan"),
        ssim_mean=float(s.mean()) if s.numel() else float("nan"),
        ssim_best=float(s.max()) if s.numel() else float("nan"),
        l2_to_member_mean=float(d_in[has_nn].mean()) if has_nn.any() else float("nan"),
        identifiability=identifiability_test(recon01, targets, ref.members, ref.member_y, ref.holdout, ref.holdout_y,
                                             seed=seed),
        domain_attribution=float((domains == ref.domain_index).float().mean()),
        predicted_domains=domains,
        nn_member_index=i_in,
    )
    if class_clf is not None:
        hits = class_clf.predict(recon01) == classes
        out.class_fidelity = float(hits.float().mean())
        out.class_fidelity_chance = best_constant_guess(classes)
    if lpips_fn is not None:
        lp = lpips_fn(recon01[has_nn], nn_in[has_nn])
        out.lpips_mean = float(lp.mean()) if lp.numel() else float("nan")
    return out


def best_constant_guess(targets: Tensor) -> float:
    """Accuracy of the best guess that ignores the image: the most frequent target class's share."""
    return float(torch.bincount(targets.cpu()).max() / targets.numel()) if targets.numel() else float("nan")


@dataclass(frozen=True)
class MatchedFidelity:
    """PSNR/SSIM over reconstructions paired one-to-one with distinct records (Hungarian on pixel MSE)."""

    n: int
    psnr_mean: float
    psnr_best: float
    ssim_mean: float
    ssim_best: float
    assignment: list[list[int]]  # [reconstruction, record] index pairs

    def scores(self) -> MatchedScores:
        return MatchedScores(psnr_mean=self.psnr_mean, ssim_mean=self.ssim_mean, psnr_best=self.psnr_best,
                             ssim_best=self.ssim_best)


@dataclass(frozen=True)
class PowerScores:
    """A positive control's reconstructions against the members its artifact was computed from."""

    identifiability: IdentifiabilityTest
    psnr: Tensor | None = None  # images: PSNR of each to the nearest of those members


def matched_fidelity(recon01: Tensor, records01: Tensor) -> MatchedFidelity:
    """PSNR/SSIM of reconstructions matched one-to-one to distinct real records.

    A batch inversion (gradient inversion) returns the batch's images in no
    particular order and with no trustworthy class, so each reconstruction is
    paired with a *distinct* record by the Hungarian algorithm
    (``scipy.optimize.linear_sum_assignment``) on pixel MSE; with more records
    than reconstructions the assignment is rectangular (every reconstruction
    gets a record), with fewer only ``len(records01)`` reconstructions are
    matched.
    """
    from scipy.optimize import linear_sum_assignment

    r, m = recon01.float().clamp(0, 1), records01.float()
    if r.shape[0] == 0 or m.shape[0] == 0:
        nan = float("nan")
        return MatchedFidelity(n=0, psnr_mean=nan, psnr_best=nan, ssim_mean=nan, ssim_best=nan, assignment=[])
    mse = torch.cdist(r.flatten(1), m.flatten(1).to(r.device)).pow(2) / r[0].numel()
    rows, cols = linear_sum_assignment(mse.cpu().double().numpy())
    ri = torch.as_tensor(rows, dtype=torch.long, device=r.device)
    ci = torch.as_tensor(cols, dtype=torch.long, device=m.device)
    a, b = r[ri], m[ci].to(r.device)
    p, s = psnr(a, b), ssim(a, b)
    return MatchedFidelity(n=int(ri.numel()), psnr_mean=float(p.mean()), psnr_best=float(p.max()),
                           ssim_mean=float(s.mean()), ssim_best=float(s.max()),
                           assignment=[[int(i), int(j)] for i, j in zip(rows, cols)])


def score_latents(latents: Tensor, targets: Tensor, ref: VictimRecords, class_probe: LinearProbe,
                  domain_probe: LinearProbe, head: nn.Module, seed: int = 0) -> RawScores:
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
    return RawScores(
        n=int(z.shape[0]),
        l2_to_member_mean=float(d_in[has_nn].mean()) if has_nn.any() else float("nan"),
        identifiability=identifiability_test(z, targets, ref.members, ref.member_y, ref.holdout, ref.holdout_y,
                                             seed=seed),
        domain_attribution=float((domains == ref.domain_index).float().mean()),
        class_fidelity=float((class_probe.logits(z).argmax(1) == targets).float().mean()),
        class_fidelity_chance=best_constant_guess(targets),
        head_agreement=float((head_pred == targets).float().mean()),
        moment_gap=float((z.mean(0) - ref.members.float().mean(0)).norm() / spread),
        predicted_domains=domains,
    )


SCALAR_METRICS = ("psnr_mean", "psnr_best", "ssim_mean", "ssim_best", "l2_to_member_mean", "lpips_mean",
                  "domain_attribution", "class_fidelity", "head_agreement", "moment_gap")


NULLS = ("control", "prior_only", "twin")  # the untrained control keeps its historical key, "control"


def with_nulls(attack: RawScores, nulls: dict[str, RawScores | None]) -> VictimScores:
    """Every metric as its attack value beside each null's (``control``, ``prior_only``, ``twin``; NaN where a
    null lacks the metric) and its chance.

    ``nulls`` maps a null's name (:data:`NULLS`) to its raw scores, or None
    when that null did not run (its key is then absent). Chance levels are
    the computed ones: class fidelity's best constant guess on the targets,
    identifiability's permutation mean (with its 95% quantile and the
    attack's p-value beside it).
    """
    ran = {k: v for k, v in nulls.items() if v is not None}
    scores: dict[str, Score] = {}
    for key in SCALAR_METRICS:
        value = attack.metric(key)
        if value is not None:
            beside = {k: float("nan") if (found := v.metric(key)) is None else found for k, v in ran.items()}
            chance = {"chance": attack.class_fidelity_chance} if key == "class_fidelity" else {}
            scores[key] = Score(attack=value).with_(**beside, **chance)
    ia = attack.identifiability
    ident = Identified(attack=ia.value, attack_ci95=ia.ci95, attack_k=ia.k, attack_p_value=ia.p_value, n=ia.n,
                       excluded=ia.excluded, chance=ia.chance, null_q95=ia.null_q95,
                       balanced=Balanced(per_class=ia.per_class, permutations=ia.permutations, members=ia.members,
                                         nonmembers=ia.nonmembers))
    for name, other in ran.items():
        test = other.identifiability
        ident = ident.with_(**{name: test.value, f"{name}_ci95": test.ci95, f"{name}_p_value": test.p_value})
    return VictimScores(identifiability=ident).with_(**scores)


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


__all__ = ["NULLS", "SCALAR_METRICS", "MatchedFidelity", "PowerScores", "RawScores", "VictimRecords", "best_constant_guess",
           "domain_matrix", "macro_diagonal", "matched_fidelity", "score_latents", "score_reconstructions", "with_nulls"]
