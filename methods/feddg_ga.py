"""FedDG-GA — Federated Domain Generalization with Generalization Adjustment
(Zhang, Xu, Yao, Zhang, Tian, Wang; CVPR 2023).

FedAvg whose aggregation weights a_k are learned by the server so that no
source domain's *generalization gap* dominates (the paper's variance-reduction
objective). Each round every client trains locally; its validation loss is
measured on the local model (``before``) and on the new global model
(``after``); the gap is G_k = after_k − before_k. The server then moves the
weights toward the clients the aggregate serves worst::

    a_k ← a_k + d_r · (G_k − mean_j G_j) / max_j |G_j − mean_j G_j|
    a   ← clip(a, 0, 1) / Σ clip(a, 0, 1)
    d_r = d · (1 − r/R)                                     (linear decay to 0)

with a_k = 1/K initially (uniform, not sample-proportional). Every tensor,
BatchNorm buffers included, is averaged with the weights a (see
:func:`ga_update`, :func:`ga_step`).

**Fitting the two evaluations into one round trip (an exact re-ordering).**
The authors' loop per round r is: train → ``before_r`` → aggregate with a^r →
``after_r`` on θ^r → update a for round r+1. fedaudit's round has one
broadcast and one upload, so the "after" measurement moves to the start of
the next round, where the client holds exactly the same model θ^{r−1}:

* client, round r: receive θ^{r−1}; val loss on it = ``after_{r−1}``; train;
  val loss of the local model = ``before_r``; upload ``FULL_MODEL`` and
  ``SCALARS`` {val_loss_local = before_r, val_loss_global = after_{r−1}}.
* server, round r: G_{r−1} = after_{r−1} − before_{r−1} (``before_{r−1}``
  kept from round r−1's upload, and checkpointed), a ← update with
  d_{r−1}; aggregate round r's models with the updated a.

So round r aggregates with weights built from gaps up to round r−1, as in
the authors' code. Round 1 has no gap: a = 1/K. The last round's ``after``
is never measured; the weights it would produce are never used. Val losses
are mean cross-entropy on the client's training-domain ``val`` split
(never the unseen target), eval mode, no augmentation, no grad.

Wire: ``FULL_MODEL`` down and up; ``SCALARS`` up (the two float32 val
losses, 8 bytes per client per round; no sample count, since the GA weights
start at 1/K and never read one — round 1's
``val_loss_global`` is the initial model's loss, sent so every upload has
one schema, unused by the server). The current weights are reported as
``ga_weight/<domain>`` extras (history.csv per round; ``metrics.json`` →
``accuracy.method_specific`` at the selected round).

Options: ``step_size`` d (default 0.2, range 0–1; 0 gives uniform FedAvg).

Profiles: ``quick`` = fedavg's quick (cnn, SGD lr 0.01, 3 local epochs,
batch 32, 20 rounds). ``paper``: SGD lr 1e-3 (momentum 0.9, wd 5e-4),
5 local epochs, 40 rounds, on the project's paper profile (ResNet-18,
64 px, batch 32).

Discrepancies between docs/methods.md's rule (followed here) and the authors'
released code (MediaBrain-SJTU/FedDG-GA, read not copied):

* The code divides the raw gaps by max|G| without subtracting their mean,
  so all weights can move the same way and only renormalisation keeps them
  on the simplex; here the gaps are mean-centred, so the update sums to zero.
* The code scales the step by 1/K (hard-coded 1/3 for PACS's three sources),
  i.e. an effective 0.067; use ``--method-option step_size=0.0667`` for that.
* The code decays the step as d − (i−1)·d/R for rounds i = 0..R (41 rounds),
  so its first update uses d·(1 + 1/R); here d_r = d·(1 − r/R), r = 1..R.
* The code's default gap metric is accuracy (``--fair acc``, sign-flipped);
  loss is used here, as in the paper's objective.
* The code keeps each client's SGD optimizer (momentum) across rounds with a
  StepLR ×0.1 at 80% of all local epochs, batch 16, and selects the model
  by the a-weighted val accuracy; fedaudit uses a fresh optimizer per
  client per round at a constant lr, batch 32, and the engine's mean
  source-val selection, as for every method.
* The authors fine-tune an ImageNet backbone; fedaudit starts from random
  weights unless ``--pretrained`` is given.
* If the gaps are all equal (up to float rounding) the weights are left
  unchanged instead of dividing by (nearly) zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.tensor_ops.aggregation import model_state, weighted_average_
from fedaudit.simulation.federation import ClientContext, Federation, ServerContext
from fedaudit.simulation.method import DOWN, UP, Scores
from fedaudit.simulation.training import Preprocess, mean_cross_entropy
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind
from fedaudit.run.options import Option

from .fedavg import FedAvg

VAL_LOSS_LOCAL = "val_loss_local"  # before aggregation: the client's trained model
VAL_LOSS_GLOBAL = "val_loss_global"  # after aggregation: the global model the client received


def ga_step(rnd: int, rounds: int, step_size: float = 0.2) -> float:
    """d_r = d·(1 − r/R): the step for the gaps measured in round ``rnd``; 0 at r = R."""
    return step_size * (1.0 - rnd / rounds)


def ga_update(weights: Tensor, gaps: Tensor, step: float) -> Tensor:
    """One generalization-adjustment step: move each weight by ``step`` times
    its mean-centred gap over the largest absolute centred gap, clip to
    [0, 1], renormalise to sum 1. A larger gap (the aggregate is worse than
    the client's own model) gains weight."""
    if weights.shape != gaps.shape or weights.ndim != 1:
        raise ValueError("weights and gaps must be 1-d tensors of the same length")
    if not torch.isfinite(gaps).all():
        raise ValueError(f"generalization gaps must be finite, got {gaps.tolist()}")
    centred = gaps - gaps.mean()
    scale = centred.abs().max()
    # Equal gaps (up to the rounding of their mean) leave nothing to adjust; the
    # max-normalisation would otherwise blow rounding noise up to a full step.
    noise = 8 * torch.finfo(gaps.dtype).eps * gaps.abs().max()
    if step == 0 or scale <= noise:
        return weights.clone()
    moved = (weights + step * centred / scale).clamp(0.0, 1.0)
    return moved / moved.sum()


@torch.no_grad()
def val_loss(model: nn.Module, predict: Callable[[nn.Module, Tensor], Tensor], x: Tensor, y: Tensor,
             preprocess: Preprocess, precision: str) -> Tensor:
    """Mean cross-entropy of ``model`` on (x, y) in eval mode with the engine's preprocessing;
    the model's train/eval mode is restored. A 0-d device tensor (no host sync)."""
    was_training = model.training
    model.eval()
    loss = mean_cross_entropy(lambda inp: predict(model, inp), x, y, preprocess, precision)
    model.train(was_training)
    return loss


class FedDGGA(FedAvg):
    """FedAvg's broadcast and local training; GA-weighted aggregation driven by val-loss gaps."""

    name = "feddg_ga"
    summary = "FedAvg with aggregation weights adjusted by each domain's generalization gap (baseline)"
    paper = "Zhang et al., CVPR 2023"
    client_dp_incompatible = ("its aggregation weights follow each client's validation loss, so clipping alone does not "
                              "bound a client's influence")
    shares = ((ArtifactKind.FULL_MODEL, DOWN), (ArtifactKind.FULL_MODEL, UP), (ArtifactKind.SCALARS, UP))
    clear_scalars = "each client's validation losses before and after its round (the server weights clients by them)"
    options = {"step_size": Option(0.2, "initial GA step d, decayed linearly to 0; 0 gives uniform FedAvg", kind=float,
                                   low=0.0, high=1.0)}
    profile_defaults: dict[str, dict[str, Any]] = {
        "quick": {},
        "paper": {"optimizer": "sgd", "lr": 1e-3, "local_epochs": 5, "rounds": 40},
    }

    def __init__(self, cfg):
        super().__init__(cfg)
        # Server state (checkpointed): the weights a_k and last round's before-losses, keyed by client role.
        self.ga_weights: dict[str, float] = {}
        self.val_loss_before: dict[str, float] = {}
        # Client side, within one round: the received global model's val loss until upload.
        self._val_loss_received: dict[str, Tensor] = {}

    def setup(self, server: ServerContext) -> list[Artifact]:
        self.ga_weights = {c.role: 1.0 / len(server.clients) for c in server.clients}
        return super().setup(server)

    # -- client side -----------------------------------------------------------

    def setup_upload(self, ctx: ClientContext, got: list[Artifact]) -> list[Artifact]:
        if ctx.client.data.val_y.shape[0] == 0:  # each client measures the aggregate on its own val split
            raise FedauditError(f"feddg_ga needs validation records on every client, but {ctx.client.domain!r} has "
                                "none; raise the val fraction in --split (e.g. 0.5,0.1,0.4)")
        return []

    def receive(self, ctx: ClientContext, artifacts: list[Artifact]) -> None:
        client = ctx.client
        super().receive(ctx, artifacts)
        # "after" for the previous round's aggregate: the model just received.
        self._val_loss_received[client.role] = val_loss(ctx.model, self.predict, client.data.val_x, client.data.val_y,
                                                        ctx.preprocess, ctx.cfg.precision)

    def upload(self, ctx: ClientContext, rnd: int) -> list[Artifact]:
        client = ctx.client
        before = val_loss(ctx.model, self.predict, client.data.val_x, client.data.val_y, ctx.preprocess,
                          ctx.cfg.precision)
        scalars = {
            VAL_LOSS_LOCAL: before,
            VAL_LOSS_GLOBAL: self._val_loss_received.pop(client.role),
        }
        return [Artifact(ArtifactKind.FULL_MODEL, client.role, SERVER, rnd, model_state(ctx.model)),
                Artifact(ArtifactKind.SCALARS, client.role, SERVER, rnd, scalars)]

    # -- server side -----------------------------------------------------------

    def aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]], rnd: int) -> None:
        roles = list(uploads)
        scalars = {r: next(a for a in uploads[r] if a.kind == ArtifactKind.SCALARS).tensors for r in roles}
        if not self.ga_weights:
            self.ga_weights = {r: 1.0 / len(roles) for r in roles}
        if self.val_loss_before:  # round ≥ 2: last round's aggregate has now been measured
            after = [float(scalars[r][VAL_LOSS_GLOBAL]) for r in roles]
            gaps = torch.tensor([a - self.val_loss_before[r] for a, r in zip(after, roles)], dtype=torch.float64)
            if not torch.isfinite(gaps).all():
                raise FedauditError(f"a client's validation loss is not finite in round {rnd}; "
                                    "lower --lr or use --precision fp32")
            old = torch.tensor([self.ga_weights[r] for r in roles], dtype=torch.float64)
            new = ga_update(old, gaps, ga_step(rnd - 1, self.cfg.rounds, float(self.opts["step_size"])))
            self.ga_weights = dict(zip(roles, new.tolist()))
        self.val_loss_before = {r: float(scalars[r][VAL_LOSS_LOCAL]) for r in roles}
        states = [next(a for a in uploads[r] if a.kind == ArtifactKind.FULL_MODEL).tensors for r in roles]
        weighted_average_(self.global_state, states, [self.ga_weights[r] for r in roles])

    def score(self, fed: Federation, model: nn.Module) -> Scores:
        scores = super().score(fed, model)
        scores.extra.update({f"ga_weight/{c.domain}": self.ga_weights[c.role] for c in fed.clients})
        return scores

    # -- checkpoint ------------------------------------------------------------

    def checkpoint(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors, extras = super().checkpoint()
        # Python floats survive the JSON round trip exactly, so a resumed run continues bit for bit.
        return tensors, {**extras, "ga_weights": self.ga_weights, "val_loss_before": self.val_loss_before}

    def restore(self, tensors: dict[str, Tensor], extras: dict[str, Any]) -> None:
        super().restore(tensors, extras)
        self.ga_weights = {k: float(v) for k, v in extras["ga_weights"].items()}
        self.val_loss_before = {k: float(v) for k, v in extras["val_loss_before"].items()}
