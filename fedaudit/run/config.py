"""Run configuration: one schema, two profiles, one precedence rule, one resolve-and-validate step.

Every run option is declared once, as a field of :class:`RunConfig` made with
:func:`fedaudit.run.options.option`: its default, its per-profile defaults, its
type, range or choices, and its help. From that declaration come the
command-line flag, the TOML key, the range or choice error and the recorded
value (``config.json``). Attack options are declared the same way on the
attack classes' ``Options`` dataclasses (``Attack.options`` is read from them) and resolved here into
``RunConfig.attack_options``, one block per selected attack family; method
options stay with their method (``Method.options``).

Precedence, lowest first: the option's default, its default for the profile,
the method's defaults for that profile, the DP-SGD recipe (``DP_RECIPE``, only
with ``dp_epsilon``), the ``--config`` TOML file, then options given explicitly
on the command line or to :func:`fedaudit.evaluate`.
:func:`resolve` merges and validates everything before any data loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError, unknown_choice
from fedaudit.models.factory import OWN_NORM, is_factory
from fedaudit.run.options import Option, declared, option

PROFILES = ("quick", "paper")
PRECISIONS = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adam")
DEFAULT_SPLIT = (0.5, 0.1, 0.4)  # train (members) / val / holdout (non-members)

# The DP-SGD recipe (issue 20; found by scripts/dp_recipe_search.py on digits' source-val, no target domain):
# under --dp-epsilon these replace the profile's and the method's defaults, below a config file and explicit
# options. The learning rate is given per unit of clipping norm (lr = DP_LR_TIMES_NORM / --dp-max-grad-norm):
# a clipped mean gradient has norm at most the clipping norm, so this keeps the step length fixed. Each
# client's batch follows from DP_NOISE_TO_SIGNAL (the largest noise-to-signal per step a batch may leave), and
# its step shrinks by √(DP_STEP_NOISE_TO_SIGNAL / the ratio left) where that ratio is above
# DP_STEP_NOISE_TO_SIGNAL; where a batch meets DP_NOISE_TO_SIGNAL, a client may run up to DP_MAX_STEP_FACTOR ×
# the method's local steps per round while it still does (fedaudit.simulation.dp_sgd.choose_batch).
DP_LR_TIMES_NORM = 0.5
DP_NOISE_TO_SIGNAL = 1.0
DP_STEP_NOISE_TO_SIGNAL = 0.5
DP_MAX_STEP_FACTOR = 2  # at most twice the compute of the method's local epochs
DP_RECIPE: dict[str, Any] = {"local_epochs": 3, "momentum": 0.9}
DP_AUGMENTATIONS = 1
# --dp-train: the weights DP-SGD trains (fedaudit.simulation.dp_sgd.trained_parts), said once for the help and the coverage table
DP_TRAINED_PARTS = {"all": "every weight",
                    "last": "the encoder's last stage, the head and a projection between them if the model has one",
                    "head": "the head and a projection before it if the model has one"}
DP_TRAIN = tuple(DP_TRAINED_PARTS)


def dp_recipe_defaults(max_grad_norm: Any) -> dict[str, Any]:
    """The recipe's option values for a clipping norm (a bad norm is left to :func:`validate`)."""
    recipe = {**DP_RECIPE, "dp_noise_to_signal": DP_NOISE_TO_SIGNAL, "dp_max_step_factor": DP_MAX_STEP_FACTOR}
    if isinstance(max_grad_norm, (int, float)) and not isinstance(max_grad_norm, bool) and max_grad_norm > 0:
        recipe["lr"] = DP_LR_TIMES_NORM / float(max_grad_norm)
    return recipe


# The options of every selected attack family: {family: {option: declaration}}.
AttackSchema = Mapping[str, Mapping[str, Option]]


