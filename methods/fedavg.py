"""FedAvg — Communication-Efficient Learning of Deep Networks from
Decentralized Data (McMahan et al., AISTATS 2017).

Each round the server broadcasts the global model; every client runs E
local epochs of SGD on its private data and uploads its whole model; the
server takes the sample-weighted mean of every tensor, BatchNorm running
statistics included.

Wire: ``FULL_MODEL`` down and up, and each client's sample count up as
``SCALARS`` (FedAvg's weights need it, so it does cross the wire; it is
counted as its own kind so the model bytes stay exactly one state_dict per
client per round).

With ``--client-dp-epsilon`` the server aggregates as DP-FedAvg instead (McMahan et al., ICLR 2018;
:mod:`fedaudit.simulation.client_dp`): each update clipped, equal weights, Gaussian noise on the mean.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedaudit.tensor_ops.aggregation import load_state_, model_state, weighted_average_
from fedaudit.simulation.client_dp import NOISE_STREAM
from fedaudit.simulation.federation import Client, ClientContext, Federation, ServerContext
from fedaudit.simulation.method import DOWN, UP, Method, sample_count, sample_weight
from fedaudit.simulation.recipes import TrainOne
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind


class FedAvg(Method):
    name = "fedavg"
    summary = "sample-weighted averaging of whole models (baseline)"
    paper = "McMahan et al., AISTATS 2017"
    dp_incompatible = ""
    client_dp_incompatible = ""
    replays = True
    shares = ((ArtifactKind.FULL_MODEL, DOWN), (ArtifactKind.FULL_MODEL, UP), (ArtifactKind.SCALARS, UP))

    def broadcast(self, server: ServerContext, rnd: int) -> list[Artifact]:
        return [Artifact(ArtifactKind.FULL_MODEL, SERVER, c.role, rnd, self.global_state) for c in server.clients]

    def receive(self, ctx: ClientContext, artifacts: list[Artifact]) -> None:
        for a in artifacts:
            if a.kind == ArtifactKind.FULL_MODEL:
                load_state_(ctx.model, a.tensors)

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        ctx.train_local(rnd)

    def round_recipe(self, fed: Federation, client: Client) -> TrainOne | None:
        """One round of the engine's local SGD (DP-SGD under --dp-epsilon): what ``local_train`` runs (a subclass
        that trains otherwise says ``replays = False`` or gives its own)."""
        return self.engine_recipe(fed, client, rounds=1) if self.replays else None

    def upload(self, ctx: ClientContext, rnd: int) -> list[Artifact]:
        client = ctx.client
        return [Artifact(ArtifactKind.FULL_MODEL, client.role, SERVER, rnd, model_state(ctx.model)), sample_count(client, rnd)]

    def aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]], rnd: int) -> None:
        if server.client_dp is not None:  # DP-FedAvg: clipped updates, equal weights, noise on the mean
            private_mean_(server, self.global_state, uploads, rnd)
        else:
            self.average_full_models(uploads)

    def average_full_models(self, uploads: dict[str, list[Artifact]], keys: Iterable[str] | None = None) -> None:
        """Sample-weighted mean of the uploaded ``FULL_MODEL``s into the global state (only ``keys`` if given)."""
        states, weights = [], []
        for arts in uploads.values():
            by_kind = {a.kind: a for a in arts}
            states.append(by_kind[ArtifactKind.FULL_MODEL].tensors)
            weights.append(sample_weight(arts))
        weighted_average_(self.global_state, states, weights, keys=keys)


def private_mean_(server: ServerContext, global_state: dict, uploads: dict[str, list[Artifact]], rnd: int) -> None:
    """The uploaded whole models aggregated by the server's client-level DP mechanism (its own noise stream)."""
    states = [a.tensors for arts in uploads.values() for a in arts if a.kind == ArtifactKind.FULL_MODEL]
    server.client_dp.mean_(global_state, states, server.generator(rnd, NOISE_STREAM))
