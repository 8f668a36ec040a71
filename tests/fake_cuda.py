"""fedaudit's CUDA branches on a machine without a GPU: ``with fake_cuda(): ...``.

Inside, a tensor on "cuda" is a :class:`~torch._subclasses.fake_tensor.FakeTensor`: a shape, a dtype,
strides and a device but no data, and every op on it runs its CUDA dispatch — the layouts cuDNN asks about
(``channels_last`` inside ``vmap``, the crash of issue 38), bf16 autocast's casts, and a CPU tensor met by
a CUDA one (a misplaced attack input) fail here as on a GPU. CPU tensors stay real and compute for real
(masks, seeds, bookkeeping), as the host does beside a GPU. Faking stops at whichever comes first:

* the first read of a CUDA value on the host — ``.item()``, ``float()``, ``.tolist()``, a tensor in an
  ``if``, ``nonzero``, a copy into a real CPU tensor: the places a GPU run synchronises;
* the first backward pass: autograd's engine asks the driver for the device's primary context, which
  no CPU machine has ("hasPrimaryContext expects a valid device index");
* an op torch has no fake kernel for (MixStyle's Beta draw, ``_sample_dirichlet``).

So every forward pass of a CUDA branch runs here, and no optimisation step does. Each test says where
its code stops and checks everything up to there.

For the duration the harness stands in for the driver, and only for it:

* CUDA's lazy initialisation does nothing (``torch.cuda.is_available`` stays False: C++ would then
  initialise the driver for real), and autocast's CUDA checks pass (bf16 counts as supported), so
  ``--precision bf16`` runs its autocast branch instead of silently switching autocast off;
* ``torch.cuda.synchronize`` does nothing (there is no stream to wait for) and the device is named "fake";
* ``torch.Generator(device="cuda")`` is a CPU generator (a CUDA generator needs a driver; fake ops only
  need one to exist), and ``fork_rng`` over "cuda" saves and restores nothing;
* ``torch.utils.swap_tensors`` forgets the mode's weak memo of converted tensors before it swaps:
  ``module.to(...)`` swaps fake parameters, and swapping refuses tensors that something holds weakly.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor,
                                          FakeTensorMode)
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

HOST_READS = (DataDependentOutputException, DynamicOutputShapeException)
CUDA = torch.device("cuda")
PROJECT = Path(__file__).resolve().parents[1]
# The project's own code, by its packages: a virtual environment inside the checkout (.venv/…/site-packages/torch)
# lies under PROJECT too, so a path prefix alone would take torch's frames for ours.
OWN_PACKAGES = tuple(PROJECT / room for room in ("fedaudit", "methods", "attacks", "reports", "examples"))


class _CpuGenerator(torch.Generator):
    """``torch.Generator(device=...)`` that hands out a CPU generator for CUDA."""

    def __new__(cls, device: str | torch.device = "cpu"):
        return super().__new__(cls, "cpu" if torch.device(device).type == "cuda" else device)

    def __init__(self, device: str | torch.device = "cpu") -> None:
        pass


def _is_cuda(x: object) -> bool:
    return (isinstance(x, FakeTensor) or (isinstance(x, torch.device) and x.type == "cuda")
            or (isinstance(x, str) and x.startswith("cuda")))


class FakeCudaMode(FakeTensorMode):
    """FakeTensorMode for ops that touch CUDA (a fake tensor, or a "cuda" device argument); every other op
    runs for real. The choice is made for the ops the program issues, not for those the mode issues itself
    while it fakes one (``_depth``).

    A copy of a CUDA tensor into a real CPU tensor is a device-to-host transfer: it stops faking, or, with
    ``count_host_copies``, is counted in :attr:`host_copies` (as ``(op, bytes)``) and leaves the CPU tensor as
    it was. Pinned host memory needs the driver: it is ordinary memory here, and each request
    (``torch.empty(..., pin_memory=True)``, ``x.pin_memory()`` on any thread) is counted in :attr:`pinned`."""

    _depth = 0

    def __init__(self, *, count_host_copies: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.count_host_copies = count_host_copies
        self.host_copies: list[tuple[str, int]] = []
        self.pinned = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._depth == 0:
            if not any(_is_cuda(x) for x in pytree.tree_leaves((args, kwargs))):
                if kwargs.get("pin_memory"):
                    self.pinned += 1
                    kwargs = {**kwargs, "pin_memory": False}
                with _disable_current_modes():
                    return func(*args, **kwargs)
            schema = func._schema.arguments
            written = [a for a, spec in zip(args, schema) if spec.alias_info is not None and spec.alias_info.is_write]
            written += [kwargs[s.name] for s in schema if s.name in kwargs and s.alias_info is not None
                        and s.alias_info.is_write]
            if (self.count_host_copies and func is torch.ops.aten._to_copy.default and isinstance(args[0], FakeTensor)
                    and torch.device(kwargs.get("device") or args[0].device).type == "cpu"):  # x.cpu()
                self.host_copies.append((str(func), args[0].numel() * args[0].element_size()))
                with _disable_current_modes():
                    return torch.empty(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype)
            real = [w for w in written if isinstance(w, torch.Tensor) and not isinstance(w, FakeTensor)]
            if real:  # a CUDA value written into a real CPU tensor
                if not self.count_host_copies:
                    raise DataDependentOutputException(func)
                self.host_copies.append((str(func), sum(w.numel() * w.element_size() for w in real)))
                return real[0]
        self._depth += 1
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self._depth -= 1


class _Event:
    """``torch.cuda.Event`` without a driver: nothing to record, nothing to wait for."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


