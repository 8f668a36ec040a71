"""Record what crosses a Flower federation, in fedaudit's wire format.

An optional extra (``pip install -e ".[flower]"``); nothing else in fedaudit imports this module.

* :func:`start_recording` writes the recording's manifest (:func:`fedaudit.interop.recording.start_recording`, the
  framework-neutral recorder this module is built on): the Flower version and run id, the model the user
  declares (its state_dict shapes decide what a record is), record names mapped to artifact kinds,
  and the auditor's data per client.
* :func:`recording_mod` is a client mod. List it **first** in ``ClientApp(mods=[...])``: the first
  mod is the outermost, so it sees the message as it arrives and the reply as it finally leaves the
  client, after every other mod (a DP mod's noise included).
* :class:`RecordingGrid` wraps the :class:`~flwr.serverapp.Grid` a strategy runs on and records both
  directions from the ServerApp process.
* :func:`record_released` records the final aggregate the strategy returns as the released model, and
  :func:`seal_recording` ends the run.

Either or both may be installed; when both record a message, the reader keeps the sender's copy.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import flwr
from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable, Mod
from flwr.serverapp import Grid

from fedaudit.errors import FedauditError
from fedaudit.interop.recording import SERVER_NODE_ID, RecordingWriter, seal_recording
from fedaudit.interop.recording_writer import check_fresh
from fedaudit.interop.recording import start_recording as core_start_recording
from fedaudit.run.stored.provenance import Framework
from fedaudit.simulation.wire import SERVER, client_role

ROUND_KEY = "server-round"  # where Flower's strategies put the round (configure_train / configure_evaluate)


def start_recording(root: str | Path, *, run_id: int | None = None, strategy: Any = None, dp_delta: float = 1e-5,
                    **manifest: Any) -> Path:
    """Create ``root`` with its manifest, before the run: :func:`fedaudit.interop.recording.start_recording` with
    Flower's name and version, and ``run_id``, Flower's id of the run (``grid.run.run_id``), which every
    recorded message is then held to: a second ``flwr run`` into the same directory is refused. ``strategy``,
    the strategy the ServerApp runs, records the parameters of Flower's DP wrapper around it, if any (the audit
    reports their ε at ``dp_delta``)."""
    dp = dp_parameters(strategy, dp_delta) if strategy is not None else None
    if dp is not None:
        manifest["dp"] = dp
    return core_start_recording(root, framework=Framework(name="flower", version=flwr.__version__),
                                framework_run_id=run_id, **manifest)


def dp_parameters(strategy: Any, delta: float = 1e-5) -> dict[str, Any] | None:
    """The parameters of Flower's fixed-clipping DP wrapper (client- or server-side) the strategy is, or wraps;
    None when it runs without one. Adaptive clipping is refused: its ε is not accounted here."""
    from flwr.serverapp import strategy as flower

    mechanisms = {flower.DifferentialPrivacyClientSideFixedClipping: "central-dp-client-side-fixed-clipping",
                  flower.DifferentialPrivacyServerSideFixedClipping: "central-dp-server-side-fixed-clipping"}
    adaptive = (flower.DifferentialPrivacyClientSideAdaptiveClipping, flower.DifferentialPrivacyServerSideAdaptiveClipping)
    seen = strategy
    for _ in range(8):  # a wrapper holds the strategy it wraps as .strategy
        if isinstance(seen, adaptive):
            raise FedauditError(f"{type(seen).__name__}: adaptive clipping's ε is not accounted by fedaudit; record "
                                "with a fixed-clipping DP wrapper, or without strategy= (the audit then claims no DP)")
        if type(seen) in mechanisms:
            accountant = getattr(seen, "accountant", None)  # Flower's own accountant, where one was given its δ
            target = getattr(getattr(accountant, "config", None), "target_delta", None)
            return {"mechanism": mechanisms[type(seen)], "noise_multiplier": float(seen.noise_multiplier),
                    "clipping_norm": float(seen.clipping_norm), "num_sampled_clients": int(seen.num_sampled_clients),
                    "delta": float(target if isinstance(target, (int, float)) else delta),
                    "weighted_by_key": getattr(seen.strategy, "weighted_by_key", None),
                    "source": f"Flower {flwr.__version__} {type(seen).__name__}"}
        seen = getattr(seen, "strategy", None)
        if seen is None:
            return None
    return None


def message_round(msg: Message, fallback: int = -1) -> int:
    """The round a message belongs to: ``server-round`` in a config record, else a numeric group id."""
    for record in msg.content.config_records.values():
        if ROUND_KEY in record:
            return int(record[ROUND_KEY])
    group = msg.metadata.group_id
    return int(group) if str(group).isdigit() else fallback


def contents(msg: Message) -> dict[str, Any]:
    """A message's records as plain values: arrays (record → key → ndarray), metrics and configs."""
    content = msg.content
    return {
        "arrays": {name: {key: array.numpy() for key, array in record.items()}
                   for name, record in content.array_records.items()},
        "metrics": {name: dict(record) for name, record in content.metric_records.items()},
        "configs": {name: dict(record) for name, record in content.config_records.items()},
    }


