"""FedGaLA — Federated Unsupervised Domain Generalization using Global and
Local Alignment of Gradients (Pourpanah, Molahasani, Soltany et al.; thesis
"Federated Learning with Generalization to New Domains", chapter 3).

Unsupervised: clients train SimCLR and never read a label.

* **Local training**: two SimCLR views of each batch (random resized crop,
  flip where the dataset allows it, colour jitter, grayscale;
  :mod:`fedaudit.tensor_ops.augment`), one forward pass over both, NT-Xent with
  τ = 0.5 (``temperature``) on the output of a projection MLP.
* **Local gradient alignment**: after every backward pass, for each
  parameter tensor l, if cos(g_l, Δ_l) < ``align_threshold`` (0) that
  tensor's gradient is zeroed for the step. Δ = θ_global^r − θ_global^(r−1):
  the client received both broadcasts and keeps the previous one in its
  private ``client.state``; nothing extra is sent. Round 1 has no Δ and no
  alignment.
* **Global gradient alignment** at the server, per tensor of the state
  (BatchNorm running statistics included, as the authors' code):
  v_k = θ_k − θ_prev, agg = mean_k(v_k); three times (``global_iters``):
  s_k = (cos(v_k, agg) + 1)/2, s ← s/Σs, agg = Σ_k s_k v_k; then
  θ_global = θ_prev + agg (Algorithm 1; eq. 3.8's extra 1/K is left out since
  the weights are already normalised). ``num_batches_tracked`` gets the plain
  mean.

Model: the configured encoder plus a projection head
Linear(d, hidden) → BatchNorm1d → ReLU → Linear(hidden, out) in the place of
the classifier head, so ``model(x)`` is the SimCLR embedding and
``model.features(x)`` the representation. The projection is part of the
shared model and crosses the wire with it (the thesis: 4096 → 2048 after a
ResNet-18; ``proj_hidden``, ``proj_dim``).

Accuracy is a linear probe (:mod:`fedaudit.simulation.linear_probe`) on the frozen global
encoder's features (before the projection, as the thesis' words say; the
authors' code appears to probe the projector's 2048-d output):

* ``target``: fit on a class-stratified 10% of the target domain (fixed by
  the run seed), tested on the other 90%; ``probe_30pct`` (method-specific
  figure): 30% / 70%.
* source ``val`` (model selection, as for every method): one probe fitted on
  the pooled source clients' training features, scored on each source val
  split. The labels are used by the auditor for evaluation only, as in the
  standard linear-eval protocol; training never sees them.

Membership inference (``attacks/mia/__init__.py``): the model has no classes
(``label_free``), so attacks score augmentation consistency, and reference
models train with the same SimCLR loss (:class:`SimCLRRecipe`, without the
local alignment: a lone reference model has no global update to align with).

Profiles: ``paper``: ResNet-18 from scratch, 32 px (the thesis crops to
32×32), Adam lr 3e-3, batch 128, 7 local epochs, 100 rounds, projection
4096 → 2048. ``quick``: CNN, Adam lr 1e-3, batch 64, 2 local epochs, 20
rounds, projection 512 → 128 (SimCLR's 128-d output): two views × 2 epochs
is about the cost of fedavg's 3 quick epochs. Both turn the engine's own
translation/flip augmentation off (``augment = false``): the SimCLR views
replace it (a config file may turn it back on; it then runs first).

Deviations: the SimCLR augmentations are batched approximations (see
:mod:`fedaudit.tensor_ops.augment`); the linear probe is fitted on features extracted
once, without augmentation, by full-batch L-BFGS instead of 100 epochs of Adam
on augmented images; aggregation is unweighted (no sample counts cross the
wire); the ResNet keeps torchvision's adaptive pooling (the thesis' variant
uses 4×4 average pooling, identical at 32 px); weight decay is the project
default 5e-4 (the thesis states none for FedGaLA). The authors' code skips a
misaligned tensor's update entirely (``grad = None``); here it is zeroed,
which avoids a host sync per step — with Adam the tensor still moves by its
momentum from earlier steps of the round, but the misaligned gradient never
enters the moments.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaudit.run.config import target_exposure
from fedaudit.run.seeds import derive_seed
from fedaudit.tensor_ops.aggregation import load_state_, model_state, weighted_average_
from fedaudit.simulation.federation import Client, ClientContext, Federation, ServerContext
from fedaudit.simulation.method import DOWN, UP, Method, Scores
from fedaudit.simulation.training import LossFn, Preprocess, index_batches, make_optimizer, train_steps
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind
from fedaudit.tensor_ops.augment import SimCLRAugment
from fedaudit.simulation.linear_probe import extract_features, fit_linear_probe, probe_on_fraction
from fedaudit.tensor_ops.losses import nt_xent_loss
from fedaudit.run.options import Option

PREV = "prev_global/"  # client.state prefix: the global parameters received last round
VIEW_STREAM = 1  # fed.generator stream for the SimCLR views (stream 0 orders the batches)
PROBE_STREAM = 7_919  # seeds the probe's fit/test split of the target domain
TARGET_FRACTIONS = {"target": 0.1, "probe_30pct": 0.3}


@torch.no_grad()
def align_gradients_(grads: list[Tensor], refs: list[Tensor], threshold: float) -> Tensor:
    """Zero, in place, each ``grads[l]`` whose cosine with ``refs[l]`` is below
    ``threshold``; return the keep mask (bool, one per tensor, on the device).

    A zero gradient or reference has cosine 0. No host sync: the mask
    multiplies the gradients on the device.
    """
    dots = torch.stack([torch.dot(g.flatten(), r.flatten()) for g, r in zip(grads, refs)])
    norms = torch.stack(torch._foreach_norm(grads)) * torch.stack(torch._foreach_norm(refs))
    keep = dots / norms.clamp_min(1e-12) >= threshold
    for g, k in zip(grads, keep.to(grads[0].dtype).unbind()):
        g.mul_(k)
    return keep


@torch.no_grad()
def align_updates(updates: Tensor, iterations: int) -> Tensor:
    """Global alignment of K client updates ``[K, n]`` (one tensor, flattened):
    start from their mean, then ``iterations`` times re-weight each update by
    (cos(update, aggregate) + 1)/2, normalised to sum 1. Returns the aggregate [n]."""
    agg = updates.mean(0)
    for _ in range(iterations):
        s = (F.cosine_similarity(updates, agg[None], dim=1) + 1) / 2
        agg = (s / s.sum().clamp_min(1e-12)) @ updates
    return agg


def simclr_loss(pre: Preprocess, views: torch.Generator, temperature: float) -> LossFn:
    """The local loss: NT-Xent between two SimCLR views of the (normalised) batch, drawn from ``views``."""
    augment = SimCLRAugment(hflip=pre.hflip)

    def loss(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        del y  # unsupervised: labels are never read
        raw = x * pre.std + pre.mean  # back to [0, 1] for the colour jitter
        both = torch.cat([augment(raw, views), augment(raw, views)])
        both = ((both - pre.mean) / pre.std).contiguous(memory_format=pre.memory_format)
        z1, z2 = model(both).chunk(2)
        return nt_xent_loss(z1, z2, temperature)

    return loss


@dataclass(frozen=True)
class SimCLRRecipe:
    """FedGaLA's local training as a membership-inference reference-model recipe
    (:func:`fedaudit.attacks.mia.reference_models.train_reference_models`): the same SimCLR loss and
    optimizer for ``epochs`` epochs. No local gradient alignment: a reference model
    trains alone, so there is no global update Δ to align with."""

    epochs: int
    batch_size: int
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    temperature: float
    precision: str = "fp32"

    def __call__(self, model: nn.Module, images: Tensor, labels: Tensor, preprocess: Preprocess,
                 generator: torch.Generator) -> None:
        opt = make_optimizer(model.parameters(), self.optimizer, self.lr, self.momentum, self.weight_decay)
        batches = index_batches(labels.shape[0], self.batch_size, generator, images.device, epochs=self.epochs)
        train_steps(model, opt, batches, images, labels, preprocess, simclr_loss(preprocess, generator, self.temperature),
                    None, self.precision)


def projection_head(dim: int, hidden: int, out: int) -> nn.Module:
    """SimCLR's projection MLP: Linear → BatchNorm1d → ReLU → Linear."""
    return nn.Sequential(OrderedDict(fc1=nn.Linear(dim, hidden), bn=nn.BatchNorm1d(hidden), relu=nn.ReLU(inplace=True),
                                     fc2=nn.Linear(hidden, out)))


