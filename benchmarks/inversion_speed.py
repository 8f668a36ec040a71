"""Inversion speed: fedaudit's engine vs a straightforward reference loop, same problem, one process.

The problem: V victims (same architecture, different weights), every class ×
``per_class`` images each, BN-statistics matching + CE + TV/L2 priors, Adam.

* reference — fp32, forward hooks on each BN layer, one victim per batch
  (the victims are solved one after the other), ``.item()`` logging each step
  as typical research code does;
* engine — :func:`fedaudit.attacks.deepinversion.engine.invert`: all victims in one batch
  (vmap over stacked weights on CUDA, the per-victim loop on CPU), bf16
  autocast on CUDA, no host sync inside the loop.

Prints image-iterations per second (images × victims × iterations / seconds)
for both and the ratio. Example::

    python benchmarks/inversion_speed.py --device cuda --model resnet18 --batch 256
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from fedaudit.attacks.deepinversion.engine import InversionSettings, InversionTarget, invert
from fedaudit.attacks.image_optim import image_priors, warmup_cosine
from fedaudit.models import build_model
from fedaudit.run.numerics import numerics
from fedaudit.tensor_ops.bn_statistics import bn_modules

NUM_CLASSES = 10


def reference_invert(model: nn.Module, per_class: int, size: int, iters: int, device: torch.device,
                     s: InversionSettings) -> torch.Tensor:
    """The plain DeepInversion loop for one victim, fp32."""
    losses: list[torch.Tensor] = []

    def hook(module, inputs, output):
        x = inputs[0]
        mu = x.mean(dim=(0, 2, 3))
        var = x.permute(1, 0, 2, 3).reshape(x.shape[1], -1).var(1, unbiased=False)
        losses.append(torch.norm(module.running_mean - mu, 2) + torch.norm(module.running_var - var, 2))

    handles = [m.register_forward_hook(hook) for m in bn_modules(model)]
    y = torch.arange(NUM_CLASSES, device=device).repeat_interleave(per_class)
    x = torch.randn(y.numel(), 3, size, size, device=device, requires_grad=True)
    opt = torch.optim.Adam([x], lr=s.lr, betas=(0.5, 0.9), eps=1e-8)
    log = []
    for step in range(iters):
        for group in opt.param_groups:
            group["lr"] = s.lr * warmup_cosine(step, iters, s.warmup)
        losses.clear()
        dy, dx = torch.randint(-1, 2, (2,)).tolist()
        logits = model(torch.roll(x, shifts=(dy, dx), dims=(2, 3)))
        bn = losses[0] * s.first_bn_mult + sum(losses[1:])
        tv, l2 = image_priors(x[None])
        loss = F.cross_entropy(logits, y) + s.bn_weight * bn + s.tv_weight * tv.sum() + s.l2_weight * l2.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            x.clamp_(-1, 1)
        log.append(loss.item())  # the per-step host sync research loops usually have
    for h in handles:
        h.remove()
    return x.detach()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="cnn", choices=["cnn", "resnet18", "resnet50"])
    p.add_argument("--batch", type=int, default=40, help="images per victim (whole classes of 10)")
    p.add_argument("--victims", type=int, default=4)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    device = torch.device(args.device)
    per_class = max(1, args.batch // NUM_CLASSES)
    n = per_class * NUM_CLASSES
    models = []
    for seed in range(args.victims):
        torch.manual_seed(seed)
        models.append(build_model(args.model, NUM_CLASSES, args.size).to(device).eval())
    bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    settings = InversionSettings(iters=args.iters, per_class=per_class, precision="bf16" if bf16 else "fp32")
    lo, hi = torch.full((3,), -1.0), torch.full((3,), 1.0)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # Warm-up both paths (cuDNN autotuning, allocator) before timing.
    reference_invert(models[0], per_class, args.size, 2, device, settings)
    targets = [InversionTarget(f"v{i}", m.state_dict()) for i, m in enumerate(models)]
    invert(models[0], targets, NUM_CLASSES, args.size, replace(settings, iters=2), lo, hi, device)

    sync()
    t0 = time.perf_counter()
    for m in models:
        reference_invert(m, per_class, args.size, args.iters, device, settings)
    sync()
    ref_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    invert(models[0], targets, NUM_CLASSES, args.size, settings, lo, hi, device)
    sync()
    eng_s = time.perf_counter() - t0

    work = n * args.victims * args.iters
    print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
          f"model {args.model} at {args.size} px, {args.victims} victims x {n} images, {args.iters} iterations")
    print(f"reference (fp32, one victim per batch): {work / ref_s:10.1f} image-iterations/s")
    print(f"engine ({'bf16' if bf16 else 'fp32'}, victims batched):     {work / eng_s:10.1f} image-iterations/s")
    print(f"ratio engine/reference: {ref_s / eng_s:.2f}x")
    print(f"numerics: {numerics(device)}")


if __name__ == "__main__":
    main()
