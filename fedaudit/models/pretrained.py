"""Load a local state_dict into a Classifier. Nothing is downloaded, nothing is unpickled.

Accepted key layouts (the prefix is detected from the file):
  * this project's ``Classifier.state_dict()``: ``encoder.…`` / ``head.…``;
  * an encoder's own state_dict: ``blocks.…`` (cnn) or ``backbone.…`` (resnet);
  * torchvision's ResNet keys: ``conv1.weight``, ``layer1.0.…``; ``fc.*`` is
    ImageNet's classifier and is ignored.
A ``module.`` prefix (DataParallel) and a ``{"state_dict": …}`` or
``{"model": …}`` wrapper are unwrapped.
"""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError

_PREFIXES = ("", "encoder.", "encoder.backbone.")
_OPTIONAL = ("encoder.proj.", "encoder.mixstyle.")  # not part of a pretrained backbone


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """Read tensors from ``.safetensors`` or a ``torch.save`` file, with ``weights_only=True``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FedauditError(
            f"pretrained weights file {path} does not exist; give a local state_dict (.pt/.pth/.safetensors)"
        )
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(p), device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise FedauditError(
                f"could not read {path} as safetensors ({_first_line(exc)}); save it with safetensors.torch.save_file"
            ) from None
    with p.open("rb") as f:
        head = f.read(4)
    # torch.save writes a zip archive (or, in the legacy format, a pickle stream that opens with its protocol byte)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise FedauditError(
            f"{path} is not a state_dict file (neither a torch.save archive nor .safetensors); give the weights "
            "saved with torch.save(model.state_dict(), path) or safetensors.torch.save_file"
        )
    try:
        # weights_only=True: a checkpoint is data; unpickling arbitrary objects would run code from the file.
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" not in str(exc).lower():  # a broken file, not a forbidden object
            raise FedauditError(
                f"{path} is not a readable state_dict file ({_first_line(exc)}); give the weights saved with "
                "torch.save(model.state_dict(), path) or safetensors.torch.save_file"
            ) from None
        raise FedauditError(
            f"{path} holds pickled Python objects besides tensors, which fedaudit refuses to unpickle; "
            "re-save it with torch.save(model.state_dict(), path) or as .safetensors"
        ) from None
    except Exception as exc:
        raise FedauditError(
            f"could not read pretrained weights file {path} ({_first_line(exc)}); "
            "give a state_dict saved with torch.save or safetensors"
        ) from None
    if isinstance(obj, Mapping):
        for wrapper in ("state_dict", "model"):  # common training-checkpoint layouts
            if isinstance(obj.get(wrapper), Mapping):
                obj = obj[wrapper]
                break
    tensors = {k: v for k, v in obj.items() if isinstance(v, Tensor)} if isinstance(obj, Mapping) else {}
    if not tensors:
        raise FedauditError(
            f"{path} holds no state_dict (a dict of names to tensors); save one with torch.save(model.state_dict(), path)"
        )
    return tensors


def _describe(model: nn.Module) -> str:
    return f"arch={getattr(model, 'arch', '?')}, norm={getattr(model, 'norm', '?')}"


def _some(keys: list[str], n: int = 3) -> str:
    return ", ".join(repr(k) for k in keys[:n]) + (", …" if len(keys) > n else "")


def load_pretrained(model: nn.Module, path: str) -> None:
    """Load the local state_dict at ``path`` into ``model`` (a Classifier), in place.

    The encoder's backbone must be complete and shape-exact; the projection
    (``feature_dim``) loads if present. The head loads only if it matches
    exactly; a head for another number of classes is skipped with a warning.
    """
    source = _unwrapped(read_state_dict(path))
    target = model.state_dict()
    where = (path, _describe(model))
    mapped, head = _place(source, _key_prefix(source, target, where), target, where)
    _check_shapes(mapped, target, where)
    _check_encoder_complete(mapped, target, where)
    target_head = {k for k in target if k.startswith("head.")}
    if head and set(head) == target_head and all(v.shape == target[k].shape for k, v in head.items()):
        mapped.update(head)
    elif head:
        warnings.warn(f"the head in {path} does not fit this model's head (other classes or head kind); "
                      "keeping a freshly initialised head", stacklevel=2)
    model.load_state_dict(mapped, strict=False)


def _unwrapped(source: dict[str, Tensor]) -> dict[str, Tensor]:
    """Without DataParallel's ``module.`` prefix, when every key has it."""
    if source and all(k.startswith("module.") for k in source):
        return {k[len("module."):]: v for k, v in source.items()}
    return source


