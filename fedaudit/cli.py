"""The ``fedaudit`` command: a thin typer layer over :mod:`fedaudit.api`.

User errors print one line (``error: ...``) naming the problem and the fix
and exit with status 2; an interrupted run says how to resume it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fedaudit.errors import FedauditError, unknown_choice

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Audit federated domain generalization methods: accuracy, communication and privacy leakage.")

# Consoles are made when used, so they follow the terminal (and tests' COLUMNS).
def console() -> Console:
    return Console()


def err_console() -> Console:
    return Console(stderr=True)

log = logging.getLogger("fedaudit")

USER_ERROR = 2


def fail(message: str) -> None:
    # The message may quote user text (folder and class names): escape it.
    err_console().print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(USER_ERROR)


class RichReporter:
    """Round progress bars, one per target domain."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.progress: Progress | None = None
        self.task = None

    def start_target(self, target: str, rounds: int, done: int) -> None:
        if self.quiet:
            log.info("target %s: rounds %d..%d", target, done + 1, rounds)
            return
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(), console=err_console(), transient=False)
        self.progress.start()
        self.task = self.progress.add_task(f"target {target}: rounds", total=rounds, completed=done, status="")

    def round_done(self, target: str, row: dict[str, Any]) -> None:
        def acc(x: float | None) -> str:  # None: no deployable model after this round
            return "—" if x is None else f"{x:.3f}"

        status = f"val {acc(row['val_mean'])}  unseen {acc(row['target'])}  loss {row['train_loss']:.3f}"
        if self.progress is not None:
            self.progress.update(self.task, advance=1, status=status)
        else:
            log.info("target %s round %d: %s", target, row["round"], status)

    def end_target(self, target: str) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _split(text: str | None) -> tuple[float, float, float] | None:
    if text is None:
        return None
    try:
        parts = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise FedauditError(f"--split must look like 0.5,0.1,0.4 (train,val,holdout), got {text!r}") from None
    if len(parts) != 3:
        raise FedauditError(f"--split needs three fractions train,val,holdout, got {text!r}")
    return parts  # type: ignore[return-value]


