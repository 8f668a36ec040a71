"""Make the long-lived recording fixtures (issue 71): one small federation recorded by each of fedaudit's recorders —
the hand-written PyTorch loop (``Recorder``), Flower (``recording_mod`` on the clients, ``RecordingGrid`` on the
server, Flower's own FedAvg strategy) and NVFlare (``FedauditRecorder``, driven by NVFlare's own objects as its
server fires them).

Run it with the fedaudit of the commit to keep, from this repository's root, in an environment with the extras::

    git worktree add /tmp/at-COMMIT COMMIT
    PYTHONPATH=/tmp/at-COMMIT python tests/recordings/record_fixtures.py tests/recordings/COMMIT

It uses only the recorders' public API, which has not changed since the recordings' format was first written, and
drives Flower and NVFlare with the tests' own drivers (tests/flower_grid.py, tests/nvflare_events.py: they need only
the frameworks), read from this checkout — ``tests`` is a namespace package, so its modules come from here where the
recorded commit's tree lacks them — so this one script makes the fixtures of any commit. The federation is two clients (``clean``, ``colour``) and two
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
    from flwr.serverapp.strategy import FedAvg
    from flwr.supercore.task_identity import TaskIdentity

    from fedaudit.interop.flower import RecordingGrid, record_released, recording_mod, seal_recording, start_recording
    from tests.flower_grid import NAMES, SERVER_NODE, FakeGrid

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SERVER_NODE  # a ServerApp's identity
    app = ClientApp(mods=[recording_mod(root)])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rnd = int(msg.content["config"]["server-round"])
        state = local_round(msg.content["arrays"].to_torch_state_dict(), NAMES[context.node_id], rnd)
        return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord({"num-examples": 8})}),
                       reply_to=msg)

    start_recording(root, run_id=7, model=PlainCNN(width=4), **MANIFEST)
    result = FedAvg(fraction_evaluate=0.0, min_available_nodes=2).start(
        grid=RecordingGrid(FakeGrid(dict.fromkeys(NAMES, app)), root), initial_arrays=ArrayRecord(initial()),
        num_rounds=ROUNDS,
        train_config=ConfigRecord({"lr": 0.05}))
    record_released(root, result.arrays, ROUNDS)  # as examples/flower_digits/run.py ends its ServerApp
    seal_recording(root)


def record_nvflare(root: Path) -> None:
    from nvflare.apis.event_type import EventType
    from nvflare.apis.fl_constant import FLContextKey
    from nvflare.app_common.abstract.model import make_model_learnable
    from nvflare.app_common.app_constant import AppConstants
    from nvflare.app_common.app_event_type import AppEventType

    from fedaudit.interop.nvflare import FedauditRecorder
    from tests.nvflare_events import context, shareable

    recorder = FedauditRecorder(str(root), **MANIFEST)
    recorder.handle_event(EventType.START_RUN, context())
    state = initial()
    for rnd in range(ROUNDS):  # NVFlare counts rounds from 0
        uploads = []
        for client in CLIENTS:
            task = f"task-{rnd}-{client}"
            recorder.handle_event(EventType.AFTER_TASK_DATA_FILTER, context(client, task, **{
                FLContextKey.TASK_DATA: shareable(state, rnd, steps=2)}))
            uploads.append(local_round(state, client, rnd + 1))
            recorder.handle_event(EventType.AFTER_TASK_RESULT_FILTER, context(client, task, **{
                FLContextKey.TASK_RESULT: shareable(uploads[-1], rnd, steps=2)}))
        state = mean(uploads)
        recorder.handle_event(AppEventType.AFTER_SHAREABLE_TO_LEARNABLE, context(**{
            AppConstants.GLOBAL_MODEL: make_model_learnable({k: v.numpy() for k, v in state.items()}, {}),
            AppConstants.CURRENT_ROUND: rnd}))
    recorder.handle_event(EventType.END_RUN, context())


RECORDERS = {"plain": record_plain, "flower": record_flower, "nvflare": record_nvflare}

if __name__ == "__main__":
    import fedaudit

    out = Path(sys.argv[1]).resolve()
    for name, record in RECORDERS.items():
        record(out / name)
        print(f"recorded {out / name} with {Path(fedaudit.__file__).parent}")
