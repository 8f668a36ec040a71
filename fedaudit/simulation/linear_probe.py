"""Linear-probe evaluation of a frozen encoder (the standard linear-eval protocol).

Features are extracted once (eval mode, no augmentation), standardised with
the fitting set's statistics, and a multinomial logistic-regression head is
fitted full-batch with L-BFGS — a convex problem from a zero start, so the
result is deterministic and cheap on a CPU. Used by unsupervised methods
(FedGaLA) to score representations, and open to attacks that want to know
what a representation reveals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fedaudit.data.split import stratified_split
from fedaudit.simulation.training import Preprocess, forward_chunks


@torch.no_grad()
def extract_features(encode: Callable[[Tensor], Tensor], images: Tensor, preprocess: Preprocess, precision: str = "fp32",
                     batch_size: int = 512) -> Tensor:
    """``encode`` applied to uint8 ``images`` in batches; float32 [N, d] on the images' device.

    The caller puts the model in eval mode (BatchNorm running statistics,
    MixStyle off): a probe scores the encoder the federation deploys.
    """
    return torch.cat([z.float().flatten(1) for _, z in forward_chunks(encode, images, preprocess, precision, batch_size)])


@dataclass
class LinearProbe:
    """A fitted linear head on standardised features."""

    weight: Tensor  # [classes, d]
    bias: Tensor  # [classes]
    mean: Tensor  # [d] of the fitting features
    std: Tensor  # [d]

    def logits(self, features: Tensor) -> Tensor:
        return ((features - self.mean) / self.std) @ self.weight.T + self.bias

    def accuracy(self, features: Tensor, labels: Tensor) -> float:
        """Top-1 accuracy (NaN for an empty set); one host sync."""
        if labels.numel() == 0:
            return float("nan")
        return (self.logits(features).argmax(1) == labels).sum().item() / labels.numel()


def fit_linear_probe(features: Tensor, labels: Tensor, num_classes: int, l2: float = 1e-4,
                     max_iter: int = 200) -> LinearProbe:
    """Fit softmax regression ``labels ~ features`` (mean cross-entropy + ``l2``·‖W‖²)
    with full-batch L-BFGS. The small L2 term keeps the weights finite on
    separable features; standardisation makes one step size fit every encoder."""
    features = features.detach().float()
    mean = features.mean(0)
    std = features.std(0, unbiased=False).clamp_min(1e-6)
    x = (features - mean) / std
    w = torch.zeros(num_classes, x.shape[1], device=x.device, requires_grad=True)
    b = torch.zeros(num_classes, device=x.device, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(x @ w.T + b, labels) + l2 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():  # evaluation may run under no_grad
        opt.step(closure)
    return LinearProbe(w.detach(), b.detach(), mean, std)


def probe_on_fraction(features: Tensor, labels: Tensor, num_classes: int, fraction: float, seed: int) -> float:
    """Fit a probe on a class-stratified ``fraction`` of the records (fixed by
    ``seed``) and return its accuracy on the rest — FedGaLA's 10% / 30%
    target-domain protocol."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    gen = torch.Generator().manual_seed(seed)
    fit, rest, _ = stratified_split(labels.cpu(), (fraction, 1.0 - fraction, 0.0), gen)
    fit, rest = fit.to(features.device), rest.to(features.device)
    probe = fit_linear_probe(features[fit], labels[fit], num_classes)
    return probe.accuracy(features[rest], labels[rest])