def method_flags(args: list[str]) -> list[tuple[str, str]]:
    """Leftover ``--<method>-<option> VALUE`` words → ``[(method, "option=VALUE")]``.

    Every method option has its own flag (``--ccst-k 3``, ``--elcfs-fraction
    0.5``) besides the generic ``--method-option k=3``; which method a flag
    belongs to is checked once the run's method is known.
    """
    from fedaudit.methods import METHODS

    out: list[tuple[str, str]] = []
    words = list(args)
    while words:
        word = words.pop(0)
        if not word.startswith("--") or len(word) == 2:
            raise FedauditError(f"unexpected argument {word!r}; see `fedaudit evaluate --help`")
        name, eq, value = word[2:].partition("=")
        key = name.replace("-", "_")
        owner = next((m for m in sorted(METHODS, key=len, reverse=True)
                      if key.startswith(f"{m}_") and key[len(m) + 1:] in METHODS[m].options), None)
        if owner is None:
            flags = ", ".join(f"--{m}-{o}".replace("_", "-") for m, cls in METHODS.items() for o in cls.options)
            raise FedauditError(f"no such option {'--' + name!r}; see `fedaudit evaluate --help` (method options: {flags})")
        if not eq:
            if not words or (words[0].startswith("--") and len(words[0]) > 2):
                raise FedauditError(f"--{name} needs a value, e.g. --{name} VALUE")
            value = words.pop(0)
        out.append((owner, f"{key[len(owner) + 1:]}={value}"))
    return out


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def evaluate(
    ctx: typer.Context,
    method: Optional[str] = typer.Option(None, help="FedDG method (see `fedaudit list methods`). Default fedavg."),
    attack: Optional[str] = typer.Option(None, help="Attack(s): none, deepinversion, gradinv, mia (or mia-loss, mia-lira, mia-rmia, mia-domain), canary (one-run ε audit; not in all), all, or names joined by commas."),
    dataset: Optional[str] = typer.Option(None, help="shapes, digits, or folder:PATH (DomainBed layout)."),
    target_domain: Optional[str] = typer.Option(None, help="Unseen domain, or 'all' to hold out each in turn."),
    model: Optional[str] = typer.Option(None, help="cnn, resnet18 or resnet50."),
    norm: Optional[str] = typer.Option(None, help="Norm layers: bn, in, gn, xan (gPerXAN)."),
    pretrained: Optional[str] = typer.Option(None, help="Local state_dict for the backbone (.pt/.pth/.safetensors)."),
    image_size: Optional[int] = typer.Option(None, help="Image side in pixels."),
    rounds: Optional[int] = typer.Option(None, help="Communication rounds."),
    local_epochs: Optional[int] = typer.Option(None, help="Local epochs per round."),
    batch_size: Optional[int] = typer.Option(None, help="Local batch size."),
    lr: Optional[float] = typer.Option(None, help="Local learning rate."),
    split: Optional[str] = typer.Option(None, help="train,val,holdout fractions of each source domain (default 0.5,0.1,0.4)."),
    seed: Optional[int] = typer.Option(None, help="Seed for split, initialisation and training."),
    profile: Optional[str] = typer.Option(None, help="quick (CPU, minutes) or paper (the seeds' settings, GPU)."),
    device: Optional[str] = typer.Option(None, help="auto, cpu or cuda."),
    precision: Optional[str] = typer.Option(None, help="fp32 or bf16 (autocast)."),
    out: Optional[str] = typer.Option(None, help="Folder for run directories (default runs/)."),
    keep_artifacts: Optional[bool] = typer.Option(None, "--keep-artifacts/--no-keep-artifacts",
                                                  help="Save every message on the wire as safetensors."),
    attacker: Optional[str] = typer.Option(None, help="Who attacks: server (sees every upload) or client:<domain> (sees its broadcasts)."),
    victim: Optional[str] = typer.Option(None, help="Victim source domain, or 'all' (every source the attacker can target)."),
    inversion_iters: Optional[int] = typer.Option(None, help="DeepInversion optimisation steps (quick 200, paper 2000)."),
    inversion_batch: Optional[int] = typer.Option(None, help="Images synthesised per victim, whole classes (quick 40, paper 256)."),
    inversion_lr: Optional[float] = typer.Option(None, help="DeepInversion Adam learning rate (default 0.1)."),
    inversion_bn_weight: Optional[float] = typer.Option(None, help="Weight of the BN-statistics loss (default 10)."),
    inversion_ce_weight: Optional[float] = typer.Option(None, help="Weight of the cross-entropy on target classes (default 1)."),
    inversion_tv_weight: Optional[float] = typer.Option(None, help="Weight of the TV-L2 image prior (default 1e-3)."),
    inversion_l2_weight: Optional[float] = typer.Option(None, help="Weight of the image L2 prior (default 1e-5)."),
    gradinv_tv_weight: Optional[float] = typer.Option(None, help="Weight of gradinv's TV prior (default 3e-5)."),
    lpips_weights: Optional[str] = typer.Option(None, help="Local AlexNet weights for LPIPS (default: the torch hub cache; never downloaded)."),
    judge_steps: Optional[int] = typer.Option(None, help="Training steps of the auditor's judge classifiers that score reconstructions (default 300)."),
    reference_models: Optional[int] = typer.Option(None, help="Membership inference: reference models per victim (quick 8, paper 64)."),
    reference_epochs: Optional[int] = typer.Option(None, help="At most this many epochs per reference model (quick 10; paper: no cap). They train the target's exposure, rounds x local epochs, if smaller."),
    canaries: Optional[int] = typer.Option(None, help="--attack canary: mislabelled canaries per victim, drawn from its holdout, each trained on with probability 1/2 (default 64)."),
    dp_epsilon: Optional[float] = typer.Option(None, help="Train every client with DP-SGD (Opacus) to this ε per client over all rounds; models switch to --norm gn."),
    dp_delta: Optional[float] = typer.Option(None, help="DP-SGD δ (default 1e-5; must be below 1/records of every client)."),
    dp_max_grad_norm: Optional[float] = typer.Option(None, help="DP-SGD per-sample clipping norm (default 1.0)."),
    dp_sweep: Optional[str] = typer.Option(None, help="Run once per DP-SGD ε, e.g. 1,8,inf (inf: no DP), and write sweep.html with the privacy–utility curve."),
    method_option: Optional[list[str]] = typer.Option(
        None, help="Method-specific NAME=VALUE (repeatable); each also has its own flag --<method>-<name> VALUE, "
                   "e.g. --ccst-style single --ccst-k 3 (see `fedaudit list methods`)."),
    config: Optional[Path] = typer.Option(None, help="TOML file of options; explicit options win."),
    resume: Optional[Path] = typer.Option(None, help="Continue an interrupted run directory from its last round."),
    quiet: bool = typer.Option(False, "--quiet", help="Logs only, no progress bars."),
) -> None:
    """Train a method in a leave-one-domain-out federation, record its wire, attack it, write a run directory."""
    from fedaudit import api, sweep

    _setup_logging(quiet)
    options = dict(attack=attack, dataset=dataset, target_domain=target_domain, model=model, norm=norm,
                   pretrained=pretrained, image_size=image_size, rounds=rounds, local_epochs=local_epochs,
                   batch_size=batch_size, lr=lr, seed=seed, profile=profile, device=device, precision=precision,
                   out=out, keep_artifacts=keep_artifacts, attacker=attacker, victim=victim,
                   inversion_iters=inversion_iters, inversion_batch=inversion_batch, inversion_lr=inversion_lr,
                   inversion_bn_weight=inversion_bn_weight, inversion_ce_weight=inversion_ce_weight,
                   inversion_tv_weight=inversion_tv_weight, inversion_l2_weight=inversion_l2_weight,
                   gradinv_tv_weight=gradinv_tv_weight,
                   lpips_weights=lpips_weights, judge_steps=judge_steps, reference_models=reference_models,
                   reference_epochs=reference_epochs,
                   canaries=canaries, dp_epsilon=dp_epsilon, dp_delta=dp_delta, dp_max_grad_norm=dp_max_grad_norm)
    try:
        options["split"] = _split(split)
        if dp_sweep is not None or (resume is not None and sweep.is_sweep(resume)):
            swept = sweep.sweep_dp(None if dp_sweep is None else sweep.parse_epsilons(dp_sweep), method, resume=resume,
                                   config=config, method_option=method_option, method_flags=method_flags(ctx.args),
                                   reporter=RichReporter(quiet), command=api.command_line(), **options)
            for metrics, run_dir in zip(swept.metrics, swept.run_dirs):
                print_summary(metrics, run_dir)
            console().print(f"DP sweep: {swept.root}\nreport: {swept.report}", highlight=False, markup=False)
            return
        result = api.evaluate(method, config=config, resume=resume, method_option=method_option,
                              method_flags=method_flags(ctx.args),
                              reporter=RichReporter(quiet), command=api.command_line(), **options)
    except FedauditError as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        err_console().print("interrupted; the finished rounds are saved — continue with `fedaudit evaluate --resume RUN_DIR`")
        raise typer.Exit(130) from None
    print_summary(result.metrics, result.run_dir)