class FedGaLA(Method):
    name = "fedgala"
    summary = "unsupervised SimCLR with local (per-layer gradient) and global (update) alignment; linear-probe accuracy"
    paper = "Pourpanah, Molahasani, Soltany et al., FedGaLA (thesis ch. 3; AAAI 2025)"
    needs_architecture = "an encoder whose head it replaces with a SimCLR projection (fedaudit's cnn and resnets)"
    dp_incompatible = "its SimCLR loss contrasts the records of a batch with each other, so per-record gradients do not exist"
    shares = ((ArtifactKind.FULL_MODEL, DOWN), (ArtifactKind.FULL_MODEL, UP))
    label_free = True  # model(x) is the SimCLR embedding: membership attacks use augmentation consistency
    options = {"temperature": Option(0.5, "NT-Xent temperature", kind=float, low=1e-3, high=100.0),
               "align_threshold": Option(0.0, "a cosine; -1 turns local alignment off", kind=float, low=-1.0, high=1.0),
               "global_iters": Option(3, "iterations of the server's gradient alignment", kind=int, low=0, high=100),
               "proj_hidden": Option(4096, "hidden width of the projection head", kind=int, low=1, high=65_536,
                                     profiles={"quick": 512}),
               "proj_dim": Option(2048, "output width of the projection head", kind=int, low=1, high=65_536,
                                  profiles={"quick": 128})}
    profile_defaults: dict[str, dict[str, Any]] = {
        "quick": {"optimizer": "adam", "lr": 1e-3, "batch_size": 64, "local_epochs": 2, "augment": False},
        "paper": {"model": "resnet18", "image_size": 32, "optimizer": "adam", "lr": 3e-3, "batch_size": 128,
                  "local_epochs": 7, "rounds": 100, "augment": False},
    }

    def __init__(self, cfg):
        super().__init__(cfg)
        self._ref: list[Tensor] | None = None  # Δ for the client being trained, per trainable parameter

    def reference_recipe(self, fed: Federation, client: Client) -> SimCLRRecipe:
        """Reference models for membership inference train with the clients' SimCLR loss."""
        cfg = self.cfg
        return SimCLRRecipe(target_exposure(cfg), cfg.batch_size, cfg.optimizer, cfg.lr, cfg.momentum, cfg.weight_decay,
                            float(self.opts["temperature"]), cfg.precision)

    def build_model(self, fed: Federation) -> nn.Module:
        model = fed.build_default_model()
        model.head = projection_head(model.feature_dim, self.opts["proj_hidden"], self.opts["proj_dim"])
        model.head_kind = "projection"
        return model

    # -- server ----------------------------------------------------------------

    def broadcast(self, server: ServerContext, rnd: int) -> list[Artifact]:
        return [Artifact(ArtifactKind.FULL_MODEL, SERVER, c.role, rnd, self.global_state) for c in server.clients]

    def aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]], rnd: int) -> None:
        states = [a.tensors for arts in uploads.values() for a in arts if a.kind == ArtifactKind.FULL_MODEL]
        counters = []
        for key, prev in self.global_state.items():
            if not prev.is_floating_point():
                counters.append(key)
                continue
            updates = torch.stack([s[key].float().flatten() - prev.float().flatten() for s in states])
            prev.add_(align_updates(updates, self.opts["global_iters"]).view_as(prev).to(prev.dtype))
        if counters:
            weighted_average_(self.global_state, states, [1.0] * len(states), keys=counters)

    # -- client ----------------------------------------------------------------

    def receive(self, ctx: ClientContext, artifacts: list[Artifact]) -> None:
        client = ctx.client
        full = next(a for a in artifacts if a.kind == ArtifactKind.FULL_MODEL).tensors
        load_state_(ctx.model, full)
        names = [n for n, p in ctx.model.named_parameters() if p.requires_grad]
        # Δ from the two global models this client received; none in its first round.
        self._ref = [full[n] - client.state[PREV + n] for n in names] if PREV + names[0] in client.state else None
        client.state.update({PREV + n: full[n].clone() for n in names})

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        views = ctx.generator(rnd, stream=VIEW_STREAM)
        loss_fn = simclr_loss(ctx.preprocess, views, float(self.opts["temperature"]))
        ctx.train_local(rnd, loss_fn, after_backward=self._aligner(ctx))

    def _aligner(self, ctx: ClientContext) -> Callable[[], None] | None:
        """After each backward pass, align the gradients with the last global update; none in a client's first round."""
        if self._ref is None:
            return None
        params = [p for p in ctx.model.parameters() if p.requires_grad]
        refs, threshold = self._ref, float(self.opts["align_threshold"])

        def align() -> None:
            align_gradients_([p.grad for p in params], refs, threshold)

        return align

    def upload(self, ctx: ClientContext, rnd: int) -> list[Artifact]:
        client = ctx.client
        return [Artifact(ArtifactKind.FULL_MODEL, client.role, SERVER, rnd, model_state(ctx.model))]

    # -- evaluation ------------------------------------------------------------

    def score(self, fed: Federation, model: nn.Module) -> Scores:
        model.eval()
        classes = len(fed.dataset.classes)

        def feats(images: Tensor) -> Tensor:
            return extract_features(model.features, images, fed.preprocess, fed.cfg.precision)

        source = fit_linear_probe(torch.cat([feats(c.data.train_x) for c in fed.clients]),
                                  torch.cat([c.data.train_y for c in fed.clients]), classes)
        val = {c.domain: source.accuracy(feats(c.data.val_x), c.data.val_y) for c in fed.clients}
        target_f = feats(fed.target_x)
        seed = derive_seed(fed.cfg.seed, PROBE_STREAM)
        probe = {k: probe_on_fraction(target_f, fed.target_y, classes, f, seed) for k, f in TARGET_FRACTIONS.items()}
        return Scores(val=val, target=probe.pop("target"), extra=probe)
