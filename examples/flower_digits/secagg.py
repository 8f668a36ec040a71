"""The Flower digits federation under Flower's secure aggregation (SecAgg+), recorded for ``fedaudit audit``.

Flower 1.41 runs SecAgg+ through its legacy workflow: ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))`` on
the server, ``secaggplus_mod`` and a ``NumPyClient`` on each client (the same data, model and recipe as
``run.py``). fedaudit's recording mod is listed **after** ``secaggplus_mod``: it records what each client computed
before the mask, while the server's recording grid records what the server received (the protocol's stages and
the masked vectors). The audit recognises SecAgg+ from those stage messages and judges every server row twice:
from the uploads as computed, and from the aggregate, which is all this server learned.

    python examples/flower_digits/secagg.py --out runs/flower-secagg [--rounds 3] [--local-epochs 1]
    fedaudit audit runs/flower-secagg --attack mia-loss,deepinversion

Runs offline on CPU through Flower's simulation engine (Ray); telemetry is off.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # before flwr is imported: an audit runs offline

import torch
from flwr.client import ClientApp, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import LegacyContext, ServerApp, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.simulation import run_simulation

from examples.flower_digits.run import (ARCHITECTURE, DATASET, RECIPE, TARGET, client_data, new_model,
                                        node_name, source_domains)
from fedaudit.errors import FedauditError
from fedaudit.interop.flower import (RecordingGrid, one_line_refusals, record_released, recording_mod,
                                     seal_recording, start_recording)
from fedaudit.interop.recording_writer import check_fresh
from fedaudit.simulation.training import (Preprocess, cross_entropy_loss, index_batches, make_optimizer,
                                          train_steps)


class DigitsClient(NumPyClient):
    """One source domain's client: a state_dict's values in, trained, out (the legacy list of arrays)."""

    def __init__(self, context: Context, seed: int, local_epochs: int):
        self.context, self.seed, self.local_epochs = context, seed, local_epochs

    def fit(self, parameters, config):
        dataset, sources = client_data(self.seed)
        data = sources[node_name(self.context)]
        model = new_model(self.seed)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in zip(model.state_dict(), parameters)})
        preprocess = Preprocess(dataset.mean, dataset.std, torch.device("cpu"), hflip=dataset.hflip)
        rnd = int(config.get("server_round", 0))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + rnd * 101
                                                  + int(self.context.node_config["partition-id"]))
        opt = make_optimizer(model.parameters(), "sgd", RECIPE["lr"], RECIPE["momentum"], RECIPE["weight_decay"])
        batches = index_batches(len(data.train_y), RECIPE["batch_size"], generator, torch.device("cpu"),
                                epochs=self.local_epochs)
        train_steps(model, opt, batches, data.train_x, data.train_y, preprocess, cross_entropy_loss,
                    generator if RECIPE["augment"] else None, "fp32")
        return [v.numpy() for v in model.state_dict().values()], int(len(data.train_y)), {}


def make_client_app(out: Path, seed: int, local_epochs: int) -> ClientApp:
    # secaggplus_mod first (outermost), the recording mod after it: it sees each client's update before the mask
    return ClientApp(client_fn=lambda context: DigitsClient(context, seed, local_epochs).to_client(),
                     mods=[secaggplus_mod, recording_mod(out, name=node_name)])


def make_server_app(out: Path, rounds: int, local_epochs: int, seed: int) -> ServerApp:
    app = ServerApp()

    @app.main()
    @one_line_refusals
    def main(grid, context: Context) -> None:
        start_recording(out, run_id=grid.run.run_id, model=new_model(seed), architecture=ARCHITECTURE,
                        data={"dataset": DATASET, "target_domain": TARGET, "seed": seed},
                        recipe={**RECIPE, "local_epochs": local_epochs, "rounds": rounds})
        clients = len(source_domains())
        strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_available_clients=clients,
                          min_fit_clients=clients,
                          initial_parameters=ndarrays_to_parameters([v.numpy() for v in new_model(seed).state_dict().values()]),
                          on_fit_config_fn=lambda rnd: {"server_round": rnd})
        legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=rounds), strategy=strategy)
        workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(num_shares=clients, reconstruction_threshold=2))
        workflow(RecordingGrid(grid, out), legacy)
        final = legacy.state.array_records["parameters"]  # where Flower's default workflow keeps the global model
        state = dict(zip(new_model(seed).state_dict(), (torch.as_tensor(a.numpy()) for a in final.values())))
        record_released(out, state, rounds)  # the final aggregate: the model the deployment releases
        seal_recording(out)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="recording directory (created)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = args.out.resolve()
    try:
        check_fresh(out)
    except FedauditError as exc:
        parser.exit(2, f"error: {exc}\n")
    run_simulation(server_app=make_server_app(out, args.rounds, args.local_epochs, args.seed),
                   client_app=make_client_app(out, args.seed, args.local_epochs), num_supernodes=len(source_domains()),
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"include_dashboard": False, "log_to_driver": False}})
    print(f"recording written to {out}")


if __name__ == "__main__":
    main()