def print_summary(metrics: dict[str, Any], run_dir: Path) -> None:
    table = Table(title=f"{metrics['method']} on {metrics['dataset']}")
    for col in ("unseen domain", "unseen acc", "source-val acc", "selected round", "MB up", "MB down"):
        table.add_column(col, justify="left" if col == "unseen domain" else "right")
    acc, comm = metrics["accuracy"], metrics["communication"]
    if metrics["target_domain"] == "all":
        for target, a in acc["per_target"].items():
            c = comm["per_target"][target]
            table.add_row(target, f"{a['unseen_domain']:.3f}", f"{a['source_val_mean']:.3f}", str(a["selected_round"]),
                          f"{c['bytes_up'] / 1e6:.1f}", f"{c['bytes_down'] / 1e6:.1f}")
        table.add_row("[bold]mean[/]", f"[bold]{acc['unseen_domain']:.3f}[/]", f"[bold]{acc['source_val']['mean']:.3f}[/]", "",
                      f"{comm['bytes_up'] / 1e6:.1f}", f"{comm['bytes_down'] / 1e6:.1f}")
    else:
        table.add_row(metrics["target_domain"], f"{acc['unseen_domain']:.3f}", f"{acc['source_val']['mean']:.3f}",
                      str(acc["selected_round"]), f"{comm['bytes_up'] / 1e6:.1f}", f"{comm['bytes_down'] / 1e6:.1f}")
    console().print(table)
    console().print(f"run directory: {run_dir}", highlight=False, markup=False)