def default_node_name(context: Context) -> str:
    """``name`` from the node's config (``--node-config "name='clean'"``), else ``partition-id``, else the id."""
    config = context.node_config
    return str(config.get("name", config.get("partition-id", context.node_id)))


def recording_mod(root: str | Path, name: Callable[[Context], str] = default_node_name) -> Mod:
    """A client mod recording every message the ClientApp receives and every reply it sends.
    ``name(context)`` names the node (the client's domain, as the auditor's data mapping calls it)."""
    writer = RecordingWriter(root, "client")

    def record_messages(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        me = name(context)
        writer.name_node(context.node_id, me)
        rnd = message_round(msg)
        if msg.has_content():
            writer.message(src_node_id=msg.metadata.src_node_id, dst_node_id=context.node_id,
                           sender=SERVER if msg.metadata.src_node_id == SERVER_NODE_ID else None,
                           receiver=client_role(me), round=rnd, message_type=msg.metadata.message_type,
                           message_id=msg.metadata.message_id, framework_run_id=context.run_id, **contents(msg))
        reply = call_next(msg, context)
        if reply.has_content():
            writer.message(src_node_id=context.node_id, dst_node_id=msg.metadata.src_node_id, sender=client_role(me),
                           receiver=SERVER if msg.metadata.src_node_id == SERVER_NODE_ID else None, round=rnd,
                           message_type=reply.metadata.message_type, message_id=reply.metadata.message_id,
                           framework_run_id=context.run_id, **contents(reply))
        return reply

    return record_messages


class RecordingGrid(Grid):
    """A Grid that records every message its strategy sends and every reply it gets, then delegates."""

    def __init__(self, grid: Grid, root: str | Path):
        self.inner = grid
        self.writer = RecordingWriter(root, "server")
        self._round_of: dict[str, int] = {}  # message id -> round, to file replies under their request's round
        self._calls = 0

    # -- delegated -------------------------------------------------------------------------------------------
    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, content: Any, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def get_nodes(self) -> Iterable[Any]:
        return self.inner.get_nodes()

    # -- recorded --------------------------------------------------------------------------------------------
    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        ids = list(self.inner.push_messages(messages))
        for msg, mid in zip(messages, ids):
            self._record_sent(msg, mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(self.inner.pull_messages(message_ids))
        for reply in replies:
            self._record_reply(reply)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        self._calls += 1
        rounds = {}
        for msg in messages:
            rounds[msg.metadata.dst_node_id] = self._record_sent(msg, msg.metadata.message_id)
        replies = list(self.inner.send_and_receive(messages, timeout=timeout))
        for reply in replies:
            self._record_reply(reply, rounds.get(reply.metadata.src_node_id))
        return replies

    def _record_sent(self, msg: Message, message_id: str) -> int:
        rnd = message_round(msg, fallback=self._calls)
        if message_id:
            self._round_of[message_id] = rnd
        if msg.has_content():
            self.writer.message(src_node_id=SERVER_NODE_ID, dst_node_id=msg.metadata.dst_node_id, sender=SERVER,
                                receiver=None, round=rnd, message_type=msg.metadata.message_type,
                                message_id=message_id or "", framework_run_id=msg.metadata.run_id, **contents(msg))
        return rnd

    def _record_reply(self, reply: Message, rnd: int | None = None) -> None:
        if not reply.has_content():
            return
        rnd = rnd if rnd is not None else self._round_of.get(reply.metadata.reply_to_message_id, message_round(reply))
        self.writer.message(src_node_id=reply.metadata.src_node_id, dst_node_id=SERVER_NODE_ID, sender=None,
                            receiver=SERVER, round=rnd, message_type=reply.metadata.message_type,
                            message_id=reply.metadata.message_id, framework_run_id=reply.metadata.run_id,
                            **contents(reply))


def record_released(root: str | Path, arrays: Any, server_round: int) -> None:
    """Record the model the ServerApp releases — the final aggregate, ``strategy.start(...).arrays`` — after round
    ``server_round``: ``fedaudit audit`` then judges it as the deployed model (without it, the newest broadcast,
    and the report says so)."""
    state = arrays.to_torch_state_dict() if hasattr(arrays, "to_torch_state_dict") else dict(arrays)
    RecordingWriter(root, "server").release(server_round, state)


def one_line_refusals(main: Callable[..., None]) -> Callable[..., None]:
    """Wrap a ServerApp's main so that fedaudit's refusals (a directory that holds another run, a declaration the
    recorder rejects) end the run with one line in Flower's log and exit status 2, not a traceback::

        @app.main()
        @one_line_refusals
        def main(grid, context): ...
    """
    import functools
    from logging import ERROR

    from flwr.common.logger import log

    @functools.wraps(main)
    def guarded(*args: Any, **kwargs: Any) -> None:
        try:
            main(*args, **kwargs)
        except FedauditError as exc:
            log(ERROR, "fedaudit: %s", exc)
            raise SystemExit(2) from None

    return guarded


def telemetry_off() -> None:
    """Flower's anonymous telemetry off for this process and the ones it starts (audits run offline)."""
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"


__all__ = ["RecordingGrid", "check_fresh", "contents", "dp_parameters", "default_node_name", "message_round",
           "one_line_refusals", "record_released",
           "recording_mod", "seal_recording", "start_recording", "telemetry_off"]
