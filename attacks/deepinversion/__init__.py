"""deepinversion — synthesise a victim's images from the statistics it shared.

One engine (:mod:`fedaudit.attacks.deepinversion.engine`), dispatched on what the attacker's
wire view holds (docs/attacks.md, "The attacks"; the dispatch is :mod:`fedaudit.attacks.targets`,
shared with ``mia-artifact``):

* **server** (honest-but-curious, sees every upload). Per victim:
  ``FULL_MODEL`` → BN-statistics matching + CE through the uploaded head;
  ``BN_STATS_ALL_LAYERS`` (statistics without the weights) → the statistics
  are loaded into a model whose weights are the best the server holds: the
  victim's own uploaded weights (``PARTIAL_MODEL``/``FULL_MODEL``) where it
  sent them, otherwise the global model the server broadcast to it, otherwise
  a fresh initialisation (reported in ``info.weights_from``). CE is used only
  when the head's weights came over the wire. A ``PARTIAL_MODEL`` that carries
  every BN layer's running statistics is attacked the same way.
* **curious client** (sees what was broadcast to it). The broadcast global
  statistics (``GLOBAL_STATS``, or the BN buffers of a broadcast
  ``FULL_MODEL``/``PARTIAL_MODEL``) are inverted as they are, and by
  **differencing**: the global statistics are the weighted mean of the K
  clients' (FedAvg averages the buffers; FedFD pools the second moments), the
  attacker knows its own, so it solves for the mean of the others and inverts
  that (:func:`fedaudit.attacks.targets.difference_stats`). The attacker does not know the others'
  sample counts and assumes equal weights 1/K.

* **classifier head** (server; FedLSI's stage-1 upload). ``CLASSIFIER_HEAD``
  = BatchNorm1d statistics + linear layer → latent inversion
  (:func:`fedaudit.tensor_ops.latent_inversion.invert_latents`, the loop FedLSI's own
  server runs, with the attacker's stronger BN weight), scored by the
  auditor in latent space against the real latents of the victim's encoder.

* **banks** (server: each victim's upload; curious client: the victim's
  entries of the broadcast bank, which names every client). ``STYLE_BANK``
  (CCST) → style inversion: images whose features at the style encoder (the
  first block of the newest global model seen; CCST freezes it at round 0)
  carry the victim's channel mean/std — one pooled style (overall mode) or
  one image per style (single mode), :class:`~fedaudit.attacks.deepinversion.engine.StyleProbe`.
  ``AMPLITUDE_BANK`` (ELCFS) → phase retrieval: one image per spectrum whose
  Fourier amplitude matches it (:class:`~fedaudit.attacks.deepinversion.engine.AmplitudeProbe`).
  Both have no target class (no class fidelity); their control is the same
  attack on a *random artifact of the same shape*: the statistic of
  uniform-noise images.

Artifacts this attack cannot invert yet (``MODEL_DELTA``) come back with
status "not yet supported"; artifacts that carry no statistics (``SCALARS``, ``TRANSLATOR``,
``IMPORTANCE``, a ``PARTIAL_MODEL`` without BN buffers) with "not applicable".
Neither is a crash.

Control: every inversion is repeated, in the same batch, against an untrained
model of the same architecture (the attacker prior's fresh model; for a head,
its untrained head).
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
from torch import nn

from fedaudit.attack import NO_ACCESS, Access, Attack, AttackerPrior, AttackOutput, AttackSetup
from fedaudit.attacks.budget import InversionBudget
from fedaudit.tensor_ops.aggregation import load_state_
from fedaudit.attacks.deepinversion.engine import (
    CPU_VMAP_MAX_IMAGES,
    VICTIM_BATCHING,
    AmplitudeProbe,
    InversionSettings,
    InversionTarget,
    ProbeLoss,
    StyleProbe,
    invert,
)
from fedaudit.attacks.image_optim import pixel_box
from fedaudit.attacks.targets import BANK_KINDS, BankTarget, HeadTarget, find_targets
from fedaudit.run.options import option
from fedaudit.simulation.wire import ArtifactKind, WireView
from fedaudit.simulation.wire_views import style_encoder_in_view
from fedaudit.tensor_ops.fourier import amplitude_spectrum
from fedaudit.tensor_ops.latent_inversion import head_running_stats, invert_latents
from fedaudit.tensor_ops.style import EPS as STYLE_EPS


@dataclass(frozen=True)
class DeepInversionOptions(InversionBudget):
    inversion_bn_weight: float = option(InversionSettings.bn_weight, kind=float, help="Weight of the BN-statistics loss.", low=0.0,
                                        high=1e6)
    inversion_ce_weight: float = option(InversionSettings.ce_weight, kind=float, help="Weight of the cross-entropy on the target "
                                        "classes.", low=0.0, high=1e6)
    inversion_tv_weight: float = option(InversionSettings.tv_weight, kind=float, help="Weight of the TV-L2 image prior.", low=0.0,
                                        high=1e6)
    inversion_l2_weight: float = option(InversionSettings.l2_weight, kind=float, help="Weight of the image L2 prior.", low=0.0,
                                        high=1e6)
    inversion_victims: str = option(InversionSettings.victims, "How the victims' inversions are batched: vmap "
                                    "(stacked, one launch per layer for all), loop (one after the other), or auto "
                                    f"(vmap on CUDA, and on a CPU for victims of at most {CPU_VMAP_MAX_IMAGES} images; "
                                    "loop otherwise).", choices=VICTIM_BATCHING)


class DeepInversion(Attack):
    name = "deepinversion"
    summary = "BN-statistics inversion (DeepInversion) of every shared model/statistics artifact, with an untrained-model control"
    roles: ClassVar[tuple[str, ...]] = ("server", "client")

    def __init__(self, settings: InversionSettings | None = None, own_weight: float | None = None) -> None:
        self.settings = settings or InversionSettings()
        self.own_weight = own_weight

    Options: ClassVar[type] = DeepInversionOptions

    @classmethod
    def from_config(cls, setup: AttackSetup, prior: AttackerPrior) -> DeepInversion:
        """Settings from the ``inversion_*`` options: ``inversion_batch`` images per victim, whole classes."""
        o: DeepInversionOptions = setup.options
        return cls(InversionSettings(
            iters=o.inversion_iters,
            per_class=max(1, o.inversion_batch // prior.num_classes),
            lr=o.inversion_lr,
            bn_weight=o.inversion_bn_weight,
            ce_weight=o.inversion_ce_weight,
            tv_weight=o.inversion_tv_weight,
            l2_weight=o.inversion_l2_weight,
            flip=prior.hflip,
            precision=setup.precision,
            victims=o.inversion_victims,
            seed=setup.seed,
        ))

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
            access: Access = NO_ACCESS) -> list[AttackOutput]:
        return self.run_batch(view, prior, [victim], device, access)

    def for_counterfactual(self, per_class: int | None = None, images: int | None = None) -> DeepInversion:
        return DeepInversion(replace(self.settings, nulls=False, per_class=per_class or self.settings.per_class,
                                     images=images), self.own_weight)

    def run_batch(self, view: WireView, prior: AttackerPrior, victims: list[str], device: torch.device,
                  access: Access = NO_ACCESS) -> list[AttackOutput]:
        """Attack every victim from what ``view`` holds; all inversions run as one batch (no access needed)."""
        found = find_targets(view, prior, victims, device, self.own_weight)
        outputs = [self._status_of(view.role, u.victim, u.artifact, u.status, u.reason) for u in found.unavailable]
        if self.settings.images is not None and (found.heads or found.banks):  # a classless count: statistics only
            outputs += [self._status_of(view.role, j.victim, j.artifact.kind.value, "not applicable",
                                        "an artifact of records of unknown class is inverted from BatchNorm "
                                        "statistics only") for j in [*found.heads, *found.banks]]
            found.heads, found.banks = [], []
        if found.heads:
            outputs += self._invert_heads(found.fresh, found.heads, prior, view.role, device)
        for kind in BANK_KINDS:
            mine = [j for j in found.banks if j.artifact.kind == kind]
            if mine:
                outputs += self._invert_bank(found.fresh, mine, prior, view, device)
        if found.stats:
            outputs += self._invert_stats(found.fresh, found.base, found.stats, prior, view.role, device)
        return outputs

    def _invert_stats(self, fresh: nn.Module, base: dict[str, torch.Tensor], jobs: list, prior: AttackerPrior,
                      role: str, device: torch.device) -> list[AttackOutput]:
        """BN-statistics inversion of every victim's state, beside its nulls, in one batch."""
        classless = self.settings.images is not None
        targets = [InversionTarget(f"{j.artifact}/{i}", j.state, {"ce": 1.0 if j.use_ce else 0.0}) for i, j in enumerate(jobs)]
        # Nulls in the same batch: the untrained model (same gates), and the victim's own state with the
        # statistics term off (prior-only: TV, L2, jitter, and CE where the head is known).
        controls = [InversionTarget(f"control/{t.name}", base, dict(t.gates)) for t in targets] if self.settings.nulls else []
        priors = [InversionTarget(f"prior/{t.name}", t.state, {**t.gates, "bn": 0.0}) for t in targets] if self.settings.nulls else []
        lo, hi = pixel_box(prior.mean, prior.std)
        result = invert(fresh, [*targets, *controls, *priors], prior.num_classes, prior.image_size, self.settings, lo, hi,
                        device)
        outputs = []
        for i, job in enumerate(jobs):
            info = {**job.info, "ce": job.use_ce and not classless, "losses": result.losses[targets[i].name],
                    "seconds_shared": result.seconds, "victims_batched": result.batching,
                    "victims_per_launch": result.per_launch}
            nulls = {}
            if controls:
                info.update(control_losses=result.losses[controls[i].name], prior_only_losses=result.losses[priors[i].name])
                nulls = {"prior_only": result.images[2 * len(jobs) + i]}
            for v in job.victims:
                outputs.append(AttackOutput(self.name, role, v, job.artifact, images=result.images[i],
                                            targets=None if classless else result.labels,
                                            control_images=result.images[len(jobs) + i] if controls else None,
                                            nulls=dict(nulls), info=dict(info, status="attacked")))
        return outputs

    def _invert_heads(self, fresh: nn.Module, jobs: list[HeadTarget], prior: AttackerPrior, role: str,
                      device: torch.device) -> list[AttackOutput]:
        """Latent inversion of every victim's head, and of the untrained head as the control, in one batch."""
        template = getattr(fresh, "head", None)
        kind = ArtifactKind.CLASSIFIER_HEAD.value
        if template is None:
            return [self._status_of(role, j.victim, kind, "not yet supported",
                                    "the architecture has no `head` module to load the uploaded head into") for j in jobs]
        heads, outputs = [], []
        for job in jobs:
            head = copy.deepcopy(template)
            tensors = {k[len("head."):]: v for k, v in job.artifact.tensors.items() if k.startswith("head.")}
            try:
                head_running_stats(head)
                load_state_(head, tensors)
            except (KeyError, ValueError, RuntimeError) as exc:
                outputs.append(self._status_of(role, job.victim, kind, "not yet supported",
                                               f"cannot load the uploaded head into a BatchNorm1d → Linear head: {exc}"))
                continue
            heads.append((job, head.to(device)))
        if not heads:
            return outputs
        st = self.settings
        num = st.per_class * prior.num_classes
        g = torch.Generator(device=device).manual_seed(st.seed)
        t0 = time.perf_counter()
        victims_heads = [h for _, h in heads]
        # Nulls: the untrained head (the control), then each victim's head with its statistics term off (prior-only).
        extra = [template.to(device), *victims_heads] if st.nulls else []
        weights = [st.latent_bn_weight] * (len(heads) + (1 if st.nulls else 0)) + [0.0] * (len(heads) if st.nulls else 0)
        latents, labels = invert_latents(victims_heads + extra, num, prior.num_classes,
                                         iterations=st.iters, generator=g, lr=st.latent_lr, batch_size=min(num, 64),
                                         bn_weight=weights, norm_weight=st.latent_norm_weight)
        # Labels are balanced, so sorting each head's latents by label gives every head the same target vector.
        order = labels.argsort(dim=1, stable=True)
        latents = torch.gather(latents, 1, order[..., None].expand_as(latents))
        targets = torch.gather(labels, 1, order)[0]
        seconds = time.perf_counter() - t0
        for i, (job, head) in enumerate(heads):
            info = {"status": "attacked", "round": job.artifact.round, "sender": job.artifact.sender,
                    "space": "latent", "latent_dim": int(latents.shape[-1]), "seconds_shared": seconds}
            nulls = {"prior_only": latents[len(heads) + 1 + i]} if st.nulls else {}
            outputs.append(AttackOutput(self.name, role, job.victim, kind, latents=latents[i], targets=targets,
                                        control_latents=latents[len(heads)] if st.nulls else None, nulls=nulls,
                                        head=head, info=info))
        return outputs

    def _invert_bank(self, fresh: nn.Module, jobs: list[BankTarget], prior: AttackerPrior, view: WireView,
                     device: torch.device) -> list[AttackOutput]:
        """Style inversion (``STYLE_BANK``) or phase retrieval (``AMPLITUDE_BANK``) of every victim's
        entries in one batch, beside the same attack on a random artifact of the same shape: the
        statistic of uniform-noise images (a bank that carries no data)."""
        st = self.settings
        kind = jobs[0].artifact.kind
        info: dict[str, Any] = {"status": "attacked"}
        setup = self._style_problem if kind == ArtifactKind.STYLE_BANK else self._amplitude_problem
        problem = setup(fresh, jobs, prior, view, device, info)
        if isinstance(problem, str):
            status, reason = problem.split(": ", 1)
            return [self._status_of(view.role, j.victim, kind.value, status, reason) for j in jobs]
        n, control, probe, victims, matcher = problem
        targets = [InversionTarget(f"{kind.value}/{i}", {k: t.to(device) for k, t in v.items()}) for i, v in enumerate(victims)]
        controls = [InversionTarget(f"control/{t.name}", control) for t in targets] if st.nulls else []
        priors = [InversionTarget(f"prior/{t.name}", t.state, {matcher: 0.0}) for t in targets] if st.nulls else []
        lo, hi = pixel_box(prior.mean, prior.std)
        result = invert(probe, [*targets, *controls, *priors], n, prior.image_size, replace(st, per_class=1), lo, hi,
                        device, matchers=[ProbeLoss(matcher)], weights={matcher: st.bn_weight})
        outputs = []
        for i, job in enumerate(jobs):
            entry = dict(info, round=job.artifact.round, sender=job.artifact.sender,
                         losses=result.losses[targets[i].name], seconds_shared=result.seconds)
            nulls = {}
            if controls:
                entry.update(control_losses=result.losses[controls[i].name],
                             prior_only_losses=result.losses[priors[i].name],
                             control_artifact="statistics of uniform-noise images")
                nulls = {"prior_only": result.images[2 * len(jobs) + i]}
            outputs.append(AttackOutput(self.name, view.role, job.victim, kind.value, images=result.images[i],
                                        targets=None, control_images=result.images[len(jobs) + i] if controls else None,
                                        nulls=nulls, info=entry))
        return outputs

    def _style_problem(self, fresh: nn.Module, jobs: list[BankTarget], prior: AttackerPrior, view: WireView,
                       device: torch.device, info: dict[str, Any]) -> tuple | str:
        """Style inversion: (images per target, the noise bank's statistics, probe, each victim's target, matcher),
        or "status: reason" when the victims' banks cannot be inverted together."""
        st = self.settings
        g = torch.Generator().manual_seed(st.seed)
        mean = torch.tensor(prior.mean).view(1, -1, 1, 1)
        std = torch.tensor(prior.std).view(1, -1, 1, 1)
        encoder, weights_from = style_encoder_in_view(fresh, view, device)
        rows = jobs[0].entries["mean"].shape[0]
        if any(j.entries["mean"].shape != jobs[0].entries["mean"].shape for j in jobs):
            return ("not yet supported: victims' style entries differ in shape; invert them one victim at a time "
                    "(--victim)")
        pooled = rows == 1  # CCST's overall style; K single-image styles otherwise
        n = st.per_class * prior.num_classes if pooled else rows * st.per_class
        noise = ((torch.rand(n if pooled else rows, prior.channels, prior.image_size, prior.image_size,
                             generator=g) - mean) / std).to(device)
        with torch.no_grad():
            f = encoder(noise).float()
        if pooled:
            f = f.transpose(0, 1).flatten(1)[None, :, :, None]  # every position of every image: one "image"
        var, mu = torch.var_mean(f, dim=(2, 3), correction=0)
        control = {"target_mean": mu, "target_std": (var + STYLE_EPS).sqrt()}
        probe = StyleProbe(encoder, control["target_mean"], control["target_std"], pooled, STYLE_EPS)
        victims = [{"target_mean": j.entries["mean"], "target_std": j.entries["std"]} for j in jobs]
        info.update(mode="overall" if pooled else "single", styles=rows, weights_from=weights_from)
        return n, control, probe, victims, "style"

    def _amplitude_problem(self, fresh: nn.Module, jobs: list[BankTarget], prior: AttackerPrior, view: WireView,
                           device: torch.device, info: dict[str, Any]) -> tuple | str:
        """Phase retrieval: the same five parts from the victims' amplitude spectra, or "status: reason"."""
        g = torch.Generator().manual_seed(self.settings.seed)
        n = min(self.settings.per_class * prior.num_classes, *(j.entries["amplitude"].shape[0] for j in jobs))
        shape = (prior.channels, prior.image_size, prior.image_size)
        bad = [j for j in jobs if tuple(j.entries["amplitude"].shape[1:]) != shape]
        if bad:
            return (f"not applicable: spectra of shape {tuple(bad[0].entries['amplitude'].shape[1:])} do not match "
                    f"the images {shape}")
        noise = torch.rand(n, *shape, generator=g)
        control = {"target": amplitude_spectrum(noise).to(device)}
        probe = AmplitudeProbe(amplitude_spectrum(noise), prior.mean, prior.std)
        victims = [{"target": j.entries["amplitude"][:n].float()} for j in jobs]
        info.update(spectra=n)
        return n, control, probe, victims, "amplitude"

    def _status_of(self, role: str, victim: str, artifact: str, status: str, reason: str) -> AttackOutput:
        return AttackOutput(self.name, role, victim, artifact, info={"status": status, "reason": reason})
