"""Membership inference against shared artifacts: was this record behind what the victim sent?

The ``artifact`` variant of ``mia`` (``--attack mia-artifact``). Model
membership inference asks the deployed model; this asks every statistics
artifact the method ships, found by the same dispatch as ``deepinversion``
(:mod:`fedaudit.attacks.targets`). The attacker holds its role's wire view,
the public prior and the auditor's unlabeled challenge per victim (members and
holdout records, shuffled), computes each candidate's *own* version of the
artifact with the public code, and scores how strongly the shared artifact
contains it. Two tests, by what the artifact summarises:

* **Per-record banks** (``AMPLITUDE_BANK``: one Fourier amplitude spectrum
  per training image, ELCFS; ``STYLE_BANK`` in single mode: one channel
  mean/std per chosen image, CCST): the candidate's own entry is either in the
  bank or not. Score = −distance to the nearest bank entry
  (:func:`fedaudit.attacks.mia.scorers.nearest_entry_scores`), on log(1 + amplitude)
  for spectra (their range spans decades) and on (mean, log std) for styles.
* **Aggregate statistics** (BatchNorm running mean/variance of every layer in
  ``FULL_MODEL``, ``BN_STATS_ALL_LAYERS``, ``PARTIAL_MODEL``; the broadcast
  ``GLOBAL_STATS`` as they are and, for a curious client, differenced; the
  BatchNorm1d statistics of a ``CLASSIFIER_HEAD``; a pooled ``STYLE_BANK``):
  the whitened tracing test (:func:`fedaudit.attacks.mia.scorers.tracing_scores`). A record's
  statistics are what the layer averages over: per channel, the record's mean
  of the layer's input over positions and its mean square; the shared ones are
  the running mean and the second moment running_var + running_mean² (every
  layer, concatenated: d = 2 × the channels of all layers), standardised and
  whitened by the candidates' own shrunk correlation, so correlated channels
  count once; the population is the candidates themselves (other domains'
  records would differ by their domain, not by membership).
  Inputs to each layer come from the assembled model in eval mode: the
  victim's weights as the observer holds them (the weights broadcast to it,
  overlaid by its own uploads), the artifact's statistics in the BN layers.
  A head's latents come from the victim's newest uploaded weights: FedLSI
  uploads its head at round 0 and its model only from round 1 on, after more
  training, so the attacker's latents are approximate, and the positive
  control (computed with the true stage-1 encoder) says what that costs.

The scores go back to the auditor (:mod:`fedaudit.audit.membership`), which
splits them by the truth, reports the same ROC, AUC band and TPR at low FPR
as model MIA, and runs the same test on two counterfactual artifacts: the
holdout twin (the victim's artifact with its members swapped for records in
neither half of the challenge; it must sit in the null band) and the
positive control (the artifact of a few members alone; the power a LOW
needs).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from fedaudit.attack import AttackerPrior, AttackOutput, MembershipChallenge
from fedaudit.attacks.targets import NOT_APPLICABLE, BankTarget, HeadTarget, Targets, Unavailable, find_targets
from fedaudit.simulation.training import Preprocess, forward_chunks
from fedaudit.simulation.wire import ArtifactKind, WireView, client_role
from fedaudit.simulation.wire_views import latest_weights, overlay_state, style_encoder_in_view
from fedaudit.attacks.mia.scorers import nearest_entry_scores, tracing_scores
from fedaudit.tensor_ops.bn_statistics import bn_modules
from fedaudit.tensor_ops.fourier import amplitude_spectrum
from fedaudit.tensor_ops.latent_inversion import head_running_stats
from fedaudit.tensor_ops.style import EPS as STYLE_EPS
from fedaudit.tensor_ops.style import feature_style

ARTIFACT = "artifact"  # the variant and its result key
NO_RECORD_STATISTICS = {kind.value for kind in NOT_APPLICABLE}
BANK_SIGNAL = "nearest bank entry: -distance of the record's own {what} to the closest one shared"
TRACING_SIGNAL = ("whitened tracing test (Dwork et al. 2015): the record's per-channel mean and mean square at {what} "
                  "against the shared statistics; population = the candidates")


def artifact_outputs(name: str, view: WireView, prior: AttackerPrior, challenges: dict[str, MembershipChallenge],
                     device: torch.device, preprocess: Preprocess, precision: str = "fp32") -> list[AttackOutput]:
    """One output per (artifact, victim) the view offers: scores for the victim's challenge, or why not."""
    victims = list(challenges)
    found = find_targets(view, prior, victims, device)
    # Kinds that carry no record statistics (sample counts, a translator) are no membership question: left out.
    outputs = [_unavailable(name, view.role, u) for u in found.unavailable if u.artifact not in NO_RECORD_STATISTICS]
    runner = _Scorer(name, view, prior, found, device, preprocess, precision)
    for target in found.stats:
        model = runner.model(target.state)
        for victim in target.victims:
            scores, info = runner.bn_trace(model, challenges[victim])
            outputs.append(_scored(name, view.role, victim, target.artifact, scores, {**_where(target.info), **info}))
    for head in found.heads:
        got = runner.head_trace(head, challenges[head.victim])
        outputs.append(got if isinstance(got, AttackOutput) else
                       _scored(name, view.role, head.victim, head.artifact.kind.value, *got))
    for bank in found.banks:
        got = runner.bank(bank, challenges[bank.victim])
        outputs.append(got if isinstance(got, AttackOutput) else
                       _scored(name, view.role, bank.victim, bank.artifact.kind.value, *got))
    return outputs


