"""mia — membership inference: was this record in the victim's training split?

The *auditor* (:mod:`fedaudit.audit.membership`) holds the records; the
attack sees only its role's wire view, the
:class:`~fedaudit.attack.AttackerPrior`, and the :class:`~fedaudit.attack.Access`
its threat model grants: black-box access to the deployed model, and a
**challenge** per victim (:class:`~fedaudit.attack.MembershipChallenge`): the
victim's members (its ``train`` split) and non-members (its ``holdout``,
never trained on), shuffled together with their class labels but *without*
saying which is which, plus population records (the other source domains'
holdouts, RMIA's z). The attack returns one score per candidate (higher =
member) in an :class:`~fedaudit.attack.AttackOutput` per result and target;
the auditor splits them by the truth it kept and reports
:func:`fedaudit.statistics.membership_statistics.membership_metrics`.

Variants (docs/attacks.md, "The attacks"; the scorers are :mod:`fedaudit.attacks.mia.scorers`, the
statistics :mod:`fedaudit.statistics.membership_statistics`):

* ``loss`` — Yeom et al., CSF 2018: score = −CE(f(x), y). No reference models.
* ``lira`` — Carlini et al., S&P 2022, reported twice: ``lira_online``
  (IN and OUT reference models) and ``lira_offline`` (OUT only).
* ``rmia`` — Zarifzadeh et al., ICML 2024, online (Pr(x) averaged over all
  reference models), the population being the other source domains' holdouts.
* ``domain`` — "was this domain in the federation?": the global model's loss
  signal on each source domain's holdout records (records of a member
  *domain*, never trained on themselves) against the unseen target domain's
  records (the non-member domain). Reported per source domain and pooled over
  them (``all``), target ``global_model`` only. Under leave-one-domain-out
  training this measures the domain gap the deployed model shows.
* ``artifact`` — membership from every *shared artifact*, not a model's
  answers: the nearest-entry test on per-record banks and the whitened
  tracing test on aggregate statistics (:mod:`fedaudit.attacks.mia.artifact`).
  Its targets are the artifacts (``amplitude_bank``, ``full_model``,
  ``global_stats:differencing``, ...); it needs no query access.

Targets: ``global_model`` — the deployed model (``Method.global_model`` at the
end of the run), queried as a black box (normalised inputs → outputs); any
role may query it. ``last_upload`` — curious server only: the victim's newest
weight-bearing upload (``FULL_MODEL``, or a ``PARTIAL_MODEL`` overlaid on the
newest weights the server broadcast to it, then the victim's uploaded BN
statistics if it sent them; deepinversion's overlay, imported) loaded into the
prior's architecture. Anything else is reported as ``{"status": "not
applicable", "reason": ...}``.

Reference models: N per victim (``reference_models``: 8 ``quick``, 64
``paper``; the caller's choice), each on a random half of the challenge pool
(:func:`fedaudit.attacks.mia.reference_models.inclusion_masks`). By default they **replay** the target
(``--reference-training replay``, :mod:`fedaudit.attacks.mia.replay`): each re-lives the victim's
participation from its first broadcast, round by round running the round's recipe as the method runs it
(``AttackerPrior.round_recipes``) and taking the victim's place in the round's weighted mean (the other uploads
as recorded); for the released model, a reference takes the victim's place in the final round's mean. Where that
is not possible (a client attacker, a method or recording that declares no round recipe, rounds the view did not
keep, a released model that is no such mean) they train **from scratch**,
each from its own initialisation with the victim's local recipe at the target's exposure
(``AttackerPrior.train_recipes``: cross-entropy SGD for rounds × local epochs by default, under DP-SGD with that
client's mechanism; at most ``--reference-epochs``), and the result says why no replay ran. Their logits on
the pool, its flips and the population are cached in the run directory
(``mia/<victim>-replay-logits.safetensors`` and ``mia/<victim>-reference-logits.safetensors``, each with a JSON key
of what produced them); a second audit whose key matches trains nothing.

Label-free encoders (``Method.label_free``, FedGaLA): ``model(x)`` is an
embedding with no classes, so the signal is **augmentation consistency**: the
cosine similarity of the embeddings of two SimCLR views of the record
(:class:`fedaudit.tensor_ops.augment.SimCLRAugment`), averaged over
``CONSISTENCY_PAIRS`` view pairs drawn with a fixed seed. ``loss`` scores it
directly; LiRA uses its Fisher z-transform atanh(c) as φ. RMIA needs class
probabilities and is reported as not applicable.

LiRA and RMIA score each target less its uniform lift over its references, estimated from the unlabelled
challenge (:func:`fedaudit.attacks.mia.scorers.reference_offset`; stored as the references' ``shift``): replayed
references hold the other clients' updates to first order, and the released model they rebuild is measurably less
confident on the victim's whole domain than the real one (+0.2 to +1.2 σ on fedavg digits before the shift). The
shift comes off the true label's logit of each challenge record, which lowers LiRA's φ by exactly the shift and
gives RMIA's Pr(x|θ) from the same shifted target; the population records z, from other domains, are left as
they are.

Hyper-parameters, the same in ``quick`` and ``paper`` except N:
RMIA T = 2, γ = 2 (:mod:`fedaudit.attacks.mia.scorers`); 4 consistency view pairs.

Deviations and choices, with reasons:

* A replay reference holds the other clients to their recorded uploads, which in its counterfactual federation
  would have trained from slightly other broadcasts; the calibration check measures what that costs.
  From-scratch references train alone on half of the victim's pool (see
  :mod:`fedaudit.attacks.mia.reference_models`); their epochs are capped in ``quick`` so a CPU audit stays
  within minutes, and the auditor's calibration check says what that costs.
* LiRA on a label-free encoder takes φ = atanh(c): cosines pile up near 1,
  where a Gaussian fits badly; the transform is monotone, so the ``loss``
  ROC is unchanged.
* Consistency views are quantised to uint8 so target and reference models see
  bit-identical inputs through the same evaluation path (a 1/255 rounding).
* ``last_upload`` is queried through the method's ``predict`` (public code,
  e.g. FedFD-A's test-time adapter) on the assembled weights.
* The ``domain`` variant has no reference models: the question is about a
  whole domain, and the loss signal already separates domains.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from fedaudit.attack import (
    NO_ACCESS,
    Access,
    Attack,
    AttackerPrior,
    AttackOutput,
    AttackSetup,
    DomainChallenge,
    MembershipChallenge,
    Query,
)
from fedaudit.attacks.mia.artifact import ARTIFACT, artifact_outputs
from fedaudit.attacks.mia.reference_models import REFERENCE_PATHS, TrainOne, eval_views
from fedaudit.attacks.mia.references import REPLAY, TRAINING, reference_signals
from fedaudit.errors import FedauditError, unknown_choice
from fedaudit.attacks.mia.signals import (MIA_STREAM, NOT_APPLICABLE, Skipped, attacker_preprocess, consistency_views,
                                          last_upload, target_signals)
from fedaudit.attacks.mia.scorers import (consistency, lira_offline, lira_online, loss_signal, reference_offset,
                                          rmia_prob, rmia_score)
from fedaudit.run.options import option
from fedaudit.run.seeds import derive_seed
from fedaudit.simulation.wire import WireView

if TYPE_CHECKING:
    from fedaudit.simulation.training import Preprocess

log = logging.getLogger("fedaudit")

# What a user selects, and the result keys each produces.
VARIANTS: dict[str, tuple[str, ...]] = {
    "loss": ("loss",),
    "lira": ("lira_online", "lira_offline"),
    "rmia": ("rmia",),
    "domain": ("domain",),
    "artifact": ("artifact",),
}
MODEL_VARIANTS = ("loss", "lira", "rmia")  # the variants that query a model about each victim's records
GLOBAL, LAST_UPLOAD = "global_model", "last_upload"
TARGETS = (GLOBAL, LAST_UPLOAD)
ALL_DOMAINS = "all"
CONSISTENCY_PAIRS = 4
MAX_REFERENCE_MODELS = 4_096
DOMAIN_TWINS = 2  # per source domain: two give the row's test one degree of freedom per domain
DEFAULT_REFERENCE_MODELS = 8


@dataclass
class VictimScores:
    """The attack's answer for one victim: ``scores[result_key][target]`` per candidate, or why not."""

    scores: dict[str, dict[str, Tensor | Skipped]]
    info: dict[str, dict[str, Any]]  # per target: round, weights_from, signal
    references: dict[str, dict[str, Any]] = field(default_factory=dict)  # per target: how its references were made
    # The attack's own LiRA signals, for the auditor's calibration check: per target φ [n], and per target the
    # reference models' φ [N, n] with their inclusion masks (absent without reference models).
    phi: dict[str, Tensor] = field(default_factory=dict)
    reference_phi: dict[str, tuple[Tensor, Tensor]] = field(default_factory=dict)


