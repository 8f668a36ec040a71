"""FedLSI — Federated Domain Generalization with Latent Space Inversion
(Palakkadavath, Le, Nguyen-Tang, Venkatesh and Gupta; seed 000).

Model: encoder g → z ∈ R^p (a Linear projection after the backbone pool),
head h = BatchNorm1d(p, affine=False) → Linear(p, classes).

1. Every client trains locally with CE, then uploads its head only
   (``CLASSIFIER_HEAD``: the BN running statistics and the linear layer).
2. The server inverts each head into s synthetic latents ẑ
   (:func:`fedaudit.tensor_ops.latent_inversion.invert_latents`).
3. The server trains a latent StarGAN translator G(z, c_src, c_trg) on the ẑ
   (:func:`fedaudit.models.translator.train_latent_translator`) and
   broadcasts G (``TRANSLATOR``); the ẑ and the discriminator are discarded.
4. Each round clients train with CE + λ_di·‖z − G(z, d, d′)‖², G frozen.
5. The server aggregates every parameter element-wise, weighted by the
   clients' MAS importances (``IMPORTANCE``); buffers by sample count.
Stages 1–3 run once, in round 0 (``setup`` sends the initial model, ``setup_upload`` is stage 1 on each
client, ``setup_aggregate`` stages 2–3 on the server, ``setup_receive`` keeps G), stages 4–5 every round.

Wire: ``FULL_MODEL`` down (round 0: the common initial model; rounds 2..R:
the global model), ``CLASSIFIER_HEAD`` up and ``TRANSLATOR`` down once
(round 0), ``FULL_MODEL`` + ``IMPORTANCE`` + ``SCALARS`` (sample count) up
every round. The paper's privacy argument covers stage 1 only; the whole
encoder, with all its BN statistics, still travels every round.

Deviations from the paper (no public code of the authors' was found):
* The initial model is broadcast at round 0 so all clients start stage 1
  from the same weights (averaging needs it; the paper is silent). Round 1
  has no broadcast: each client continues from its own stage-1 model, the
  one whose head the translator was built from. Each client still receives
  R full models, as under FedAvg.
* Stage 2: the paper draws ẑ's labels from the client's label distribution,
  which the server does not have; fedaudit balances them over the classes.
  The BN term uses plain L2 norms (docs/methods.md; the paper's text says
  squared). "10,000 epochs" is read as 10k Adam steps on fixed batches of 32
  (every latent moves in every step).
* Stage 3 uses StarGAN's WGAN-GP losses (not the log-loss written in the
  paper's eq. 9) and DIRT's settings (the paper defers to both): Adam 1e-4,
  β = (0.5, 0.999), batch 16, 5 critic steps per G step, λ_cls 1, λ_rec 10,
  λ_gp 10, 200k iterations, linear lr decay over the second half (per step,
  not every 1,000). Targets are the batch's client labels shuffled, as in
  StarGAN. The output layers are linear.
* ``TRANSLATOR`` also carries the receiving client's index (one int64), the
  one-hot code G uses for it.
* Stage 4: d′ is drawn uniformly from the other clients per sample; the
  squared distance is summed over the p dimensions and averaged over the
  batch; G runs in eval mode (no dropout) and the gradient reaches the
  encoder through both z and G(z).
* Stage 5: encoder importances are |∂‖g(x)‖²/∂φ| and head importances
  |∂‖h(g(x))‖²/∂θ| (the paper's eq. 17 split, squared as in MAS), averaged
  over the batches of one pass over the training data after local training
  (model in eval mode, so measuring does not move BN statistics) rather than
  during it. ω̂ = (ω + ε)/Σ(ω + ε); the paper's extra 1/m in eq. 18 is
  dropped, since with ω̂ summing to 1 it would shrink the model m-fold.
* The paper uses an ImageNet-pretrained ResNet-50 (PACS, OfficeHome); the
  architecture here is ``--model`` (add ``--model resnet50 --pretrained PATH``
  for the paper's). The uploaded head omits BN's ``num_batches_tracked``.

Profiles: ``paper`` is the paper's recipe (SGD lr 1e-3, momentum 0.9, weight
decay 5e-4, batch 32, 10 local epochs, 20 rounds) with the option defaults,
which are the paper's values. ``quick`` keeps every stage but shrinks p to
64, stage 1 to 3 epochs, inversion to 300 steps (lr 3e-3), the translator to
hidden 256 and 500 steps (lr 1e-3), and λ_di to 0.1: quick trains at lr
0.01, ten times the paper's, and at that rate the λ_di term at weight 1
makes SGD diverge.
"""

from __future__ import annotations