def _where(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info[k] for k in ("round", "sender", "weights_from", "variant") if k in info}


def _scored(name: str, role: str, victim: str, artifact: str, scores: Tensor, info: dict[str, Any]) -> AttackOutput:
    return AttackOutput(name, role, victim, artifact, scores=scores.double().cpu(),
                        info={"result": ARTIFACT, "status": "attacked", **info})


def _unavailable(name: str, role: str, u: Unavailable) -> AttackOutput:
    return AttackOutput(name, role, u.victim, u.artifact, info={"result": ARTIFACT, "status": u.status, "reason": u.reason})


class _Scorer:
    """The attacker's own version of each artifact for every candidate, and the test against the shared one."""

    def __init__(self, name: str, view: WireView, prior: AttackerPrior, found: Targets, device: torch.device,
                 preprocess: Preprocess, precision: str) -> None:
        self.name, self.view, self.prior, self.found, self.device = name, view, prior, found, device
        self.preprocess, self.precision = preprocess, precision
        self._style: tuple[nn.Module, str] | None = None  # the style encoder in the view, built once for every bank

    def model(self, state: dict[str, Tensor]) -> nn.Module:
        model = copy.deepcopy(self.found.fresh).to(self.device)
        model.load_state_dict(state)
        return model.eval()

    @torch.no_grad()
    def bn_trace(self, model: nn.Module, challenge: MembershipChallenge) -> tuple[Tensor, dict[str, Any]]:
        """The tracing test against every BN layer's running statistics in ``model``."""
        layers = bn_modules(model)
        shared = torch.cat([s for m in layers for s in (m.running_mean.float(), m.running_var.float()
                                                        + m.running_mean.float().square())])
        features = _layer_moments(model, layers, challenge.images.to(self.device), self.preprocess, self.precision)
        return tracing_scores(features, shared), {"signal": TRACING_SIGNAL.format(what=f"{len(layers)} BN layers"),
                                                  "statistics": int(shared.numel()), "layers": len(layers)}

    @torch.no_grad()
    def head_trace(self, head: HeadTarget, challenge: MembershipChallenge) -> tuple[Tensor, dict[str, Any]] | AttackOutput:
        """The tracing test against the head's BatchNorm1d statistics, on latents of the victim's encoder."""
        kind = head.artifact.kind.value
        fresh = self.found.fresh
        if getattr(fresh, "head", None) is None or not hasattr(fresh, "features"):
            return _unavailable(self.name, self.view.role, Unavailable(head.victim, kind, "not yet supported",
                                "the architecture has no `head`/`features` to compute latents with"))
        try:
            mean_key, var_key = (f"head.{k}" for k in head_running_stats(fresh.head))
        except ValueError as exc:
            return _unavailable(self.name, self.view.role, Unavailable(head.victim, kind, "not yet supported", str(exc)))
        mine = [a for a in self.view if a.sender == client_role(head.victim)]
        # The encoder the head's latents came from is the victim's at the head's round; the observer holds the
        # victim's newest weight upload (the view keeps the newest message of each kind), trained further since.
        weights = latest_weights(mine, sender=client_role(head.victim))
        if not weights:
            return _unavailable(self.name, self.view.role, Unavailable(head.victim, kind, "not applicable",
                                "the encoder whose latents the head summarises never crossed the wire"))
        state, _ = overlay_state(self.found.base, weights, self.device)
        model = self.model(state)
        z = torch.cat([out.float() for _, out in forward_chunks(model.features, challenge.images.to(self.device),
                                                                self.preprocess, self.precision)])
        mean, var = head.artifact.tensors[mean_key].float(), head.artifact.tensors[var_key].float()
        scores = tracing_scores(torch.cat([z, z.square()], 1), torch.cat([mean, var + mean.square()]).to(z.device))
        return scores, {"signal": TRACING_SIGNAL.format(what="the head's BatchNorm1d (latents of the victim's "
                                                             "uploaded encoder)"),
                        "statistics": int(2 * mean.numel()), "round": head.artifact.round,
                        "encoder_round": weights[-1].round}

    @torch.no_grad()
    def bank(self, bank: BankTarget, challenge: MembershipChallenge) -> tuple[Tensor, dict[str, Any]] | AttackOutput:
        images = challenge.images.to(self.device)
        where = {"round": bank.artifact.round, "sender": bank.artifact.sender}
        if bank.artifact.kind == ArtifactKind.AMPLITUDE_BANK:
            entries = bank.entries["amplitude"].to(self.device).float()
            if tuple(entries.shape[1:]) != tuple(images.shape[1:]):
                return _unavailable(self.name, self.view.role, Unavailable(
                    bank.victim, bank.artifact.kind.value, "not applicable",
                    f"spectra of shape {tuple(entries.shape[1:])} do not match the images {tuple(images.shape[1:])}"))
            own = torch.cat([amplitude_spectrum(images[i:i + 256].float() / 255.0) for i in range(0, len(images), 256)])
            bank_rows = entries.log1p().flatten(1)
            scores = nearest_entry_scores(own.log1p().flatten(1), bank_rows)
            return scores, {"signal": BANK_SIGNAL.format(what="log(1 + Fourier amplitude)"), "bank_entries": len(entries),
                            "exact_tolerance": _exact_tolerance(bank_rows), **where}
        if self._style is None:
            self._style = style_encoder_in_view(self.found.fresh, self.view, self.device)
        encoder, weights_from = self._style
        mean, std = bank.entries["mean"].to(self.device).float(), bank.entries["std"].to(self.device).float()
        feats = [encoder(x).float() for _, x in forward_chunks(lambda x: x, images, self.preprocess, self.precision)]
        where.update(weights_from=weights_from, bank_entries=int(mean.shape[0]))
        if mean.shape[0] == 1:  # CCST's overall style: one pooled mean/std, an aggregate
            moments = torch.cat([torch.cat([f.mean((2, 3)), f.square().mean((2, 3))], 1) for f in feats])
            shared = torch.cat([mean[0], std[0].square() - STYLE_EPS + mean[0].square()])
            return tracing_scores(moments, shared), {"signal": TRACING_SIGNAL.format(what="the style encoder"),
                                                     "statistics": int(shared.numel()), **where}
        own = [feature_style(f) for f in feats]
        own_mean, own_std = torch.cat([m for m, _ in own]), torch.cat([s for _, s in own])
        bank_rows = torch.cat([mean, std.log()], 1)
        scores = nearest_entry_scores(torch.cat([own_mean, own_std.log()], 1), bank_rows)
        return scores, {"signal": BANK_SIGNAL.format(what="style (channel mean, log std)"),
                        "exact_tolerance": _exact_tolerance(bank_rows), **where}


def _exact_tolerance(bank_rows: Tensor) -> float:
    """The distance below which a candidate's own entry *is* a bank entry (float error of recomputing it):
    1e-4 of the entries' mean norm."""
    return float(1e-4 * bank_rows.double().norm(dim=1).mean())


def _layer_moments(model: nn.Module, layers: list[nn.Module], images: Tensor, preprocess: Preprocess,
                   precision: str) -> Tensor:
    """[n, d]: per record and layer (in order), the layer input's per-channel mean, then its mean square, over
    positions — the order :meth:`_Scorer.bn_trace` lays out the shared running mean and second moment in."""
    grabbed: list[Tensor] = []

    def hook(_module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        x = inputs[0].float()
        dims = tuple(range(2, x.dim()))
        grabbed.append(torch.cat([x.mean(dims), x.square().mean(dims)], 1) if dims else torch.cat([x, x.square()], 1))

    handles = [m.register_forward_pre_hook(hook) for m in layers]
    rows = []
    try:
        for _ in forward_chunks(model, images, preprocess, precision):
            rows.append(torch.cat(grabbed, 1))
            grabbed.clear()
    finally:
        for h in handles:
            h.remove()
    return torch.cat(rows)


__all__ = ["ARTIFACT", "artifact_outputs"]
