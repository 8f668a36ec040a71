"""Feature "style": the per-channel mean and standard deviation of a feature map, and AdaIN.

Style-transfer methods (CCST, Chen et al., WACV 2023; AdaIN, Huang &
Belongie, ICCV 2017) treat the spatial statistics of a feature map's
channels as an image's style. The reconstruction attacks on those styles
must use the very same definition, so it lives here, once.

Convention (the one CCST's released code uses for its style bank):

* ``mean`` is the channel mean over the spatial positions (H·W of one image,
  or N·H·W pooled over a whole set of images);
* ``std = sqrt(var + eps)`` where ``var`` is the **biased** (population)
  variance over the same positions (divide by the count, not count − 1) and
  ``eps = 1e-5`` by default.

Statistics are computed in float32 (float64 when pooling), whatever the
input's dtype, so bf16 autocast does not change a style.

Where styles are measured: :func:`style_encoder` gives a model's first block
(the CNN's first conv-norm-ReLU-pool block, the ResNet stem) as one module,
CCST's feature-level style encoder; the attacks take the same view.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.models.cnn import CNNEncoder
from fedaudit.models.resnet import ResNetEncoder

EPS = 1e-5


def _moments(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-image channel mean and biased variance of ``x`` [N, C, H, W], each (N, C)."""
    if x.dim() != 4:
        raise ValueError(f"a feature style needs feature maps [N, C, H, W], got shape {tuple(x.shape)}")
    xf = x.float()
    var, mean = torch.var_mean(xf, dim=(2, 3), correction=0)
    return mean, var


def feature_style(x: Tensor, eps: float = EPS) -> tuple[Tensor, Tensor]:
    """Each image's style: channel ``(mean, std)`` of ``x`` [N, C, H, W], shapes (N, C), float32.

    ``std = sqrt(biased var over H·W + eps)``.
    """
    mean, var = _moments(x)
    return mean, (var + eps).sqrt()


def pooled_feature_style(chunks: Iterable[Tensor], eps: float = EPS) -> tuple[Tensor, Tensor]:
    """One style for a whole set of images: channel ``(mean, std)`` pooled over
    every image and position (N·H·W), shapes (1, C), float32.

    ``chunks`` are feature maps [n_i, C, H, W] of the set's images (e.g. one
    per batch; every chunk must have the same H·W). Sums are accumulated in
    float64, so the result does not depend on how the set was batched beyond
    rounding.
    """
    total = total_sq = None
    count = 0
    for x in chunks:
        mean, var = _moments(x)
        mean, var = mean.double(), var.double()
        s, sq = mean.sum(0), (var + mean.square()).sum(0)  # per image: E[x] and E[x²] over H·W
        total = s if total is None else total + s
        total_sq = sq if total_sq is None else total_sq + sq
        count += x.shape[0]
    if total is None or count == 0:
        raise ValueError("pooled_feature_style needs at least one image")
    mean = total / count
    var = (total_sq / count - mean.square()).clamp_min(0.0)
    return mean.float().unsqueeze(0), (var + eps).sqrt().float().unsqueeze(0)


def adain(content: Tensor, style_mean: Tensor, style_std: Tensor, eps: float = EPS,
          alpha: Tensor | float = 1.0) -> Tensor:
    """Adaptive instance normalisation: re-normalise ``content`` [N, C, H, W] to
    the target channel statistics.

    ``out = (content − μ_c) / σ_c · style_std + style_mean`` with the content's
    own per-image style (μ_c, σ_c) (:func:`feature_style`, same ``eps``).
    ``style_mean``/``style_std`` are (N, C) (one target per image) or (C,) /
    (1, C) (one for all). ``alpha`` (a number or a per-image (N,) tensor in
    [0, 1]) interpolates as in AdaIN's content–style trade-off:
    ``alpha·AdaIN + (1 − alpha)·content``; ``alpha = 0`` returns ``content``
    unchanged. The result has ``content``'s dtype.
    """
    mean_c, std_c = feature_style(content, eps)
    n, c = mean_c.shape
    style_mean = style_mean.float().reshape(-1, c)
    style_std = style_std.float().reshape(-1, c)
    xf = content.float()
    normalised = (xf - mean_c[..., None, None]) / std_c[..., None, None]
    styled = normalised * style_std[..., None, None] + style_mean[..., None, None]
    if isinstance(alpha, Tensor):
        weight = alpha.float().reshape(-1, 1, 1, 1)
        # lerp returns `xf` exactly where the weight is 0 (the unchanged images)
        return torch.lerp(xf, styled, weight).to(content.dtype)
    if alpha == 1.0:
        return styled.to(content.dtype)
    return torch.lerp(xf, styled, float(alpha)).to(content.dtype)


class _ResNetStem(nn.Module):
    """A view of a ResNet's stem (conv1-bn1-relu-maxpool) as one module; it shares the model's layers."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.conv1, self.bn1, self.relu, self.maxpool = backbone.conv1, backbone.bn1, backbone.relu, backbone.maxpool

    def forward(self, x: Tensor) -> Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))


def style_encoder(model: nn.Module) -> nn.Module:
    """The model's first block as a module sharing the model's layers: ``encoder.blocks[0]``
    of a CNN, the stem (conv1-bn1-relu-maxpool) of a ResNet. Its output is where
    feature styles are measured."""
    encoder = getattr(model, "encoder", None)
    if isinstance(encoder, CNNEncoder):
        return encoder.blocks[0]
    if isinstance(encoder, ResNetEncoder):
        return _ResNetStem(encoder.backbone)
    raise FedauditError(f"feature styles are measured after the first block of a cnn or resnet encoder, got "
                        f"{type(encoder).__name__}; use --model cnn, resnet18 or resnet50")
