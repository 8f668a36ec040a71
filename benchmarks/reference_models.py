"""Reference-model training: the sequential path vs the vmapped path, same work, one process.

N reference models (default 8) of the ``cnn`` with GroupNorm (BatchNorm cannot
be vmapped) on random halves of one digits domain at 32 px, trained with
:func:`fedaudit.attacks.mia.reference_models.train_reference_models` and the default
:class:`~fedaudit.simulation.recipes.SGDRecipe` (same init, same batches, same
augmentation per model on both paths):

* sequential — one model after another, ordinary autograd;
* vmap — the N models' weights stacked with ``torch.func``, one
  ``vmap(grad(functional_call))`` per step for all of them.

Both include computing the logits on the whole pool. Prints models per
minute for both, the ratio vmap/sequential (above 1 = vmap faster) and the
largest logit difference between the paths. Example::

    python benchmarks/reference_models.py                       # CPU
    python benchmarks/reference_models.py --device cuda --models 64
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedaudit.attacks.mia.reference_models import inclusion_masks, train_reference_models
from fedaudit.data import load_dataset
from fedaudit.models import build_model
from fedaudit.run.numerics import numerics
from fedaudit.simulation.recipes import SGDRecipe
from fedaudit.simulation.training import Preprocess


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--models", type=int, default=8, help="reference models N")
    ap.add_argument("--domain", default="clean", help="digits domain whose records form the pool")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3, help="local epochs (the quick profile's 3)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()

    device = torch.device(args.device)
    ds = load_dataset("digits", args.image_size)
    images, labels = ds.images[args.domain].to(device), ds.labels[args.domain].to(device)
    masks = inclusion_masks(labels.numel(), args.models, torch.Generator().manual_seed(0))
    prep = Preprocess(ds.mean, ds.std, device, hflip=ds.hflip)
    recipe = SGDRecipe(epochs=args.epochs, batch_size=args.batch_size)
    num_classes = len(ds.classes)

    def build() -> torch.nn.Module:
        return build_model("cnn", num_classes, args.image_size, norm="gn")

    def run(path: str, m: torch.Tensor = masks):
        sync(device)
        t0 = time.perf_counter()
        out = train_reference_models(build, images, labels, m, recipe, preprocess=prep, path=path)
        sync(device)
        return time.perf_counter() - t0, out

    # Warm-up both paths (allocator, kernels, torch.func tracing) on two models.
    run("sequential", masks[:2])
    run("vmap", masks[:2])
    seq_s, vmap_s = [], []
    for _ in range(args.repeats):  # alternate so drift in machine load hits both alike
        t, seq = run("sequential")
        seq_s.append(t)
        t, fast = run("vmap")
        vmap_s.append(t)
    if fast.path != "vmap":
        raise SystemExit(f"the vmap path did not run: {fast.reason}")
    s, v = statistics.median(seq_s), statistics.median(vmap_s)
    steps = (masks.sum(1).min().item() // args.batch_size) * args.epochs
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {device} ({name}), threads={torch.get_num_threads()}, cnn+gn at {args.image_size} px, "
          f"N={args.models} models x {steps} SGD steps of batch {args.batch_size} on {int(masks.sum(1).min())} records, "
          f"logits on {labels.numel()} records, repeats={args.repeats}")
    print(f"sequential : {60 * args.models / s:8.1f} models/min  (median {s:.2f} s)")
    print(f"vmap       : {60 * args.models / v:8.1f} models/min  (median {v:.2f} s)")
    print(f"ratio vmap/sequential speed: {s / v:.2f}x")
    print(f"max |logit difference| between the paths: {(seq.logits - fast.logits).abs().max().item():.2e}")
    print(f"numerics: {numerics(device)}  (TF32 convolutions make fp32 paths differ more)")


if __name__ == "__main__":
    main()
