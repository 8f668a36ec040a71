"""NVFlare's server-side objects as its server fires them (a context naming the site and the task, a task's data
or result as a shareable), to drive fedaudit's recorder without a simulator. Used by tests/test_nvflare.py and by
tests/recordings/record_fixtures.py (which imports it by file, beside the fedaudit of the commit it records: it needs
only NVFlare and torch)."""

from __future__ import annotations

import torch
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_constant import FLContextKey, ReservedKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.app_constant import AppConstants


def context(site: str | None = None, task_id: str = "t", **props) -> FLContext:
    ctx = FLContext()
    ctx.set_prop(ReservedKey.RUN_NUM, "simulate_job", private=False, sticky=False)
    ctx.set_prop(FLContextKey.TASK_NAME, "train", private=True, sticky=False)
    ctx.set_prop(FLContextKey.TASK_ID, task_id, private=True, sticky=False)
    if site is not None:
        peer = FLContext()
        peer.set_prop(ReservedKey.IDENTITY_NAME, site, private=False, sticky=False)
        ctx.set_peer_context(peer)
    for key, value in props.items():
        ctx.set_prop(key, value, private=True, sticky=False)
    return ctx


def shareable(weights: dict[str, torch.Tensor], rnd: int, rc: str = ReturnCode.OK, steps: int = 5) -> Shareable:
    s = DXO(DataKind.WEIGHTS, data={k: v.numpy() for k, v in weights.items()},
            meta={"NUM_STEPS_CURRENT_ROUND": steps}).to_shareable()
    s.set_header(AppConstants.CURRENT_ROUND, rnd)
    s.set_return_code(rc)
    return s
