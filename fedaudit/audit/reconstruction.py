"""Reconstruction audits: an attack, its nulls, its holdout twin and its positive control, scored.

For every artifact a reconstruction attack inverts, the auditor stores

* the attack's scores beside every **null** it ran: the untrained control
  (``control``), the prior-only control (``prior_only``: the same
  optimisation with the artifact's matching term off) and the **holdout
  twin** (``twin``: the same attack on the artifact recomputed from holdout
  records), and the computed chance levels (:func:`fedaudit.audit.leakage.with_nulls`);
* its **power**: the same attack, same iterations and weights, on the
  artifact of one member image alone (one artifact per image,
  :data:`~fedaudit.audit.counterfactual.POWER_SINGLE`) and of one and two
  member images per class
  (:data:`~fedaudit.audit.counterfactual.POWER_PER_CLASS`). ``reached`` when,
  for some size, the reconstructions reveal what the verdict's tests look
  for — the victim's domain or the intended class — significantly more often
  than the prior-only control's; ``record_level`` when they single out the
  source members from non-members of their class. Without power a low reading cannot be told
  from a weak attack, and the verdict says INCONCLUSIVE; without record-level
  power a LOW says record-level leakage was not testable.

The twin and the power runs need an attack that can be re-run without its
nulls on a counterfactual view (:meth:`Attack.without_nulls`) and the
server's view; otherwise the entry says why they are absent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedaudit.attack import Attack, AttackerPrior, AttackOutput
from fedaudit.run import run_directory
from fedaudit.audit.counterfactual import (
    POWER_PER_CLASS,
    POWER_SINGLE,
    TWIN,
    case_group,
    case_per_class,
    Counterfactual,
    counterfactual_view,
    power_case,
    pseudo_name,
    single_case,
    split_pseudo,
)
from fedaudit.audit.leakage import Auditor, image_grid
from fedaudit.audit.scoring import RawScores, domain_matrix, macro_diagonal, with_nulls
from fedaudit.audit.verdict import POWER_ALPHA
from fedaudit.run.stored.reconstruction import (DomainAttribution, Lift, Matched, Power, PowerSize, PsnrToSources,
                                                ReconstructionEntry, ReconstructionSection, ReconstructionSummary, Score,
                                                Twin, VictimScores)
from fedaudit.simulation.wire import SERVER, WireView

POWER_RULE = ("reached when, for one member image alone (its class not told to the attack) or one or two member "
              "images per class, the reconstructions from their artifact are attributed to the victim's domain, or "
              "labelled as their intended class, more often than the prior-only control's (one-sided Fisher), or are "
              "record_level: closer to those members than to as many non-members of their class (permutation test) "
              f"and than the prior-only control's are; p <= {POWER_ALPHA} after Bonferroni over the metrics and "
              "sizes, and in the verdict Holm over the row's victims")
Key = tuple[str, str, str]  # (victim, artifact, case)


def audit_reconstruction(attack: Attack, view: WireView, prior: AttackerPrior, victims: list[str], auditor: Auditor,
                         run_dir: Path, device: torch.device, *, observe: Callable[[WireView], WireView] | None = None,
                         grid_suffix: str = "") -> ReconstructionSection:
    """Run ``attack`` (with its nulls) and its counterfactuals; return its metrics.json section. ``observe`` turns
    ``view`` into another observer's (secure aggregation's): the counterfactuals are built from ``view``'s clear
    uploads and then seen through it, as the attack is; ``grid_suffix`` keeps that observer's image grids apart."""
    outputs = attack.run_batch(observe(view) if observe else view, prior, victims, device)
    counter, absent = run_counterfactuals(attack, view, prior, victims, auditor, device, observe)
    return score_section(attack.name + grid_suffix, outputs, counter, absent, auditor, run_dir)


