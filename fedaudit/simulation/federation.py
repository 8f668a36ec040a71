"""The round loop: clients, server, wire, model selection.

One round, for every method::

    server ── broadcast ──► wire ──► client.receive ─► local_train ─► upload ──► wire ──► server.aggregate
                                                                                            │
                        evaluate the global model on every source val split and the target ◄┘

The engine owns no algorithm: it receives a :class:`~fedaudit.simulation.method.Method`
and calls its hooks. A round after which the method's server holds no
deployable model (``Method.global_model`` returns None) is recorded with its
accuracy missing and is never selected. Randomness is re-derived from (seed, round, client) at
the start of every round, so a run resumed after round r takes exactly the
steps an uninterrupted run would have taken.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fedaudit.data import ClientData, LODOSplit, MultiDomainDataset
from fedaudit.errors import FedauditError
from fedaudit.run.config import RunConfig
from fedaudit.run.seeds import derive_seed
from fedaudit.run.stored import Accuracy, FinalRound, SourceVal
from fedaudit.tensor_ops.aggregation import StateDict, clone_state, load_state_, model_state
from fedaudit.simulation.client_dp import ClientLevelDP
from fedaudit.simulation.dp_sgd import PrivateTraining, describe_layers, freeze_for_dp, unsupported_layers
from fedaudit.simulation.method import Method
from fedaudit.simulation.training import LossFn, Preprocess, accuracy, cross_entropy_loss, index_batches, make_optimizer, train_steps
from fedaudit.simulation.wire import Artifact, Wire, client_role


DP_SAMPLING_STREAM, DP_NOISE_STREAM = 9_001, 9_002  # generator streams private to DP-SGD's sampling and noise


class TrainingDiverged(FedauditError):
    """The loss became NaN or infinite; the run stops, keeping what it wrote."""


@dataclass
class Client:
    """One source domain's silo. ``state`` holds tensors that never leave it
    (personalised layers, local statistics); it is saved in checkpoints."""

    index: int
    domain: str
    data: ClientData
    state: StateDict = field(default_factory=dict)

    @property
    def role(self) -> str:
        return client_role(self.domain)

    @property
    def num_samples(self) -> int:
        return int(self.data.train_y.shape[0])


class ClientContext:
    """What a client hook (``setup_upload``, ``setup_receive``, ``receive``, ``local_train``, ``upload``) works with,
    and all it works with:
    its own silo (``client``: data and private state), the shared model object it trains in place, the
    run's config, device and preprocessing, the federation's size (a protocol fact), and the engine's
    services bound to this client. Not the federation: through it a client cannot reach another client's
    data, the unseen target domain or the wire."""

    __slots__ = ("client", "model", "cfg", "device", "preprocess", "num_clients", "_engine")

    def __init__(self, engine: Federation, client: Client) -> None:
        self.client, self._engine = client, engine  # the engine stays private: its services are bound below
        self.model, self.cfg, self.device, self.preprocess = engine.model, engine.cfg, engine.device, engine.preprocess
        self.num_clients = len(engine.clients)

    def generator(self, rnd: int, stream: int = 0) -> torch.Generator:
        """This client's generator for (round, stream); stream 0 is the engine's batch order and augmentation."""
        return self._engine.generator(rnd, self.client, stream)

    def batches(self, generator: torch.Generator, epochs: int | None = None, steps: int | None = None) -> Iterator[Tensor]:
        """Index batches over this client's ``train`` split."""
        return self._engine.batches(self.client, generator, epochs, steps)

    def train_local(self, rnd: int, loss_fn: LossFn = cross_entropy_loss, **options: Any) -> None:
        """The engine's local training loop on this client's ``train`` split (DP-SGD under ``--dp-epsilon``);
        ``options`` as :meth:`Federation.train_local` (epochs, steps, optimizer, after_backward)."""
        self._engine.train_local(self.client, rnd, loss_fn, **options)

    def record_loss(self, total: Tensor, steps: int) -> None:
        """A method's own loop reports its summed loss and step count (for train_loss and divergence)."""
        self._engine.record_loss(total, steps)


@dataclass(frozen=True)
class ClientAddress:
    """A client as the server knows it: its index and domain name (protocol facts), never its data."""

    index: int
    domain: str

    @property
    def role(self) -> str:
        return client_role(self.domain)


