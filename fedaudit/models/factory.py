"""Your own model: ``--model PKG.MODULE:CALLABLE``, a callable that returns an ``nn.Module``.

fedaudit builds its own architectures (``cnn``, ``resnet18``, ``resnet50``); a team signing off a
deployment audits *its* model. ``--model torchvision.models:mobilenet_v3_small`` or
``--model mypkg.nets:Net`` names a factory: fedaudit imports the module (with the working directory on
``sys.path``, as ``python -m`` would), calls the callable with ``num_classes=`` when its signature takes
it and with the ``--model-arg KEY=VALUE`` pairs, and checks what comes back: an ``nn.Module`` whose
forward maps a batch of images to ``[batch, num_classes]`` logits.

Importing a module runs its code, so fedaudit imports a factory only when the user names it in the
options of the command (or the Python call) being run: never because a file names one — a recording's
manifest, a run's ``config.json`` or a TOML file may *suggest* a factory, and the error says which.

What the attacks need from a model is found, not assumed (:mod:`fedaudit.models.classifier`): layers
with running statistics by their buffers, the head as the last ``nn.Linear``.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedaudit.errors import FedauditError

SEPARATOR = ":"
OWN_NORM = "own"  # the --norm a factory's model is recorded with: the normalisation layers its factory built
FORM = "PKG.MODULE:CALLABLE (e.g. torchvision.models:mobilenet_v3_small)"


def is_factory(name: object) -> bool:
    """Whether a ``--model`` value names a factory rather than one of fedaudit's architectures."""
    return isinstance(name, str) and SEPARATOR in name


@dataclass(frozen=True)
class ModelFactory:
    """A factory named on the command line, and the arguments it is called with."""

    spec: str
    args: Mapping[str, Any]

    def callable(self) -> Callable[..., Any]:
        """The callable, imported (each problem a one-line error naming the value)."""
        module_name, _, attr = self.spec.partition(SEPARATOR)
        if not module_name or not attr or not all(part.isidentifier() for part in [*module_name.split("."), *attr.split(".")]):
            raise FedauditError(f"--model {self.spec!r} is not a model factory's import path; give {FORM}, or one of "
                                "cnn, resnet18, resnet50")
        module = _import(module_name, self.spec)
        obj: Any = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise FedauditError(f"--model {self.spec}: module {module_name} has no attribute {attr!r}; name a "
                                    f"callable that returns an nn.Module ({FORM})")
            obj = getattr(obj, part)
        if not callable(obj):
            raise FedauditError(f"--model {self.spec}: {attr} is a {type(obj).__name__}, not callable; name a function "
                                "or class that returns an nn.Module")
        return obj

    def build(self, num_classes: int) -> nn.Module:
        """A fresh model: the callable called with ``num_classes`` (when it takes it) and the arguments."""
        fn = self.callable()
        kwargs = ({"num_classes": num_classes} if _takes(fn, "num_classes") else {}) | dict(self.args)
        try:
            model = fn(**kwargs)
        except TypeError as exc:
            raise FedauditError(f"--model {self.spec} could not be called with {_show(kwargs)} ({exc}); pass the "
                                "arguments it needs with --model-arg KEY=VALUE") from None
        except Exception as exc:  # the user's factory failed; say so in one line
            raise FedauditError(f"--model {self.spec} raised {type(exc).__name__} when called with {_show(kwargs)}: "
                                f"{exc}") from None
        if not isinstance(model, nn.Module):
            raise FedauditError(f"--model {self.spec} returned a {type(model).__name__}, not a torch nn.Module; "
                                "name a callable that builds the model")
        return model

    def provenance(self) -> dict[str, Any]:
        """What a reader needs to rebuild the model: the import path, the arguments, the module's file and its sha256."""
        try:  # the file that defines the callable (torchvision.models:… lives in torchvision/models/mobilenetv3.py)
            file: str | None = inspect.getsourcefile(inspect.unwrap(self.callable()))
        except TypeError:  # a built-in or C extension: the module's own file
            file = getattr(sys.modules.get(self.spec.partition(SEPARATOR)[0]), "__file__", None)
        digest = hashlib.sha256(Path(file).read_bytes()).hexdigest() if file and Path(file).is_file() else None
        return {"factory": self.spec, "args": dict(self.args), "module_file": file, "sha256": digest}


def _import(module_name: str, spec: str) -> Any:
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:  # a module of the user's project, as `python -m` would find it
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise FedauditError(f"--model {spec}: cannot import {module_name} ({exc}); install the package or run from "
                            "the folder that holds it") from None
    except (Exception, SystemExit) as exc:  # the user's module failed while imported: one line
        raise FedauditError(f"--model {spec}: importing {module_name} raised {type(exc).__name__}: {exc}") from None
    finally:
        if added:
            sys.path.remove(cwd)


def _takes(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _show(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"


@torch.no_grad()
def check_logits(model: nn.Module, spec: str, num_classes: int, image_size: int, channels: int = 3) -> None:
    """The model must map images ``[B, C, H, W]`` to class logits ``[B, num_classes]``: the attacks query it so."""
    was_training = model.training
    model.eval()
    try:
        out = model(torch.zeros(2, channels, image_size, image_size))
    except Exception as exc:  # the user's forward failed on a plain image batch; say so in one line
        raise FedauditError(f"--model {spec} failed on a batch of {channels}×{image_size}×{image_size} images "
                            f"({type(exc).__name__}: {exc}); give a model that takes --image-size {image_size} images") from None
    finally:
        model.train(was_training)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (2, num_classes):
        raise FedauditError(f"--model {spec} returned {shape} for a batch of 2 images; fedaudit needs class logits of "
                            f"shape [batch, {num_classes}] (one per class of the data) from forward")


def parse_model_args(pairs: list[str]) -> dict[str, Any]:
    """``["width=32", "name=\\"a\\""]`` → ``{"width": 32, "name": "a"}``: values are JSON scalars, a bare word a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise FedauditError(f"--model-arg expects KEY=VALUE with KEY a Python name, got {pair!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # a bare word such as `relu`
        if isinstance(value, (dict, list)):
            raise FedauditError(f"--model-arg {key}: give a scalar (number, true/false, null or a word), got {raw!r}")
        out[key.strip()] = value
    return out


__all__ = ["FORM", "OWN_NORM", "ModelFactory", "check_logits", "is_factory", "parse_model_args"]