def run_counterfactuals(attack: Attack, view: WireView, prior: AttackerPrior, victims: list[str], auditor: Auditor,
                        device: torch.device, observe: Callable[[WireView], WireView] | None = None
                        ) -> tuple[dict[Key, AttackOutput], dict[Key, str]]:
    """The attack (without nulls) on the holdout twin and on each positive control of every victim.

    Returns the outputs by (victim, artifact, case), and why a (victim, artifact, case) is absent."""
    cases = [TWIN, *(power_case(k) for k in POWER_PER_CLASS), POWER_SINGLE]
    absent: dict[Key, str] = {}
    if attack.for_counterfactual() is None:
        return {}, {("*", "*", c): f"{attack.name} has no counterfactual run yet" for c in cases}
    if view.role != SERVER:
        return {}, {("*", "*", c): "counterfactuals are built for the server's view only: a curious client sees "
                                   "aggregates of several clients" for c in cases}
    out: dict[Key, AttackOutput] = {}
    for case in cases:
        bare, records = _case_records(attack, case, victims, auditor)
        if bare is None:
            absent.update({(v, "*", case): f"{attack.name} cannot be re-run on this counterfactual" for v in victims})
            continue
        assert auditor.recipe is not None  # build_auditor gives every auditor the clients' training recipe
        cf_view, skipped = counterfactual_view(view, prior, records, device, auditor.recipe, auditor.seed,
                                               auditor.latent_encoders)
        cf_view = observe(cf_view) if observe else cf_view
        # One batch per case: cases differ in artifact shape (a bank of 10 spectra vs of 90).
        for o in bare.run_batch(cf_view, prior, [pseudo_name(r.victim, r.case) for r in records], device):
            pseudo = split_pseudo(o.victim)
            assert pseudo is not None  # the counterfactual run attacks its pseudo-clients only
            key = (pseudo[0], o.artifact, pseudo[1])
            why = skipped.get(o.victim, {}).get(o.artifact.split(":")[0])
            if why is not None:
                absent[key] = why
            elif o.info.get("status") != "attacked":
                absent[key] = f"{o.info.get('status')}: {o.info.get('reason', '')}"
            else:
                out[key] = o
    return out, absent


def _case_records(attack: Attack, case: str, victims: list[str], auditor: Auditor
                  ) -> tuple[Attack | None, list[Counterfactual]]:
    """The attack re-run for one counterfactual case and the records each pseudo-client's artifacts come from."""
    if case == TWIN:
        return attack.for_counterfactual(), [Counterfactual(v, case, auditor.twin_records(v),
                                                            swap_out=auditor.members(v)) for v in victims]
    if case == POWER_SINGLE:  # one artifact per member image, each inverted into one image of unknown class
        return attack.for_counterfactual(images=1), [Counterfactual(v, single_case(i), image[None]) for v in victims
                                                     for i, image in enumerate(auditor.power_records(v, 1))]
    per_class = case_per_class(case)
    return attack.for_counterfactual(per_class), [Counterfactual(v, case, auditor.power_records(v, per_class))
                                                  for v in victims]


def _why_absent(absent: dict[Key, str], victim: str, artifact: str, case: str) -> str:
    group = case_group(case)  # a one-record case: its group's reason
    return (absent.get((victim, artifact, case)) or absent.get((victim, "*", group)) or absent.get(("*", "*", group))
            or "not run")


def score_section(attack: str, outputs: list[AttackOutput], counter: dict[Key, AttackOutput], absent: dict[Key, str],
                  auditor: Auditor, run_dir: Path) -> ReconstructionSection:
    """Every attacked artifact's entry per victim, each metric beside its nulls, with the summary over the victims
    and the auditor's judges."""
    tables: dict[str, dict[str, ReconstructionEntry]] = {}
    scored: dict[str, dict[str, dict[str, RawScores]]] = {}  # artifact -> victim -> case -> raw scores
    for out in outputs:
        entry, raw = score_output(attack, out, counter, absent, auditor, run_dir)
        if raw is not None:
            scored.setdefault(out.artifact, {})[out.victim] = raw
        tables.setdefault(out.artifact, {})[out.victim] = entry
    summary = {artifact: summarise_artifact(rows, auditor) for artifact, rows in scored.items()}
    if not summary:
        return ReconstructionSection(artifacts=tables)
    return ReconstructionSection(artifacts=tables, summary=summary, auditor=auditor.judges())