@dataclass
class RunConfig:
    """Everything that determines a run. Field names are the option names (``--flag-name``, TOML keys)."""

    # -- what runs ---------------------------------------------------------------------------------------
    method: str = option("fedavg", "FedDG method (see `fedaudit list methods`).")
    attack: str = option("auto", "Attack(s): auto (what applies to the method's shares: deepinversion and "
                         "mia-artifact for statistics and banks, mia-loss always, mia-lira and mia-rmia on the paper "
                         "profile), none (training only), "
                         "deepinversion, gradinv, mia (or mia-loss, mia-lira, mia-rmia, mia-domain, mia-artifact), "
                         "canary (one-run ε audit; not in all), all, or names joined by commas.")
    dataset: str = option("shapes", "shapes, shapes:N (N images per class), digits, or folder:PATH (DomainBed layout).")
    image_size: int = option(32, "Image side in pixels.", low=16, high=256, profiles={"paper": 64})
    target_domain: str | None = option(None, "Unseen domain (default: the dataset's last), or 'all' to hold out "
                                       "each in turn.", kind=str, nullable=True)
    model: str = option("cnn", "cnn, resnet18, resnet50, or your own model: PKG.MODULE:CALLABLE, a callable returning "
                        "an nn.Module (given num_classes= when it takes it, and --model-arg pairs).",
                        profiles={"paper": "resnet18"})
    norm: str = option("bn", "Norm layers of fedaudit's architectures: bn, in, gn, xan (gPerXAN); a --model factory's "
                       "model keeps its own (recorded as 'own').")
    pretrained: str | None = option(None, "Local state_dict for the backbone (.pt/.pth/.safetensors).", kind=str,
                                    nullable=True)
    # -- local training (the method's defaults per profile override these) -------------------------------
    rounds: int = option(20, "Communication rounds.", low=1, high=100_000, profiles={"paper": 40})
    local_epochs: int = option(3, "Local epochs per round.", low=1, high=1_000, profiles={"paper": 1})
    batch_size: int = option(32, "Local batch size.", low=2, high=65_536)  # BatchNorm needs 2 samples
    optimizer: str = option("sgd", "Local optimizer.", choices=OPTIMIZERS)
    lr: float = option(0.01, "Local learning rate.", low=1e-9, high=10.0, profiles={"paper": 1e-3})
    momentum: float = option(0.9, "SGD momentum.", low=0.0, high=0.999)
    weight_decay: float = option(5e-4, "Weight decay.", low=0.0, high=1.0)
    augment: bool = option(True, "On-device augmentation of training batches (random shifts; flips where the data "
                           "allows).")
    split: tuple[float, float, float] = field(default=DEFAULT_SPLIT)  # parsed and checked by parse_split / validate
    seed: int = option(0, "Seed for split, initialisation and training.", low=0, high=2**63 - 1)
    device: str = option("auto", "Where to train and attack.", choices=DEVICES)
    precision: str = option("fp32", "fp32, or bf16 (autocast).", choices=PRECISIONS)
    deterministic: bool = option(False, "GPU: deterministic cuDNN and cuBLAS kernels, no TF32, torch's "
                                 "deterministic algorithms (an op without one still runs and is named in "
                                 "provenance); slower. A CPU run is deterministic already.")
    out: str = option("runs", "Folder for run directories.")
    cache_mb: float = option(4096.0, "folder: datasets whose decoded images exceed this many MB are streamed from "
                             "disk through a cache of this size (same split and results); smaller ones are decoded "
                             "into memory whole.", low=0.0, high=1e9)
    keep_artifacts: bool = option(False, "Save every message on the wire as safetensors.")
    # -- who attacks, and the auditor ---------------------------------------------------------------------
    attacker: str = option("server", "Who attacks: server (sees every upload) or client:<domain> (sees its "
                           "broadcasts).")
    victim: str = option("all", "Victim source domain, or 'all' (every source the attacker can target).")
    secure_aggregation: bool = option(False, "Also judge what a server under secure aggregation sees (the sum of the "
                                      "masked model uploads, every other message in clear, as Flower's SecAgg+ "
                                      "leaves it): each server row beside its secure-aggregation twin.")
    lpips_weights: str | None = option(None, "Local AlexNet weights for LPIPS (default: the torch hub cache; never "
                                       "downloaded).", kind=str, nullable=True)
    judge_steps: int = option(300, "Adam steps of each auditor judge (the domain and class classifiers that score "
                              "reconstructions).", low=1, high=1_000_000)
    # -- defense: DP-SGD (Opacus) for every client's local training; the ε is per client, for one record of
    # its training split, over all rounds (fedaudit/simulation/dp_sgd.py) ---------------------------------------------------
    dp_epsilon: float | None = option(None, "Train every client with DP-SGD (Opacus) to this ε per client over all "
                                      "rounds; models switch to --norm gn.", kind=float, nullable=True, low=0.01,
                                      high=1e4)
    dp_delta: float = option(1e-5, "DP-SGD δ (must be below 1/records of every client).", low=1e-12, high=0.1)
    dp_max_grad_norm: float = option(1.0, "DP-SGD per-sample clipping norm.", low=1e-4, high=1e4)
    dp_augmentations: int = option(DP_AUGMENTATIONS, "DP-SGD augmentation multiplicity: each sampled record is seen "
                                   "in this many augmented views whose gradients are averaged before clipping (needs "
                                   "--augment).", low=1, high=64)
    dp_noise_to_signal: float | None = option(None, "DP-SGD batch by noise: each client's Poisson batch is the smallest "
                                              "of --batch-size, doubled, …, all its records whose noise-to-signal per "
                                              "step (σ·√trained parameters / expected batch) is at most this, and "
                                              f"--lr shrinks by √({DP_STEP_NOISE_TO_SIGNAL:g} / the ratio left) where "
                                              f"that ratio is above {DP_STEP_NOISE_TO_SIGNAL:g}; none: --batch-size and "
                                              f"--lr as given (the DP recipe sets {DP_NOISE_TO_SIGNAL:g} unless "
                                              "--batch-size is given).",
                                              kind=float, nullable=True, low=1e-3, high=1e6)
    dp_max_step_factor: int = option(1, "DP-SGD steps where the noise allows: where a client's batch meets "
                                     "--dp-noise-to-signal, it may run up to this many times the method's local "
                                     "steps per round (the plan with the most steps still within the target; at "
                                     "equal steps the larger batch); 1: the method's steps (the DP recipe sets "
                                     f"{DP_MAX_STEP_FACTOR} unless --batch-size or --local-epochs is given).",
                                     low=1, high=8)
    dp_train: str = option("all", "Which weights DP-SGD trains: all, last (" + DP_TRAINED_PARTS["last"] + ") or head ("
                           + DP_TRAINED_PARTS["head"] + "); the rest stay at their public initialisation (--pretrained, "
                           "or the seed's random init): fewer trained parameters, less noise in total.", choices=DP_TRAIN)
    dp_recipe: bool = option(True, "With --dp-epsilon, train with the DP-SGD recipe's defaults (lr 0.5 per unit of "
                             f"clipping norm, --dp-noise-to-signal {DP_NOISE_TO_SIGNAL:g}, --dp-max-step-factor "
                             f"{DP_MAX_STEP_FACTOR}, local epochs 3, momentum 0.9; DP_RECIPE) unless options set them; "
                             "--no-dp-recipe keeps the non-private defaults.")
    # -- defense: client-level DP on the aggregate (DP-FedAvg; fedaudit/simulation/client_dp.py): bounds a whole
    # client's influence on what the server sends and releases, for adding or removing one client ----------------------
    client_dp_epsilon: float | None = option(None, "Client-level DP: clip each client's update and add Gaussian noise "
                                             "to their mean, to this ε over all rounds for adding or removing one "
                                             "client (covers broadcasts and the released model, not the uploads).",
                                             kind=float, nullable=True, low=0.01, high=1e4)
    client_dp_delta: float = option(1e-5, "Client-level DP δ.", low=1e-12, high=0.1)
    client_dp_clip: float = option(1.0, "Client-level DP: the largest norm of one client's update (all its floating "
                                   "tensors) each round; larger ones are scaled down to it.", low=1e-6, high=1e6)
    method_options: dict[str, Any] = field(default_factory=dict)
    # keyword arguments of a --model factory (--model-arg KEY=VALUE, a [model_args] table)
    model_args: dict[str, Any] = field(default_factory=dict)
    # {attack family: {option: value}} for the selected attacks (declared on the attack classes).
    attack_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    profile: str = option("quick", "quick (CPU, minutes) or paper (the seeds' settings, GPU).", choices=PROFILES)

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["split"] = list(self.split)
        return d

    def hash(self) -> str:
        """Hash of everything that changes results (not where they are written, or held while running)."""
        d = self.to_json()
        d.pop("out", None)
        d.pop("cache_mb", None)  # where images are held, not what is computed
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def attack_option(self, family: str, name: str) -> Any:
        """One resolved attack option (``cfg.attack_option("deepinversion", "inversion_iters")``)."""
        return self.attack_options[family][name]