def check_reference_models(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_REFERENCE_MODELS:
        raise FedauditError(f"--reference-models must be an integer from 2 to {MAX_REFERENCE_MODELS}, got {n!r}; "
                            "use 8 (quick) or 64 (paper)")
    return n


def check_variants(variants: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(variants))
    for v in chosen:
        if v not in VARIANTS:
            raise unknown_choice("mia variant", v, list(VARIANTS))
    if not chosen:
        raise FedauditError(f"no mia variant selected; choose from {', '.join(VARIANTS)}")
    return chosen


@dataclass(frozen=True)
class MembershipOptions:
    reference_models: int = option(DEFAULT_REFERENCE_MODELS, "Membership inference: reference models per victim.",
                                   low=2, high=MAX_REFERENCE_MODELS, profiles={"paper": 64})
    # quick: 10 epochs, not the target's 60 (20 rounds x 3), so a CPU audit takes minutes; the run stores
    # both numbers and a calibration figure that says what the cap costs.
    reference_epochs: int | None = option(10, "At most this many epochs per from-scratch reference model; they train "
                                          "the target's exposure (rounds x local epochs) if smaller; none: no cap.",
                                          kind=int, nullable=True, low=1, high=100_000, profiles={"paper": None})
    reference_training: str = option(REPLAY, "How LiRA's and RMIA's reference models train: replay (from the weights "
                                     "the target's last round started from, its round's recipe; from scratch where "
                                     "that is not possible, said so) or scratch (from their own initialisation).",
                                     choices=tuple(TRAINING))
    # The auditor trains these (fedaudit.audit.domain_twin); declared here, beside the variant they serve.
    domain_twins: int = option(DOMAIN_TWINS, "Domain-level membership: federations trained without each source "
                               "domain, each with its own seed (the participation row's null; their spread is its "
                               "training noise); 0: none, and that row reads inconclusive.", low=0, high=64)


class MembershipInference(Attack):
    """Every selected variant against both targets of each victim's challenge.

    The method-side knowledge an attacker has from the public code — whether
    the model is a label-free encoder, its local training recipe, its
    architecture's constructor and its ``predict`` — comes with the prior.
    """

    name = "mia"
    family: ClassVar[str] = "mia"
    summary = ("membership inference (loss, LiRA online/offline, RMIA, domain-level) on the global model and the last "
               "upload, and against every shared bank or statistics artifact")
    roles: ClassVar[tuple[str, ...]] = ("server", "client")
    needs: ClassVar[frozenset[str]] = frozenset({"query", "challenges", "domain_challenge", "cache_dir", "history"})
    variants: ClassVar[tuple[str, ...]] = tuple(VARIANTS)
    Options: ClassVar[type] = MembershipOptions

    def __init__(self, reference_models: int = DEFAULT_REFERENCE_MODELS, *, seed: int = 0, precision: str = "fp32",
                 path: str = "auto", variants: Sequence[str] | None = None, reference_epochs: int | None = None,
                 consistency_pairs: int = CONSISTENCY_PAIRS, domain_twins: int = DOMAIN_TWINS,
                 training: str = REPLAY) -> None:
        if path not in REFERENCE_PATHS:
            raise unknown_choice("reference-model path", path, REFERENCE_PATHS)
        if training not in TRAINING:
            raise unknown_choice("reference training", training, TRAINING)
        self.training = training
        self.reference_models = check_reference_models(reference_models)
        self.reference_epochs = reference_epochs  # None: the reference models see a record as often as the target
        self.seed, self.precision, self.path = seed, precision, path
        self.selected = check_variants(type(self).variants if variants is None else variants)
        self.consistency_pairs = consistency_pairs
        self.domain_twins = domain_twins  # how many the auditor trains per source domain for the domain-level null
        self.trained = 0  # reference-model sets trained (not read from the cache) by this instance

    @classmethod
    def from_config(cls, setup: AttackSetup, prior: AttackerPrior) -> MembershipInference:
        return cls.for_selection([cls], setup, prior)

    @classmethod
    def for_selection(cls, selected: Sequence[type[Attack]], setup: AttackSetup,
                      prior: AttackerPrior) -> MembershipInference:
        """One run of the union of the selected classes' variants (``--attack mia-loss,mia-lira``)."""
        o: MembershipOptions = setup.options
        return MembershipInference(o.reference_models, seed=setup.seed, precision=setup.precision,
                                   variants=mia_variants(selected), reference_epochs=o.reference_epochs,
                                   domain_twins=o.domain_twins, training=o.reference_training)

    @classmethod
    def keeps_rounds(cls, setup: AttackSetup) -> bool:
        """A curious server's LiRA or RMIA with replayed references re-lives every round of the victims'."""
        from fedaudit.simulation.wire import SERVER

        return (setup.attacker == SERVER and any(v in ("lira", "rmia") for v in cls.variants)
                and setup.options.reference_training == REPLAY)

    @property
    def references_needed(self) -> int:
        """Reference models per victim this selection trains (0 for loss, domain and artifact alone)."""
        return self.reference_models if any(v in ("lira", "rmia") for v in self.selected) else 0

    def recipe(self, prior: AttackerPrior, victim: str) -> TrainOne | None:
        """The victim's public local recipe at the target's exposure, capped at ``reference_epochs``."""
        recipe = prior.train_recipes.get(victim)
        if recipe is None or self.reference_epochs is None or recipe.epochs <= self.reference_epochs:
            return recipe
        return replace(recipe, epochs=self.reference_epochs)

    def run(self, view: WireView, prior: AttackerPrior, victim: str, device: torch.device,
            access: Access = NO_ACCESS) -> list[AttackOutput]:
        return self.run_batch(view, prior, [victim], device, access)

    def run_batch(self, view: WireView, prior: AttackerPrior, victims: list[str], device: torch.device,
                  access: Access = NO_ACCESS) -> list[AttackOutput]:
        """One output per (result key, target, victim); for ``domain`` one over the domain challenge."""
        if access.query is None and any(v != ARTIFACT for v in self.selected):
            raise FedauditError("membership inference needs query access to the deployed model and the auditor's "
                                "challenges; run it through fedaudit.audit.membership.audit_membership")
        outputs: list[AttackOutput] = []
        # Reference training may draw from torch's global RNG (MixStyle, dropout): fork it, seeded, so the
        # attack is reproducible and leaves the caller's RNG where it was.
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(derive_seed(self.seed, MIA_STREAM, 4))
            for victim in victims if any(v in MODEL_VARIANTS for v in self.selected) else ():
                challenge = access.challenges.get(victim)
                if challenge is None:
                    raise FedauditError(f"membership inference against {victim} needs the auditor's challenge for it")
                outputs += self._victim_outputs(view, prior, challenge, access, device)
            if "domain" in self.selected:
                if access.domain_challenge is None:
                    raise FedauditError("domain-level membership needs the auditor's domain challenge")
                scores = self.attack_domain(access.domain_challenge, access.query, prior, device).cpu()
                outputs.append(AttackOutput(self.name, view.role, ALL_DOMAINS, GLOBAL, scores=scores,
                                            info={"result": "domain", "status": "attacked",
                                                  "signal": self.signal_name("domain", prior.label_free)}))
        if ARTIFACT in self.selected:
            missing = [v for v in victims if v not in access.challenges]
            if missing:
                raise FedauditError(f"artifact membership against {missing[0]} needs the auditor's challenge for it")
            outputs += artifact_outputs(self.name, view, prior, {v: access.challenges[v] for v in victims}, device,
                                        attacker_preprocess(prior, device), self.precision)
        return outputs

    def for_artifact_controls(self) -> MembershipInference:
        """The artifact test alone, same settings: what the auditor re-runs on its counterfactual artifacts."""
        return MembershipInference(self.reference_models, seed=self.seed, precision=self.precision, path=self.path,
                                   variants=(ARTIFACT,), reference_epochs=self.reference_epochs,
                                   consistency_pairs=self.consistency_pairs, training=self.training)

    def _victim_outputs(self, view: WireView, prior: AttackerPrior, challenge: MembershipChallenge, access: Access,
                        device: torch.device) -> list[AttackOutput]:
        assert access.query is not None
        answer = self.attack(view, prior, challenge, access.query, device, self.selected, access.cache_dir,
                             access.history)
        outputs = []
        for key, by_target in answer.scores.items():
            for target, scores in by_target.items():
                info: dict[str, Any] = {"result": key}
                if isinstance(scores, Skipped):
                    outputs.append(AttackOutput(self.name, view.role, challenge.victim, target,
                                                info={**info, **scores.to_json()}))
                    continue
                info.update(status="attacked", signal=self.signal_name(key, prior.label_free),
                            **answer.info.get(target, {}))
                signals: dict[str, Tensor] = {}
                if key != "loss":
                    info["reference"] = answer.references.get(target, {})
                    if target in answer.reference_phi and target in answer.phi:
                        ref_phi, masks = answer.reference_phi[target]
                        signals = {"phi": answer.phi[target], "reference_phi": ref_phi, "reference_masks": masks}
                if key == "rmia":
                    info["population"] = int(challenge.population_labels.shape[0])
                outputs.append(AttackOutput(self.name, view.role, challenge.victim, target,
                                            scores=scores.double().cpu(), info=info, signals=signals))
        return outputs

    # -- one victim ------------------------------------------------------------------

    def attack(self, view: WireView, prior: AttackerPrior, challenge: MembershipChallenge, query: Query,
               device: torch.device, variants: Sequence[str], cache_dir: Path | None = None,
               history: WireView | None = None) -> VictimScores:
        """Scores for every result key of ``variants`` (except ``domain``) on both targets; ``history``, every round
        of the attacker's view where the auditor kept it, lets the reference models replay the victim's rounds."""
        pre = attacker_preprocess(prior, device)
        forwards: dict[str, Query | Skipped] = {GLOBAL: query}
        info: dict[str, dict[str, Any]] = {GLOBAL: {}}
        last, info[LAST_UPLOAD] = self._last_upload(view, prior, challenge.victim, device)
        forwards[LAST_UPLOAD] = last
        want_rmia = "rmia" in variants and not prior.label_free and challenge.population_labels.numel() > 0
        signals = self._signals(forwards, challenge, pre, prior, want_rmia)

        refs: dict[str, dict[str, Any] | Skipped] = {}
        if "lira" in variants or want_rmia:
            targets = [t for t, sig in signals.items() if not isinstance(sig, Skipped)]
            refs = reference_signals(self, view, history, prior, challenge, query, targets, pre, device, cache_dir)
        made = _made(refs, signals)

        keys = [k for v in variants if v in MODEL_VARIANTS for k in VARIANTS[v]]
        out = {key: {target: sig if isinstance(sig, Skipped) else self._score(key, sig, refs.get(target), challenge, prior)
                     for target, sig in signals.items()} for key in keys}
        phi = {t: sig["phi"] for t, sig in signals.items() if not isinstance(sig, Skipped)}
        ref_phi = {t: (ref["phi"], ref["masks"]) for t, ref in refs.items() if isinstance(ref, dict)}
        return VictimScores(out, info, made, phi, ref_phi)

    def _signals(self, forwards: dict[str, Query | Skipped], challenge: MembershipChallenge, pre: Preprocess,
                 prior: AttackerPrior, want_rmia: bool) -> dict[str, dict[str, Tensor] | Skipped]:
        """Each target's per-record signals (or why the target is skipped)."""
        return {t: f if isinstance(f, Skipped) else target_signals(f, challenge, pre, prior, want_rmia, self.precision,
                                                                   self.seed, self.consistency_pairs)
                for t, f in forwards.items()}

    def _score(self, key: str, sig: dict[str, Tensor], ref: dict[str, Any] | Skipped | None,
               challenge: MembershipChallenge, prior: AttackerPrior) -> Tensor | Skipped:
        if key == "loss":
            return sig["loss"]
        if key == "rmia":
            if prior.label_free:
                return Skipped("label-free encoder: RMIA needs class probabilities Pr(y|x), and the model outputs embeddings")
            if challenge.population_labels.numel() == 0:
                return Skipped("no population records: the federation has no other source domain whose holdout could serve as z")
        if isinstance(ref, Skipped):
            return ref
        assert ref is not None
        if key == "lira_online":
            return lira_online(sig["phi"] - ref["shift"], ref["phi"], ref["masks"])
        if key == "lira_offline":
            return lira_offline(sig["phi"] - ref["shift"], ref["phi"], ref["masks"])
        p_x = rmia_prob(sig["logits"], challenge.labels.cpu(), flipped_logits=sig.get("flipped"), shift=ref["shift"])
        return rmia_score(p_x, ref["p_x"], ref["masks"], sig["p_z"], ref["p_z"])

    # -- targets -----------------------------------------------------------------------

    def _last_upload(self, view: WireView, prior: AttackerPrior, victim: str,
                     device: torch.device) -> tuple[Query | Skipped, dict[str, Any]]:
        return last_upload(view, prior, victim, device)

    # -- domain level --------------------------------------------------------------------

    def attack_domain(self, challenge: DomainChallenge, query: Query, prior: AttackerPrior,
                      device: torch.device) -> Tensor:
        """The global model's per-record signal (higher = looks like a training domain)."""
        pre = attacker_preprocess(prior, device)
        if prior.label_free:
            probe = MembershipChallenge(ALL_DOMAINS, challenge.images, challenge.labels, challenge.images[:0],
                                        challenge.labels[:0])
            (emb,) = eval_views(query, [consistency_views(probe, prior, self.seed, self.consistency_pairs)], pre, False, self.precision)
            return consistency(emb, self.consistency_pairs)
        (logits,) = eval_views(query, [challenge.images], pre, False, self.precision)
        return loss_signal(logits, challenge.labels.cpu())

    def signal_name(self, key: str, label_free: bool) -> str:
        if label_free:
            return (f"augmentation consistency: mean cosine of the embeddings of {self.consistency_pairs} SimCLR view "
                    "pairs" + ("; LiRA on its Fisher z" if key.startswith("lira") else ""))
        return {
            "loss": "-cross-entropy (Yeom et al.)",
            "lira_online": "LiRA logit-scaled confidence, record and flip averaged; IN and OUT Gaussians",
            "lira_offline": "LiRA logit-scaled confidence, record and flip averaged; one-sided OUT Gaussian",
            "rmia": "RMIA: fraction of population records z with LR(x, z) >= 2, Pr(y|x) at T = 2",
            "domain": "-cross-entropy of the global model (Yeom et al.)",
        }[key]


def _made(refs: dict[str, dict[str, Any] | Skipped], signals: dict[str, dict[str, Tensor] | Skipped]
          ) -> dict[str, dict[str, Any]]:
    """How each target's reference models were made, with the target's uniform lift over them (``shift``, which
    LiRA and RMIA take off the target's true-label logit), set on the references too."""
    made = {}
    for t, ref in refs.items():
        if isinstance(ref, dict):
            made[t] = ref.pop("info")
            if not isinstance(sig := signals[t], Skipped):
                ref["shift"] = made[t]["shift"] = reference_offset(sig["phi"], ref["phi"])
    return made


class MiaLoss(MembershipInference):
    name = "mia-loss"
    summary = "membership inference, loss attack only (no reference models)"
    variants = ("loss",)


class MiaLira(MembershipInference):
    name = "mia-lira"
    summary = "membership inference, LiRA online and offline only"
    variants = ("lira",)


class MiaRmia(MembershipInference):
    name = "mia-rmia"
    summary = "membership inference, RMIA only"
    variants = ("rmia",)


class MiaArtifact(MembershipInference):
    name = "mia-artifact"
    summary = "membership inference against every shared statistics artifact (banks: nearest entry; aggregates: tracing)"
    variants = ("artifact",)


class MiaDomain(MembershipInference):
    name = "mia-domain"
    summary = "domain-level membership: was this domain in the federation? (global model)"
    variants = ("domain",)


def mia_variants(classes: Iterable[type[Attack]]) -> tuple[str, ...]:
    """The union of variants of the selected mia classes (``--attack mia-loss,mia-lira``), in canonical order."""
    chosen = {v for cls in classes if issubclass(cls, MembershipInference) for v in cls.variants}
    return tuple(v for v in VARIANTS if v in chosen)


__all__ = ["ALL_DOMAINS", "GLOBAL", "LAST_UPLOAD", "MIA_STREAM", "NOT_APPLICABLE", "VARIANTS",
           "MembershipInference", "Skipped", "last_upload", "mia_variants"]
