"""``fedaudit.evaluate(...)``: the one flow, callable from a notebook.

config → data (LODO split) → federation (method hooks, wire) → attacks →
run directory. The CLI is a thin layer over this module. With
``target_domain="all"`` every domain is the unseen target once; each gets its
own sub-directory and the top-level ``metrics.json`` averages them.
"""

from __future__ import annotations

import logging
import platform
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fedaudit import runs
from fedaudit.attack import AttackerPrior
from fedaudit.audit.verdict import RiskThresholds, judge
from fedaudit.config import RunConfig, from_json, load_toml, parse_method_options, resolve
from fedaudit.data import MultiDomainDataset, load_dataset, lodo_split
from fedaudit.errors import FedauditError, unknown_choice
from fedaudit.federation import Federation
from fedaudit.seeds import derive_seed
from fedaudit.leakage import Auditor, DomainRecords
from fedaudit.method import Method
from fedaudit.reports import write_report_or_warn
from fedaudit.wire import SERVER, Wire, client_role

log = logging.getLogger("fedaudit")

RUN_FILES = ["config.json", "metrics.json", "history.csv", "wire.jsonl"]
DATA_SEED = 0  # built-in data is the same for every run seed, so fingerprints compare across seeds


class Reporter:
    """Progress callbacks; the CLI supplies a rich progress bar, the API is silent."""

    def start_target(self, target: str, rounds: int, done: int) -> None: ...

    def round_done(self, target: str, row: dict[str, Any]) -> None: ...

    def end_target(self, target: str) -> None: ...


@dataclass
class EvaluateResult:
    run_dir: Path
    metrics: dict[str, Any]


def evaluate(
    method: str | None = None,
    *,
    config: str | Path | None = None,
    resume: str | Path | None = None,
    method_option: list[str] | None = None,
    method_flags: list[tuple[str, str]] | None = None,
    reporter: Reporter | None = None,
    on_round_end: Callable[[Federation, int], None] | None = None,
    command: str | None = None,
    **options: Any,
) -> EvaluateResult:
    """Train ``method`` in a LODO federation, attack what it shares, write a run directory.

    ``options`` are :class:`~fedaudit.config.RunConfig` fields (``dataset``,
    ``rounds``, ``target_domain``, ...) and attack options (``inversion_iters``,
    ``reference_models``, ...: ``fedaudit list attacks``); ``resume`` continues an
    interrupted run from its last finished round. Returns the run directory and metrics.
    """
    reporter = reporter or Reporter()
    command = command or "fedaudit.evaluate(" + ", ".join(f"{k}={v!r}" for k, v in {"method": method, **options}.items() if v is not None) + ")"
    if resume is not None:
        return _resume(Path(resume), reporter, on_round_end)

    from fedaudit.attacks import attack_options, attack_schema
    from fedaudit.methods import get_method

    explicit = dict(options)
    if method is not None:
        explicit["method"] = method
    file_opts = load_toml(config) if config is not None else {}
    method_cls = get_method(explicit.get("method") or file_opts.get("method") or RunConfig.method)
    pairs = list(method_option or [])
    for owner, pair in method_flags or []:
        if owner != method_cls.name:
            flag = f"--{owner}-{pair.split('=', 1)[0]}".replace("_", "-")
            raise FedauditError(f"{flag} is an option of method {owner}, but this run's method is {method_cls.name}; "
                                f"add --method {owner} or drop {flag}")
        pairs.append(pair)
    if pairs:
        explicit["method_options"] = parse_method_options(pairs)
    spec = explicit.get("attack") or file_opts.get("attack") or RunConfig.attack
    cfg = resolve(explicit, file_opts, method_cls.profile_defaults, attack_schema(spec) if isinstance(spec, str) else {},
                  set(attack_options()))
    check_names(cfg)
    method_cls(cfg)  # validates method options before any work is done
    cfg = private_config(cfg, method_cls)
    device = resolve_device(cfg.device)

    t0 = time.perf_counter()
    dataset = load_dataset(cfg.dataset, cfg.image_size, seed=DATA_SEED)
    data_seconds = time.perf_counter() - t0
    targets = resolve_targets(cfg, dataset)
    if cfg.attack != "none":
        for target in targets:  # a bad --attacker/--victim fails now, not after training
            attack_role_and_victims(cfg, [d for d in dataset.domains if d != target])

    root = runs.new_run_dir(Path(cfg.out).expanduser(), cfg.method, cfg.dataset, "all" if len(targets) > 1 else targets[0])
    runs.write_json(root / "config.json", {"config": cfg.to_json(), "config_hash": cfg.hash(), "command": command,
                                           "targets": targets})
    return _run_targets(root, cfg, dataset, targets, device, reporter, on_round_end, command, data_seconds)


