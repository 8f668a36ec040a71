"""FedAvg on fedaudit's built-in ``digits`` as a Flower app, recorded for ``fedaudit audit``.

One SuperNode per source domain (clean, colour, rotated; ``textured`` is the unseen target), each
training fedaudit's ``cnn`` on its split of the data with the same recipe as
``fedaudit evaluate --method fedavg --dataset digits`` (quick: 20 rounds × 3 local epochs, SGD lr
0.01, momentum 0.9, weight decay 5e-4, batch 32, shift augmentation). Flower's own ``FedAvg``
strategy aggregates. fedaudit's recording mod is the ClientApp's first mod, and the strategy runs on
a :class:`~fedaudit.interop.flower.RecordingGrid`, so ``--out DIR`` receives the recording from both sides.

    python examples/flower_digits/run.py --out runs/flower-digits [--rounds 20] [--local-epochs 3] [--dp 1.1 1.0]
    fedaudit audit runs/flower-digits --attack deepinversion,mia

Runs offline on CPU through Flower's simulation engine (Ray); telemetry is off.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # before flwr is imported: an audit runs offline

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping, FedAvg
from flwr.simulation import run_simulation

from fedaudit.data import load_dataset
from fedaudit.errors import FedauditError
from fedaudit.data.split import lodo_split
from fedaudit.interop.flower import (RecordingGrid, one_line_refusals, record_released, recording_mod,
                                     seal_recording, start_recording)
from fedaudit.interop.recording_writer import check_fresh
from fedaudit.models import build_model
from fedaudit.simulation.training import (Preprocess, accuracy, cross_entropy_loss, index_batches, make_optimizer,
                               train_steps)

DATASET, TARGET, IMAGE_SIZE = "digits", "textured", 32
ARCHITECTURE = {"model": "cnn", "norm": "bn", "num_classes": 10, "image_size": IMAGE_SIZE, "channels": 3}
RECIPE = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 32, "augment": True}


_CACHE: dict = {}  # per process (each simulated node's actor): the data is generated once


def client_data(seed: int):
    """Every source client's split, as fedaudit's own run makes it (same data seed and split seed)."""
    if ("split", seed) not in _CACHE:
        dataset = load_dataset(DATASET, IMAGE_SIZE, seed=0)
        _CACHE["split", seed] = dataset, {cd.domain: cd for cd in lodo_split(dataset, TARGET, seed=seed).sources}
    return _CACHE["split", seed]


def new_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ARCHITECTURE["model"], ARCHITECTURE["num_classes"], IMAGE_SIZE, ARCHITECTURE["norm"])


def source_domains() -> list[str]:
    """Partition i is the i-th source domain (the split's order)."""
    return list(client_data(0)[1])


def node_name(context: Context) -> str:
    return source_domains()[int(context.node_config["partition-id"])]


def make_client_app(out: Path, seed: int, dp: tuple[float, float] | None = None) -> ClientApp:
    # the recording mod first: it sees what finally leaves the client, after Flower's clipping mod under DP
    app = ClientApp(mods=[recording_mod(out, name=node_name), *([fixedclipping_mod] if dp else [])])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        dataset, sources = client_data(seed)
        data = sources[node_name(context)]
        config = msg.content["config"]
        rnd = int(config["server-round"])
        model = new_model(seed)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        preprocess = Preprocess(dataset.mean, dataset.std, torch.device("cpu"), hflip=dataset.hflip)
        generator = torch.Generator().manual_seed(seed * 1_000_003 + rnd * 101 + int(context.node_config["partition-id"]))
        opt = make_optimizer(model.parameters(), "sgd", float(config["lr"]), RECIPE["momentum"], RECIPE["weight_decay"])
        batches = index_batches(len(data.train_y), RECIPE["batch_size"], generator, torch.device("cpu"),
                                epochs=int(config["local-epochs"]))
        train_steps(model, opt, batches, data.train_x, data.train_y, preprocess, cross_entropy_loss,
                    generator if RECIPE["augment"] else None, "fp32")
        reply = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                            "metrics": MetricRecord({"num-examples": int(len(data.train_y))})})
        return Message(content=reply, reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        dataset, sources = client_data(seed)
        data = sources[node_name(context)]
        model = new_model(seed)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        model.eval()
        preprocess = Preprocess(dataset.mean, dataset.std, torch.device("cpu"), hflip=dataset.hflip)
        acc = accuracy(model, data.val_x, data.val_y, preprocess, "fp32")
        return Message(content=RecordDict({"metrics": MetricRecord({"accuracy": acc, "num-examples": len(data.val_y)})}),
                       reply_to=msg)

    return app


def run_server(grid: Grid, out: Path, rounds: int, local_epochs: int, seed: int,
               dp: tuple[float, float] | None = None) -> None:
    """Flower's FedAvg on a recording grid: every round trains on every node, then evaluates the new global
    model on every node (so the deployed model crosses the wire once more, as it does in a deployment). With
    ``dp`` (noise multiplier, clipping norm), Flower's central DP with client-side fixed clipping."""
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=3, min_train_nodes=3,
                      min_evaluate_nodes=3)
    if dp is not None:
        strategy = DifferentialPrivacyClientSideFixedClipping(strategy, noise_multiplier=dp[0], clipping_norm=dp[1],
                                                              num_sampled_clients=len(source_domains()))
    # the recording's manifest, once per run: Flower's run id, the model, the auditor's data (fedaudit's own
    # split), the public recipe, and the strategy (a DP wrapper's parameters, had it one)
    start_recording(out, run_id=grid.run.run_id, strategy=strategy, model=new_model(seed), architecture=ARCHITECTURE,
                    data={"dataset": DATASET, "target_domain": TARGET, "seed": seed},
                    recipe={**RECIPE, "local_epochs": local_epochs, "rounds": rounds})
    result = strategy.start(grid=RecordingGrid(grid, out), initial_arrays=ArrayRecord(new_model(seed).state_dict()),
                            num_rounds=rounds, train_config=ConfigRecord({"lr": RECIPE["lr"], "local-epochs": local_epochs}))
    record_released(out, result.arrays, rounds)  # the final aggregate: the model the deployment releases
    seal_recording(out)  # the run has ended: the ledger's sha256 goes into the manifest (tamper evidence)


def make_server_app(out: Path, rounds: int, local_epochs: int, seed: int,
                    dp: tuple[float, float] | None = None) -> ServerApp:
    app = ServerApp()

    @app.main()
    @one_line_refusals  # a refusal inside the ServerApp: one line in Flower's log, not a traceback
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, out, rounds, local_epochs, seed, dp)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="recording directory (created)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--local-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dp", type=float, nargs=2, metavar=("NOISE_MULTIPLIER", "CLIPPING_NORM"),
                        help="Flower's central DP with client-side fixed clipping (the audit accounts its ε)")
    args = parser.parse_args()
    out = args.out.resolve()
    try:
        check_fresh(out)  # refused here in one line, not as a traceback from inside Flower's ServerApp
    except FedauditError as exc:
        parser.exit(2, f"error: {exc}\n")
    dp = tuple(args.dp) if args.dp else None
    run_simulation(server_app=make_server_app(out, args.rounds, args.local_epochs, args.seed, dp),
                   client_app=make_client_app(out, args.seed, dp), num_supernodes=len(source_domains()),
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"include_dashboard": False, "log_to_driver": False}})
    print(f"recording written to {out}")


if __name__ == "__main__":
    main()