def score_output(attack: str, out: AttackOutput, counter: dict[Key, AttackOutput], absent: dict[Key, str],
                 auditor: Auditor, run_dir: Path) -> tuple[ReconstructionEntry, dict[str, RawScores] | None]:
    """One attacked artifact of one victim: its metrics.json entry, and the raw scores of the attack and
    each null (None when nothing was scored: a status, or a head without its encoder)."""
    entry: dict[str, object] = {k: v for k, v in out.info.items() if not k.endswith("losses")}
    latent = out.latents is not None
    control = out.control_latents if latent else out.control_images
    if (out.latents if latent else out.images) is None or control is None:
        return ReconstructionEntry.reported(out.attack, entry), None
    score = _scorer(auditor, out)
    if score is None:
        entry["metrics"] = VictimScores(status="unavailable",
                                        reason="the method keeps no record of the encoder this head was trained on")
        return ReconstructionEntry.reported(out.attack, entry), None
    twin = counter.get((out.victim, out.artifact, TWIN))
    cases = {"attack": out.latents if latent else out.images, "control": control,
             "prior_only": out.nulls.get("prior_only"),
             "twin": None if twin is None else (twin.latents if latent else twin.images)}
    raw = {name: score(x) for name, x in cases.items() if x is not None}
    metrics = with_nulls(raw["attack"], {k: raw.get(k) for k in ("control", "prior_only", "twin")})
    metrics = metrics.with_(**_details(entry, attack, out, cases, raw, auditor, run_dir))
    entry["twin"] = (Twin(status="scored", records=int(auditor.twin_records(out.victim).shape[0]),
                          source="half of the victim's holdout (never trained on)") if twin is not None else
                     Twin(status="not available", reason=_why_absent(absent, out.victim, out.artifact, TWIN)))
    entry["power"] = _power(auditor, out, counter, absent, latent, raw.get("prior_only"))
    entry["metrics"] = metrics
    return ReconstructionEntry.reported(out.attack, entry), raw


def _details(entry: dict[str, object], attack: str, out: AttackOutput, cases: dict[str, torch.Tensor | None],
             raw: dict[str, RawScores], auditor: Auditor, run_dir: Path) -> dict[str, Matched | Score]:
    """Into the entry: each set's predicted domains, the optimisation's final losses (attack and nulls) and, for
    images, the grid beside the nearest members; returned, the scores they add: matched scores of unordered batch
    reconstructions, and LPIPS's status where it could not score."""
    added: dict[str, Matched | Score] = {}
    if out.info.get("batch_matching") and out.images is not None and out.control_images is not None:
        # Unordered batch reconstructions: each is matched to a distinct member (Hungarian).
        added["matched"] = Matched(attack=auditor.score_matched(out.victim, out.images).scores(),
                                   control=auditor.score_matched(out.victim, out.control_images).scores())
    entry["predicted_domain"] = {
        name: dict(zip(auditor.domains, domain_matrix({out.victim: s.predicted_domains}, auditor.domains)[0]))
        for name, s in raw.items()}
    losses = {name: out.info[f"{prefix}losses"] for name, prefix in
              (("attack", ""), ("control", "control_"), ("prior_only", "prior_only_")) if f"{prefix}losses" in out.info}
    if "final_loss" not in entry and losses:
        entry["final_loss"] = losses
    if out.images is not None:
        if auditor.lpips is None:
            status = auditor.lpips_status
            added["lpips_mean"] = Score(**{k: getattr(status, k) for k in status.model_fields_set})
        entry["image_grid"] = save_reconstruction_grid(run_dir, attack, out, cases, auditor, raw["attack"])
        entry["grid_columns"] = ["real nearest member", *(GRID_NAMES[c] for c in GRID_COLUMNS if cases.get(c) is not None)]
    return added


def _scorer(auditor: Auditor, out: AttackOutput) -> Callable[..., RawScores] | None:
    """Raw scores of a reconstruction set of ``out``'s kind (images or latents) against its victim, for
    ``out``'s targets unless others are given; None for latents whose encoder the auditor does not hold."""
    if out.latents is None:
        return lambda x, targets=out.targets: auditor.score(out.victim, x, targets)
    if auditor.latent_judges(out.victim) is None:
        return None

    def latents(z: torch.Tensor, targets: torch.Tensor | None = out.targets) -> RawScores:
        assert out.head is not None and targets is not None  # a latent inversion returns its head and classes
        found = auditor.score_latents(out.victim, z, targets, out.head)
        assert found is not None  # its judges were found above
        return found

    return latents


