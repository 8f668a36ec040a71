"""What a run's floating-point numbers depend on beyond its config, and the switch that pins them down.

On a GPU one config can give different numbers from run to run and card to card: cuDNN picks
convolution algorithms (benchmark mode times several and keeps the fastest, some of them
nondeterministic), fp32 convolutions and matmuls may run in TF32 (a 10-bit mantissa) on Ampere and
later, and some kernels accumulate with atomics in whatever order threads arrive. :func:`numerics`
records every such setting in a run's provenance; ``--deterministic`` (:func:`run_numerics`) fixes
them: cuDNN deterministic and not benchmarking, no TF32, torch's deterministic algorithms, cuBLAS's
fixed workspace. An op that has no deterministic CUDA kernel still runs (warn-only: a run is not
stopped in its 30th round by a backward pass) and is named in provenance
(``numerics.nondeterministic_ops``), so a reviewer sees what was and was not pinned.

A CPU run is deterministic for a given build and thread count; the golden numbers (``tests/golden``)
are CPU numbers and a GPU run is not expected to reproduce them bit for bit.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

import torch

# torch's warning when an op without a deterministic kernel runs under warn-only deterministic algorithms
NONDETERMINISTIC_WARNING = "does not have a deterministic implementation"
_NONDETERMINISTIC = re.compile(rf"^(\S+) {NONDETERMINISTIC_WARNING}")
CUBLAS_WORKSPACE = ":4096:8"  # what cuBLAS needs to reduce deterministically (CUDA ≥ 10.2)


def _has_precision_api() -> bool:
    """Whether this torch sets TF32 through ``fp32_precision`` (2.9 and later). Once that API is used, the
    legacy ``allow_tf32`` flags and ``get_float32_matmul_precision`` raise ("mix of the legacy and new
    APIs"), so fedaudit reads and sets TF32 through it where it exists."""
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(torch.backends.cudnn, "conv")


def _tf32() -> dict[str, Any]:
    """TF32 for CUDA matmuls and cuDNN convolutions, as this torch names it."""
    if _has_precision_api():
        return {"matmul_fp32_precision": torch.backends.cuda.matmul.fp32_precision,
                "cudnn_conv_fp32_precision": torch.backends.cudnn.conv.fp32_precision}  # type: ignore[attr-defined]
    return {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32}


# Full fp32 under either API's names (torch's "ieee"; the legacy flags off)
NO_TF32 = {"matmul_fp32_precision": "ieee", "cudnn_conv_fp32_precision": "ieee", "tf32_matmul": False, "tf32_cudnn": False}


def _set_tf32(settings: dict[str, Any]) -> None:
    """Set TF32 from ``settings`` (as :func:`_tf32` names them; extra keys are ignored)."""
    if _has_precision_api():
        torch.backends.cuda.matmul.fp32_precision = settings["matmul_fp32_precision"]
        torch.backends.cudnn.conv.fp32_precision = settings["cudnn_conv_fp32_precision"]  # type: ignore[attr-defined]
    else:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = settings["tf32_matmul"], settings["tf32_cudnn"]


def numerics(device: torch.device) -> dict[str, Any]:
    """The settings the run's numbers depend on, as they are now (recorded in provenance)."""
    out: dict[str, Any] = {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}
    if device.type == "cuda":
        out.update({
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
            "capability": ".".join(map(str, torch.cuda.get_device_capability(device))),
            **_tf32(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            # read by cuBLAS when it makes its handle: in effect only if set before the process's first CUDA matmul
            "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        })
    return out


@contextlib.contextmanager
def run_numerics(deterministic: bool) -> Iterator[list[str]]:
    """Within: the run's numeric settings; yields the list of ops that ran without a deterministic kernel
    (filled only with ``deterministic``). Every setting, ``CUBLAS_WORKSPACE_CONFIG`` included, comes back on
    exit, so a notebook's next run starts from its own."""
    ops: list[str] = []
    if not deterministic:
        yield ops
        return
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, _tf32(),
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    _set_tf32(NO_TF32)
    show = warnings.showwarning

    def note(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: TextIO | None = None,
             line: str | None = None) -> None:
        found = _NONDETERMINISTIC.match(str(message))
        if found:
            if found.group(1) not in ops:
                ops.append(found.group(1))
            return
        show(message, category, filename, lineno, file, line)

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("always", message=f".*{NONDETERMINISTIC_WARNING}")
            warnings.showwarning = note
            yield ops
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2], saved[3]
        _set_tf32(saved[4])
        if saved[5] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[5]
