"""One declaration per option: the flag, the TOML key, the range error and the recorded value all come from it.

A dummy attack declares one option and registers itself; without touching cli/flags.py, api.py or
config.py the option has its ``--flag`` (in ``--help`` too), its TOML key, its one-line range error
and its value in ``config.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from fedaudit import cli
from fedaudit.attack import NO_ACCESS, Attack, AttackOutput, AttackSetup
from fedaudit.attacks import ATTACKS
from fedaudit.errors import FedauditError
from fedaudit.run.config import OPTIONS, RunConfig, from_json, resolve
from fedaudit.run.options import Option, option

FAST = ["--dataset", "digits", "--image-size", "16", "--rounds", "1", "--device", "cpu", "--quiet"]


@dataclass(frozen=True)
class DummyOptions:
    dummy_level: int = option(2, "How hard the dummy tries.", low=1, high=5, profiles={"paper": 5})


class Dummy(Attack, register=False):
    """An attack that reads its one option and reports it."""

    name = "dummy"
    summary = "a test attack with one option"
    Options: ClassVar[type] = DummyOptions

    def __init__(self, level: int) -> None:
        self.level = level

    @classmethod
    def from_config(cls, setup: AttackSetup, prior: Any) -> Dummy:
        return cls(setup.options.dummy_level)

    def run(self, view, prior, victim, device, access=NO_ACCESS) -> list[AttackOutput]:
        return [AttackOutput(self.name, view.role, victim, "full_model",
                             info={"status": "not applicable", "reason": f"a dummy at level {self.level}"})]


@pytest.fixture
def app(monkeypatch):
    monkeypatch.setitem(ATTACKS, "dummy", Dummy)
    return cli.make_app()


def _run(app, tmp_path, *args: str) -> dict[str, Any]:
    out = tmp_path / "runs"
    result = CliRunner().invoke(app, ["evaluate", "--attack", "dummy", *FAST, "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    (run_dir,) = out.iterdir()
    config = json.loads((run_dir / "config.json").read_text())["config"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["leakage"]["dummy"]["full_model"]["clean"]["reason"] == f"a dummy at level {config['attack_options']['dummy']['dummy_level']}"
    return config


def test_a_new_attack_option_gets_its_flag_and_help_and_is_recorded(app, tmp_path):
    help_text = CliRunner().invoke(app, ["evaluate", "--help"], env={"COLUMNS": "200"}).output
    assert "--dummy-level" in help_text and "How hard the dummy tries. (default 2; paper 5)" in help_text
    assert _run(app, tmp_path, "--dummy-level", "4")["attack_options"] == {"dummy": {"dummy_level": 4}}


def test_a_new_attack_option_has_its_toml_key_and_default(app, tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("dummy_level = 3\n")
    assert _run(app, tmp_path / "a", "--config", str(toml))["attack_options"] == {"dummy": {"dummy_level": 3}}
    assert _run(app, tmp_path / "b")["attack_options"] == {"dummy": {"dummy_level": 2}}


def test_a_new_attack_option_has_its_range_error(app):
    result = CliRunner().invoke(app, ["evaluate", "--attack", "dummy", *FAST, "--dummy-level", "9"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--dummy-level must be between 1 and 5, got 9" in result.output
    listed = CliRunner().invoke(app, ["list", "attacks"], env={"COLUMNS": "250"})
    assert "--dummy-level 2" in listed.output


# -- the run's own options -----------------------------------------------------------------------------


def test_every_run_option_has_a_flag_and_a_range_or_type_check():
    """The four fields that had no flag (optimizer, momentum, weight decay, augment) have one now."""
    help_text = CliRunner().invoke(cli.app, ["evaluate", "--help"], env={"COLUMNS": "250"}).output
    for name in OPTIONS:
        assert "--" + name.replace("_", "-") in help_text, name
    with pytest.raises(FedauditError, match="--momentum must be between 0 and 0.999, got 2"):
        resolve({"momentum": 2.0})
    with pytest.raises(FedauditError, match="--augment must be true or false"):
        resolve({"augment": "yes"})
    assert resolve({"optimizer": "adam", "augment": False}).optimizer == "adam"


def test_profile_defaults_come_from_the_declarations():
    paper = resolve({"profile": "paper"})
    assert (paper.model, paper.rounds, paper.image_size, paper.lr) == ("resnet18", 40, 64, 1e-3)
    assert resolve({}).rounds == RunConfig.rounds == 20


def test_nullable_options_take_none_on_the_command_line():
    """`none` stays a word until it is checked, so it overrides a default instead of reading as "not given"."""
    opt = Option(10, "cap", kind=int, nullable=True, low=1, high=100)
    assert opt.parse("reference_epochs", "none") == "none" and opt.parse("reference_epochs", "7") == 7
    assert opt.check("reference_epochs", "none") is None and opt.check("reference_epochs", "None") is None
    with pytest.raises(FedauditError, match="--reference-epochs must be an integer"):
        opt.parse("reference_epochs", "seven")


def test_a_config_recorded_before_the_attack_blocks_still_resumes():
    """Runs recorded with the attack options at the top level (before they were declared per attack)."""
    from fedaudit.attacks import attack_schema

    saved = {**RunConfig().to_json(), "attack": "deepinversion,mia", "inversion_iters": 20, "reference_models": 2}
    saved.pop("attack_options")
    cfg = from_json(saved, attack_schema("deepinversion,mia"))
    assert cfg.attack_options == {"deepinversion": {"inversion_iters": 20}, "mia": {"reference_models": 2}}
    assert cfg.split == (0.5, 0.1, 0.4)


def test_evaluate_and_audit_take_typed_keywords_generated_from_the_declarations():
    """fedaudit/run/option_types.py is what scripts/option_types.py writes from the declarations (a new or changed
    option without regenerating it fails here), and evaluate and audit_recording annotate their keywords with it."""
    import importlib.util
    import inspect
    import typing
    from pathlib import Path

    from fedaudit import api
    from fedaudit.attacks import attack_options
    from fedaudit.run.config import RunConfig
    from fedaudit.run.option_types import AuditOptions, EvaluateOptions
    from fedaudit.run.options import declared

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("option_types_script", root / "scripts" / "option_types.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.render() == (root / "fedaudit" / "run" / "option_types.py").read_text(encoding="utf-8"), (
        "fedaudit/run/option_types.py is behind the declarations: run python scripts/option_types.py")
    keys = set(EvaluateOptions.__annotations__)
    # every option but evaluate's own named parameter (a keyword of both would be ambiguous to a type checker)
    assert (set(declared(RunConfig)) - script.NAMED) | set(attack_options()) <= keys and not keys & script.NAMED
    assert script.NAMED <= set(inspect.signature(api.evaluate).parameters)
    hints = typing.get_type_hints(EvaluateOptions)
    assert hints["rounds"] is int and hints["target_domain"] == str | None
    assert set(attack_options()) <= set(AuditOptions.__annotations__) and "rounds" not in AuditOptions.__annotations__
    assert "Unpack[EvaluateOptions]" in str(inspect.signature(api.evaluate).parameters["options"].annotation)
    assert "Unpack[AuditOptions]" in str(inspect.signature(api.audit_recording).parameters["explicit"].annotation)
    assert api.audit_recording.__annotations__["return"] == api.evaluate.__annotations__["return"] == "RunResult"


def test_a_method_options_profile_default_is_declared_once_on_the_option_and_recorded_by_the_run():
    """Issue 50 item 4: a method option's per-profile default lives on its Option (shown in --help) and reaches the
    resolved config (what config.json records), as the method's other profile defaults do; declared twice, refused."""
    from fedaudit.api import run_config
    from fedaudit.methods import METHODS
    from fedaudit.run.options import Option
    from fedaudit.simulation.method import fold_option_profiles

    fedlsi = METHODS["fedlsi"]
    assert fedlsi.options["latent_dim"].profiles == {"quick": 64}
    cfg, _ = run_config("fedlsi", None, None, None, {"dataset": "digits", "attack": "none"})
    assert cfg.profile == "quick" and cfg.method_options["latent_dim"] == 64
    paper, _ = run_config("fedlsi", None, None, None, {"dataset": "digits", "attack": "none", "profile": "paper"})
    assert "latent_dim" not in paper.method_options  # the paper's value is the option's default
    with pytest.raises(TypeError, match="declared twice"):
        fold_option_profiles({"quick": {"method_options": {"k": 2}}}, {"k": Option(1, "k", kind=int, profiles={"quick": 3})},
                             "Twice")