import copy

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaudit.tensor_ops.aggregation import (
    StateDict,
    clone_state,
    importance_weighted_average_,
    load_state_,
    model_state,
    weighted_average_,
)
from fedaudit.errors import FedauditError
from fedaudit.models.classifier import make_head
from fedaudit.models.translator import LatentTranslator, train_latent_translator
from fedaudit.run.seeds import derive_seed
from fedaudit.simulation.federation import Client, ClientContext, Federation, ServerContext
from fedaudit.simulation.method import DOWN, UP, Method, sample_count, sample_weight
from fedaudit.simulation.training import autocast
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind
from fedaudit.tensor_ops.latent_inversion import invert_latents
from fedaudit.run.options import Option

STAGE1 = "stage1/"  # client.state: the client's stage-1 model (round 1 starts from it; the auditor scores head inversions with its encoder)
TRANSLATOR = "translator/"  # client.state: the translator it received, and its own client index
CLIENT_INDEX = "client_index"
# generator streams (stream 0 is the engine's batch order)
INVERSION_STREAM, TRANSLATOR_STREAM, TARGET_STREAM, IMPORTANCE_STREAM = 1, 2, 3, 4

# name: (low, high, integer?) — checked when the method is built


class FedLSI(Method):
    name = "fedlsi"
    summary = "classifier-head latent inversion, latent StarGAN translator, importance-weighted aggregation"
    paper = "Palakkadavath et al., Federated Domain Generalization with Latent Space Inversion"
    needs_architecture = "a BatchNorm1d → Linear head on a latent projection (fedaudit builds it on its cnn and resnets)"
    dp_incompatible = "its shared head is BatchNorm1d, whose statistics are what the method shares and which DP-SGD cannot train"
    shares = (
        (ArtifactKind.CLASSIFIER_HEAD, UP),
        (ArtifactKind.TRANSLATOR, DOWN),
        (ArtifactKind.FULL_MODEL, DOWN),
        (ArtifactKind.FULL_MODEL, UP),
        (ArtifactKind.IMPORTANCE, UP),
        (ArtifactKind.SCALARS, UP),
    )
    # The paper's values; `quick` shrinks the latent, the iteration counts and their step sizes (each option's profiles).
    options = {
        "latent_dim": Option(512, "width of the latent the shared head reads", kind=int, low=1, high=65_536,
                             profiles={"quick": 64}),
        "stage1_epochs": Option(10, "local epochs of stage 1 (training the head that is shared)", kind=int, low=1,
                                high=1_000, profiles={"quick": 3}),
        "num_latents": Option(200, "latents inverted from each client's head", kind=int, low=2, high=1_000_000),
        "inversion_iters": Option(10_000, "steps of the latent inversion", kind=int, low=0, high=10_000_000,
                                  profiles={"quick": 300}),
        "inversion_lr": Option(1e-4, "step size of the latent inversion", kind=float, low=1e-9, high=10.0,
                               profiles={"quick": 3e-3}),
        "inversion_batch": Option(32, "latents per inversion batch", kind=int, low=2, high=65_536),
        "lambda_bn": Option(1e-3, "weight of the head's BN-statistics term in the inversion", kind=float, low=0.0,
                            high=1e4),
        "lambda_norm": Option(1e-4, "weight of the latent-norm term in the inversion", kind=float, low=0.0, high=1e4),
        "translator_hidden": Option(1024, "hidden width of the latent translator", kind=int, low=1, high=65_536,
                                    profiles={"quick": 256}),
        "translator_dropout": Option(0.5, "dropout in the translator", kind=float, low=0.0, high=0.99),
        "translator_iters": Option(200_000, "training iterations of the translator", kind=int, low=0,
                                   high=10_000_000, profiles={"quick": 500}),
        "translator_batch": Option(16, "latents per translator batch", kind=int, low=2, high=65_536),
        "translator_lr": Option(1e-4, "step size of the translator", kind=float, low=1e-9, high=10.0,
                                profiles={"quick": 1e-3}),
        "n_critic": Option(5, "critic steps per translator step", kind=int, low=1, high=1_000),
        "lambda_cls": Option(1.0, "weight of the translator's classification loss", kind=float, low=0.0, high=1e4),
        "lambda_rec": Option(10.0, "weight of the translator's reconstruction loss", kind=float, low=0.0, high=1e4),
        "lambda_gp": Option(10.0, "weight of the critic's gradient penalty", kind=float, low=0.0, high=1e4),
        "lambda_di": Option(1.0, "weight λ_di of the domain-invariance loss in local training", kind=float, low=0.0,
                            high=1e4, profiles={"quick": 0.1}),
        "importance_eps": Option(1e-8, "floor of the importance weights in aggregation", kind=float, low=1e-30,
                                 high=1.0),
    }
    profile_defaults = {
        # Fewer, larger steps: 300 inversion steps at 3e-3 move ẑ as far as the paper's 10k at 1e-4. Quick's
        # SGD lr is 10x the paper's; λ_di is 10x smaller so the λ_di step stays the paper's size (at 1 it diverges).
        "paper": {"rounds": 20, "local_epochs": 10, "batch_size": 32, "optimizer": "sgd", "lr": 1e-3, "momentum": 0.9,
                  "weight_decay": 5e-4},
    }

    def __init__(self, cfg) -> None:
        super().__init__(cfg)
        self.translator_state: StateDict = {}
        self._client_translator: LatentTranslator | None = None  # the client-side working copy of G

    def build_model(self, fed: Federation) -> nn.Module:
        return fed.build_default_model(head="bn_linear", feature_dim=self.opts["latent_dim"])

    # -- stages 1-3 (once) -------------------------------------------------------

    def setup(self, server: ServerContext) -> list[Artifact]:
        if len(server.clients) < 2:
            raise FedauditError("fedlsi translates latents between clients and needs at least 2 source domains; "
                                "use a dataset with 3 or more domains")
        super().setup(server)
        return [Artifact(ArtifactKind.FULL_MODEL, SERVER, c.role, 0, self.global_state) for c in server.clients]

    def setup_upload(self, ctx: ClientContext, got: list[Artifact]) -> list[Artifact]:
        """Stage 1, client side: local CE training from the common initial model, then the head goes up."""
        load_state_(ctx.model, got[0].tensors)
        ctx.train_local(0, epochs=self.opts["stage1_epochs"])
        ctx.client.state.update({STAGE1 + k: v.detach().clone() for k, v in model_state(ctx.model).items()})
        head = {k: v for k, v in model_state(ctx.model).items()
                if k.startswith("head.") and not k.endswith("num_batches_tracked")}
        return [Artifact(ArtifactKind.CLASSIFIER_HEAD, ctx.client.role, SERVER, 0, head)]

    def setup_aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]]) -> list[Artifact]:
        """Stages 2 and 3, server side, then G goes down to every client with that client's domain index."""
        heads = [uploads[c.role][0] for c in server.clients]
        translator = self._invert_and_train_translator(server, heads)
        self.translator_state = clone_state(translator.state_dict())
        return [Artifact(ArtifactKind.TRANSLATOR, SERVER, c.role, 0,
                         {**self.translator_state, CLIENT_INDEX: torch.tensor(c.index, device=server.device)})
                for c in server.clients]

    def setup_receive(self, ctx: ClientContext, got: list[Artifact]) -> None:
        ctx.client.state.update({TRANSLATOR + k: v.clone() for k, v in got[0].tensors.items()})  # the wire keeps its own copy

    def _invert_and_train_translator(self, server: ServerContext, heads: list[Artifact]) -> LatentTranslator:
        """Stages 2 and 3, server side. The synthetic latents and the
        discriminator are local to this call and discarded when it returns."""
        o = self.opts
        num_classes = server.num_classes
        modules = []
        for artifact in heads:
            head = make_head("bn_linear", o["latent_dim"], num_classes).to(server.device)
            load_state_(head, {k[len("head."):]: v for k, v in artifact.tensors.items()})
            modules.append(head)
        latents, labels = invert_latents(
            modules, o["num_latents"], num_classes, iterations=o["inversion_iters"], lr=o["inversion_lr"],
            batch_size=o["inversion_batch"], bn_weight=o["lambda_bn"], norm_weight=o["lambda_norm"],
            generator=server.generator(0, INVERSION_STREAM),
        )
        domains = torch.arange(len(heads), device=server.device).repeat_interleave(o["num_latents"])
        torch.manual_seed(derive_seed(server.cfg.seed, 0, -1, TRANSLATOR_STREAM))  # G/D initialisation and dropout
        translator, _ = train_latent_translator(
            latents.flatten(0, 1), domains, labels.flatten(), len(heads), iterations=o["translator_iters"],
            generator=server.generator(0, TRANSLATOR_STREAM), hidden=o["translator_hidden"],
            dropout=o["translator_dropout"], batch_size=o["translator_batch"], lr=o["translator_lr"],
            n_critic=o["n_critic"], lambda_cls=o["lambda_cls"], lambda_rec=o["lambda_rec"], lambda_gp=o["lambda_gp"],
        )
        return translator

    # -- stages 4-5 (every round) ----------------------------------------------

    def broadcast(self, server: ServerContext, rnd: int) -> list[Artifact]:
        if rnd == 1:
            return []  # clients continue from their stage-1 models
        return [Artifact(ArtifactKind.FULL_MODEL, SERVER, c.role, rnd, self.global_state) for c in server.clients]

    def receive(self, ctx: ClientContext, artifacts: list[Artifact]) -> None:
        client = ctx.client
        full = [a for a in artifacts if a.kind == ArtifactKind.FULL_MODEL]
        if full:
            load_state_(ctx.model, full[0].tensors)
            return
        stage1 = self._stage1_state(client)
        if not stage1:
            raise RuntimeError(f"{client.role} got no model and holds no stage-1 model")
        load_state_(ctx.model, stage1)

    @staticmethod
    def _stage1_state(client: Client) -> StateDict:
        return {k[len(STAGE1):]: v for k, v in client.state.items() if k.startswith(STAGE1)}

    def head_encoder(self, fed: Federation, client: Client) -> nn.Module | None:
        """The client's stage-1 model: its head's statistics summarise this encoder's latents."""
        stage1 = self._stage1_state(client)
        if not stage1:
            return None
        model = copy.deepcopy(fed.model)
        load_state_(model, stage1)
        return model.eval()

    def _translator(self, ctx: ClientContext) -> tuple[LatentTranslator, Tensor]:
        """The client's copy of G, loaded into the working module, and its client index."""
        if self._client_translator is None:
            o = self.opts
            g = LatentTranslator(o["latent_dim"], ctx.num_clients, o["translator_hidden"], o["translator_dropout"])
            self._client_translator = g.to(ctx.device).eval().requires_grad_(False)  # frozen, no dropout
        mine = {k[len(TRANSLATOR):]: v for k, v in ctx.client.state.items() if k.startswith(TRANSLATOR)}
        index = mine.pop(CLIENT_INDEX)
        load_state_(self._client_translator, mine)
        return self._client_translator, index

    def local_train(self, ctx: ClientContext, rnd: int) -> None:
        translator, index = self._translator(ctx)
        k = translator.num_domains
        lam = float(self.opts["lambda_di"])
        g = ctx.generator(rnd, TARGET_STREAM)

        def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            z = model.features(x)
            loss = F.cross_entropy(model.head(z), y)
            if lam:
                src = index.expand(z.shape[0])
                trg = (src + torch.randint(1, k, src.shape, generator=g, device=z.device)) % k  # any other client
                loss = loss + lam * (z - translator(z, src, trg)).pow(2).sum(1).mean()
            return loss

        ctx.train_local(rnd, loss_fn)

    def _importance(self, ctx: ClientContext, rnd: int) -> dict[str, Tensor]:
        """MAS importances ω = mean over batches of |∂‖output‖²/∂param|: the
        encoder's output is z, the head's the logits (z detached for it)."""
        model = ctx.model.eval()
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        omega = [torch.zeros_like(p) for p in params]
        batches = 0
        for idx in ctx.batches(ctx.generator(rnd, IMPORTANCE_STREAM), epochs=1):
            x = ctx.preprocess(ctx.client.data.train_x[idx])
            with autocast(ctx.device, ctx.cfg.precision):
                z = model.features(x)
                logits = model.head(z.detach())
            out = z.float().pow(2).sum(1).mean() + logits.float().pow(2).sum(1).mean()
            grads = torch.autograd.grad(out, params)
            torch._foreach_add_(omega, torch._foreach_abs(grads))
            batches += 1
        torch._foreach_div_(omega, float(batches))
        return {n: w for (n, _), w in zip(named, omega)}

    def upload(self, ctx: ClientContext, rnd: int) -> list[Artifact]:
        client = ctx.client
        return [
            Artifact(ArtifactKind.FULL_MODEL, client.role, SERVER, rnd, model_state(ctx.model)),
            Artifact(ArtifactKind.IMPORTANCE, client.role, SERVER, rnd, self._importance(ctx, rnd)),
            sample_count(client, rnd),
        ]

    def aggregate(self, server: ServerContext, uploads: dict[str, list[Artifact]], rnd: int) -> None:
        states, importances, counts = [], [], []
        for arts in uploads.values():
            by_kind = {a.kind: a for a in arts}
            states.append(by_kind[ArtifactKind.FULL_MODEL].tensors)
            importances.append(by_kind[ArtifactKind.IMPORTANCE].tensors)
            counts.append(sample_weight(arts))
        params = list(importances[0])
        importance_weighted_average_(self.global_state, states, importances, self.opts["importance_eps"], keys=params)
        weighted_average_(self.global_state, states, counts, keys=[k for k in self.global_state if k not in importances[0]])

    # -- checkpoint --------------------------------------------------------------

    def checkpoint(self) -> tuple[dict[str, Tensor], dict[str, Any]]:
        tensors, extras = super().checkpoint()
        tensors.update({TRANSLATOR + k: v for k, v in self.translator_state.items()})
        return tensors, extras

    def restore(self, tensors: dict[str, Tensor], extras: dict[str, Any]) -> None:
        super().restore(tensors, extras)
        self.translator_state = {k[len(TRANSLATOR):]: v for k, v in tensors.items() if k.startswith(TRANSLATOR)}