def _resume(path: Path, reporter: Reporter, on_round_end) -> EvaluateResult:
    from fedaudit.attacks import attack_schema

    root = runs.resolve_resume(path)
    saved = runs.read_json(root / "config.json")
    cfg = from_json(saved["config"], attack_schema(saved["config"].get("attack", "none")))
    if runs.is_complete(root):
        log.info("run %s is already complete; nothing to resume", root)
        return EvaluateResult(root, runs.read_json(root / "metrics.json"))
    check_names(cfg)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    dataset = load_dataset(cfg.dataset, cfg.image_size, seed=DATA_SEED)
    return _run_targets(root, cfg, dataset, saved["targets"], device, reporter, on_round_end, saved["command"],
                        time.perf_counter() - t0)


def _run_targets(root: Path, cfg: RunConfig, dataset: MultiDomainDataset, targets: list[str], device: torch.device,
                 reporter: Reporter, on_round_end, command: str, data_seconds: float) -> EvaluateResult:
    if len(targets) == 1:
        metrics = run_one(root, cfg, dataset, targets[0], device, reporter, on_round_end, command, data_seconds)
        write_report_or_warn(root)  # report.html from the finished run's files; a failure only warns
        return EvaluateResult(root, metrics)
    per_target = {}
    for target in targets:
        sub = root / runs.target_dirname(target)
        if not (sub / "config.json").exists():
            sub.mkdir(parents=True, exist_ok=True)
            runs.write_json(sub / "config.json", {"config": {**cfg.to_json(), "target_domain": target},
                                                  "config_hash": cfg.hash(), "command": command, "targets": [target]})
        per_target[target] = run_one(sub, cfg, dataset, target, device, reporter, on_round_end, command, data_seconds)
    metrics = summarise_targets(cfg, per_target)
    runs.write_json(root / "metrics.json", metrics)
    runs.mark_complete(root, ["config.json", "metrics.json", *(f"{runs.target_dirname(t)}/{runs.COMPLETE}" for t in targets)])
    write_report_or_warn(root)  # one report for all targets, rendered from the root and its target-*/ folders
    return EvaluateResult(root, metrics)


