"""The flags of ``evaluate`` and ``audit``, built from the declarations (RunConfig's fields, every registered
attack's and every method's options), with their help panels."""

from __future__ import annotations

import difflib
import inspect
from pathlib import Path
from typing import Any

import typer

from fedaudit.errors import FedauditError
from fedaudit.run.config import DEFAULT_SPLIT
from fedaudit.run.options import Option, flag_of


def refuse_leftovers(args: list[str]) -> None:
    """Words no flag took. Every run, attack and method option is a declared flag, so a leftover is no option at all:
    one line naming it and the nearest flag."""
    if not args:
        return
    word = args[0]
    if not word.startswith("--") or len(word) == 2:
        raise FedauditError(f"unexpected argument {word!r}; see `fedaudit evaluate --help`")
    given = "--" + word[2:].partition("=")[0]
    near = difflib.get_close_matches(given, [flag_of(n) for n in (*declared_options(), *method_options())], n=1)
    raise FedauditError(f"no such option {given!r}" + (f" (did you mean {near[0]}?)" if near else "")
                        + "; see `fedaudit evaluate --help`")


PANELS = {"run": "Run", "training": "Local training", "audit": "Attacker and auditor", "dp": "Defense: DP-SGD (records)",
          "client_dp": "Defense: client-level DP (a client's whole data)",
          "attack": "Attack options (declared by each attack; see `fedaudit list attacks`)"}
PANEL_OF = {
    **dict.fromkeys(("rounds", "local_epochs", "batch_size", "optimizer", "lr", "momentum", "weight_decay", "augment",
                     "split"), "training"),
    **dict.fromkeys(("attacker", "victim", "lpips_weights", "judge_steps"), "audit"),
    **dict.fromkeys(("dp_epsilon", "dp_delta", "dp_max_grad_norm", "dp_augmentations", "dp_noise_to_signal", "dp_max_step_factor", "dp_train", "dp_recipe", "dp_sweep"), "dp"),
    **dict.fromkeys(("client_dp_epsilon", "client_dp_delta", "client_dp_clip"), "client_dp"),
}
def declared_options() -> dict[str, tuple[Option, str]]:
    """Every option ``evaluate`` takes as a flag, with its help panel: the run's own, then each registered attack's."""
    from fedaudit.attacks import attack_options
    from fedaudit.run.config import OPTIONS

    out = {name: (opt, PANEL_OF.get(name, "run")) for name, opt in OPTIONS.items()}
    for name, opt in attack_options().items():
        out.setdefault(name, (opt, "attack"))
    return out


def shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def option_help(opt: Option) -> str:
    """The declaration's help with its defaults, e.g. ``Communication rounds. (default 20; paper 40)``
    (parentheses: rich would read square brackets as markup)."""
    defaults = [f"default {shown(opt.default)}", *(f"{p} {shown(v)}" for p, v in opt.profiles.items())]
    choices = f" Choices: {', '.join(opt.choices)}." if opt.choices else ""
    return f"{opt.help}{choices} ({'; '.join(defaults)})"


def _parameter(name: str, opt: Option, panel: str, help_text: str | None = None) -> inspect.Parameter:
    flag = flag_of(name)
    help_text = help_text or option_help(opt)
    if opt.kind is bool:
        info = typer.Option(None, f"{flag}/--no-{flag[2:]}", help=help_text, rich_help_panel=PANELS[panel])
        annotation: Any = bool | None
    else:
        # A nullable number also takes the word `none` ("no cap"): it arrives as text and its declaration parses it.
        info = typer.Option(None, flag, help=help_text, rich_help_panel=PANELS[panel],
                            metavar=opt.kind.__name__.upper() + ("|none" if opt.nullable else ""))
        annotation = str | None if opt.nullable and opt.kind is not str else opt.kind | None
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)


