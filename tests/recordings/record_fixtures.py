"""Make the long-lived recording fixtures (issue 71): one small federation recorded by each of fedaudit's recorders —
the hand-written PyTorch loop (``Recorder``), Flower (``recording_mod`` on the clients, ``RecordingGrid`` on the
server, Flower's own FedAvg strategy) and NVFlare (``FedauditRecorder``, driven by NVFlare's own objects as its
server fires them).

Run it with the fedaudit of the commit to keep, from this repository's root, in an environment with the extras::

    git worktree add /tmp/at-COMMIT COMMIT
    PYTHONPATH=/tmp/at-COMMIT python tests/recordings/record_fixtures.py tests/recordings/COMMIT

It uses only the recorders' public API, which has not changed since the recordings' format was first written, and
nothing of the test modules (it drives Flower and NVFlare as tests/test_flower.py and tests/test_nvflare.py do, with
its own few lines), so this one script makes the fixtures of any commit. The federation is two clients (``clean``, ``colour``) and two
rounds of a 16-pixel ``PlainCNN`` (tests/user_models.py, width 4: ~0.6k parameters) trained on fixed random inputs: the
fixtures hold the recorders' formats, not a finding.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.append(str(Path(__file__).resolve().parents[2]))  # after PYTHONPATH: the recorded commit's fedaudit comes first
from tests.user_models import PlainCNN  # the factory the audit imports (--model tests.user_models:PlainCNN)

CLIENTS = ("clean", "colour")
ROUNDS = 2
SIZE = 16
FACTORY = "tests.user_models:PlainCNN"
MANIFEST = {"architecture": {"model": FACTORY, "args": {"width": 4}, "num_classes": 10, "image_size": SIZE},
            "data": {"dataset": "digits", "seed": 0, "target_domain": "textured"},
            "recipe": {"lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "batch_size": 8, "local_epochs": 1,
                       "rounds": ROUNDS, "augment": False}}


def initial() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return PlainCNN(width=4).state_dict()


def local_round(state: dict[str, torch.Tensor], client: str, rnd: int) -> dict[str, torch.Tensor]:
    """A client's round: two SGD steps on its own fixed inputs (seeded by client and round)."""
    model = PlainCNN(width=4)
    model.load_state_dict(state)
    gen = torch.Generator().manual_seed(1000 * rnd + CLIENTS.index(client))
    x, y = torch.randn(8, 3, SIZE, SIZE, generator=gen), torch.randint(0, 10, (8,), generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(2):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def mean(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([s[k] for s in states]).mean(0) for k in states[0]}


def record_plain(root: Path) -> None:
    from fedaudit.interop.recording import Recorder

    recorder = Recorder(root, model=PlainCNN(width=4), **MANIFEST)
    state = initial()
    for rnd in range(1, ROUNDS + 1):
        uploads = []
        for client in CLIENTS:
            recorder.send(rnd, "server", client, state)
            uploads.append(local_round(state, client, rnd))
            recorder.send(rnd, client, "server", uploads[-1])
        state = mean(uploads)
    recorder.release(state)
    recorder.close()


def record_flower(root: Path) -> None:
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid
    from flwr.serverapp.strategy import FedAvg
    from flwr.supercore.task_identity import TaskIdentity

    from fedaudit.interop.flower import RecordingGrid, record_released, recording_mod, seal_recording, start_recording

    names = {101: "clean", 202: "colour"}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, 1  # a ServerApp process's identity
    app = ClientApp(mods=[recording_mod(root)])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rnd = int(msg.content["config"]["server-round"])
        state = local_round(msg.content["arrays"].to_torch_state_dict(), names[context.node_id], rnd)
        return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord({"num-examples": 8})}),
                       reply_to=msg)

    class InProcessGrid(Grid):
        """Delivers each message to its node's ClientApp in this process (as tests/test_flower.py's FakeGrid)."""

        def set_run(self, run) -> None:
            pass

        @property
        def run(self):
            return type("Run", (), {"run_id": 7})()

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
            return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

        def get_node_ids(self):
            return list(names)

        def push_messages(self, messages):
            raise NotImplementedError

        def pull_messages(self, message_ids):
            raise NotImplementedError

        def send_and_receive(self, messages, *, timeout=None):
            return [app(m, Context(run_id=7, node_id=m.metadata.dst_node_id,
                                   node_config={"name": names[m.metadata.dst_node_id]}, state=RecordDict(),
                                   run_config={})) for m in messages]

    start_recording(root, run_id=7, model=PlainCNN(width=4), **MANIFEST)
    result = FedAvg(fraction_evaluate=0.0, min_available_nodes=2).start(
        grid=RecordingGrid(InProcessGrid(), root), initial_arrays=ArrayRecord(initial()), num_rounds=ROUNDS,
        train_config=ConfigRecord({"lr": 0.05}))
    record_released(root, result.arrays, ROUNDS)  # as examples/flower_digits/run.py ends its ServerApp
    seal_recording(root)


