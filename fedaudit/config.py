"""Run configuration: one dataclass, two profiles, one precedence rule.

Precedence, lowest first: the profile's defaults, the method's defaults for
that profile, the ``--config`` TOML file, then options given explicitly on
the command line or to :func:`fedaudit.evaluate`. The resolved config is
written to ``config.json`` with its hash, so a report can be reproduced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError, unknown_choice

PROFILES = ("quick", "paper")
PRECISIONS = ("fp32", "bf16")
DEVICES = ("auto", "cpu", "cuda")
OPTIMIZERS = ("sgd", "adam")


@dataclass
class RunConfig:
    """Everything that determines a run. Field names are the option names."""

    method: str = "fedavg"
    attack: str = "none"
    dataset: str = "shapes"
    image_size: int = 32
    target_domain: str | None = None  # None: the dataset's last domain; "all": every domain in turn
    model: str = "cnn"
    norm: str = "bn"
    pretrained: str | None = None
    rounds: int = 20
    local_epochs: int = 3
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    augment: bool = True
    split: tuple[float, float, float] = (0.5, 0.1, 0.4)  # train (members) / val / holdout (non-members)
    seed: int = 0
    device: str = "auto"
    precision: str = "fp32"
    out: str = "runs"
    keep_artifacts: bool = False
    # Attacks (ATTACKS.md). attacker: "server" or "client:<domain>"; victim: a source domain or "all".
    attacker: str = "server"
    victim: str = "all"
    inversion_iters: int = 200
    inversion_batch: int = 40  # images per victim, whole classes: batch // classes per class (at least 1)
    reference_models: int = 8  # membership inference: reference ("shadow") models per victim domain
    # Reference models train the target's exposure, rounds × local epochs, but at most this many (None: no cap).
    reference_epochs: int | None = None
    # Canary audit (--attack canary): canaries per victim, drawn from its holdout (fedaudit/canary.py).
    # 64 leaves digits' ~180-record holdouts 116 >= 100 non-members, so mia's TPR at 10% FPR stays resolvable.
    canaries: int = 64
    inversion_lr: float = 0.1
    inversion_bn_weight: float = 10.0
    inversion_ce_weight: float = 1.0
    inversion_tv_weight: float = 1e-3
    inversion_l2_weight: float = 1e-5
    gradinv_tv_weight: float = 3e-5  # gradinv's TV prior: DeepInversion's 1e-3 blurs a one-image reconstruction (21 vs 35 dB)
    lpips_weights: str | None = None  # local AlexNet backbone file; default: the torch hub cache
    judge_steps: int = 300  # Adam steps of each auditor judge (domain and class classifiers that score reconstructions)
    # Defense: DP-SGD (Opacus) for every client's local training; None = no DP. The ε is per client,
    # for one record of its training split, over all rounds (fedaudit/dp.py).
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5
    dp_max_grad_norm: float = 1.0
    method_options: dict[str, Any] = field(default_factory=dict)
    profile: str = "quick"

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["split"] = list(self.split)
        return d

    def hash(self) -> str:
        """Hash of everything that changes results (not where they are written)."""
        d = self.to_json()
        d.pop("out", None)
        blob = json.dumps(d, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def target_exposure(cfg: RunConfig) -> int:
    """How many passes the federation made over a member: rounds × local epochs."""
    return cfg.rounds * cfg.local_epochs

# Profile defaults. `quick` keeps every algorithm and shrinks rounds and model
# so a CPU run takes minutes; `paper` uses the seeds' settings (GPU).
PROFILE_DEFAULTS: dict[str, dict[str, Any]] = {
    # quick: reference models train 10 epochs, not the target's 60 (20 rounds × 3), so a CPU membership audit
    # takes minutes; recorded in config.json, and the run's calibration figure says what it costs.
    "quick": {"reference_epochs": 10},
    "paper": {
        "model": "resnet18",
        "rounds": 40,
        "local_epochs": 1,
        "batch_size": 32,
        "lr": 1e-3,
        "image_size": 64,
        # DeepInversion's CIFAR-scale settings (Yin et al. 2020).
        "inversion_iters": 2000,
        "inversion_batch": 256,
        "reference_models": 64,
    },
}


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
) -> RunConfig:
    """Merge defaults, the config file's options and explicit options (in that
    order) and validate."""
    from_file = from_file or {}
    explicit = {k: v for k, v in explicit.items() if v is not None}
    profile = explicit.get("profile", from_file.get("profile", "quick"))
    if profile not in PROFILES:
        raise unknown_choice("profile", profile, PROFILES)

    merged: dict[str, Any] = {}
    merged.update(PROFILE_DEFAULTS[profile])
    merged.update((method_defaults or {}).get(profile, {}))
    for source in (from_file, explicit):
        for key, value in source.items():
            if key not in FIELDS:
                hint = "a [method_options] table" if source is from_file else "method_options"
                raise FedauditError(f"unknown option {key!r}; valid options: {', '.join(sorted(FIELDS))} (method-specific ones go in {hint})")
            if key == "method_options":
                merged.setdefault("method_options", {})
                merged["method_options"] = {**merged["method_options"], **value}
            else:
                merged[key] = value
    merged["profile"] = profile
    if "split" in merged:
        merged["split"] = tuple(float(x) for x in merged["split"])
    cfg = RunConfig(**merged)
    validate(cfg)
    return cfg


def _check_range(name: str, value: Any, lo: float, hi: float, kind: type = int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise FedauditError(f"--{name.replace('_', '-')} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if not lo <= value <= hi:
        raise FedauditError(f"--{name.replace('_', '-')} must be between {lo:g} and {hi:g}, got {value!r}")


def validate(cfg: RunConfig) -> None:
    """Range and choice checks that need no registry (names of methods,
    datasets and models are checked against their registries by the API)."""
    _check_range("rounds", cfg.rounds, 1, 100_000)
    _check_range("local_epochs", cfg.local_epochs, 1, 1_000)
    _check_range("batch_size", cfg.batch_size, 2, 65_536)  # BatchNorm needs 2 samples
    _check_range("image_size", cfg.image_size, 16, 256)
    _check_range("seed", cfg.seed, 0, 2**63 - 1)
    _check_range("lr", cfg.lr, 1e-9, 10.0, float)
    _check_range("momentum", cfg.momentum, 0.0, 0.999, float)
    _check_range("weight_decay", cfg.weight_decay, 0.0, 1.0, float)
    _check_range("inversion_iters", cfg.inversion_iters, 1, 1_000_000)
    _check_range("inversion_batch", cfg.inversion_batch, 1, 1_000_000)
    _check_range("reference_models", cfg.reference_models, 2, 4096)
    _check_range("judge_steps", cfg.judge_steps, 1, 1_000_000)
    if cfg.reference_epochs is not None:
        _check_range("reference_epochs", cfg.reference_epochs, 1, 100_000)
    _check_range("canaries", cfg.canaries, 2, 100_000)
    _check_range("inversion_lr", cfg.inversion_lr, 1e-6, 10.0, float)
    for name in ("inversion_bn_weight", "inversion_ce_weight", "inversion_tv_weight", "inversion_l2_weight", "gradinv_tv_weight"):
        _check_range(name, getattr(cfg, name), 0.0, 1e6, float)
    if cfg.dp_epsilon is not None:
        _check_range("dp_epsilon", cfg.dp_epsilon, 0.01, 1e4, float)
        if cfg.precision != "fp32":
            raise FedauditError("--dp-epsilon needs --precision fp32 (per-sample gradients in bf16 clip inexactly); "
                                "drop --precision bf16")
    _check_range("dp_delta", cfg.dp_delta, 1e-12, 0.1, float)
    _check_range("dp_max_grad_norm", cfg.dp_max_grad_norm, 1e-4, 1e4, float)
    check_attacker(cfg.attacker)
    if not isinstance(cfg.victim, str) or not cfg.victim:
        raise FedauditError(f"--victim must be a source domain or 'all', got {cfg.victim!r}")
    for name, value, choices in (
        ("precision", cfg.precision, PRECISIONS),
        ("device", cfg.device, DEVICES),
        ("optimizer", cfg.optimizer, OPTIMIZERS),
    ):
        if value not in choices:
            raise unknown_choice(name, value, choices)
    if len(cfg.split) != 3 or any(f <= 0 for f in cfg.split) or abs(sum(cfg.split) - 1) > 1e-6:
        raise FedauditError(f"--split must be three positive fractions train,val,holdout summing to 1, got {cfg.split}")
    if not isinstance(cfg.method_options, dict):
        raise FedauditError("method_options must be a table of name = value pairs")


def check_attacker(attacker: object) -> None:
    """``server`` or ``client:<domain>`` (the domain is checked against the dataset later)."""
    if attacker == "server" or (isinstance(attacker, str) and attacker.startswith("client:") and attacker[len("client:"):]):
        return
    raise FedauditError(f"unknown attacker {attacker!r}; valid choices: server, client:<domain> (e.g. client:clean)")


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
