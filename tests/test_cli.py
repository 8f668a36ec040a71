"""The command line: user errors are one line with the fix, exit 2, no traceback."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from fedaudit.cli import app
from fedaudit.methods import METHODS

runner = CliRunner()
FAST = ["--dataset", "digits", "--image-size", "16", "--rounds", "1", "--device", "cpu", "--quiet"]


def _user_error(args, *needles):
    result = runner.invoke(app, args)
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text
    assert "error" in text.lower() or "invalid" in text.lower()
    for needle in needles:
        assert needle in text, (needle, text)
    return text


def test_unknown_method_lists_the_valid_ones():
    text = _user_error(["evaluate", "--method", "fedfoo"], "fedfoo", "fedavg", "fedprox")
    assert len([ln for ln in text.splitlines() if ln.strip()]) == 1


def test_markup_in_user_text_is_printed_verbatim():
    _user_error(["evaluate", "--method", "[bold]x[/bold]"], "[bold]x[/bold]")


def test_unknown_dataset_lists_the_valid_ones():
    _user_error(["evaluate", "--dataset", "cifar"], "cifar", "shapes", "digits", "folder:PATH")


def test_bad_shapes_size_names_the_fix_and_list_shows_the_spelling():
    text = _user_error(["evaluate", "--dataset", "shapes:9"], "shapes:9", "shapes:N", "shapes:375")
    assert len([ln for ln in text.splitlines() if ln.strip()]) == 1
    listed = runner.invoke(app, ["list", "datasets"], env={"COLUMNS": "250"})
    assert listed.exit_code == 0 and "shapes:N" in listed.output and "shapes:375" in listed.output


def test_unknown_target_domain_lists_the_domains():
    _user_error(["evaluate", *FAST, "--target-domain", "mars"], "mars", "clean", "all")


def test_missing_folder_says_so(tmp_path):
    _user_error(["evaluate", "--dataset", f"folder:{tmp_path / 'nope'}"], "does not exist")


@pytest.mark.parametrize("args,needle", [
    (["--rounds", "0"], "--rounds"),
    (["--lr", "-1"], "--lr"),
    (["--image-size", "8"], "image"),
    (["--split", "0.5,0.5,0.5"], "--split"),
    (["--precision", "fp8"], "fp32"),
    (["--profile", "slow"], "quick"),
    (["--model", "vgg"], "resnet18"),
    (["--norm", "ln"], "gn"),
    (["--attack", "magic"], "none"),
    (["--method-option", "mu=0.1"], "mu"),  # fedavg has no options
    (["--method", "fedprox", "--method-option", "nu=0.1"], "mu"),
])
def test_values_out_of_range_are_user_errors(args, needle):
    _user_error(["evaluate", *args], needle)


def test_cuda_without_a_gpu_is_a_user_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    _user_error(["evaluate", "--device", "cuda"], "cuda", "--device cpu")


def test_bad_config_file(tmp_path):
    _user_error(["evaluate", "--config", str(tmp_path / "missing.toml")], "does not exist")
    bad = tmp_path / "bad.toml"
    bad.write_text("rounds = [")
    _user_error(["evaluate", "--config", str(bad)], "not valid TOML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("roundz = 3\n")
    _user_error(["evaluate", "--config", str(unknown)], "roundz")


def test_resume_of_a_folder_that_is_not_a_run(tmp_path):
    _user_error(["evaluate", "--resume", str(tmp_path)], "not a fedaudit run directory")


def _write_folder(root, domains):
    rng = np.random.default_rng(0)
    for domain, classes in domains.items():
        for cls in classes:
            d = root / domain / cls
            d.mkdir(parents=True)
            for i in range(6):
                Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(d / f"{i}.png")


def test_folder_with_differing_class_sets_names_the_domains(tmp_path):
    _write_folder(tmp_path, {"art": ["cat", "dog"], "photo": ["cat", "dog"], "sketch": ["cat", "horse"]})
    _user_error(["evaluate", "--dataset", f"folder:{tmp_path}"], "sketch")


def test_folder_run_skips_an_unreadable_image_and_counts_it(tmp_path):
    _write_folder(tmp_path, {"art": ["cat", "dog"], "photo": ["cat", "dog"], "sketch": ["cat", "dog"]})
    (tmp_path / "art" / "cat" / "broken.png").write_bytes(b"not an image")
    out = tmp_path / "runs"
    result = runner.invoke(app, ["evaluate", *FAST, "--dataset", f"folder:{tmp_path}", "--batch-size", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "skipped 1" in result.output.lower() or "1 unreadable" in result.output.lower(), result.output
    (run_dir,) = out.iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["provenance"]["dataset_skipped_files"] == 1


def test_config_file_is_overridden_by_explicit_options(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('dataset = "digits"\nimage-size = 16\nrounds = 3\ndevice = "cpu"\n[method_options]\nmu = 0.5\n')
    out = tmp_path / "runs"
    result = runner.invoke(app, ["evaluate", "--method", "fedprox", "--config", str(cfg), "--rounds", "1", "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (run_dir,) = out.iterdir()
    saved = json.loads((run_dir / "config.json").read_text())["config"]
    assert saved["rounds"] == 1 and saved["dataset"] == "digits" and saved["method_options"] == {"mu": 0.5}


def test_evaluate_prints_the_summary_table(tmp_path):
    result = runner.invoke(app, ["evaluate", *FAST, "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for needle in ("unseen acc", "source-val acc", "MB up", "MB down", "run directory"):
        assert needle in result.output


def test_list_methods_shows_what_each_method_shares():
    result = runner.invoke(app, ["list", "methods"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    for name, cls in METHODS.items():
        line = next(ln for ln in result.output.splitlines() if f" {name} " in ln)
        for kind, _ in cls.shares:
            assert kind.value in line, (name, kind)


def test_list_rejects_unknown_things():
    _user_error(["list", "gadgets"], "methods", "attacks", "datasets")


def test_the_installed_command_runs_without_a_traceback():
    proc = subprocess.run([sys.executable, "-m", "fedaudit.cli", "evaluate", "--method", "nope"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "nope" in proc.stderr


def test_method_options_have_their_own_flags(tmp_path):
    out = tmp_path / "runs"
    result = runner.invoke(app, ["evaluate", "--method", "fedprox", *FAST, "--fedprox-mu", "0.25", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (run_dir,) = out.iterdir()
    assert json.loads((run_dir / "config.json").read_text())["config"]["method_options"] == {"mu": 0.25}


@pytest.mark.parametrize("args,needles", [
    (["--fedprox-mu", "0.1"], ["--fedprox-mu", "method fedprox", "--method fedprox"]),  # flag of another method
    (["--method", "fedprox", "--fedprox-mu"], ["--fedprox-mu needs a value"]),
    (["--method", "fedprox", "--fedprox-nu", "1"], ["no such option", "--fedprox-nu", "--fedprox-mu"]),
    (["--method", "fedprox", "stray"], ["unexpected argument", "stray"]),
    (["--method", "fedprox", "--fedprox-mu", "-1"], ["mu of fedprox must be", "got -1"]),  # still range-checked
])
def test_bad_method_flags_are_user_errors(args, needles):
    _user_error(["evaluate", *FAST, *args], *needles)