OPTIONS: dict[str, Option] = declared(RunConfig)
FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def target_exposure(cfg: RunConfig, step_factor: int = 1) -> int:
    """How many passes a client made over a member: rounds × local epochs (× its DP plan's ``step_factor``
    where the recipe added local steps)."""
    return cfg.rounds * cfg.local_epochs * step_factor


def load_toml(path: str | Path) -> dict[str, Any]:
    """Options from a TOML file: top-level keys are option names (dashes or
    underscores), ``[method_options]`` holds method-specific options."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FedauditError(f"config file {path} does not exist; give --config PATH to a TOML file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FedauditError(f"config file {path} is not valid TOML ({exc}); fix the file or drop --config") from None
    return {k.replace("-", "_"): v for k, v in data.items()}


def resolve(
    explicit: dict[str, Any],
    from_file: dict[str, Any] | None = None,
    method_defaults: dict[str, dict[str, Any]] | None = None,
    attack_schema: AttackSchema | None = None,
    attack_option_names: Mapping[str, Option] | set[str] | frozenset[str] = frozenset(),
) -> RunConfig:
    """Merge defaults, the config file's options and explicit options (in that order) and validate.

    ``attack_schema`` declares the options of the selected attack families (their values land in
    ``attack_options``); ``attack_option_names`` are every registered attack's options, accepted
    (and ignored) when their attack is not selected — but range-checked even then when given as declarations:
    a bad value is an error whether or not its attack runs.
    """
    attack_schema = attack_schema or {}
    # An explicit None is "not given"; a `none` given (None from here on) overrides the file, the recipe and the
    # method's defaults, as a file's does the recipe and the defaults.
    explicit = _words_to_none({k: v for k, v in explicit.items() if v is not None})
    from_file = _words_to_none(from_file or {})
    profile = explicit.get("profile", from_file.get("profile", "quick"))
    if profile not in PROFILES:
        raise unknown_choice("profile", profile, PROFILES)
    owners = _attack_owners(attack_schema)
    merged: dict[str, Any] = {name: opt.default_for(profile) for name, opt in OPTIONS.items()}
    attack_values = {family: {name: opt.default_for(profile) for name, opt in opts.items()}
                     for family, opts in attack_schema.items()}
    given = {**from_file, **explicit}
    _check_unselected_attack_options(given, attack_option_names, owners)
    known = FIELDS | set(owners) | set(attack_option_names)
    for source in ((method_defaults or {}).get(profile, {}), _dp_recipe(given), from_file, explicit):
        hint = "a [method_options] table" if source is from_file else "method_options"
        _merge(source, known, owners, merged, attack_values, hint)
    _settle_dp(merged, given)
    _settle_model(merged, given)
    merged["profile"] = profile
    merged["split"] = tuple(float(x) for x in merged.get("split", DEFAULT_SPLIT))
    merged["attack_options"] = {family: {name: attack_schema[family][name].check(name, value)
                                         for name, value in values.items()}
                                for family, values in attack_values.items()}
    cfg = RunConfig(**merged)
    validate(cfg)
    return cfg


def _attack_owners(attack_schema: AttackSchema) -> dict[str, list[str]]:
    """Each selected attack option's families: an option can belong to several (the shared inversion budget)."""
    owners: dict[str, list[str]] = {}
    for family, opts in attack_schema.items():
        for name in opts:
            owners.setdefault(name, []).append(family)
    return owners