def record_nvflare(root: Path) -> None:
    from nvflare.apis.dxo import DXO, DataKind
    from nvflare.apis.event_type import EventType
    from nvflare.apis.fl_constant import FLContextKey, ReservedKey, ReturnCode
    from nvflare.apis.fl_context import FLContext
    from nvflare.app_common.abstract.model import make_model_learnable
    from nvflare.app_common.app_constant import AppConstants
    from nvflare.app_common.app_event_type import AppEventType

    from fedaudit.interop.nvflare import FedauditRecorder

    def ctx(site: str | None = None, task_id: str = "t", **props) -> FLContext:
        c = FLContext()
        c.set_prop(ReservedKey.RUN_NUM, "simulate_job", private=False, sticky=False)
        c.set_prop(FLContextKey.TASK_NAME, "train", private=True, sticky=False)
        c.set_prop(FLContextKey.TASK_ID, task_id, private=True, sticky=False)
        if site is not None:
            peer = FLContext()
            peer.set_prop(ReservedKey.IDENTITY_NAME, site, private=False, sticky=False)
            c.set_peer_context(peer)
        for key, value in props.items():
            c.set_prop(key, value, private=True, sticky=False)
        return c

    def shareable(state: dict[str, torch.Tensor], rnd: int):
        s = DXO(DataKind.WEIGHTS, data={k: v.numpy() for k, v in state.items()},
                meta={"NUM_STEPS_CURRENT_ROUND": 2}).to_shareable()
        s.set_header(AppConstants.CURRENT_ROUND, rnd)
        s.set_return_code(ReturnCode.OK)
        return s

    recorder = FedauditRecorder(str(root), **MANIFEST)
    recorder.handle_event(EventType.START_RUN, ctx())
    state = initial()
    for rnd in range(ROUNDS):  # NVFlare counts rounds from 0
        uploads = []
        for client in CLIENTS:
            task = f"task-{rnd}-{client}"
            recorder.handle_event(EventType.AFTER_TASK_DATA_FILTER, ctx(client, task, **{
                FLContextKey.TASK_DATA: shareable(state, rnd)}))
            uploads.append(local_round(state, client, rnd + 1))
            recorder.handle_event(EventType.AFTER_TASK_RESULT_FILTER, ctx(client, task, **{
                FLContextKey.TASK_RESULT: shareable(uploads[-1], rnd)}))
        state = mean(uploads)
        recorder.handle_event(AppEventType.AFTER_SHAREABLE_TO_LEARNABLE, ctx(**{
            AppConstants.GLOBAL_MODEL: make_model_learnable({k: v.numpy() for k, v in state.items()}, {}),
            AppConstants.CURRENT_ROUND: rnd}))
    recorder.handle_event(EventType.END_RUN, ctx())


RECORDERS = {"plain": record_plain, "flower": record_flower, "nvflare": record_nvflare}

if __name__ == "__main__":
    import fedaudit

    out = Path(sys.argv[1]).resolve()
    for name, record in RECORDERS.items():
        record(out / name)
        print(f"recorded {out / name} with {Path(fedaudit.__file__).parent}")