def _power(auditor: Auditor, out: AttackOutput, counter: dict[Key, AttackOutput], absent: dict[Key, str],
           latent: bool, prior_only: RawScores | None) -> Power:
    """The positive control of one attacked artifact, per size (one member image alone, or member images per
    class): whether its
    reconstructions reveal what the verdict's tests look for better than the prior-only control's do —
    the victim's domain or the intended class (``reached``), or the records themselves (``record_level``)."""
    sizes: dict[str, PowerSize] = {}
    score = _scorer(auditor, out)
    for k in (POWER_SINGLE, *POWER_PER_CLASS):
        found = _power_reconstructions(auditor, out, counter, absent, k, latent)
        if isinstance(found, str) or prior_only is None or score is None:
            why = found if isinstance(found, str) else "no prior-only control ran" if prior_only is None else "not scored"
            sizes[str(k)] = PowerSize(status="not available", reason=why)
            continue
        sizes[str(k)] = _power_size(auditor, out, *found, k, score, latent, prior_only)
    return power_of(sizes)


def power_of(sizes: dict[str, PowerSize]) -> Power:
    """A victim's positive control from its sizes: each question's p-value, Bonferroni over the sizes that ran (the
    row's victims are corrected in the verdict)."""
    ran = [(r.p_reveals, r.p_record_level) for r in sizes.values() if r.p_reveals is not None]
    if not ran:
        reasons = sorted({r.reason or "" for r in sizes.values()})
        return Power(status="not available", reason="; ".join(reasons), sizes=sizes)
    p_reveals = min(1.0, len(ran) * min(reveals for reveals, _ in ran))
    p_record = min(1.0, len(ran) * min(record if record is not None else 1.0 for _, record in ran))
    return Power(status="measured", p_value=min(p_reveals, p_record), p_reveals=p_reveals, p_record_level=p_record,
                 reached=p_reveals <= POWER_ALPHA or p_record <= POWER_ALPHA, record_level=p_record <= POWER_ALPHA,
                 sizes=sizes, rule=POWER_RULE)


def record_level_p(identifiability: float, p_against_chance: float, prior_only: float) -> float:
    """One control size's record-level p: its reconstructions single out their source members (the permutation p
    against chance) only where they are also nearer them than the prior-only control's reconstructions are — what
    the prior alone gives is no power. Not above the prior-only control: 1."""
    return p_against_chance if identifiability > prior_only else 1.0


def _power_reconstructions(auditor: Auditor, out: AttackOutput, counter: dict[Key, AttackOutput],
                           absent: dict[Key, str], k: int | str, latent: bool) -> tuple[Any, Any] | str:
    """The reconstructions of one size of the positive control and the classes they are scored for, or why
    there are none. The one-record size gathers its artifacts' single images, in the order of the one-per-class
    draw, and scores each for the class of the image it came from (the attack was not told it)."""
    if k != POWER_SINGLE:
        cf = counter.get((out.victim, out.artifact, power_case(int(k))))
        if cf is None:
            return _why_absent(absent, out.victim, out.artifact, power_case(int(k)))
        return (cf.latents if latent else cf.images), cf.targets
    n = auditor.power_records(out.victim, 1).shape[0]
    singles = [counter.get((out.victim, out.artifact, single_case(i))) for i in range(n)]
    if any(cf is None or cf.images is None for cf in singles):
        i = next(i for i, cf in enumerate(singles) if cf is None or cf.images is None)
        return _why_absent(absent, out.victim, out.artifact, single_case(i))
    return (torch.cat([cf.images for cf in singles if cf is not None and cf.images is not None]),
            auditor.power_labels(out.victim, 1))


