"""``fedaudit.evaluate(...)``: the one flow, callable from a notebook.

config → data (LODO split) → federation (method hooks, wire) → attacks →
run directory. Orchestration only: the federation trains, the auditor
(:mod:`fedaudit.audit.session`) runs the attacks and scores them,
:mod:`fedaudit.simulation.summary` summarises, :mod:`fedaudit.run.run_directory` writes. The CLI is a
thin layer over this module. With
``target_domain="all"`` every domain is the unseen target once; each gets its
own sub-directory and the top-level ``metrics.json`` averages them.
"""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Unpack

import torch

from fedaudit.audit.session import attack_role_and_victims
from fedaudit.data import MultiDomainDataset, load_dataset
from fedaudit.errors import FedauditError, unknown_choice
from fedaudit.models.factory import is_factory
from fedaudit.pipeline import Reporter, RunPlan, RunResult, run_targets
from fedaudit.reports import write_report_or_warn
from fedaudit.run import run_directory
from fedaudit.run.config import RunConfig, from_json, load_toml, parse_method_options, resolve
from fedaudit.run.numerics import run_numerics
from fedaudit.run.option_types import AuditOptions, EvaluateOptions
from fedaudit.simulation.dp_sgd import private_config
from fedaudit.simulation.federation import Federation
from fedaudit.simulation.wire import SERVER

log = logging.getLogger("fedaudit")

DATA_SEED = 0  # built-in data is the same for every run seed, so fingerprints compare across seeds


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
    **options: Unpack[EvaluateOptions],
) -> RunResult:
    """Train ``method`` in a LODO federation, attack what it shares, write a run directory.

    ``options`` are :class:`~fedaudit.run.config.RunConfig` fields (``dataset``,
    ``rounds``, ``target_domain``, ...) and attack options (``inversion_iters``,
    ``reference_models``, ...: ``fedaudit list attacks``); ``resume`` continues an
    interrupted run from its last finished round. Returns the run directory and metrics.
    """
    reporter = reporter or Reporter()
    command = command or "fedaudit.evaluate(" + ", ".join(f"{k}={v!r}" for k, v in {"method": method, **options}.items() if v is not None) + ")"
    if resume is not None:
        return _resume(Path(resume), reporter, on_round_end, options.get("model"))

    cfg, auto_note = run_config(method, config, method_option, method_flags, options)
    device = resolve_device(cfg.device)

    t0 = time.perf_counter()
    dataset = load_dataset(cfg.dataset, cfg.image_size, seed=DATA_SEED, cache_mb=cfg.cache_mb)
    data_seconds = time.perf_counter() - t0
    targets = resolve_targets(cfg, dataset)
    if cfg.attack != "none":
        for target in targets:  # a bad --attacker/--victim fails now, not after training
            attack_role_and_victims(cfg, [d for d in dataset.domains if d != target])

    if is_factory(cfg.model) or cfg.pretrained is not None:
        # the user's code and weights before a directory exists: a factory imports, builds and answers logits, and
        # --pretrained loads into the model (a file that is no state_dict for it is one line, not an orphan run)
        from fedaudit.models import build_model

        norm: dict[str, Any] = {} if is_factory(cfg.model) else {"norm": cfg.norm}  # a factory builds its own
        build_model(cfg.model, len(dataset.classes), cfg.image_size, pretrained=cfg.pretrained,
                    model_args=cfg.model_args, **norm)
    if auto_note:  # said once the options are known to be good
        log.info(auto_note)
    root = run_directory.new_run_dir(Path(cfg.out).expanduser(), cfg.method, cfg.dataset, "all" if len(targets) > 1 else targets[0])
    try:
        run_directory.write_json(root / "config.json", {"config": cfg.to_json(), "config_hash": cfg.hash(), "command": command,
                                               "targets": targets})
        return _run_and_report(root, _plan(cfg, dataset, device, reporter, on_round_end, command, data_seconds), targets)
    except BaseException:
        # A run that failed before its first round leaves nothing to resume: no orphan directory that `report`,
        # `compare` or `--resume` would then trip over.
        if not run_directory.has_progress(root):
            shutil.rmtree(root, ignore_errors=True)
        raise