def _check_unselected_attack_options(given: dict[str, Any], attack_option_names: Mapping[str, Option] | set[str]
                                     | frozenset[str], owners: dict[str, list[str]]) -> None:
    """An option of an attack that is not selected is ignored, but range-checked when declared: a bad value is
    an error whether or not its attack runs (checked in the order given)."""
    if not isinstance(attack_option_names, Mapping):
        return
    for key, value in given.items():
        if key in attack_option_names and key not in owners and value is not None:
            attack_option_names[key].check(key, value)


def _merge(source: dict[str, Any], known: set[str], owners: dict[str, list[str]], merged: dict[str, Any],
           attack_values: dict[str, dict[str, Any]], hint: str) -> None:
    """One source's options over what the earlier ones set: dict options key by key, an attack option into
    every family that declares it; an unknown option is refused, naming where method options go (``hint``)."""
    for key, value in source.items():
        if key not in known:
            raise FedauditError(f"unknown option {key!r}; valid options: {', '.join(sorted(known))} "
                                f"(method-specific ones go in {hint})")
        if key in ("method_options", "model_args"):
            merged[key] = {**merged.get(key, {}), **value}
        elif key in owners:
            for family in owners[key]:
                attack_values[family][key] = value
        elif key in FIELDS:
            merged[key] = value