def _key_prefix(source: dict[str, Tensor], target: dict[str, Tensor], where: tuple[str, str]) -> str:
    """Where the file's keys sit in the model: at the top, in the encoder, or in its backbone (torchvision's)."""
    prefix = max(_PREFIXES, key=lambda p: sum(p + k in target for k in source))  # ties keep the first
    if not any(prefix + k in target for k in source):
        raise FedauditError(f"no key in {where[0]} matches this model ({where[1]}): expected keys like "
                            f"{_some(list(target))}, found {_some(list(source))}")
    return prefix


def _place(source: dict[str, Tensor], prefix: str, target: dict[str, Tensor],
           where: tuple[str, str]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The file's weights by model name, the head's apart; a weight with no place in the model is refused."""
    mapped: dict[str, Tensor] = {}
    head: dict[str, Tensor] = {}
    unexpected: list[str] = []
    for key, value in source.items():
        name = prefix + key
        if prefix and key.startswith("fc."):
            continue  # torchvision's ImageNet classifier; our head is task-specific
        if name.startswith("head."):
            head[name] = value
        elif name in target:
            mapped[name] = value
        else:
            unexpected.append(key)
    if unexpected:
        raise FedauditError(
            f"{len(unexpected)} weights in {where[0]} have no place in this model ({where[1]}), "
            f"e.g. {_some(unexpected)}; was it saved for another architecture, norm layer or feature_dim?"
        )
    return mapped, head


def _check_shapes(mapped: dict[str, Tensor], target: dict[str, Tensor], where: tuple[str, str]) -> None:
    for name, value in mapped.items():
        if value.shape != target[name].shape:
            hint = ""
            if name == "encoder.backbone.conv1.weight":
                hint = " (the small-image stem, used for image_size <= 64, has a 3x3 conv1; use image_size > 64 to keep the ImageNet stem)"
            raise FedauditError(
                f"pretrained weight {name!r} in {where[0]} has shape {tuple(value.shape)} but this model "
                f"({where[1]}) expects {tuple(target[name].shape)}{hint}"
            )


def _check_encoder_complete(mapped: dict[str, Tensor], target: dict[str, Tensor], where: tuple[str, str]) -> None:
    missing = [
        k for k in target
        if k.startswith("encoder.") and not k.startswith(_OPTIONAL)
        and not k.endswith("num_batches_tracked") and k not in mapped
    ]
    if missing:
        raise FedauditError(
            f"{where[0]} lacks {len(missing)} of this model's encoder weights ({where[1]}), "
            f"e.g. {_some(missing)}; was it saved for another architecture or norm layer?"
        )


def load_whole_state(model: nn.Module, path: str) -> None:
    """Load the local state_dict at ``path`` into a factory's model, whole and shape-exact (a ``module.`` prefix
    is unwrapped); the first key that does not fit is named."""
    source = _unwrapped(read_state_dict(path))
    target = model.state_dict()
    for key, value in source.items():
        if key not in target:
            raise FedauditError(f"pretrained weight {key!r} in {path} has no place in this model (expected keys like "
                                f"{_some(list(target))}); was it saved for another model?")
        if tuple(value.shape) != tuple(target[key].shape):
            raise FedauditError(f"pretrained weight {key!r} in {path} has shape {tuple(value.shape)} but the model has "
                                f"{tuple(target[key].shape)}")
    missing = [k for k in target if k not in source and not k.endswith("num_batches_tracked")]
    if missing:
        raise FedauditError(f"{path} lacks {len(missing)} of the model's tensors, e.g. {_some(missing)}; give its "
                            "whole state_dict")
    model.load_state_dict(source, strict=False)