@app.command("list")
def list_(what: str = typer.Argument(..., help="methods, attacks or datasets")) -> None:
    """List methods (with what each shares), attacks, or datasets."""
    try:
        _list(what)
    except FedauditError as exc:
        fail(str(exc))


def _list(what: str) -> None:
    if what == "methods":
        from fedaudit.methods import METHODS

        table = Table("method")
        # the shares stay on one line: they are what a reviewer scans this list for
        table.add_column("shares (↑ client→server, ↓ server→client)", no_wrap=True)
        table.add_column("options")
        table.add_column("what it is")
        table.add_column("--dp-epsilon")
        for name, cls in METHODS.items():
            opts = ", ".join(f"--{name}-{k} {v}".replace("_", "-") for k, v in cls.options.items()) or "-"
            dp = f"no: {cls.dp_incompatible}" if cls.dp_incompatible else "yes"
            table.add_row(name, cls.describe_shares(), opts, f"{cls.summary} ({cls.paper})", dp)
    elif what == "attacks":
        from fedaudit.attacks import ATTACKS, NO_ATTACK

        table = Table("attack", "roles", "what it is")
        table.add_row(NO_ATTACK, "-", "no attack: accuracy and communication only")
        for name, cls in ATTACKS.items():
            table.add_row(name, ", ".join(cls.roles), cls.summary)
    elif what == "datasets":
        from fedaudit.data import DATASETS

        table = Table("dataset", "what it is")
        for name, text in DATASETS.items():
            table.add_row(name, text)
    else:
        raise unknown_choice("list", what, ["methods", "attacks", "datasets"])
    console().print(table)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at emit time (tests swap it)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _setup_logging(quiet: bool) -> None:
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.INFO)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="A finished run directory (written by `fedaudit evaluate`)."),
    redact: bool = typer.Option(False, "--redact", help="Blur every embedded reconstruction (the sharp pixels are not written)."),
    risk_thresholds: Optional[Path] = typer.Option(None, help="TOML or JSON file of risk-tier thresholds (keys listed in the report)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where to write (default RUN_DIR/report.html)."),
) -> None:
    """Re-render a run's HTML leakage report from its stored files."""
    from fedaudit.reports import write_report

    try:
        path = write_report(run_dir, output, redact=redact, thresholds=risk_thresholds)
    except FedauditError as exc:
        fail(str(exc))
    console().print(f"report: {path}", highlight=False, markup=False)


@app.command()
def compare(
    run_dirs: list[Path] = typer.Argument(..., help="Finished run directories, one column each."),
    output: Path = typer.Option(..., "-o", "--output", help="The HTML file to write."),
    redact: bool = typer.Option(False, "--redact", help="Blur every embedded reconstruction."),
    risk_thresholds: Optional[Path] = typer.Option(None, help="TOML or JSON file of risk-tier thresholds."),
) -> None:
    """One page comparing runs side by side, with a privacy–utility scatter."""
    from fedaudit.reports import write_compare

    try:
        path = write_compare(run_dirs, output, redact=redact, thresholds=risk_thresholds)
    except FedauditError as exc:
        fail(str(exc))
    console().print(f"comparison: {path}", highlight=False, markup=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
