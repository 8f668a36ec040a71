"""Flower's grid in one process, without Ray: a Grid that hands each message to its node's ClientApp directly, so
Flower's own strategies run against ClientApps as in a deployment. Used by tests/test_flower.py and by
tests/recordings/record_fixtures.py (which imports it by file, beside the fedaudit of the commit it records: it needs
only Flower)."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid

SERVER_NODE = 1
NAMES = {101: "clean", 202: "colour"}  # node id → the client's name (a domain of the built-in data)


class FakeGrid(Grid):
    """A Grid that delivers each message to its node's ClientApp in this process."""

    def __init__(self, apps: dict[int, ClientApp], node_configs: dict[int, dict] | None = None):
        self.apps = apps
        self.node_configs = node_configs or {node: {"name": NAMES[node]} for node in apps}
        self.sent: list[Message] = []
        self.replies: list[Message] = []
        self.bytes_by_round: dict[int, int] = {}  # taken at send time: the strategy reuses its config record

    def set_run(self, run) -> None:
        pass

    @property
    def run(self):
        return type("Run", (), {"run_id": 7})()

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.apps)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            ctx = Context(run_id=7, node_id=node, node_config=self.node_configs[node], state=RecordDict(), run_config={})
            out.append(self.apps[node](msg, ctx))
            rnd = int(msg.content.config_records["config"]["server-round"])
            self.bytes_by_round[rnd] = self.bytes_by_round.get(rnd, 0) + array_bytes(msg) + array_bytes(out[-1])
        self.replies += out
        return out


def array_bytes(msg: Message) -> int:
    return sum(a.numpy().nbytes for record in msg.content.array_records.values() for a in record.values())