class ServerContext:
    """What a server hook (``setup``, ``broadcast``, ``aggregate``, ``setup_aggregate``, ``global_model``) works
    with, and all it works with: the clients' addresses, the shared model object that holds the global model,
    the run's config and device, the number of classes, and generators for the server's own streams. It keeps
    no reference to the federation, so nothing reachable from it holds a client's data or private state; what
    a server learns from a client comes through the wire, as uploads."""

    __slots__ = ("clients", "model", "cfg", "device", "num_classes", "client_dp")

    def __init__(self, engine: Federation) -> None:
        self.clients = tuple(ClientAddress(c.index, c.domain) for c in engine.clients)
        self.model, self.cfg, self.device = engine.model, engine.cfg, engine.device
        self.num_classes = len(engine.dataset.classes)
        self.client_dp: ClientLevelDP | None = engine.client_dp  # the server's own mechanism, when the run asks for it

    def generator(self, rnd: int, stream: int = 0) -> torch.Generator:
        """The server's generator for (round, stream): the engine's stream with no client."""
        return seeded_generator(self.device, derive_seed(self.cfg.seed, rnd, -1, stream))


def seeded_generator(device: torch.device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def addressed_to(artifacts: list[Artifact], client: Client) -> list[Artifact]:
    return [a for a in artifacts if a.receiver == client.role]


class Federation:
    """Holds the shared model, the clients, the wire, and runs the rounds."""

    def __init__(self, cfg: RunConfig, method: Method, dataset: MultiDomainDataset, split: LODOSplit,
                 device: torch.device, wire: Wire, *, channels_last: bool | None = None):
        self.cfg = cfg
        self.method = method
        self.dataset = dataset
        self.split = split
        self.device = device
        self.wire = wire
        # cuDNN's convolutions are fastest channels_last; the wire sends contiguous copies whatever the layout.
        self.channels_last = device.type == "cuda" if channels_last is None else channels_last
        self.preprocess = Preprocess(dataset.mean, dataset.std, device, hflip=dataset.hflip, channels_last=self.channels_last)
        self.clients = [Client(i, cd.domain, cd.to(device)) for i, cd in enumerate(split.sources)]
        self.target_x = split.target_x.to(device)
        self.target_y = split.target_y.to(device)
        torch.manual_seed(derive_seed(cfg.seed, 0))
        memory_format = torch.channels_last if self.channels_last else torch.preserve_format
        self.model: nn.Module = method.build_model(self).to(device, memory_format=memory_format)
        self.client_dp: ClientLevelDP | None = None
        if cfg.client_dp_epsilon is not None:
            if method.client_dp_incompatible:
                raise FedauditError(f"--client-dp-epsilon: {cfg.method} cannot aggregate with client-level DP "
                                    f"({method.client_dp_incompatible}); use fedavg, fedprox or fedsb, or drop it")
            self.client_dp = ClientLevelDP.for_target(cfg.client_dp_epsilon, cfg.client_dp_delta, cfg.rounds,
                                                      cfg.client_dp_clip)
        self.server = ServerContext(self)  # what every server hook gets: built once, it holds no reference back
        self.history: list[dict[str, Any]] = []
        self.selected: dict[str, Any] = {"round": 0, "val_mean": -math.inf}
        self.selected_state: StateDict = {}
        self.timings: dict[str, float] = {"setup": 0.0, "local_train": 0.0, "aggregate": 0.0, "evaluate": 0.0}
        self.rounds_done = 0
        self._round_loss = torch.zeros((), device=device)
        self._round_steps = 0
        self.dp: PrivateTraining | None = None
        if cfg.dp_epsilon is not None:
            bad = unsupported_layers(self.model)
            if bad:
                raise FedauditError(f"method {cfg.method}'s model has layers DP-SGD cannot train: {describe_layers(bad)}; "
                                    "drop --dp-epsilon or choose a method without them")
            self.dp = PrivateTraining(cfg, {c.index: c.num_samples for c in self.clients},
                                      freeze_for_dp(self.model, cfg.dp_train))

    # -- services for methods --------------------------------------------------

    def build_default_model(self, norm: str | None = None, head: str = "linear", feature_dim: int | None = None,
                            mixstyle: nn.Module | None = None) -> nn.Module:
        from fedaudit.models import build_model

        return build_model(self.cfg.model, len(self.dataset.classes), self.cfg.image_size, norm=norm or self.cfg.norm,
                           head=head, feature_dim=feature_dim, pretrained=self.cfg.pretrained, mixstyle=mixstyle,
                           model_args=self.cfg.model_args)

    def generator(self, rnd: int, client: Client | None = None, stream: int = 0) -> torch.Generator:
        """A generator private to (round, client, stream): batch order and augmentation."""
        return seeded_generator(self.device, derive_seed(self.cfg.seed, rnd, -1 if client is None else client.index, stream))

    def send(self, artifact: Artifact) -> Artifact:
        """Put ``artifact`` on the wire; return it as the receiver gets it (read-only)."""
        tensors = self.wire.send(artifact)
        return Artifact(artifact.kind, artifact.sender, artifact.receiver, artifact.round, tensors, artifact.meta)

    def batches(self, client: Client, generator: torch.Generator, epochs: int | None = None, steps: int | None = None) -> Iterator[Tensor]:
        return index_batches(client.num_samples, self.cfg.batch_size, generator, self.device, epochs=epochs, steps=steps)

    def train_local(self, client: Client, rnd: int, loss_fn: LossFn = cross_entropy_loss, *, epochs: int | None = None,
                    steps: int | None = None, optimizer: torch.optim.Optimizer | None = None,
                    after_backward: Callable[[], None] | None = None) -> None:
        """The client's local SGD on its private ``train`` split (members).

        A fresh optimizer per client per round (momentum does not leak across
        clients through the shared model object) unless a method passes its own.
        """
        if epochs is None and steps is None:
            epochs = self.cfg.local_epochs
        cfg = self.cfg
        opt = optimizer or make_optimizer(self.model.parameters(), cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay)
        g = self.generator(rnd, client)
        aug = g if cfg.augment else None
        data = client.data

        def run(opt: torch.optim.Optimizer, batches: Iterator[Tensor], after: Callable[[], None] | None = None) -> tuple[Tensor, int]:
            return train_steps(self.model, opt, batches, data.train_x, data.train_y, self.preprocess, loss_fn, aug,
                               cfg.precision, after)

        if self.dp is None:
            total, n = run(opt, self.batches(client, g, epochs, steps), after_backward)
        else:
            # DP-SGD: Poisson batches, per-sample clipping and noise; a method's after_backward term
            # (data-independent, e.g. FedProx's proximal gradient) is added after the noise.
            total, n = self.dp.train(self.model, opt, client.index, epochs, steps,
                                     derive_seed(cfg.seed, rnd, client.index, DP_SAMPLING_STREAM),
                                     self.generator(rnd, client, DP_NOISE_STREAM), run, after_privatise=after_backward)
        self.record_loss(total, n)

    def record_loss(self, total: Tensor, steps: int) -> None:
        """Add a local loop's summed loss (a device tensor: no host sync) and step count to
        the round's train_loss, which also detects divergence; methods with their own loop call this."""
        self._round_loss += total
        self._round_steps += steps

    def deployed_model(self) -> nn.Module | None:
        """The method's global model loaded into the shared module (None while the server holds none)."""
        return self.method.global_model(self.server)

    def accuracy(self, model: nn.Module, x: Tensor, y: Tensor) -> float:
        model.eval()
        return accuracy(lambda inp: self.method.predict(model, inp), x, y, self.preprocess, self.cfg.precision)

    # -- the loop ----------------------------------------------------------------

    def setup(self) -> None:
        """Round 0: the method's one-time exchange before training, in a round's shape (server, clients,
        server, clients) and through the same wire; most methods only initialise the global model."""
        t0 = time.perf_counter()
        method, server = self.method, self.server
        sent = [self.send(a) for a in method.setup(server)]
        uploads = {c.role: [self.send(a) for a in method.setup_upload(ClientContext(self, c), addressed_to(sent, c))]
                   for c in self.clients}
        replies = [self.send(a) for a in method.setup_aggregate(server, uploads)]
        for client in self.clients:
            method.setup_receive(ClientContext(self, client), addressed_to(replies, client))
        self.timings["setup"] += self._elapsed(t0)

    def run(self, on_round_end: Callable[[Federation, int], None] | None = None) -> None:
        """Run rounds ``rounds_done+1 .. cfg.rounds``."""
        for rnd in range(self.rounds_done + 1, self.cfg.rounds + 1):
            self.run_round(rnd)
            if on_round_end is not None:
                on_round_end(self, rnd)

    def run_round(self, rnd: int) -> None:
        torch.manual_seed(derive_seed(self.cfg.seed, rnd))
        self._round_loss.zero_()
        self._round_steps = 0
        method = self.method
        t0 = time.perf_counter()
        broadcasts = [self.send(a) for a in method.broadcast(self.server, rnd)]  # the server sees uploads, not clients
        uploads: dict[str, list[Artifact]] = {}
        for client in self.clients:
            ctx = ClientContext(self, client)  # a client hook sees its own silo, not the federation
            method.receive(ctx, addressed_to(broadcasts, client))
            method.local_train(ctx, rnd)
            uploads[client.role] = [self.send(a) for a in method.upload(ctx, rnd)]
        self.timings["local_train"] += self._elapsed(t0)
        train_loss = (self._round_loss / max(self._round_steps, 1)).item()
        if not math.isfinite(train_loss):
            raise TrainingDiverged(
                f"training diverged in round {rnd} (mean loss {train_loss}); lower --lr or use --precision fp32 "
                f"(rounds 1..{rnd - 1} are kept and can be resumed)"
            )
        t0 = time.perf_counter()
        method.aggregate(self.server, uploads, rnd)
        self.timings["aggregate"] += self._elapsed(t0)
        t0 = time.perf_counter()
        row = self.evaluate(rnd, train_loss)
        self.timings["evaluate"] += self._elapsed(t0)
        self.history.append(row)
        self.rounds_done = rnd

    def evaluate(self, rnd: int, train_loss: float) -> dict[str, Any]:
        model = self.deployed_model()
        if model is None:
            # No deployable model after this round (see Method.global_model): its
            # accuracy is missing (None, an empty history.csv cell) and never selected.
            if rnd == self.cfg.rounds:
                raise RuntimeError(f"method {self.cfg.method} deploys no model after the final round {rnd}")
            val: dict[str, float | None] = {c.domain: None for c in self.clients}
            val_mean, target, extra = None, None, {}
        else:
            scores = self.method.score(self, model)
            val, target, extra = dict(scores.val), scores.target, scores.extra
            val_mean = sum(scores.val.values()) / len(val)
            # DomainBed's training-domain validation: the best mean source-val
            # round is selected; the target domain never influences the choice.
            if val_mean > self.selected["val_mean"]:
                self.selected = {"round": rnd, "val_mean": val_mean}
                self.selected_state = clone_state(model_state(model))
        comm = self.wire.bytes_in_round(rnd)
        row = {"round": rnd, "train_loss": round(train_loss, 6), "val_mean": val_mean}
        row.update({f"val/{d}": a for d, a in val.items()})
        row.update({"target": target, "bytes_up": comm["up"], "bytes_down": comm["down"]})
        row.update({f"extra/{k}": v for k, v in extra.items()})
        return row

    def results(self) -> Accuracy:
        """Accuracy at the selected round, and at the final one."""
        if not self.history:
            raise RuntimeError("no round has run")
        best = next(r for r in self.history if r["round"] == self.selected["round"])
        extra = {k[len("extra/"):]: v for k, v in best.items() if k.startswith("extra/")}
        undeployed = [r["round"] for r in self.history if r["val_mean"] is None]
        last = self.history[-1]
        return Accuracy(
            unseen_domain=best["target"],
            source_val=SourceVal(mean=best["val_mean"],
                                 per_domain={c.domain: best[f"val/{c.domain}"] for c in self.clients}),
            selected_round=best["round"],
            final_round=FinalRound(round=last["round"], unseen_domain=last["target"], source_val_mean=last["val_mean"]),
            **({"rounds_without_deployed_model": undeployed} if undeployed else {}),
            **({"method_specific": extra} if extra else {}),
        )

    def _elapsed(self, t0: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    # -- checkpoint --------------------------------------------------------------

    def checkpoint(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """Everything needed to continue after the last finished round."""
        tensors, extras = self.method.checkpoint()
        tensors = {f"method/{k}": v for k, v in tensors.items()}
        tensors.update({f"model/{k}": v for k, v in model_state(self.model).items()})
        tensors.update({f"selected/{k}": v for k, v in self.selected_state.items()})
        for c in self.clients:
            tensors.update({f"client/{c.index}/{k}": v for k, v in c.state.items()})
        wire_tensors, wire_index = self.wire.retained_state()
        tensors.update({f"wire/{k}": v for k, v in wire_tensors.items()})
        state = {
            "rounds_done": self.rounds_done,
            "history": self.history,
            "selected": self.selected,
            "timings": self.timings,
            "method": extras,
            "ledger": self.wire.ledger_rows(),
            "wire_index": wire_index,
            **({"dp": self.dp.state()} if self.dp is not None else {}),
            **({"client_dp": self.client_dp.state()} if self.client_dp is not None else {}),
        }
        return tensors, state

    def restore(self, tensors: dict[str, Tensor], state: dict[str, Any]) -> None:
        def part(prefix: str) -> dict[str, Tensor]:
            return {k[len(prefix):]: v.to(self.device) for k, v in tensors.items() if k.startswith(prefix)}

        self.method.restore(part("method/"), state["method"])
        load_state_(self.model, part("model/"))
        self.selected_state = part("selected/")
        for c in self.clients:
            c.state = part(f"client/{c.index}/")
        self.wire.restore(state["ledger"], part("wire/"), state["wire_index"], self.device)
        self.rounds_done = state["rounds_done"]
        self.history = state["history"]
        self.selected = state["selected"]
        self.timings = state["timings"]
        if self.dp is not None:
            self.dp.restore(state.get("dp", {}))
        if self.client_dp is not None:
            self.client_dp.restore(state.get("client_dp", {}))