def run_config(method: str | None, config: str | Path | None, method_option: list[str] | None,
               method_flags: list[tuple[str, str]] | None, options: Mapping[str, Any]) -> tuple[RunConfig, str | None]:
    """The run's config as ``evaluate`` resolves it, checked, before any data is loaded: explicit options over
    the config file over the method's profile defaults; ``--attack auto`` resolved from what the method shares
    (and the note saying so); under DP-SGD the norm layers Opacus can train."""
    from fedaudit.attacks import AUTO, attack_options, attack_schema, auto_attacks
    from fedaudit.methods import METHODS, get_method

    explicit = dict(options)
    if method is not None:
        explicit["method"] = method
    file_opts = load_toml(config) if config is not None else {}
    if is_factory(file_opts.get("model")) and explicit.get("model") != file_opts["model"]:
        raise FedauditError(f"{config} names the model factory {file_opts['model']}; fedaudit imports code only when "
                            f"the command names it: pass --model {file_opts['model']}")
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
    auto_note = None
    if spec == AUTO:  # the attacks that apply to what this method, so configured, shares; recorded as resolved
        draft = resolve({**explicit, "attack": "none"}, {**file_opts, "attack": "none"}, method_cls.profile_defaults,
                        {}, attack_options())
        spec = explicit["attack"] = auto_attacks(method_cls(draft).declared_shares(), draft.profile)
        auto_note = f"--attack auto: {spec} (from what {method_cls.name} shares)"
    cfg = resolve(explicit, file_opts, method_cls.profile_defaults, attack_schema(spec) if isinstance(spec, str) else {},
                  attack_options())
    warn_unused_attack_options({**file_opts, **explicit}, cfg)
    check_names(cfg)
    method_cls(cfg)  # validates method options before any work is done
    cfg = private_config(cfg, method_cls, [name for name, cls in METHODS.items() if not cls.dp_incompatible])
    return cfg, auto_note


def warn_unused_attack_options(given: dict[str, Any], cfg: RunConfig) -> None:
    """A line for each attack option given that no selected attack takes: it changes nothing in this run."""
    from fedaudit.attacks import attack_options

    taken = {name for block in cfg.attack_options.values() for name in block}
    for name in sorted(k for k, v in given.items() if k in attack_options() and k not in taken and v is not None):
        log.warning("--%s has no effect in this run: none of its attacks (--attack %s) takes it",
                    name.replace("_", "-"), cfg.attack)


def _resume(path: Path, reporter: Reporter, on_round_end: Callable[[Federation, int], None] | None,
            model: str | None = None) -> RunResult:
    from fedaudit.attacks import attack_schema

    root = run_directory.resolve_resume(path)
    saved = run_directory.read_json(root / "config.json")
    cfg = from_json(saved["config"], attack_schema(saved["config"].get("attack", "none")))
    if run_directory.is_complete(root):
        log.info("run %s is already complete; nothing to resume", root)
        return RunResult(root, run_directory.read_json(root / "metrics.json"))
    if is_factory(cfg.model) and model != cfg.model:  # a run directory is a file: it never makes fedaudit import code
        raise FedauditError(f"run {root} trains the model factory {cfg.model}; fedaudit imports code only when the "
                            f"command names it: add --model {cfg.model} to --resume")
    check_names(cfg)
    device = resolve_device(cfg.device)
    t0 = time.perf_counter()
    dataset = load_dataset(cfg.dataset, cfg.image_size, seed=DATA_SEED, cache_mb=cfg.cache_mb)
    plan = _plan(cfg, dataset, device, reporter, on_round_end, saved["command"], time.perf_counter() - t0)
    return _run_and_report(root, plan, saved["targets"])


def _plan(cfg: RunConfig, dataset: MultiDomainDataset, device: torch.device, reporter: Reporter,
          on_round_end: Callable[[Federation, int], None] | None, command: str, data_seconds: float) -> RunPlan:
    """What every target shares, with the method and the attacks looked up in their registries."""
    from fedaudit.attacks import get_attacks
    from fedaudit.methods import get_method

    return RunPlan(cfg, get_method(cfg.method), get_attacks(cfg.attack), dataset, device, reporter, on_round_end,
                   command, data_seconds)


def _run_and_report(root: Path, plan: RunPlan, targets: list[str]) -> RunResult:
    result = run_targets(root, plan, targets)
    write_report_or_warn(root)  # report.html from the finished run's files (all targets'); a failure only warns
    return result


