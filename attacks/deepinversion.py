"""deepinversion — synthesise a victim's images from the statistics it shared.

One engine (:mod:`fedaudit.inversion`), dispatched on what the attacker's
wire view holds (ATTACKS.md, "deepinversion"):

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
  that (:func:`difference_stats`). The attacker does not know the others'
  sample counts and assumes equal weights 1/K.

* **classifier head** (server; FedLSI's stage-1 upload). ``CLASSIFIER_HEAD``
  = BatchNorm1d statistics + linear layer → latent inversion
  (:func:`fedaudit.latent_inversion.invert_latents`, the loop FedLSI's own
  server runs, with the attacker's stronger BN weight), scored by the
  auditor in latent space against the real latents of the victim's encoder.

* **banks** (server: each victim's upload; curious client: the victim's
  entries of the broadcast bank, which names every client). ``STYLE_BANK``
  (CCST) → style inversion: images whose features at the style encoder (the
  first block of the newest global model seen; CCST freezes it at round 0)
  carry the victim's channel mean/std — one pooled style (overall mode) or
  one image per style (single mode), :class:`~fedaudit.inversion.StyleProbe`.
  ``AMPLITUDE_BANK`` (ELCFS) → phase retrieval: one image per spectrum whose
  Fourier amplitude matches it (:class:`~fedaudit.inversion.AmplitudeProbe`).
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
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from fedaudit.attack import NO_ACCESS, Access, Attack, AttackerPrior, AttackOutput
from fedaudit.aggregation import load_state_
from fedaudit.fourier import amplitude_spectrum
from fedaudit.inversion import (
    AmplitudeProbe,
    InversionSettings,
    InversionTarget,
    ProbeLoss,
    StyleProbe,
    invert,
    pixel_box,
)
from fedaudit.style import EPS as STYLE_EPS
from fedaudit.latent_inversion import head_running_stats, invert_latents
from fedaudit.options import Option
from fedaudit.views import MEAN, VAR, count_sources, latest_weights, overlay_state, stat_keys, style_encoder_in_view
from fedaudit.wire import SERVER, Artifact, ArtifactKind, WireView, client_role

from .budget import INVERSION_BUDGET

if TYPE_CHECKING:
    from fedaudit.config import RunConfig

DIFFERENCING = "differencing"

STATS_KINDS = (ArtifactKind.FULL_MODEL, ArtifactKind.BN_STATS_ALL_LAYERS, ArtifactKind.PARTIAL_MODEL,
               ArtifactKind.GLOBAL_STATS)
BANK_KINDS = (ArtifactKind.STYLE_BANK, ArtifactKind.AMPLITUDE_BANK)
NOT_YET = {
    ArtifactKind.MODEL_DELTA: "inverting a model delta is not yet supported by deepinversion",
}
NOT_APPLICABLE = {
    ArtifactKind.SCALARS: "carries no statistics to invert",
    ArtifactKind.TRANSLATOR: "carries no statistics to invert",
    ArtifactKind.IMPORTANCE: "carries no statistics to invert",
}


def difference_stats(global_stats: dict[str, Tensor], own_stats: dict[str, Tensor], num_clients: int,
                     own_weight: float | None = None, pooled: bool = False) -> dict[str, Tensor]:
    """The mean statistics of the *other* clients, from the global ones and the attacker's own.

    With global statistics G = w·s_own + (1 − w)·m_others (``w`` the
    attacker's aggregation weight, 1/K by default), m_others =
    (G − w·s_own) / (1 − w). With ``pooled`` aggregation the relation holds for
    the mean and the second moment σ² + μ², so the variance is recovered from
    the second moment. Variances are clamped at 0 (an assumed weight that is
    off can push them below).
    """
    if num_clients < 2:
        raise ValueError("differencing needs at least two clients")
    w = 1.0 / num_clients if own_weight is None else float(own_weight)
    if not 0.0 < w < 1.0:
        raise ValueError(f"own_weight must lie in (0, 1), got {w}")
    out: dict[str, Tensor] = {}
    for key, g in global_stats.items():
        if key.endswith(MEAN):
            out[key] = (g.float() - w * own_stats[key].float()) / (1 - w)
    for key, g in global_stats.items():
        if not key.endswith(VAR):
            continue
        if pooled:
            mkey = key[: -len(VAR)] + MEAN
            g2 = g.float() + global_stats[mkey].float().square()
            own2 = own_stats[key].float() + own_stats[mkey].float().square()
            out[key] = ((g2 - w * own2) / (1 - w) - out[mkey].square()).clamp_min(0.0)
        else:
            out[key] = ((g.float() - w * own_stats[key].float()) / (1 - w)).clamp_min(0.0)
    return out


@dataclass
class _HeadJob:
    """Latent inversion of one victim's uploaded classifier head."""

    victim: str
    artifact: Artifact


@dataclass
class _BankJob:
    """Inversion of one victim's entries of a style or amplitude bank."""

    victim: str
    artifact: Artifact
    entries: dict[str, Tensor]  # "mean"/"std" (styles) or "amplitude"


@dataclass
class _Job:
    """One inversion problem: an artifact key, the victims its images are scored against, the target state."""

    artifact: str
    victims: list[str]
    state: dict[str, Tensor]
    use_ce: bool
    info: dict[str, Any] = field(default_factory=dict)


class DeepInversion(Attack):
    name = "deepinversion"
    summary = "BN-statistics inversion (DeepInversion) of every shared model/statistics artifact, with an untrained-model control"
    roles: ClassVar[tuple[str, ...]] = ("server", "client")

    def __init__(self, settings: InversionSettings | None = None, own_weight: float | None = None) -> None:
        self.settings = settings or InversionSettings()
        self.own_weight = own_weight

    options: ClassVar[dict[str, Option]] = {
        **INVERSION_BUDGET,
        "inversion_bn_weight": Option(InversionSettings.bn_weight, "Weight of the BN-statistics loss.", kind=float,
                                      low=0.0, high=1e6),
        "inversion_ce_weight": Option(InversionSettings.ce_weight, "Weight of the cross-entropy on the target classes.",
                                      kind=float, low=0.0, high=1e6),
        "inversion_tv_weight": Option(InversionSettings.tv_weight, "Weight of the TV-L2 image prior.", kind=float,
                                      low=0.0, high=1e6),
        "inversion_l2_weight": Option(InversionSettings.l2_weight, "Weight of the image L2 prior.", kind=float,
                                      low=0.0, high=1e6),
    }

    @classmethod
    def from_config(cls, cfg: RunConfig, prior: AttackerPrior) -> DeepInversion:
        """Settings from the ``inversion_*`` options: ``inversion_batch`` images per victim, whole classes."""
        o = cls.option_values(cfg)
        return cls(InversionSettings(
            iters=o["inversion_iters"],
            per_class=max(1, o["inversion_batch"] // prior.num_classes),
            lr=o["inversion_lr"],
            bn_weight=o["inversion_bn_weight"],
            ce_weight=o["inversion_ce_weight"],
            tv_weight=o["inversion_tv_weight"],
            l2_weight=o["inversion_l2_weight"],
            flip=prior.hflip,
            precision=cfg.precision,
            seed=cfg.seed,
        ))

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
            access: Access = NO_ACCESS) -> list[AttackOutput]:
        return self.run_batch(view, prior, [victim], device, access)

    def for_counterfactual(self, per_class: int | None = None) -> DeepInversion:
        return DeepInversion(replace(self.settings, nulls=False, per_class=per_class or self.settings.per_class),
                             self.own_weight)

    def run_batch(self, view: WireView, prior: AttackerPrior, victims: list[str], device: torch.device,
                  access: Access = NO_ACCESS) -> list[AttackOutput]:
        """Attack every victim from what ``view`` holds; all inversions run as one batch (no access needed)."""
        fresh = prior.build_model()
        keys = stat_keys(fresh)
        base = {k: v.detach().to(device) for k, v in fresh.state_dict().items()}
        head_keys = [k for k in base if k.startswith("head.")]
        outputs: list[AttackOutput] = []
        ctx = _Context(view, prior, base, keys, head_keys, device)
        jobs, statuses = (self._server_jobs if view.role == SERVER else self._client_jobs)(ctx, victims)
        outputs += statuses
        head_jobs = [j for j in jobs if isinstance(j, _HeadJob)]
        bank_jobs = [j for j in jobs if isinstance(j, _BankJob)]
        jobs = [j for j in jobs if isinstance(j, _Job)]
        if head_jobs:
            outputs += self._invert_heads(fresh, head_jobs, prior, view.role, device)
        for kind in BANK_KINDS:
            mine = [j for j in bank_jobs if j.artifact.kind == kind]
            if mine:
                outputs += self._invert_bank(fresh, mine, prior, view, device)
        if not jobs:
            return outputs
        targets = [InversionTarget(f"{j.artifact}/{i}", j.state, {"ce": 1.0 if j.use_ce else 0.0}) for i, j in enumerate(jobs)]
        # Nulls in the same batch: the untrained model (same gates), and the victim's own state with the
        # statistics term off (prior-only: TV, L2, jitter, and CE where the head is known).
        controls = [InversionTarget(f"control/{t.name}", base, dict(t.gates)) for t in targets] if self.settings.nulls else []
        priors = [InversionTarget(f"prior/{t.name}", t.state, {**t.gates, "bn": 0.0}) for t in targets] if self.settings.nulls else []
        lo, hi = pixel_box(prior.mean, prior.std)
        result = invert(fresh, [*targets, *controls, *priors], prior.num_classes, prior.image_size, self.settings, lo, hi,
                        device)
        for i, job in enumerate(jobs):
            info = {**job.info, "ce": job.use_ce, "losses": result.losses[targets[i].name], "seconds_shared": result.seconds}
            nulls = {}
            if controls:
                info.update(control_losses=result.losses[controls[i].name], prior_only_losses=result.losses[priors[i].name])
                nulls = {"prior_only": result.images[2 * len(jobs) + i]}
            for v in job.victims:
                outputs.append(AttackOutput(self.name, view.role, v, job.artifact, images=result.images[i],
                                            targets=result.labels,
                                            control_images=result.images[len(jobs) + i] if controls else None,
                                            nulls=dict(nulls), info=dict(info, status="attacked")))
        return outputs

    # -- dispatch ----------------------------------------------------------------

    def _server_jobs(self, ctx: _Context, victims: list[str]) -> tuple[list[_Job], list[AttackOutput]]:
        jobs, statuses = [], []
        broadcasts = [a for a in ctx.view if a.sender == SERVER]
        for victim in victims:
            sent = [a for a in ctx.view if a.sender == client_role(victim)]
            for kind in sorted({a.kind for a in sent}, key=lambda k: k.value):
                art = max((a for a in sent if a.kind == kind), key=lambda a: a.round)
                if kind == ArtifactKind.CLASSIFIER_HEAD:
                    jobs.append(_HeadJob(victim, art))
                    continue
                if kind in BANK_KINDS:
                    jobs.append(_BankJob(victim, art, dict(art.tensors)))
                    continue
                reason = ctx.skip_reason(art)
                if reason is not None:
                    statuses.append(self._status(ctx.view, victim, kind.value, *reason))
                    continue
                # Weights: fresh < what the server broadcast to the victim < what the victim uploaded itself.
                layers = [*latest_weights(broadcasts, receiver=client_role(victim)),
                          *latest_weights(sent, sender=client_role(victim))]
                state, info = ctx.assemble(layers, art)
                if "unsupported" in info:
                    statuses.append(self._status(ctx.view, victim, kind.value, "not yet supported", info["unsupported"]))
                    continue
                jobs.append(_Job(kind.value, [victim], state, info.pop("use_ce"), info))
        return jobs, statuses

    def _client_jobs(self, ctx: _Context, victims: list[str]) -> tuple[list[_Job], list[AttackOutput]]:
        me = ctx.view.role
        received = [a for a in ctx.view if a.receiver == me]
        own = [a for a in ctx.view if a.sender == me]
        jobs, statuses = [], []
        for kind in sorted({a.kind for a in received}, key=lambda k: k.value):
            art = max((a for a in received if a.kind == kind), key=lambda a: a.round)
            if kind in BANK_KINDS:  # the broadcast bank names every client's entries: no differencing needed
                for v in victims:
                    entries = {k[len(v) + 1:]: t for k, t in art.tensors.items() if k.startswith(f"{v}/")}
                    if entries:
                        jobs.append(_BankJob(v, art, entries))
                    else:
                        statuses.append(self._status(ctx.view, v, kind.value, "not applicable",
                                                     f"the broadcast bank holds no entry of {v}"))
                continue
            reason = ctx.skip_reason(art)
            if reason is not None:
                statuses += [self._status(ctx.view, v, kind.value, *reason) for v in victims]
                continue
            # Weights: fresh < own uploads < the broadcast weights (the model the global stats belong to).
            layers = [*latest_weights(own, sender=me), *latest_weights(received, receiver=me)]
            state, info = ctx.assemble(layers, art)
            if "unsupported" in info:
                statuses += [self._status(ctx.view, v, kind.value, "not yet supported", info["unsupported"]) for v in victims]
                continue
            use_ce = info.pop("use_ce")
            jobs.append(_Job(kind.value, list(victims), state, use_ce, dict(info, variant="global")))
            mine = ctx.own_stats(own, art.round)
            if mine is None:
                statuses += [self._status(ctx.view, v, f"{kind.value}:{DIFFERENCING}", "not applicable",
                                          "the attacker never uploaded its own BN statistics") for v in victims]
                continue
            own_art, own_stats = mine
            k = ctx.prior.num_clients
            pooled = kind == ArtifactKind.GLOBAL_STATS  # FedFD pools second moments; FedAvg averages buffers
            others = difference_stats({key: state[key] for key in ctx.keys}, own_stats, k, self.own_weight, pooled)
            diff_state = {**state, **{key: t.to(state[key].dtype) for key, t in others.items()}}
            jobs.append(_Job(f"{kind.value}:{DIFFERENCING}", list(victims), diff_state, use_ce, dict(
                info, variant=DIFFERENCING, clients=k, own_weight=self.own_weight or 1.0 / k, pooled=pooled,
                own_round=own_art.round, exact_round=own_art.round == art.round - 1)))
        return jobs, statuses

    def _invert_heads(self, fresh: nn.Module, jobs: list[_HeadJob], prior: AttackerPrior, role: str,
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

    def _invert_bank(self, fresh: nn.Module, jobs: list[_BankJob], prior: AttackerPrior, view: WireView,
                     device: torch.device) -> list[AttackOutput]:
        """Style inversion (``STYLE_BANK``) or phase retrieval (``AMPLITUDE_BANK``) of every victim's
        entries in one batch, beside the same attack on a random artifact of the same shape: the
        statistic of uniform-noise images (a bank that carries no data)."""
        st = self.settings
        kind = jobs[0].artifact.kind
        g = torch.Generator().manual_seed(st.seed)
        mean = torch.tensor(prior.mean).view(1, -1, 1, 1)
        std = torch.tensor(prior.std).view(1, -1, 1, 1)
        cap = st.per_class * prior.num_classes
        info: dict[str, Any] = {"status": "attacked"}
        if kind == ArtifactKind.STYLE_BANK:
            encoder, weights_from = style_encoder_in_view(fresh, view, device)
            rows = jobs[0].entries["mean"].shape[0]
            if any(j.entries["mean"].shape != jobs[0].entries["mean"].shape for j in jobs):
                return [self._status_of(view.role, j.victim, kind.value, "not yet supported",
                                        "victims' style entries differ in shape; invert them one victim at a time "
                                        "(--victim)") for j in jobs]
            pooled = rows == 1  # CCST's overall style; K single-image styles otherwise
            n = cap if pooled else rows * st.per_class
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
            matcher = "style"
        else:
            n = min(cap, *(j.entries["amplitude"].shape[0] for j in jobs))
            shape = (prior.channels, prior.image_size, prior.image_size)
            bad = [j for j in jobs if tuple(j.entries["amplitude"].shape[1:]) != shape]
            if bad:
                return [self._status_of(view.role, j.victim, kind.value, "not applicable",
                                        f"spectra of shape {tuple(j.entries['amplitude'].shape[1:])} do not match the "
                                        f"images {shape}") for j in jobs]
            noise = torch.rand(n, *shape, generator=g)
            control = {"target": amplitude_spectrum(noise).to(device)}
            probe = AmplitudeProbe(amplitude_spectrum(noise), prior.mean, prior.std)
            victims = [{"target": j.entries["amplitude"][:n].float()} for j in jobs]
            info.update(spectra=n)
            matcher = "amplitude"
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

    def _status(self, view: WireView, victim: str, artifact: str, status: str, reason: str) -> AttackOutput:
        return self._status_of(view.role, victim, artifact, status, reason)

    def _status_of(self, role: str, victim: str, artifact: str, status: str, reason: str) -> AttackOutput:
        return AttackOutput(self.name, role, victim, artifact, info={"status": status, "reason": reason})


@dataclass
class _Context:
    view: WireView
    prior: AttackerPrior
    base: dict[str, Tensor]
    keys: list[str]
    head_keys: list[str]
    device: torch.device

    def skip_reason(self, art: Artifact) -> tuple[str, str] | None:
        """Why ``art`` cannot be inverted here, or None when it can."""
        if art.kind in NOT_YET:
            return "not yet supported", NOT_YET[art.kind]
        if art.kind in NOT_APPLICABLE:
            return "not applicable", NOT_APPLICABLE[art.kind]
        if art.kind not in STATS_KINDS:
            return "not yet supported", f"no matcher for artifact kind {art.kind.value}"
        if not self.keys:
            return "not applicable", "the architecture has no BatchNorm running statistics"
        if not any(k in art.tensors for k in self.keys):
            if art.kind == ArtifactKind.PARTIAL_MODEL:
                return "not applicable", "this partial model carries no BatchNorm running statistics"
            some = ", ".join(list(art.tensors)[:2])
            return "not yet supported", f"its tensors ({some}, ...) name no BatchNorm buffer of the model"
        return None

    def assemble(self, layers: Iterable[Artifact], stats: Artifact) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """A full model state: fresh init, overlaid by ``layers`` in order, then the statistics of ``stats``."""
        state, source = overlay_state(self.base, [*layers, stats], self.device)
        weights_from = count_sources(source, skip=self.keys)
        use_ce = bool(self.head_keys) and all(source[k] != "fresh" for k in self.head_keys)
        unknown = [k for k in self.keys if source[k] == "fresh"]
        info = {"round": stats.round, "sender": stats.sender, "weights_from": weights_from, "use_ce": use_ce}
        if unknown:
            # Matching a fresh layer's 0/1 statistics would pull the images toward noise, not toward the victim.
            info["unsupported"] = (f"the wire carries the statistics of {(len(self.keys) - len(unknown)) // 2} of "
                                   f"{len(self.keys) // 2} BN layers (missing e.g. {unknown[0]}); partial-layer "
                                   "matching is not implemented")
        return state, info

    def own_stats(self, own: list[Artifact], broadcast_round: int) -> tuple[Artifact, dict[str, Tensor]] | None:
        """The attacker's own uploaded statistics that went into the broadcast of ``broadcast_round``.

        The broadcast of round r aggregates the uploads of round r − 1; the
        wire keeps only the newest message per kind in memory, so when that
        upload is gone the newest one stands in (``exact_round`` says which).
        """
        candidates = [a for a in own if all(k in a.tensors for k in self.keys)]
        if not candidates:
            return None
        before = [a for a in candidates if a.round < broadcast_round]
        art = max(before or candidates, key=lambda a: a.round)
        return art, {k: art.tensors[k].to(self.device) for k in self.keys}
