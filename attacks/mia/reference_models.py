"""Reference ("shadow") models for membership inference: train N, return their logits.

LiRA (Carlini et al., S&P 2022) and RMIA (Zarifzadeh et al., ICML 2024) both
calibrate each record's signal against models trained with and without it.
The auditor trains N reference models for one victim domain on random halves
of its pool (members ∪ holdout) with the victim's local recipe, so each
record is IN for about half of them, and keeps only their logits on the pool
(the caller caches those; this module caches nothing).

* :func:`inclusion_masks` — complementary pairs: model 2k trains on a random
  half of the pool and model 2k+1 on the other half, so every model gets
  ⌊n/2⌋ or ⌈n/2⌉ records and every record is IN for exactly N/2 models
  (N even; ⌊N/2⌋ or ⌈N/2⌉ for odd N, whose last model draws a fresh half).
* :func:`train_reference_models` — trains model i from its own init seed on
  ``images[masks[i]]`` with ``train_one`` and a generator private to model i
  (batch order, augmentation), then records logits on every pool record (and
  on its horizontal flip when the data allows flips).

``train_one(model, images, labels, preprocess, generator)`` is the victim's
local recipe; a method with a custom local loop passes its own. The default,
:class:`SGDRecipe`, is plain cross-entropy SGD for E epochs through
fedaudit's own :func:`~fedaudit.simulation.training.index_batches`,
:func:`~fedaudit.simulation.training.train_steps` and
:func:`~fedaudit.simulation.training.make_optimizer` — the same steps a client takes.

Two paths, same steps and same per-model data order, so their logits agree up
to float error:

* ``sequential`` — one model after another, ``SGDRecipe`` or any callable;
* ``vmap`` — ``SGDRecipe`` only: the N models' weights are stacked with
  :func:`torch.func.stack_module_state` and one step computes every model's
  gradient with ``vmap(grad(functional_call))``; the stacked weights are
  updated by one ordinary ``torch.optim`` optimizer, which is exact because
  SGD and Adam act element-wise.

``auto`` picks ``vmap`` on CUDA and ``sequential`` on CPU. docs/attacks.md
records vmap 1.8× faster at N = 8 (7.2× at 64) on an H100 with a GroupNorm
CNN, but 3× slower on a 2-core CPU. BatchNorm in training mode updates
running buffers, which vmap cannot batch, so BatchNorm models — and models
whose pool halves give different batch shapes — always take the sequential
path; the returned ``path`` and ``reason`` (also logged) say which ran and why.

Hyper-parameters: N = 8 reference models (``quick``) / 64 (``paper``), chosen
by the caller; the recipe is the run's own (``SGDRecipe.from_config``: local
epochs, batch size, optimizer, lr, momentum, weight decay, augmentation).

Deviations, with reasons:

* A reference model trains from scratch for the recipe's epochs on its half
  of the pool, not through the victim's federated trajectory (rounds of local
  training interleaved with aggregation over other clients' data). Carlini et
  al. train reference models like the target; re-running the whole federation
  N times per victim is what fedaudit cannot afford. The caller chooses the
  epochs (e.g. rounds × local epochs) to match the target's exposure.
* Logits are taken in eval mode on the un-augmented record (and its flip),
  the same views the target model is queried with.
* The two paths agree to float error, not bit for bit: vmapped kernels sum
  in another order, and SGD amplifies that like any re-run (measured: the
  gap between the paths is the size of a 1e-6 relative change of the init).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, stack_module_state, vmap

from fedaudit.errors import FedauditError, unknown_choice
from fedaudit.run.seeds import derive_seed
from fedaudit.simulation.recipes import SGDRecipe, TrainOne
from fedaudit.simulation.training import Preprocess, autocast, forward_chunks, make_optimizer
from fedaudit.tensor_ops.bn_statistics import bn_modules

log = logging.getLogger("fedaudit")

REFERENCE_PATHS = {
    "auto": "vmap on CUDA when the model and recipe allow it, sequential otherwise",
    "sequential": "one model after another (any recipe, any architecture)",
    "vmap": "all models stacked with torch.func (SGDRecipe, no BatchNorm; otherwise falls back to sequential)",
}

def inclusion_masks(n_records: int, n_models: int, generator: torch.Generator, size: int | None = None) -> Tensor:
    """Bool [n_models, n_records]: True where the record is in that model's training set.

    Complementary pairs: each model trains on ⌊n/2⌋ or ⌈n/2⌉ records and each
    record is IN for exactly N/2 models (even N). ``generator`` is a CPU generator.
    With ``size`` (a replay: the target's own training-set size, so a reference takes its number of steps) each
    model trains on exactly ``size`` records, taken cyclically along one random order so that every record is IN for
    ⌊N·size/n⌋ or ⌈N·size/n⌉ models.
    """
    if n_records < 4:
        raise FedauditError(f"reference models need a pool of at least 4 records, got {n_records}; "
                            "give the victim more records it trained on and did not (evaluate: a larger --split share; "
                            "audit: more records in the recording's data)")
    if n_models < 1:
        raise FedauditError(f"the number of reference models must be >= 1, got {n_models}; use 8 (quick) or 64 (paper)")
    masks = torch.zeros(n_models, n_records, dtype=torch.bool)
    if size is not None:
        if not 2 <= size < n_records:
            raise FedauditError(f"a reference model cannot train on {size} of {n_records} records; it needs at least 2 "
                                "and must leave some out")
        order = torch.randperm(n_records, generator=generator)
        for k in range(n_models):
            masks[k, order[(k * size + torch.arange(size)) % n_records]] = True
        return masks
    half = n_records // 2
    for k in range(0, n_models, 2):
        perm = torch.randperm(n_records, generator=generator)
        # alternate which model of a pair gets the odd record, so model sizes balance too
        first = perm[:n_records - half] if (k // 2) % 2 == 0 else perm[:half]
        masks[k, first] = True
        if k + 1 < n_models:
            masks[k + 1] = ~masks[k]
    return masks


@dataclass(eq=False)
class ReferenceLogits:
    """What :func:`train_reference_models` returns (tensors on the CPU, float32).

    ``logits`` [N, n, C] on the pool records; ``flipped`` the same on their
    horizontal flips, or None when the data does not allow flips;
    ``population_logits`` / ``population_flipped`` [N, k, C] on the
    ``population`` records (never trained on; RMIA's z), None when none were
    given; ``masks`` [N, n] the inclusion masks used; ``path`` "sequential"
    or "vmap" and ``reason`` why.
    """

    logits: Tensor
    flipped: Tensor | None
    population_logits: Tensor | None
    population_flipped: Tensor | None
    masks: Tensor
    path: str
    reason: str


def has_batch_norm(model: nn.Module) -> bool:
    return bool(bn_modules(model))


def _build(build_model: Callable[[], nn.Module], seed: int, device: torch.device) -> nn.Module:
    """``build_model()`` under its own init seed, without touching the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model().to(device)


def _generator(seed: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _batch_shapes(recipe: SGDRecipe, n: int) -> list[int]:
    """The batch sizes ``recipe`` takes on ``n`` records (independent of the shuffle)."""
    return [b.numel() for b in recipe.batches(n, _generator(0, torch.device("cpu")), torch.device("cpu"))]


def choose_path(path: str, model: nn.Module, train_one: object, sizes: list[int], device: torch.device) -> tuple[str, str]:
    """(path, reason) for ``path`` in REFERENCE_PATHS given the model, recipe and per-model pool sizes."""
    if path not in REFERENCE_PATHS:
        raise unknown_choice("reference-model path", path, REFERENCE_PATHS)
    if path == "sequential":
        return "sequential", "asked for"
    if path == "auto" and device.type != "cuda":
        return "sequential", f"auto on {device.type}: vmap measured slower than a loop on a 2-core CPU"
    if type(train_one) is not SGDRecipe:
        return "sequential", "a custom local recipe cannot be vmapped"
    if has_batch_norm(model):
        return "sequential", "BatchNorm in training mode updates buffers, which vmap cannot batch"
    if len({tuple(_batch_shapes(train_one, n)) for n in set(sizes)}) > 1:
        return "sequential", "the pool halves give different batch shapes"
    return "vmap", "asked for" if path == "vmap" else f"auto on {device.type}"


Views = tuple[Tensor, ...]  # logits on the pool [, its flips] [, the population [, its flips]]


def _flip_width(x: Tensor) -> Tensor:
    return x.flip(3)


@torch.no_grad()
def eval_views(forward: Callable[[Tensor], Tensor], sets: list[Tensor], preprocess: Preprocess, flip: bool,
           precision: str) -> Views:
    """``forward``'s logits (CPU float32, records on dim -2) on each image set, then on its flips when ``flip``."""
    out = []
    for images in sets:
        for flipped in (False, True) if flip else (False,):
            chunks = forward_chunks(forward, images, preprocess, precision, transform=_flip_width if flipped else None)
            out.append(torch.cat([logits.float().cpu() for _, logits in chunks], -2))
    return tuple(out)


def _train_sequential(build_model, images, labels, masks, train_one, preprocess, seed, device,
                      evaluate: Callable[[Callable[[Tensor], Tensor]], Views]) -> Views:
    """Train and evaluate one model after the other (only one model is held at a time)."""
    per_model = []
    for i in range(masks.shape[0]):
        model = _build(build_model, derive_seed(seed, i, 0), device)
        sel = masks[i].nonzero().squeeze(1).to(device)
        train_one(model, images[sel], labels[sel], preprocess, _generator(derive_seed(seed, i, 1), device))
        per_model.append(evaluate(model.eval()))
    return tuple(torch.stack(view) for view in zip(*per_model))


def _train_vmap(build_model, images, labels, masks, recipe: SGDRecipe, preprocess, seed, device,
                evaluate: Callable[[Callable[[Tensor], Tensor]], Views]) -> Views:
    """Train all models in lock step under vmap, then evaluate them in one batched forward."""
    models = [_build(build_model, derive_seed(seed, i, 0), device) for i in range(masks.shape[0])]
    params, buffers = stack_module_state(models)
    base = models[0]
    del models
    opt = make_optimizer(list(params.values()), recipe.optimizer, recipe.lr, recipe.momentum, recipe.weight_decay)

    def loss_one(p: dict[str, Tensor], b: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

    grads_all = vmap(grad(loss_one))
    subsets = [masks[i].nonzero().squeeze(1).to(device) for i in range(masks.shape[0])]
    gens = [_generator(derive_seed(seed, i, 1), device) for i in range(masks.shape[0])]
    # One iterator per model, advanced in lock step: each generator sees the same
    # draws in the same order as in the sequential path (shuffle, then augmentation).
    iters = [recipe.batches(sub.numel(), g, device) for sub, g in zip(subsets, gens)]
    base.train()
    while True:
        idx = [next(it, None) for it in iters]
        if all(j is None for j in idx):
            break
        if any(j is None for j in idx):
            raise RuntimeError("reference models ran out of batches at different steps; choose_path should have "
                               "sent them to the sequential path")
        x = torch.stack([preprocess(images[sub[j]], g if recipe.augment else None) for sub, j, g in zip(subsets, idx, gens)])
        y = torch.stack([labels[sub[j]] for sub, j in zip(subsets, idx)])
        with autocast(device, recipe.precision):
            grads = grads_all({k: v.detach() for k, v in params.items()}, buffers, x, y)
        for k, w in params.items():
            w.grad = grads[k].to(w.dtype)
        opt.step()  # element-wise update of the stacked weights = N independent optimizers
    base.eval()
    stacked = {k: v.detach() for k, v in params.items()}
    forward_all = vmap(lambda p, b, x: functional_call(base, (p, b), (x,)), in_dims=(0, 0, None))
    return evaluate(lambda x: forward_all(stacked, buffers, x))


# A model a trained reference answers for besides itself (e.g. the released model with it in the victim's place).
Queried = Callable[[nn.Module], Callable[[Tensor], Tensor]]
ITSELF = "model"


def train_reference_models(build_model: Callable[[], nn.Module], images: Tensor, labels: Tensor, masks: Tensor,
                           train_one: TrainOne, *, preprocess: Preprocess, population: Tensor | None = None,
                           seed: int = 0, path: str = "auto", flip: bool | None = None,
                           precision: str = "fp32") -> ReferenceLogits:
    """Train ``masks.shape[0]`` reference models on ``images[masks[i]]``; return their pool logits (see
    :func:`train_references`, which also replays)."""
    return train_references(build_model, images, labels, masks, train_one, preprocess=preprocess,
                            population=population, seed=seed, path=path, flip=flip, precision=precision)[ITSELF]


def train_references(build_model: Callable[[], nn.Module], images: Tensor, labels: Tensor, masks: Tensor,
                     train_one: TrainOne, *, preprocess: Preprocess, population: Tensor | None = None,
                     seed: int = 0, path: str = "auto", flip: bool | None = None, precision: str = "fp32",
                     start: dict[str, Tensor] | None = None,
                     queries: dict[str, Queried] | None = None) -> dict[str, ReferenceLogits]:
    """Train ``masks.shape[0]`` reference models on ``images[masks[i]]``; return their pool logits.

    ``build_model()`` returns a fresh untrained model (called once per model
    under a per-model seed); ``images`` uint8 [n, C, H, W] and ``labels`` [n]
    are the victim's pool on the training device; ``train_one`` the local
    recipe (an :class:`SGDRecipe` or any callable with its signature);
    ``population`` uint8 images never trained on whose logits are wanted too
    (RMIA's z: other domains' holdouts); ``flip`` defaults to
    ``preprocess.hflip``; ``precision`` is used for the logits. ``path`` is
    one of :data:`REFERENCE_PATHS`. ``start``: the weights every model starts from instead of its own
    initialisation (a replay reference: the round's broadcast, :mod:`fedaudit.attacks.mia.replay`). ``queries``:
    the models each trained reference is asked about, by name (default: itself, :data:`ITSELF`), e.g. the released
    model with the reference in the victim's place; each gets its own :class:`ReferenceLogits` (and the sequential
    path).
    """
    masks = torch.as_tensor(masks).bool().cpu()
    if masks.dim() != 2 or masks.shape[1] != labels.shape[0] or images.shape[0] != labels.shape[0]:
        raise ValueError(f"masks {tuple(masks.shape)} must be [n_models, n_records] for {labels.shape[0]} records "
                         f"and {images.shape[0]} images")
    sizes = masks.sum(1).tolist()
    if min(sizes) < 2:
        raise FedauditError(f"a reference model would train on {min(sizes)} record(s); it needs at least 2 — "
                            "build the masks with inclusion_masks on a pool of at least 4 records")
    device = images.device
    flip = preprocess.hflip if flip is None else flip
    if start is not None:
        build_model = _starting_from(build_model, start)
    probe = _build(build_model, derive_seed(seed, 0, 0), torch.device("cpu"))
    chosen, reason = choose_path(path, probe, train_one, sizes, device)
    if queries is not None and chosen == "vmap":
        chosen, reason = "sequential", "each reference is asked about another model too (a replay of the released one)"
    del probe
    log.info("reference models: %d on the %s path (%s)", masks.shape[0], chosen, reason)
    sets = [images] if population is None else [images, population.to(device)]
    asked = queries or {ITSELF: lambda model: model}

    def evaluate(model: Callable[[Tensor], Tensor]) -> Views:
        if queries is None:  # the model itself; on the vmap path a batched forward, not a module
            return eval_views(model, sets, preprocess, flip, precision)
        return tuple(v for query in asked.values() for v in eval_views(query(model), sets, preprocess, flip, precision))

    run = _train_vmap if chosen == "vmap" else _train_sequential
    views = list(run(build_model, images, labels, masks, train_one, preprocess, seed, device, evaluate))
    out = {}
    for name in asked:
        logits, flipped = views.pop(0), views.pop(0) if flip else None
        pop = views.pop(0) if population is not None else None
        pop_flipped = views.pop(0) if population is not None and flip else None
        out[name] = ReferenceLogits(logits=logits, flipped=flipped, population_logits=pop,
                                    population_flipped=pop_flipped, masks=masks, path=chosen, reason=reason)
    return out


def _starting_from(build_model: Callable[[], nn.Module], start: dict[str, Tensor]) -> Callable[[], nn.Module]:
    """``build_model`` whose every model holds ``start`` (the same weights whatever the seed)."""
    def build() -> nn.Module:
        model = build_model()
        model.load_state_dict({k: v.detach().to("cpu") for k, v in start.items()})
        return model
    return build