def _words_to_none(options: dict[str, Any]) -> dict[str, Any]:
    """The word `none` for a nullable option (Option.parse; a config file's "none"): None, set on purpose."""
    return {k: None if k in OPTIONS and OPTIONS[k].is_none_word(v) else v for k, v in options.items()}


def _dp_recipe(given: dict[str, Any]) -> dict[str, Any]:
    """The DP recipe's defaults under --dp-epsilon (unless --no-dp-recipe); a given batch is used as given."""
    if given.get("dp_epsilon") is None or given.get("dp_recipe", True) is False:
        return {}
    recipe = dp_recipe_defaults(given.get("dp_max_grad_norm", OPTIONS["dp_max_grad_norm"].default))
    if "batch_size" in given:
        recipe.pop("dp_noise_to_signal", None)
    return recipe


def _settle_dp(merged: dict[str, Any], given: dict[str, Any]) -> None:
    """The DP options that depend on others: augmentation multiplicity needs augmentation, and more steps are
    taken only within a noise target (a given batch or epoch count is used as given)."""
    if merged["dp_augmentations"] != 1 and merged["augment"] is False:
        if "dp_augmentations" in given:
            raise FedauditError("--dp-augmentations needs augmented views, but --no-augment is set; drop one of them")
        merged["dp_augmentations"] = 1  # without augmentation every view would be the same record
    if "dp_max_step_factor" not in given and (merged["dp_noise_to_signal"] is None or "batch_size" in given
                                              or "local_epochs" in given):
        merged["dp_max_step_factor"] = 1


def _settle_model(merged: dict[str, Any], given: dict[str, Any]) -> None:
    """A --model factory has the norm layers it was built with; --model-arg is for a factory only."""
    if is_factory(merged["model"]):
        if "norm" in given and given["norm"] != OWN_NORM:
            raise FedauditError(f"--norm {given['norm']} applies to fedaudit's architectures; --model {merged['model']} "
                                "builds its own normalisation layers: drop --norm")
        merged["norm"] = OWN_NORM
    elif merged.get("model_args"):
        raise FedauditError(f"--model-arg is for a --model factory (PKG.MODULE:CALLABLE); --model {merged['model']} "
                            "takes none: drop --model-arg")