def _power_size(auditor: Auditor, out: AttackOutput, recon: Any, targets: Any, k: int | str,
                score: Callable[..., RawScores], latent: bool, prior_only: RawScores) -> PowerSize:
    """One size of the positive control (k member images per class, or one image alone): what its reconstructions
    reveal against the prior-only control's, with one p-value per question."""
    per_class = 1 if k == POWER_SINGLE else int(k)
    mine = score(recon, targets)
    sources = auditor.score_power(out.victim, per_class, recon, targets, latent)
    null = auditor.score_power(out.victim, per_class, out.nulls["prior_only"], out.targets, latent)
    ident = sources.identifiability
    lifts, found = [], {}
    for metric in ("domain_attribution", "class_fidelity"):
        rate, rate_null = mine.metric(metric), prior_only.metric(metric)
        if rate is not None and rate_null is not None:
            p = fisher_greater(rate, mine.n, rate_null, prior_only.n)
            found[metric] = Lift(attack=rate, prior_only=rate_null, p_value=p)
            lifts.append(p if rate > rate_null else 1.0)
    null_value = null.identifiability.value
    psnr = (None if sources.psnr is None or null.psnr is None else
            PsnrToSources(attack_mean=float(sources.psnr.mean()), attack_best=float(sources.psnr.max()),
                          prior_only_mean=float(null.psnr.mean())))
    # One p-value per question, Bonferroni over the metrics that answer it; the victim's sizes and the
    # row's victims are corrected where power is summed up (in _power, and in the verdict).
    size = PowerSize(per_class=per_class, images=int(auditor.power_records(out.victim, per_class).shape[0]),
                     identifiability=ident.value, ci95=ident.ci95, p_value=ident.p_value, chance=ident.chance,
                     prior_only=null_value, p_reveals=min(1.0, len(lifts) * min(lifts)) if lifts else 1.0,
                     p_record_level=record_level_p(ident.value, ident.p_value, null_value))
    if k == POWER_SINGLE:
        size = size.with_(records_per_artifact=1)  # ``images`` artifacts of one image each
    size = size.with_(**found)
    return size if psnr is None else size.with_(psnr_to_sources=psnr)


def fisher_greater(a: float, n_a: int, b: float, n_b: int) -> float:
    """One-sided Fisher exact p-value that rate ``a`` (of ``n_a``) exceeds rate ``b`` (of ``n_b``)."""
    from scipy.stats import fisher_exact

    ka, kb = round(a * n_a), round(b * n_b)
    return float(fisher_exact([[ka, n_a - ka], [kb, n_b - kb]], alternative="greater")[1])


def summarise_artifact(rows: dict[str, dict[str, RawScores]], auditor: Auditor) -> ReconstructionSummary:
    """The headline over victims: the victim × predicted-domain matrix and its macro diagonal, and the mean
    class fidelity (absent for inversions with no target class), for the attack and each null, with the
    counts behind them (for the verdict's tests) and the computed chance levels."""
    cases = [c for c in ("attack", "control", "prior_only", "twin") if all(c in by_case for by_case in rows.values())]
    attribution = _attribution(rows, cases, auditor.domains)
    if any(by_case["attack"].class_fidelity is None for by_case in rows.values()):
        return ReconstructionSummary(domain_attribution=attribution)
    return ReconstructionSummary(domain_attribution=attribution, class_fidelity=_fidelity(rows, cases))


def _attribution(rows: dict[str, dict[str, RawScores]], cases: list[str], domains: list[str]) -> DomainAttribution:
    """The victim × predicted-domain matrix of every set, its macro diagonal and the counts behind it."""
    victims = list(rows)
    index = [domains.index(v) for v in victims]
    mats = {c: domain_matrix({v: rows[v][c].predicted_domains for v in victims}, domains) for c in cases}
    counts = {c: [sum(int((rows[v][c].predicted_domains == i).sum()) for v, i in zip(victims, index)),
                  sum(int(rows[v][c].predicted_domains.numel()) for v in victims)] for c in cases}
    macro = {c: macro_diagonal(mats[c], index) for c in cases}
    # A guess that ignores the victim puts share p(v) on each victim: its macro diagonal is at most 1/#victims.
    # One victim has no such guard (always naming it scores 1): there the controls show the judge's default.
    if len(victims) > 1:
        chance, chance_name = 1.0 / len(victims), f"the best guess that ignores the victim (1/{len(victims)} victims)"
    else:
        chance, chance_name = 1.0 / len(domains), (
            f"a uniform guess over {len(domains)} domains (one victim: the controls show where the judge sends "
            "images that carry no data)")
    return DomainAttribution(victims=victims, domains=list(domains), matrix=mats,
                             macro=Score(chance=chance, chance_name=chance_name).with_(**macro), counts=counts)


