"""Record what crosses an NVFlare federation, in fedaudit's wire format, from the server alone.

An optional extra (``pip install -e ".[nvflare]"``: NVFlare 2.9); nothing else in fedaudit imports this module.

:class:`FedauditRecorder` is a server-side NVFlare component: it listens to the server's events and records every
task the server sends a site (after the server's output filters: what left), every result a site returns (after
the input filters: what is aggregated) and, when the run ends, the final aggregate as the released model — then
seals the recording. The site scripts need no change: each site runs in its own process (or machine), and the
server sees every message of the run. :func:`add_recorder` installs it on a job built with NVFlare's recipe API::

    recipe = FedAvgRecipe(name="hello-pt", model=Net(), min_clients=2, num_rounds=3, train_script="client.py")
    add_recorder(recipe, "runs/nvflare-hello", architecture={"model": "mypkg.net:Net", "num_classes": 10,
                 "image_size": 32}, data={"records": "auditor-records"})
    recipe.execute(SimEnv(clients=["clean", "colour"]))

Rounds are recorded 1-based (NVFlare's round 0 is round 1), as fedaudit and Flower count them. A site's name is
its NVFlare identity (``SimEnv(clients=[...])``, the site's name in the project), so name each site after the
domain its records come from. A result a site failed to return (any return code but OK) is not recorded: the
audit lists the site and the round on its first screen. A refusal (e.g. the directory holds another run) stops
the job at its start in one line — NVFlare would otherwise log the error and run on unrecorded.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nvflare
import torch
from nvflare.apis.dxo import DataKind, from_shareable
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.abstract.model import ModelLearnableKey
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

from fedaudit.errors import FedauditError
from fedaudit.interop.recording import node_id_for, seal_recording
from fedaudit.interop.recording_writer import LEDGER, SERVER_NODE_ID, RecordingWriter, start_recording, write_manifest
from fedaudit.run.stored.provenance import Framework
from fedaudit.simulation.wire import SERVER, client_role

MODEL, DELTA = "model", "model_delta"  # record names: whole weights, and weight differences (declared model_delta)
EVALUATION_TASKS = ("validate",)  # NVFlare's tasks that send a model to be scored, not trained from


class FedauditRecorder(FLComponent):
    """Records an NVFlare job's traffic on its server (see the module docstring). Its arguments are
    :func:`fedaudit.interop.recording.start_recording`'s, as plain JSON values: NVFlare rebuilds the component
    in the server's process from the job's configuration."""

    def __init__(self, recording: str = "", architecture: dict | None = None, data: dict | None = None,
                 recipe: dict | None = None, prior: dict | None = None, record_kinds: dict | None = None,
                 dp: dict | None = None):
        super().__init__()
        self.recording, self.architecture, self.data = recording, architecture, data
        self.recipe, self.prior, self.record_kinds, self.dp = recipe, prior, record_kinds, dp
        self._lock = threading.Lock()
        self._writer: RecordingWriter | None = None
        self._round_of: dict[tuple[Any, str], int] = {}  # (task id, site) → the round the server sent it in
        self._final: tuple[int, dict[str, torch.Tensor]] | None = None
        self._declared_model = False

    # -- NVFlare's events ----------------------------------------------------------------------------------
    def handle_event(self, event_type: str, fl_ctx: FLContext) -> None:
        try:
            if event_type == EventType.START_RUN:
                self._start(fl_ctx)
            elif self._writer is None:
                return
            elif event_type == EventType.AFTER_TASK_DATA_FILTER:
                self._sent(fl_ctx)
            elif event_type == EventType.AFTER_TASK_RESULT_FILTER:
                self._returned(fl_ctx)
            elif event_type == AppEventType.AFTER_SHAREABLE_TO_LEARNABLE:
                self._aggregated(fl_ctx)
            elif event_type == EventType.END_RUN:
                self._end()
        except Exception as exc:  # NVFlare would log any error and run on, and a recording missing a
            # message must not be sealed as if whole: one line, the job stops, nothing is sealed
            self._writer = None
            why = str(exc) if isinstance(exc, FedauditError) else f"recording failed ({type(exc).__name__}: {exc})"
            self.system_panic(f"fedaudit: {why}", fl_ctx)

    def _start(self, fl_ctx: FLContext) -> None:
        if not self.recording:
            raise FedauditError("FedauditRecorder needs recording=, the directory to record into")
        root = Path(self.recording).expanduser()
        # NVFlare's job id names the job, not the run (the simulator calls every job "simulate_job"), so it is
        # kept in the manifest but not used to tell runs apart: a directory holding any recorded run is refused.
        start_recording(root, architecture=self.architecture, data=self.data, recipe=self.recipe, prior=self.prior,
                        record_kinds={DELTA: "model_delta", **(self.record_kinds or {})}, dp=self.dp,
                        framework=Framework(name="nvflare", version=nvflare.__version__,
                                            job_id=str(fl_ctx.get_job_id()), round_offset=1))
        self._writer = RecordingWriter(root, "server")

    def _sent(self, fl_ctx: FLContext) -> None:
        task = fl_ctx.get_prop(FLContextKey.TASK_DATA)
        site = _site(fl_ctx)
        if not isinstance(task, Shareable) or site is None:
            return
        rnd = _round(task)
        task_id = fl_ctx.get_prop(FLContextKey.TASK_ID)
        with self._lock:
            self._round_of[(task_id, site)] = rnd
        arrays, metrics, kind = _contents(task)
        if arrays is None:
            return
        if kind == DataKind.WEIGHTS and not self._declared_model:  # the global model: its shapes tell whole from part
            write_manifest(self._writer.root, {"model_state": {k: list(v.shape) for k, v in arrays.items()}},
                           mode="join")
            self._writer.reload()
            self._declared_model = True
        node = self._node(site)
        self._writer.message(src_node_id=SERVER_NODE_ID, dst_node_id=node, sender=SERVER, receiver=client_role(site),
                             round=rnd, message_type=_message_type(fl_ctx), message_id=f"task-{task_id}-{site}",
                             arrays={_record(kind): arrays}, metrics=metrics)

    def _returned(self, fl_ctx: FLContext) -> None:
        result = fl_ctx.get_prop(FLContextKey.TASK_RESULT)
        site = _site(fl_ctx)
        task_id = fl_ctx.get_prop(FLContextKey.TASK_ID)
        with self._lock:  # the round the server sent this task in (a site's header is its own claim)
            sent_in = self._round_of.pop((task_id, site), None)
        if not isinstance(result, Shareable) or site is None or result.get_return_code() != ReturnCode.OK:
            return  # a site that failed sent nothing: the audit lists its missed round
        rnd = sent_in if sent_in is not None else _round(result)
        arrays, metrics, kind = _contents(result)
        if arrays is None:
            return
        node = self._node(site)
        self._writer.message(src_node_id=node, dst_node_id=SERVER_NODE_ID, sender=client_role(site), receiver=SERVER,
                             round=rnd, message_type=_message_type(fl_ctx), message_id=f"result-{task_id}-{site}",
                             arrays={_record(kind): arrays}, metrics=metrics)

    def _aggregated(self, fl_ctx: FLContext) -> None:
        model = fl_ctx.get_prop(AppConstants.GLOBAL_MODEL)
        weights = model.get(ModelLearnableKey.WEIGHTS) if model is not None else None
        if weights:
            rnd = fl_ctx.get_prop(AppConstants.CURRENT_ROUND)
            with self._lock:
                self._final = ((int(rnd) + 1) if rnd is not None else 0, {k: _array(v) for k, v in weights.items()})

    def _end(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if self._final is not None:  # the model the job releases: the aggregate after its last round
            rnd, weights = self._final
            writer.release(rnd, weights, record=MODEL)
        if (writer.root / LEDGER).is_file():
            seal_recording(writer.root)

    def _node(self, site: str) -> int:
        node = node_id_for(site)
        self._writer.name_node(node, site)
        return node


def add_recorder(job_recipe: Any, recording: str | Path, /, **manifest: Any) -> FedauditRecorder:
    """Install a :class:`FedauditRecorder` on the server of a job built with NVFlare's recipe API (``FedAvgRecipe``
    and its kin), recording into ``recording``. fedaudit is imported from its installed package on the server
    (NVFlare would otherwise copy its modules into the job one by one)."""
    job = getattr(job_recipe, "_job", None)  # the recipe's FedJob; NVFlare's own recipe utilities add components so
    if job is None or not hasattr(job, "to_server"):
        raise FedauditError(f"add_recorder: {type(job_recipe).__name__} is not an NVFlare recipe (it holds no job); pass "
                            "a recipe such as nvflare.app_opt.pt.recipes.fedavg.FedAvgRecipe")
    component = FedauditRecorder(str(Path(recording).expanduser().resolve()), **manifest)
    job.to_server(component, id="fedaudit_recorder")
    job.set_app_packages(["fedaudit"])
    return component


# -- what a message holds ------------------------------------------------------------------------------------


def _site(fl_ctx: FLContext) -> str | None:
    peer = fl_ctx.get_peer_context()
    return peer.get_identity_name() if peer is not None else None


def _round(shareable: Shareable) -> int:
    """NVFlare's round (0-based, in the message's header) counted from 1."""
    rnd = shareable.get_header(AppConstants.CURRENT_ROUND)
    return int(rnd) + 1 if rnd is not None else 0


def _message_type(fl_ctx: FLContext) -> str:
    task = str(fl_ctx.get_prop(FLContextKey.TASK_NAME) or "train")
    return "evaluate" if task in EVALUATION_TASKS else task


def _record(kind: str) -> str:
    return DELTA if kind == DataKind.WEIGHT_DIFF else MODEL


def _contents(shareable: Shareable) -> tuple[dict[str, torch.Tensor] | None, dict[str, dict[str, Any]], str | None]:
    """(the weights, the numeric meta as metrics, the DXO's data kind); no weights for a message that carries none."""
    try:
        dxo = from_shareable(shareable)
    except Exception:  # NVFlare raises a bare ValueError/TypeError for a shareable without a DXO
        return None, {}, None
    if dxo.data_kind not in (DataKind.WEIGHTS, DataKind.WEIGHT_DIFF) or not isinstance(dxo.data, Mapping):
        return None, {}, dxo.data_kind
    numbers = {k: v for k, v in (dxo.meta or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {k: _array(v) for k, v in dxo.data.items()}, ({"meta": numbers} if numbers else {}), dxo.data_kind


def _array(value: Any) -> torch.Tensor:
    """A copy (the broadcast is one object shared by every site's task: never touched)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    return torch.as_tensor(value).clone()


__all__ = ["FedauditRecorder", "add_recorder"]