@contextlib.contextmanager
def fake_cuda(count_host_copies: bool = False) -> Iterator[FakeCudaMode]:
    mode = FakeCudaMode(allow_non_fake_inputs=True, count_host_copies=count_host_copies)
    swap = torch.utils.swap_tensors

    def swap_forgetting_memo(t1, t2):
        mode.fake_tensor_converter.meta_converter.tensor_memo.clear()
        return swap(t1, t2)

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch("torch.cuda._lazy_init", lambda: None))
        stack.enter_context(mock.patch("torch.cuda.amp.common.amp_definitely_not_available", lambda: False))
        stack.enter_context(mock.patch("torch.cuda.is_bf16_supported", lambda *a, **k: True))
        stack.enter_context(mock.patch("torch.cuda.synchronize", lambda *a, **k: None))
        stack.enter_context(mock.patch("torch.cuda.get_device_name", lambda *a, **k: "fake"))
        stack.enter_context(mock.patch("torch.Generator", _CpuGenerator))
        stack.enter_context(mock.patch("torch.cuda.Event", _Event))

        def pin_memory(tensor, *args, **kwargs):  # patched on the class: worker threads pin too (modes are per thread)
            mode.pinned += 1
            return tensor

        stack.enter_context(mock.patch.object(torch.Tensor, "pin_memory", pin_memory))
        stack.enter_context(mock.patch("torch.cuda.get_rng_state", lambda *a, **k: torch.get_rng_state()))
        stack.enter_context(mock.patch("torch.cuda.set_rng_state", lambda *a, **k: None))
        stack.enter_context(mock.patch("torch.utils.swap_tensors", swap_forgetting_memo))
        stack.enter_context(mode)
        yield mode


def is_own_code(filename: str) -> bool:
    path = Path(filename).resolve()
    return any(path.is_relative_to(room) for room in OWN_PACKAGES)


def stopped_at(exc: BaseException) -> str:
    """``file:function`` of the innermost frame of fedaudit's own code (not torch's) when ``exc`` was raised."""
    ours = [f for f in traceback.extract_tb(exc.__traceback__) if is_own_code(f.filename)]
    if not ours:
        return "<outside fedaudit>"
    last = ours[-1]
    return f"{Path(last.filename).name}:{last.name}"


# Where faking stops, told by torch's words: a backward pass on CUDA, .numpy() of a CUDA value, and an op
# that has no fake kernel (torch then tries the real one, which needs the driver).
STOPS = {"hasPrimaryContext expects a valid device index": "backward",
         ".numpy() is not supported for tensor subclasses": "read",
         "there was no fake impl or Meta kernel registered": "unfaked"}


def _stop_kind(exc: BaseException | None) -> str | None:
    while exc is not None:
        kind = next((kind for words, kind in STOPS.items() if words in str(exc)), None)
        if kind is not None:
            return kind
        exc = exc.__context__
    return None


def run_faked(fn, *args, **kwargs) -> str:
    """Run ``fn`` under :func:`fake_cuda` until faking stops; return where: ``"read file:function"`` (a host
    read), ``"backward file:function"`` (the first backward pass) or ``"completed"``. Any other error (a
    layout the device cannot take, a tensor on the wrong device) propagates and fails the test."""
    with fake_cuda():
        try:
            fn(*args, **kwargs)
        except HOST_READS as exc:
            return f"read {stopped_at(exc)}"
        except (RuntimeError, NotImplementedError) as exc:
            kind = _stop_kind(exc)
            if kind is None:
                raise
            return f"{kind} {stopped_at(exc)}"
    return "completed"