def audit_recording(recording: str | Path, *, command: str = "", unverified: bool = False,
                    records: str | Path | None = None, **explicit: Unpack[AuditOptions]) -> RunResult:
    """``fedaudit audit``: attack a recorded federation as ``evaluate`` attacks its own (see
    :mod:`fedaudit.interop.audit_recording`); ``records`` is the auditor's records folder (needed where the
    recording's manifest points outside the recording); returns the run directory and its metrics."""
    from fedaudit.attacks import AUTO, attack_options, attack_schema, auto_attacks, get_attacks
    from fedaudit.methods import get_method
    from fedaudit.interop.audit_recording import (NO_DATA, audit, audited_model, auditor_data, check_audit_options,
                                                  check_some_client_answered, data_free_attacks, name_model_records,
                                                  recorded_config, recorded_shares)
    from fedaudit.interop.recording_reader import read_recording
    from fedaudit.interop.recording_verify import verify_recording

    rec = read_recording(recording)
    t0 = time.perf_counter()
    rec.verification = verify_recording(rec, unverified=unverified)  # whole, before anything is judged
    rec.verification["seconds"] = round(time.perf_counter() - t0, 3)
    check_some_client_answered(rec)
    given: dict[str, Any] = {k: v for k, v in explicit.items() if v is not None}
    check_audit_options(given, set(attack_options()))
    base = audited_model(rec, recorded_config(rec, records, given.get("dataset")), given)
    method_cls = get_method(base["method"])
    # First the options without attacks: the data and the architecture say what the recorded records are,
    # and those say what `--attack auto` runs.
    draft = resolve({**base, **given, "attack": "none"}, None, method_cls.profile_defaults, {}, attack_options())
    check_names(draft)
    dataset, split = auditor_data(draft, DATA_SEED, rec)
    name_model_records(rec, draft, len(dataset.classes))
    spec = given.get("attack", AUTO)
    by_auto = spec in (AUTO, "all")  # chosen for the user: what cannot run without data is left out, not refused
    if spec == AUTO:
        spec = auto_attacks(recorded_shares(rec), "quick")
        log.info("--attack auto: %s (from what the recording holds)", spec)
    selected = get_attacks(spec)
    if any(cls.plants_canaries for cls in selected):
        raise FedauditError("the canary audit plants canaries before training, which a recording cannot have; "
                            "drop canary from --attack")
    left_out: dict[str, str] = {}
    if draft.dataset == NO_DATA:
        selected, left_out = data_free_attacks(selected, by_auto)
        for name, why in left_out.items():
            log.warning("--attack %s leaves %s out: %s", given.get("attack", AUTO), name, why)
        spec = ",".join(cls.name for cls in selected) or "none"
    cfg = resolve({**base, **given, "attack": spec}, None, method_cls.profile_defaults, attack_schema(spec),
                  attack_options())
    warn_unused_attack_options(given, cfg)
    protocol = rec.secure_aggregation()
    if protocol is not None and cfg.attacker == SERVER and not cfg.secure_aggregation and selected:
        log.info("the recording used %s (its stage messages): the server rows are judged under secure aggregation "
                 "too (--secure-aggregation)", protocol)
        cfg = replace(cfg, secure_aggregation=True)
    with run_numerics(cfg.deterministic) as unpinned:
        run_dir, metrics = audit(rec, cfg, method_cls(cfg), selected, dataset, split, resolve_device(cfg.device), command,
                                 left_out, unpinned)
    write_report_or_warn(run_dir)
    return RunResult(run_dir, metrics)


def seal_recording(recording: str | Path) -> tuple[str, list[str]]:
    """``fedaudit seal``: a recorded run's shards checked and merged, its ledger sealed; returns (the ledger's
    sha256, the shards merged)."""
    from fedaudit.interop.recording import seal_recording as seal
    from fedaudit.interop.recording_reader import read_recording

    root = Path(recording).expanduser()
    if not root.is_dir():
        raise FedauditError(f"recording {root} does not exist; give the directory the recorder wrote")
    digest = seal(root)
    rec = read_recording(root)  # what was sealed reads back whole
    return digest, sorted(rec.manifest.shards or {})


def run_option_names() -> set[str]:
    """Every option an ``evaluate`` run takes: the RunConfig fields, every attack's, and ``method_options``."""
    from fedaudit.attacks import attack_options
    from fedaudit.run.config import FIELDS

    return set(FIELDS) | set(attack_options()) | {"method_options"}


def check_registry_names(methods: list[Any], attack_specs: list[Any]) -> None:
    """Method names and attack specs against their registries (one-line errors naming the choices)."""
    from fedaudit.attacks import AUTO, get_attacks
    from fedaudit.methods import get_method

    for name in methods:
        if name is not None:
            get_method(name)
    for spec in attack_specs:
        if spec is not None and spec != AUTO:
            get_attacks(spec)


def write_comparison(run_dirs: list[Path], out: Path) -> Path:
    """The compare page of finished runs (``fedaudit compare``)."""
    from fedaudit.reports import write_compare

    return Path(write_compare(run_dirs, out))


# -- validation helpers --------------------------------------------------------


def check_names(cfg: RunConfig) -> None:
    """Names checked against the registries before any data is loaded."""
    from fedaudit.attacks import AUTO, get_attacks
    from fedaudit.methods import get_method
    from fedaudit.models import ARCHITECTURES, NORM_LAYERS, is_factory

    get_method(cfg.method)
    if cfg.attack != AUTO:  # auto is resolved per method by evaluate, before the run's config is final
        get_attacks(cfg.attack)
    if not is_factory(cfg.model):
        if cfg.model not in ARCHITECTURES:
            raise unknown_choice("model", cfg.model, [*ARCHITECTURES, "PKG.MODULE:CALLABLE (your own model)"])
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