def validate(cfg: RunConfig) -> None:
    """Every declared option's type and range, then the checks that span options (names of methods,
    datasets and models are checked against their registries by the API)."""
    for name, opt in OPTIONS.items():
        opt.check(name, getattr(cfg, name))
    if cfg.dp_epsilon is not None and cfg.dp_max_step_factor > 1 and cfg.dp_noise_to_signal is None:
        raise FedauditError(f"--dp-max-step-factor {cfg.dp_max_step_factor} needs --dp-noise-to-signal (more steps "
                            "are taken only where the noise per step stays within it); give --dp-noise-to-signal 1 "
                            "or drop --dp-max-step-factor")
    if cfg.dp_epsilon is not None and cfg.precision != "fp32":
        raise FedauditError("--dp-epsilon needs --precision fp32 (per-sample gradients in bf16 clip inexactly); "
                            "drop --precision bf16")
    check_attacker(cfg.attacker)
    if cfg.secure_aggregation and cfg.attacker != "server":
        raise FedauditError(f"--secure-aggregation changes what the server sees, not what {cfg.attacker} receives: "
                            "use it with --attacker server")
    if not cfg.victim:
        raise FedauditError(f"--victim must be a source domain or 'all', got {cfg.victim!r}")
    if len(cfg.split) != 3 or any(f <= 0 for f in cfg.split) or abs(sum(cfg.split) - 1) > 1e-6:
        raise FedauditError(f"--split must be three positive fractions train,val,holdout summing to 1, got {cfg.split}")
    for table in ("method_options", "model_args"):
        if not isinstance(getattr(cfg, table), dict):
            raise FedauditError(f"{table} must be a table of name = value pairs")


def check_attacker(attacker: object) -> None:
    """``server`` or ``client:<domain>`` (the domain is checked against the dataset later)."""
    if attacker == "server" or (isinstance(attacker, str) and attacker.startswith("client:") and attacker[len("client:"):]):
        return
    raise FedauditError(f"unknown attacker {attacker!r}; valid choices: server, client:<domain> (e.g. client:clean)")


def parse_split(text: str | None) -> tuple[float, float, float] | None:
    """``"0.5,0.1,0.4"`` → (0.5, 0.1, 0.4); the sum is checked by :func:`validate`."""
    if text is None:
        return None
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise FedauditError(f"--split must look like 0.5,0.1,0.4 (train,val,holdout), got {text!r}") from None
    if len(parts) != 3:
        raise FedauditError(f"--split needs three fractions train,val,holdout, got {text!r}")
    return parts[0], parts[1], parts[2]


def from_json(saved: dict[str, Any], attack_schema: AttackSchema) -> RunConfig:
    """The RunConfig a run recorded in ``config.json``. Runs recorded before attack options were declared
    per attack kept them as top-level keys: they move into ``attack_options`` by their owner."""
    data = dict(saved)
    data["split"] = tuple(data.get("split", DEFAULT_SPLIT))
    blocks: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (data.get("attack_options") or {}).items()}
    for family, opts in attack_schema.items():
        for name in opts:
            if name in data and name not in FIELDS:
                blocks.setdefault(family, {})[name] = data[name]
    data = {k: v for k, v in data.items() if k in FIELDS}
    data["attack_options"] = blocks
    return RunConfig(**data)


def parse_method_options(pairs: list[str]) -> dict[str, Any]:
    """``["mu=0.1", "upload=full"]`` → ``{"mu": 0.1, "upload": "full"}`` (values parsed as TOML scalars)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise FedauditError(f"--method-option expects NAME=VALUE, got {pair!r}")
        key, raw = pair.split("=", 1)
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw  # a bare word such as `full`
        out[key.strip().replace("-", "_")] = value
    return out