# Options of the command itself, not of a run.
COMMAND_PARAMETERS = [
    ("split", str | None, typer.Option(None, help="train,val,holdout fractions of each source domain (default "
                                          f"{','.join(f'{f:g}' for f in DEFAULT_SPLIT)}).",
                                          rich_help_panel=PANELS["training"])),
    ("dp_sweep", str | None, typer.Option(None, help="Run once per DP-SGD ε, e.g. 1,8,inf (inf: no DP), and write "
                                             "sweep.html with the privacy–utility curve.", rich_help_panel=PANELS["dp"])),
    ("method_option", list[str] | None, typer.Option(
        None, help="Method-specific NAME=VALUE (repeatable); each also has its own flag --<method>-<name> VALUE, "
                   "e.g. --ccst-style single --ccst-k 3 (see `fedaudit list methods`).")),
    ("model_arg", list[str] | None, typer.Option(
        None, help="KEY=VALUE keyword argument of a --model factory (repeatable; VALUE a JSON scalar or a word).",
        rich_help_panel=PANELS["run"])),
    ("config", Path | None, typer.Option(None, help="TOML file of options (keys are the option names); explicit "
                                            "options win.")),
    ("resume", Path | None, typer.Option(None, help="Continue an interrupted run directory from its last round.")),
    ("quiet", bool, typer.Option(False, "--quiet", help="Log lines only: no progress bars, no tables.")),
    ("json_summary", bool, typer.Option(False, "--json", help="Print the metrics summary (accuracy, traffic, verdict, "
                                        "paths) as JSON on stdout, for scripts; logs stay on stderr.")),
    ("fail_on", str | None, typer.Option(None, "--fail-on", metavar="TIER[:LEVEL]",
                                            help="Exit with status 3 when any verdict row reaches this tier (high or "
                                                 "medium), after every file is written (a CI gate; status 2 stays for "
                                                 "user errors); high:records counts only the rows of one level "
                                                 "(records, client_data, participation). INCONCLUSIVE rows do not "
                                                 "reach it: see --fail-on-inconclusive.")),
    ("fail_on_inconclusive", bool, typer.Option(False, "--fail-on-inconclusive",
                                                help="Also exit with status 3 when a verdict row (of --fail-on's level, "
                                                     "if it names one) is INCONCLUSIVE: a gate that passes only what "
                                                     "the audit could see. NOT ASSESSED rows never fail a gate; an "
                                                     "audit that assessed nothing always does.")),
    ("unverified", bool, typer.Option(False, "--unverified",
                                      help="Audit a recording whose hashes do not match (edited after it was made); "
                                           "the report marks it unverified on its first screen.")),
    ("records", Path | None, typer.Option(None, help="The auditor's records (members/<client>/, holdout/<client>/, "
                                             "unseen/<domain>/): needed where the recording's manifest points "
                                             "outside the recording, which fedaudit never follows by itself.")),
]
AUDIT_ONLY = ("unverified", "records")
# An audit's data and model default to what the recording's manifest declares, not to evaluate's defaults.
AUDIT_HELP = {
    "dataset": "The clients' data where the manifest's is not to be used: shapes, shapes:N, digits or folder:PATH, "
               "split as fedaudit splits it (default: the manifest's data; a path it names outside the recording is "
               "read only when you name it here or with --records).",
    "model": "The architecture the clients trained: cnn, resnet18, resnet50 or PKG.MODULE:CALLABLE (default: the "
             "manifest's; a factory it names is imported only when you pass it here).",
}


METHOD_PANEL = "Method options (each method's own; see `fedaudit list methods`)"


def method_options() -> dict[str, tuple[str, str, Option]]:
    """Every method's options as their flags' parameter names (``ccst_k`` for ``--ccst-k``): (method, option, its
    declaration)."""
    from fedaudit.methods import METHODS

    return {f"{m}_{o}": (m, o, opt) for m, cls in METHODS.items() for o, opt in cls.options.items()}


def _method_parameter(name: str, opt: Option) -> inspect.Parameter:
    """A method option's flag: the words typed go to the method's own declaration, which parses and checks them once
    the run's method is known (a flag of another method is refused there)."""
    info = typer.Option(None, flag_of(name), help=option_help(opt), rich_help_panel=METHOD_PANEL,
                        metavar=opt.kind.__name__.upper())
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=str | None)


def given_method_flags(given: dict[str, Any]) -> list[tuple[str, str]]:
    """The method flags given, taken out of ``given``: ``[(method, "option=VALUE")]``."""
    out = []
    for name, (method, option, _) in method_options().items():
        value = given.pop(name, None)
        if value is not None:
            out.append((method, f"{option}={value}"))
    return out


def evaluate_signature() -> inspect.Signature:
    params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    params += [_parameter(name, opt, panel) for name, (opt, panel) in declared_options().items()]
    params += [_method_parameter(name, opt) for name, (_, _, opt) in method_options().items()]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)
               for name, annotation, info in COMMAND_PARAMETERS if name not in AUDIT_ONLY]
    return inspect.Signature(params)


def audit_signature() -> inspect.Signature:
    """``fedaudit audit RECORDING``: who attacks, the architecture override, where it runs, and every attack option."""
    from fedaudit.interop.audit_recording import AUDIT_OPTIONS

    params = [inspect.Parameter("recording", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Path,
                                default=typer.Argument(..., help="A recording directory (written by fedaudit's Recorder, "
                                                                 "or fedaudit.interop.flower's recording mod and RecordingGrid)."))]
    params += [_parameter(name, opt, panel, AUDIT_HELP.get(name)) for name, (opt, panel) in declared_options().items()
               if name in AUDIT_OPTIONS or panel == "attack"]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation)
               for name, annotation, info in COMMAND_PARAMETERS
               if name in ("model_arg", "quiet", "json_summary", "fail_on", "fail_on_inconclusive", *AUDIT_ONLY)]
    return inspect.Signature(params)