def run_one(run_dir: Path, cfg: RunConfig, dataset: MultiDomainDataset, target: str, device: torch.device,
            reporter: Reporter, on_round_end, command: str, data_seconds: float) -> dict[str, Any]:
    """Train, attack and write one target's run directory (resuming if it has a checkpoint)."""
    from fedaudit.attacks import get_attacks
    from fedaudit.audit.canary import canary_split
    from fedaudit.methods import get_method

    if runs.is_complete(run_dir):
        return runs.read_json(run_dir / "metrics.json")
    wall0 = time.perf_counter()
    log.info("run directory %s (target %s)", run_dir, target)
    method = get_method(cfg.method)(cfg)
    split = lodo_split(dataset, target, cfg.split, seed=cfg.seed)
    if any(cls.plants_canaries for cls in get_attacks(cfg.attack)):  # before training: canaries change what is trained
        split = canary_split(cfg, split, len(dataset.classes), lambda sources: attack_role_and_victims(cfg, sources)[1])
    wire = Wire(run_dir / "artifacts" if cfg.keep_artifacts else None)
    fed = Federation(cfg, method, dataset, split, device, wire)
    ckpt = runs.load_checkpoint(run_dir)
    if ckpt is not None:
        fed.restore(*ckpt)
        log.info("resuming %s after round %d", run_dir, fed.rounds_done)
    else:
        fed.setup()

    def after_round(fed: Federation, rnd: int) -> None:
        save_progress(run_dir, fed)
        reporter.round_done(target, fed.history[-1])
        if on_round_end is not None:
            on_round_end(fed, rnd)

    reporter.start_target(target, cfg.rounds, fed.rounds_done)
    try:
        fed.run(after_round)
    finally:
        reporter.end_target(target)

    t0 = time.perf_counter()
    leakage = run_attacks(run_dir, cfg, method, fed, dataset, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    attack_seconds = time.perf_counter() - t0

    stages = {"data": data_seconds, **fed.timings, "attacks": attack_seconds, "wall": time.perf_counter() - wall0}
    metrics = {
        "schema_version": runs.SCHEMA_VERSION,
        "method": cfg.method,
        "dataset": cfg.dataset,
        "target_domain": target,
        "source_domains": [c.domain for c in fed.clients],
        "accuracy": fed.results(),
        "communication": communication(fed),
        "leakage": leakage,
        "privacy": privacy(fed),
        "provenance": provenance(cfg, dataset, device, command, stages),
    }
    # The verdict is computed once, here, from the evidence just stored; the report renders it.
    metrics["verdict"] = judge(metrics, cfg.to_json(), RiskThresholds())
    metrics["verdict_thresholds"] = asdict(RiskThresholds())
    save_progress(run_dir, fed)
    runs.write_json(run_dir / "metrics.json", metrics)
    runs.mark_complete(run_dir, RUN_FILES)
    runs.drop_checkpoint(run_dir)
    return metrics


# -- defenses ------------------------------------------------------------------


def private_config(cfg: RunConfig, method_cls: type[Method]) -> RunConfig:
    """With ``--dp-epsilon``: check the method can be trained with DP-SGD, and switch the
    norm layers to GroupNorm when Opacus' validator rejects the chosen ones (saying which)."""
    from dataclasses import replace

    from fedaudit.dp import check_supported, describe_layers, unsupported_layers
    from fedaudit.methods import METHODS
    from fedaudit.models import build_model

    if cfg.dp_epsilon is None:
        return cfg
    check_supported(cfg, method_cls, [name for name, cls in METHODS.items() if not cls.dp_incompatible])
    bad = unsupported_layers(build_model(cfg.model, 2, cfg.image_size, norm=cfg.norm))
    if not bad:
        return cfg
    if cfg.norm == "gn":
        raise FedauditError(f"DP-SGD cannot train {describe_layers(bad)} of --model {cfg.model}; choose another --model")
    log.warning("DP-SGD cannot train --norm %s (Opacus' validator rejects %s): training with --norm gn instead",
                cfg.norm, describe_layers(bad))
    return replace(cfg, norm="gn")


def privacy(fed: Federation) -> dict[str, Any]:
    """The defense in force and what it covers: per client ε spent (Opacus' accountant), and for every
    artifact the method sends whether that ε covers it."""
    from fedaudit.dp import coverage

    shares = fed.method.declared_shares()
    if fed.dp is None:
        return {"dp": None, "coverage": [{**row, "covered": False, "why": "no DP: trained without a privacy mechanism"}
                                         for row in coverage(shares)]}
    return {"dp": fed.dp.summary({c.index: c.domain for c in fed.clients}), "coverage": coverage(shares)}


# -- attacks -------------------------------------------------------------------

PRIOR_SEED_STREAM = 7_001  # the attacker's fresh model: a fixed initialisation, independent of the run's own


def attacker_prior(cfg: RunConfig, method: Method, fed: Federation, dataset: MultiDomainDataset) -> AttackerPrior:
    """Public knowledge: the method's architecture (built by the method itself, so
    norm layers and heads match), classes, domains, image shape, normalisation, and the
    method's public code (its predict, whether it is label-free, its local training recipe)."""
    seed = derive_seed(cfg.seed, PRIOR_SEED_STREAM)

    def build() -> torch.nn.Module:
        # fork_rng: building the attacker's model must not move the run's RNG streams.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return method.build_model(fed)

    return AttackerPrior(arch=cfg.model, num_classes=len(dataset.classes), class_names=tuple(dataset.classes),
                         domains=tuple(dataset.domains), image_size=cfg.image_size, channels=3,
                         mean=tuple(dataset.mean), std=tuple(dataset.std), build_model=build,
                         num_clients=len(fed.clients), hflip=dataset.hflip, predict=method.predict,
                         label_free=method.label_free, train_recipe=method.reference_recipe(fed),
                         new_model=lambda: method.build_model(fed))


def attack_role_and_victims(cfg: RunConfig, sources: list[str]) -> tuple[str, list[str]]:
    """The attacker's wire role and the victims' domains for one target (user errors name the choices)."""
    if cfg.attacker == SERVER:
        role, pool = SERVER, list(sources)
    else:
        domain = cfg.attacker[len("client:"):]
        if domain not in sources:
            raise unknown_choice("attacker", cfg.attacker, [SERVER, *(client_role(d) for d in sources)])
        role, pool = client_role(domain), [d for d in sources if d != domain]
    if cfg.victim == "all":
        return role, pool
    if cfg.victim not in pool:
        raise unknown_choice(f"victim for attacker {cfg.attacker}", cfg.victim, [*pool, "all"])
    return role, [cfg.victim]


def run_attacks(run_dir: Path, cfg: RunConfig, method: Method, fed: Federation, dataset: MultiDomainDataset,
                device: torch.device) -> dict[str, Any]:
    """Every selected attack against the attacker's wire view, scored by the auditor.

    An attack gets the view, the prior and the access its threat model grants
    (``Attack.needs``); the auditor's procedure for it follows from that grant:
    membership challenges, planted canaries, or reconstructions scored against
    the private records. One instance per attack family, membership first.
    """
    from fedaudit.attacks import get_attacks
    from fedaudit.audit.canary import audit_canaries
    from fedaudit.audit.membership import audit_membership
    from fedaudit.audit.reconstruction import audit_reconstruction

    prior = attacker_prior(cfg, method, fed, dataset)
    role, victims = attack_role_and_victims(cfg, [c.domain for c in fed.clients])
    families: dict[str, list] = {}
    for cls in get_attacks(cfg.attack):
        families.setdefault(cls.family or cls.name, []).append(cls)
    attacks = [group[0].for_selection(group, cfg, prior) for group in families.values()]
    attacks.sort(key=lambda a: 0 if "challenges" in a.needs else 1 if "canaries" in a.needs else 2)
    leakage: dict[str, Any] = {}
    auditor = None
    for attack in attacks:
        against = f"as {role} against {', '.join(victims)}"
        if "challenges" in attack.needs:
            log.info("attack %s %s (%d reference models)", attack.name, against, getattr(attack, "reference_models", 0))
            leakage[attack.name] = audit_membership(attack, run_dir, cfg, method, fed, prior, role=role, victims=victims)
        elif "canaries" in attack.needs:  # the one-run audit: the auditor scores the canaries it planted
            log.info("canary audit %s", against)
            leakage[attack.name] = audit_canaries(attack, cfg, method, fed, prior, role=role, victims=victims)
        else:
            log.info("attack %s %s (with its nulls, holdout twin and positive control)", attack.name, against)
            auditor = auditor or build_auditor(cfg, fed, dataset, device)  # trains the judges: only when needed
            leakage[attack.name] = audit_reconstruction(attack, fed.wire.view(role), prior, victims, auditor, run_dir,
                                                        device)
            settings = getattr(attack, "settings", None)
            if settings is not None:
                leakage[attack.name]["settings"] = settings.to_json()
    return leakage


def build_auditor(cfg: RunConfig, fed: Federation, dataset: MultiDomainDataset, device: torch.device) -> Auditor:
    """The auditor's records: members, holdouts and judge-training records of every domain."""
    records = []
    for domain in dataset.domains:
        client = next((c for c in fed.clients if c.domain == domain), None)
        if client is None:  # the unseen target: only a reference for the domain judge
            records.append(DomainRecords(domain, None, None, None, None, fed.target_x, fed.target_y))
            continue
        d = client.data
        records.append(DomainRecords(domain, *d.members(), d.holdout_x, d.holdout_y,  # members: train minus canaries
                                     torch.cat([d.val_x, d.holdout_x]), torch.cat([d.val_y, d.holdout_y])))
    from fedaudit.audit.counterfactual import TrainingRecipe

    return Auditor(records, len(dataset.classes), dataset.mean, dataset.std, dataset.hflip,
                   seed=derive_seed(cfg.seed, PRIOR_SEED_STREAM + 1) % 2**31, device=device,
                   lpips_weights=cfg.lpips_weights, judge_steps=cfg.judge_steps, latent_encoders=latent_encoders(cfg, fed),
                   recipe=TrainingRecipe(fed.preprocess, cfg.augment, cfg.batch_size))


def latent_encoders(cfg: RunConfig, fed: Federation) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Per source domain, uint8 images → latents of the encoder its shared head was trained on
    (``Method.head_encoder``; built on first use, only for methods that keep one)."""
    from fedaudit.probe import extract_features

    def encoder_of(client) -> Callable[[torch.Tensor], torch.Tensor]:
        model: list[torch.nn.Module] = []

        def encode(images: torch.Tensor) -> torch.Tensor:
            if not model:
                model.append(fed.method.head_encoder(fed, client))
            return extract_features(model[0].features, images, fed.preprocess, cfg.precision)
        return encode

    if type(fed.method).head_encoder is Method.head_encoder:
        return {}
    return {c.domain: encoder_of(c) for c in fed.clients}


def save_progress(run_dir: Path, fed: Federation) -> None:
    """After each round: history, ledger, and a checkpoint to resume from."""
    runs.write_csv(run_dir / "history.csv", fed.history)
    runs.write_jsonl(run_dir / "wire.jsonl", fed.wire.ledger_rows())
    runs.save_checkpoint(run_dir, *fed.checkpoint())


def communication(fed: Federation) -> dict[str, Any]:
    s = fed.wire.summary()
    rounds = max(fed.rounds_done, 1)
    return {
        **s,
        "rounds": fed.rounds_done,
        "clients": len(fed.clients),
        "mb_up_per_round": s["bytes_up"] / rounds / 1e6,
        "mb_down_per_round": s["bytes_down"] / rounds / 1e6,
        # what the configured method says it sends; tests hold the ledger to it
        "declared": sorted(f"{k.value}{'↑' if d == 'up' else '↓'}" for k, d in fed.method.declared_shares()),
    }


def summarise_targets(cfg: RunConfig, per_target: dict[str, dict]) -> dict[str, Any]:
    """Mean over targets of the headline numbers, with every target's own."""
    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    accs = {t: m["accuracy"] for t, m in per_target.items()}
    first = next(iter(per_target.values()))
    return {
        "schema_version": runs.SCHEMA_VERSION,
        "method": cfg.method,
        "dataset": cfg.dataset,
        "target_domain": "all",
        "accuracy": {
            "unseen_domain": mean([a["unseen_domain"] for a in accs.values()]),
            "source_val": {"mean": mean([a["source_val"]["mean"] for a in accs.values()])},
            "per_target": {t: {"unseen_domain": a["unseen_domain"], "source_val_mean": a["source_val"]["mean"],
                               "selected_round": a["selected_round"]} for t, a in accs.items()},
        },
        "communication": {
            "bytes_up": sum(m["communication"]["bytes_up"] for m in per_target.values()),
            "bytes_down": sum(m["communication"]["bytes_down"] for m in per_target.values()),
            "per_target": {t: m["communication"] for t, m in per_target.items()},
        },
        "leakage": {t: m["leakage"] for t, m in per_target.items()},
        "privacy": {t: m.get("privacy") for t, m in per_target.items()},
        "verdict": [{**row, "target": t} for t, m in per_target.items() for row in m.get("verdict") or []],
        "provenance": {**first["provenance"], "seconds": {t: m["provenance"]["seconds"] for t, m in per_target.items()}},
    }


def provenance(cfg: RunConfig, dataset: MultiDomainDataset, device: torch.device, command: str,
               stages: dict[str, float]) -> dict[str, Any]:
    import numpy
    import sklearn
    import torchvision

    from fedaudit import __version__

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return {
        "command": command,
        "config_hash": cfg.hash(),
        "config": cfg.to_json(),
        "dataset_fingerprint": dataset.fingerprint(),
        "dataset_skipped_files": dataset.skipped,
        "seed": cfg.seed,
        "versions": {"fedaudit": __version__, "python": platform.python_version(), "torch": torch.__version__,
                     "torchvision": torchvision.__version__, "numpy": numpy.__version__, "scikit-learn": sklearn.__version__},
        "device": {"type": device.type, "name": device_name, "threads": torch.get_num_threads()},
        "seconds": {k: round(v, 3) for k, v in stages.items()},
    }


# -- validation helpers --------------------------------------------------------


def check_names(cfg: RunConfig) -> None:
    """Names checked against the registries before any data is loaded."""
    from fedaudit.attacks import get_attacks
    from fedaudit.models import ARCHITECTURES, NORM_LAYERS
    from fedaudit.methods import get_method

    get_method(cfg.method)
    get_attacks(cfg.attack)
    if cfg.model not in ARCHITECTURES:
        raise unknown_choice("model", cfg.model, ARCHITECTURES)
    if cfg.norm not in NORM_LAYERS:
        raise unknown_choice("norm layer", cfg.norm, NORM_LAYERS)
    if cfg.lpips_weights is not None and not Path(cfg.lpips_weights).expanduser().is_file():
        raise FedauditError(f"LPIPS weights file {cfg.lpips_weights} does not exist; give torchvision's AlexNet "
                            "state_dict (alexnet-owt-7be5be79.pth) or drop --lpips-weights")
    if cfg.pretrained is not None and not Path(cfg.pretrained).expanduser().is_file():
        raise FedauditError(f"pretrained weights file {cfg.pretrained} does not exist; give a local state_dict (.pt/.pth/.safetensors)")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise FedauditError("--device cuda was requested but no CUDA GPU is available; use --device cpu or --device auto")
    return torch.device(name)


def resolve_targets(cfg: RunConfig, dataset: MultiDomainDataset) -> list[str]:
    if cfg.target_domain is None:
        return [dataset.domains[-1]]
    if cfg.target_domain == "all":
        return list(dataset.domains)
    if cfg.target_domain not in dataset.domains:
        raise unknown_choice("target domain", cfg.target_domain, [*dataset.domains, "all"])
    return [cfg.target_domain]


def command_line() -> str:
    return "fedaudit " + " ".join(shlex.quote(a) for a in sys.argv[1:])