def _fidelity(rows: dict[str, dict[str, RawScores]], cases: list[str]) -> Score:
    """The mean class fidelity over victims of every set, with the best constant guess and the counts behind it."""
    victims = list(rows)
    fidelity = {c: sum(rows[v][c].class_fidelity or 0.0 for v in victims) / len(victims) for c in cases}
    counted = {c: [round(sum((rows[v][c].class_fidelity or 0.0) * rows[v][c].n for v in victims)),
                   sum(rows[v][c].n for v in victims)] for c in cases}
    chance = sum(rows[v]["attack"].class_fidelity_chance or 0.0 for v in victims) / len(victims)
    return Score(chance=chance, chance_name="the best constant guess on the targets", counts=counted).with_(**fidelity)


def unscored_section(attack: str, outputs: list[AttackOutput], prior: AttackerPrior, run_dir: Path,
                     why: str) -> ReconstructionSection:
    """Every artifact's entry per victim of an attack run with no records to score it against: each attacked
    entry keeps its losses and image grid (reconstruction and the nulls that ran, no real member beside
    them) and says ``why`` its metrics are absent, which the verdict reads as NOT ASSESSED."""
    mean = torch.tensor(prior.mean).view(1, -1, 1, 1)
    std = torch.tensor(prior.std).view(1, -1, 1, 1)
    tables: dict[str, dict[str, ReconstructionEntry]] = {}
    for out in outputs:
        entry: dict[str, object] = {k: v for k, v in out.info.items() if not k.endswith("losses")}
        if out.info.get("status") == "attacked":
            entry["metrics"] = VictimScores(status="unscored", reason=why)
            if out.images is not None:
                cases = {"attack": out.images, "prior_only": out.nulls.get("prior_only"), "control": out.control_images}
                shown = [c for c in GRID_COLUMNS if cases.get(c) is not None]
                idx = _grid_rows(out)
                columns = [(x[idx].float().cpu() * std + mean).clamp(0, 1) for c in shown if (x := cases[c]) is not None]
                entry["image_grid"] = _save_grid(run_dir, attack, out, columns)
                entry["grid_columns"] = [GRID_NAMES[c] for c in shown]
        tables.setdefault(out.artifact, {})[out.victim] = ReconstructionEntry.reported(out.attack, entry)
    return ReconstructionSection(artifacts=tables)


def save_reconstruction_grid(run_dir: Path, attack: str, out: AttackOutput, cases: dict[str, torch.Tensor | None],
                             auditor: Auditor, scores: RawScores) -> str:
    """PNG: per class (or the first ten, without classes), real nearest member | reconstruction | prior-only |
    untrained control | holdout twin (the nulls that ran). Returns its path relative to the run."""
    idx = _grid_rows(out)
    members = auditor.victim_records(out.victim).members
    assert scores.nn_member_index is not None  # images: each has its nearest member
    columns = [members[scores.nn_member_index[idx.to(members.device)]]]
    columns += [auditor.to_unit(x[idx]) for c in GRID_COLUMNS if (x := cases.get(c)) is not None]
    return _save_grid(run_dir, attack, out, columns)


def _grid_rows(out: AttackOutput) -> torch.Tensor:
    """The reconstructions a grid shows: the first of each class (the first ten without classes)."""
    assert out.images is not None  # a grid is of images
    if out.targets is None:
        return torch.arange(min(10, out.images.shape[0]), device=out.images.device)
    first = [int(torch.nonzero(out.targets == c)[0]) for c in torch.unique(out.targets).tolist()][:10]
    return torch.tensor(first, device=out.targets.device)


def _save_grid(run_dir: Path, attack: str, out: AttackOutput, columns: list[torch.Tensor]) -> str:
    from PIL import Image

    assert out.images is not None  # a grid is of images
    grid = image_grid(columns, scale=max(1, 64 // out.images.shape[-1]))
    rel = f"images/{run_directory.safe_name(f'{attack}-{out.artifact}-{out.victim}')}.png"
    with run_directory.atomic_path(run_dir / rel) as tmp:
        Image.fromarray(grid.numpy()).save(tmp, format="PNG")
    return rel


GRID_COLUMNS = ("attack", "prior_only", "control", "twin")  # after the nearest real member
GRID_NAMES = {"attack": "reconstruction", "prior_only": "prior-only control", "control": "untrained-model control",
              "twin": "holdout twin"}


__all__ = ["POWER_ALPHA", "audit_reconstruction", "run_counterfactuals", "score_section", "summarise_artifact",
           "unscored_section"]
