"""The command line: user errors are one line with the fix, exit 2, no traceback."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from fedaudit.cli import app
from fedaudit.methods import METHODS

runner = CliRunner()
FAST = ["--dataset", "digits", "--image-size", "16", "--rounds", "1", "--device", "cpu", "--quiet", "--attack", "none"]


def _user_error(args, *needles):
    result = runner.invoke(app, args)
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text
    assert "error" in text.lower() or "invalid" in text.lower()
    for needle in needles:
        assert needle in text, (needle, text)
    return text


def test_secure_aggregation_with_a_client_attacker_is_refused_before_training():
    _user_error(["evaluate", "--secure-aggregation", "--attacker", "client:clean"], "--secure-aggregation",
                "--attacker server")


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


def test_a_block_failing_its_model_deep_in_a_run_is_one_line_and_the_run_is_never_marked_complete(tmp_path, monkeypatch):
    """Issue 71: a stored block that fails its model after the run directory exists (as NVFlare's framework block
    once did in `audit`) reads as one line, status 2, no traceback; the run stays incomplete, so `--resume` and
    `report` know it for what it is."""
    from fedaudit import pipeline
    from fedaudit.run.stored.provenance import Framework

    def broken(*_args, **_kwargs):
        Framework.model_validate({"name": "x", "undeclared": 1})

    monkeypatch.setattr(pipeline, "store_verdict", broken)
    result = runner.invoke(app, ["evaluate", *FAST, "--out", str(tmp_path)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert "failed its model" in line and "'undeclared'" in line and "--resume" in line, line
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "COMPLETE").exists()


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
    """An unreadable file is skipped and counted; a class folder left without a readable image is accepted, said in a
    warning line and named in the provenance (and the report's); so is a split too thin to rely on."""
    _write_folder(tmp_path, {"art": ["cat", "dog"], "photo": ["cat", "dog"], "sketch": ["cat", "dog"]})
    (tmp_path / "art" / "cat" / "broken.png").write_bytes(b"not an image")
    for f in (tmp_path / "photo" / "dog").iterdir():
        f.unlink()
    out = tmp_path / "runs"
    result = runner.invoke(app, ["evaluate", *FAST, "--dataset", f"folder:{tmp_path}", "--batch-size", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "skipped 1" in result.output.lower() or "1 unreadable" in result.output.lower(), result.output
    (run_dir,) = out.iterdir()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["provenance"]["dataset_skipped_files"] == 1
    assert metrics["provenance"]["dataset_empty_class_folders"] == ["photo/dog"]
    assert "1 class folder(s)" in result.output and "photo/dog" in result.output, result.output
    assert "photo/dog" in (run_dir / "report.html").read_text()
    # six images per class: each client keeps one or two validation records and a few holdout records per class
    thin = metrics["provenance"]["data_warnings"]
    assert any("validation record(s) (fewer than 10)" in w for w in thin), thin
    assert any("fewer than 10 holdout records of 2 class(es)" in w for w in thin), thin
    assert "thin split: client" in result.output


def test_config_file_is_overridden_by_explicit_options(tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text('dataset = "digits"\nimage-size = 16\nrounds = 3\ndevice = "cpu"\n[method_options]\nmu = 0.5\n')
    out = tmp_path / "runs"
    result = runner.invoke(app, ["evaluate", "--method", "fedprox", "--config", str(cfg), "--rounds", "1", "--quiet", "--attack", "none", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (run_dir,) = out.iterdir()
    saved = json.loads((run_dir / "config.json").read_text())["config"]
    assert saved["rounds"] == 1 and saved["dataset"] == "digits" and saved["method_options"] == {"mu": 0.5}


LOUD = [a for a in FAST if a != "--quiet"]


def test_evaluate_prints_the_summary_table(tmp_path):
    result = runner.invoke(app, ["evaluate", *LOUD, "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for needle in ("unseen acc", "source-val acc", "MB up", "MB down", "run directory", "verdict", "report: "):
        assert needle in result.output
    # --quiet: log lines only; --json: the summary for scripts, nothing else on stdout
    quiet = runner.invoke(app, ["evaluate", *FAST, "--out", str(tmp_path / "q")])
    assert quiet.exit_code == 0 and "unseen acc" not in quiet.stdout and "verdict" not in quiet.stdout
    as_json = runner.invoke(app, ["evaluate", *LOUD, "--json", "--out", str(tmp_path / "j")])
    summary = json.loads(as_json.stdout)
    assert summary["method"] == "fedavg" and summary["report"].endswith("report.html")
    assert {row["tier"] for row in summary["verdict"]} == {"not_assessed"}  # --attack none: nothing assessed


def test_list_methods_reads_at_80_columns_and_as_json():
    """Every method's full name, what it shares and its DP column, unclipped at 80 columns and in a pipe."""
    result = runner.invoke(app, ["list", "methods"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    assert "…" not in result.output
    text = " ".join(ln.strip() for ln in lines)
    for name, cls in METHODS.items():
        assert name in lines, name  # the name alone on its line, whole
        block = text[text.index(f" {name} what:"):]
        block = block[: block.index("--client-dp-epsilon:") + 60]
        assert all(f"{kind.value}{'↑' if d == 'up' else '↓'}" in block for kind, d in cls.shares), name
        assert ("--dp-epsilon: yes" in block) == (not cls.dp_incompatible), name
        assert ("--client-dp-epsilon: yes" in block) == (not cls.client_dp_incompatible), name
    listed = json.loads(runner.invoke(app, ["list", "methods", "--json"]).stdout)
    assert [m["name"] for m in listed] == list(METHODS)
    assert {s["kind"] for s in listed[0]["shares"]} == {k.value for k, _ in METHODS[listed[0]["name"]].shares}
    assert "deepinversion" in listed[0]["auto_attacks"]["quick"]


def test_version():
    from fedaudit import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"fedaudit {__version__}"


def test_fail_on_exits_3_only_when_a_verdict_reaches_the_tier(tmp_path, monkeypatch):
    """--fail-on is a CI gate: 3 after every file is written when a row reaches the tier, 0 otherwise;
    2 stays for user errors (a bad tier fails before anything runs)."""
    _user_error(["evaluate", *FAST, "--fail-on", "low", "--out", str(tmp_path)], "--fail-on", "high", "medium")
    assert not any(tmp_path.iterdir())
    clean = runner.invoke(app, ["evaluate", *FAST, "--fail-on", "high", "--out", str(tmp_path / "clean")])
    assert clean.exit_code == 0, clean.output
    from fedaudit import api

    real = api.evaluate

    made = []  # one real run; the gates below read its result again (the gate is the CLI's, after evaluate)

    def with_a_high_row(*args, **kwargs):
        if not made:
            made.append(real(*args, **kwargs))
            made[0].metrics["verdict"].append({"row": "client_data:full_model↑", "title": "full_model ↑", "tier": "high",
                                               "question": "client_data", "level": "client_data", "reason": "x."})
        return made[0]

    monkeypatch.setattr(api, "evaluate", with_a_high_row)
    high = runner.invoke(app, ["evaluate", *FAST, "--fail-on", "high", "--out", str(tmp_path / "high")])
    assert high.exit_code == 3, high.output
    assert "--fail-on high" in high.output
    (run_dir,) = (tmp_path / "high").iterdir()
    assert (run_dir / "COMPLETE").is_file() and (run_dir / "report.html").is_file()  # the gate comes after the files
    medium = runner.invoke(app, ["evaluate", *FAST, "--fail-on", "medium", "--out", str(tmp_path / "medium")])
    assert medium.exit_code == 3
    # limited to one level (issue 47): a HIGH about the client's data as a whole does not trip a records gate
    records = runner.invoke(app, ["evaluate", *FAST, "--fail-on", "high:records", "--out", str(tmp_path / "records")])
    assert records.exit_code == 0, records.output
    data = runner.invoke(app, ["evaluate", *FAST, "--fail-on", "high:client_data", "--out", str(tmp_path / "data")])
    assert data.exit_code == 3
    _user_error(["evaluate", *FAST, "--fail-on", "high:domains", "--out", str(tmp_path / "bad")], "--fail-on level",
                "records", "client_data", "participation")


def test_a_failure_before_round_one_leaves_no_run_directory(tmp_path):
    """--pretrained on random bytes: one line saying it is not a state_dict file, exit 2, and no orphan run
    directory for report/compare/--resume to trip over."""
    junk = tmp_path / "weights.pt"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    out = tmp_path / "runs"
    _user_error(["evaluate", *FAST, "--pretrained", str(junk), "--out", str(out)], "not a state_dict file")
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(("saved", "needle"), [([1, 2, 3], "holds no state_dict"),
                                                ({"model": {"w": 1.0}}, "holds no state_dict"),
                                                ({"w": "tensor"}, "no key in")])
def test_pretrained_weights_that_do_not_fit_are_refused_before_any_folder_or_log_line(tmp_path, saved, needle):
    """Issue 56: a readable file that is no state_dict for the model is refused before the run directory (or --out)
    exists and before the run says anything else — one line, status 2."""
    import torch

    weights = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(2)} if saved == {"w": "tensor"} else saved, weights)
    out = tmp_path / "runs"
    text = _user_error(["evaluate", *[a for a in FAST if a != "--quiet"], "--pretrained", str(weights),
                        "--out", str(out)], needle)
    assert not out.exists() and "run directory" not in text and len(text.strip().splitlines()) == 1, text


def test_list_rejects_unknown_things():
    _user_error(["list", "gadgets"], "methods", "attacks", "datasets")


def test_method_options_have_their_own_flags(tmp_path):
    out = tmp_path / "runs"
    result = runner.invoke(app, ["evaluate", "--method", "fedprox", *FAST, "--fedprox-mu", "0.25", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (run_dir,) = out.iterdir()
    assert json.loads((run_dir / "config.json").read_text())["config"]["method_options"] == {"mu": 0.25}


@pytest.mark.parametrize("args,needles", [
    (["--fedprox-mu", "0.1"], ["--fedprox-mu", "method fedprox", "--method fedprox"]),  # flag of another method
    (["--method", "fedprox", "--fedprox-mu"], ["--fedprox-mu", "requires an argument"]),  # as every other flag
    (["--method", "fedprox", "--fedprox-nu", "1"], ["no such option", "--fedprox-nu", "did you mean --fedprox-mu"]),
    (["--method", "fedprox", "stray"], ["unexpected argument", "stray"]),
    (["--method", "fedprox", "--fedprox-mu", "-1"], ["--fedprox-mu must be between 0 and 100", "got -1"]),  # still range-checked
])
def test_bad_method_flags_are_user_errors(args, needles):
    _user_error(["evaluate", *FAST, *args], *needles)


def test_every_method_option_is_a_flag_in_evaluate_help():
    """Method options are declared like attack options: each is a flag of its own, listed in --help with its help
    and default (issue 50)."""
    from fedaudit.methods import METHODS

    result = runner.invoke(app, ["evaluate", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for method, cls in METHODS.items():
        for name, _opt in cls.options.items():
            flag = f"--{method}-{name}".replace("_", "-")
            assert flag in result.output, flag
    assert "Method options" in result.output and "proximal weight" in result.output


def test_an_option_of_an_attack_not_selected_is_checked_and_said_to_do_nothing(caplog):
    """A bad value is an error whether or not its attack runs; a good one that nothing takes says so in a line."""
    from fedaudit.api import run_config

    _user_error(["evaluate", "--canaries", "-3", *FAST], "--canaries must be between 2 and 100000, got -3")
    with caplog.at_level("WARNING", logger="fedaudit"):
        run_config("fedavg", None, None, None, {"attack": "mia-loss", "canaries": 10, "dataset": "digits"})
    assert caplog.text.count("--canaries has no effect in this run: none of its attacks (--attack mia-loss) takes it") == 1
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedaudit"):
        run_config("fedavg", None, None, None, {"attack": "canary", "canaries": 10, "dataset": "digits"})
    assert "no effect" not in caplog.text


def test_the_console_verdict_shows_each_rows_deciding_number_in_80_columns(monkeypatch, capsys):
    """Issue 36: every row's short form (written from its facts, not cut) fits an 80-column terminal beside its tier;
    no line is cut with an ellipsis, and a significant row shows its attack, number and p."""
    import json
    from pathlib import Path

    from rich.console import Console

    from fedaudit.cli import output

    metrics = json.loads((Path(__file__).parent / "golden" / "fedavg.json").read_text())
    monkeypatch.setattr(output, "console", lambda: Console(width=80, color_system=None))
    output.print_verdict(metrics, Path("/nonexistent"))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(len(line) <= 80 and not line.rstrip().endswith("…") for line in lines), out
    for row in metrics["verdict"]:
        assert row["short"] in out, row["short"]
    upload = next(r for r in metrics["verdict"] if r["row"] == "membership:full_model↑")
    assert upload["tier"] == "medium" and upload["short"] in out  # the upload's membership row, significant:
    assert re.fullmatch(r"[\w\- ]+ adv \d\.\d\d > null \d\.\d\d, p[<=]?\s?[\d.]+", upload["short"])  # attack, number, null, p


# -- issue 56: the headline never reads lower than what is unknown -------------------------------------------------

UNDECIDED_VERDICT = [
    {"row": "consistency:broadcasts", "title": "broadcasts", "tier": "low", "question": "consistency",
     "level": "records", "reason": "the same model to every client.", "short": "same model"},
    *({"row": f"membership:{a}", "title": f"{a}: membership", "tier": "inconclusive", "question": "membership",
       "level": "records", "reason": "no power.", "short": "can't see <0.17"} for a in ("full_model↑", "global_model")),
    {"row": "participation:global_model", "title": "participation", "tier": "inconclusive",
     "question": "participation", "level": "participation", "reason": "no power.", "short": "can't see <0.25"},
    {"row": "scalars↑", "title": "scalars", "tier": "not_assessed", "question": "inversion", "level": "records",
     "reason": "not applicable.", "short": "not applicable"},
]


def test_the_headline_never_reads_low_while_rows_are_undecided_and_a_gate_can_fail_on_them(tmp_path, monkeypatch):
    """A recording's only LOW row beside three INCONCLUSIVE ones (the Flower quickstart's case): the terminal, --json
    and the report's first screen say LOW only 'where decided' and count what is not; --fail-on does not fail on
    INCONCLUSIVE, --fail-on-inconclusive does (limited to --fail-on's level where it names one)."""
    from fedaudit import api

    real = api.evaluate

    made = []  # one real run (into "shown"); --json and the gates read its result again (they are the CLI's)

    def undecided(*args, **kwargs):
        if not made:
            result = real(*args, **kwargs)
            result.metrics["verdict"] = UNDECIDED_VERDICT
            stored = result.run_dir / "metrics.json"
            stored.write_text(json.dumps(json.loads(stored.read_text()) | {"verdict": UNDECIDED_VERDICT}))
            made.append(result)
        return made[0]

    monkeypatch.setattr(api, "evaluate", undecided)
    loud = [a for a in FAST if a != "--quiet"]
    shown = runner.invoke(app, ["evaluate", *loud, "--out", str(tmp_path / "shown")], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "verdict: LOW where decided; 3 questions inconclusive, 1 not assessed" in shown.output
    summary = json.loads(runner.invoke(app, ["evaluate", *FAST, "--json", "--out", str(tmp_path / "json")]).stdout)
    assert summary["headline"] == {"words": "LOW where decided; 3 questions inconclusive, 1 not assessed",
                                   "decided": "low", "inconclusive": 3, "not_assessed": 1}
    (run_dir,) = (tmp_path / "shown").iterdir()
    assert runner.invoke(app, ["report", str(run_dir)]).exit_code == 0
    page = (run_dir / "report.html").read_text(encoding="utf-8")
    first = page[page.index('id="summary"'):page.index("</section>", page.index('id="summary"'))]
    assert re.search(r'class="tier tier-inconclusive">LOW</span> where decided; 3 questions inconclusive, '
                     r'1 not assessed', first), first
    gates = {"--fail-on medium": 0, "--fail-on-inconclusive": 3, "--fail-on medium --fail-on-inconclusive": 3,
             "--fail-on high:participation --fail-on-inconclusive": 3,
             "--fail-on high:client_data --fail-on-inconclusive": 0}
    for i, (flags, status) in enumerate(gates.items()):
        result = runner.invoke(app, ["evaluate", *FAST, *flags.split(), "--out", str(tmp_path / f"gate{i}")])
        assert result.exit_code == status, (flags, result.output)
        assert status == 0 or "INCONCLUSIVE" in result.output


def test_every_flag_of_every_command_reads_whole_in_its_help_at_80_columns():
    """Issue 56: rich's option tables cut names at 80 columns (--secure-aggregati…); the help is plain text in
    sections now, so every flag (and its negative form) a command declares appears whole, every line fits, and the
    common flags come first."""
    import typer.main

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, result.output
        text = result.output
        assert max(len(line) for line in text.splitlines()) <= 80, (name, text)
        for param in command.params:
            for flag in (*param.opts, *param.secondary_opts):
                if flag.startswith("-"):
                    assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (name, flag)
            rows = [line for line in text.splitlines()
                    if re.match(rf"  {re.escape((param.opts or [''])[0])}(?:[ ,/]|$)", line)]
            assert len(rows) == 1 or param.param_type_name == "argument", (name, param.name, rows)  # listed once
    usage = runner.invoke(app, ["evaluate", "--help"], env={"COLUMNS": "80"}).output
    first = usage.index("Common options:")
    assert first < usage.index("Run:") and all(first < usage.index(f"{f} ") < usage.index("Run:")
                                               for f in ("--method", "--dataset", "--attack", "--fail-on"))


def test_every_command_help_exits_0_through_the_installed_entry_point():
    """Issue 70: `fedaudit evaluate --help` crashed on a fresh machine (typer 0.29 builds its commands on its own copy
    of click) while CliRunner-based tests of the same app were the only guard. Here every command's --help runs as a
    user runs it — the `fedaudit` script pip installed, in a process of its own, at 80 columns — and must exit 0 with
    its usage and no traceback. Beside them, `python -m fedaudit.cli` with a user error: one line, exit 2."""
    import os
    import sysconfig
    from pathlib import Path

    import typer.main

    # this environment's script, not whichever `fedaudit` PATH finds first (another install would be tested instead)
    script = Path(sysconfig.get_path("scripts")) / "fedaudit"
    assert script.exists(), f"no {script}: install fedaudit into this environment as the README says"
    commands = ["", *typer.main.get_command(app).commands]  # "" is `fedaudit --help`
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    runs = {name: subprocess.Popen([script, *([name] if name else []), "--help"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, env=env) for name in commands}
    user_error = subprocess.Popen([sys.executable, "-m", "fedaudit.cli", "evaluate", "--method", "nope"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for name, process in runs.items():
        out, _ = process.communicate(timeout=300)
        assert process.returncode == 0 and "Traceback" not in out, (name or "fedaudit", out[-2000:])
        assert f"Usage: fedaudit {name}".rstrip() in out, (name, out[:500])
    _, err = user_error.communicate(timeout=300)
    assert user_error.returncode == 2 and "Traceback" not in err and "nope" in err, err[-2000:]


def test_compare_says_it_needs_two_runs_before_asking_where_to_write(tmp_path):
    """Issue 56: one run directory is refused for what it is (one run's page is its report), not for a missing -o;
    two without -o name the flag with the command to type."""
    _user_error(["compare", str(tmp_path)], "compare needs two or more run directories, got 1",
                f"fedaudit report {tmp_path}")
    _user_error(["compare", str(tmp_path), str(tmp_path)], "give its path with -o FILE")
