"""XAN — eXplicitly Assembled Normalization, from gPerXAN: "Efficiently Assemble
Normalization Layers and Regularization for Federated Domain Generalization"
(Le et al., CVPR 2024; seed 004).

An XAN layer runs BatchNorm and InstanceNorm side by side on the same input
and mixes their *outputs* with two learnable scores::

    y = softmax([s_bn, s_in])[0] · BN(x) + softmax([s_bn, s_in])[1] · IN(x)

Both sides have their own affine parameters; the scores start at 1 (a 0.5/0.5
mix, as in the authors' code; the paper says "randomly initialised").

Registering ``NORM_LAYERS["xan"]`` here makes ``--norm xan`` put XAN in every
norm layer of any encoder. gPerXAN personalises the **BN side** of each XAN
layer (BN affine, running statistics, ``bn_score``); :func:`xan_bn_side_keys`
selects exactly those state keys, so methods and attacks name the same set.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedaudit.errors import FedauditError
from fedaudit.models.cnn import CNNEncoder
from fedaudit.models.norms import NORM_LAYERS
from fedaudit.models.resnet import ResNetEncoder


class XAN(nn.Module):
    """BN and IN outputs mixed by softmax scores. State keys: ``bn.*`` and
    ``bn_score`` (the BN side), ``inorm.*`` and ``in_score`` (the IN side)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.num_features = channels
        self.bn = nn.BatchNorm2d(channels)
        self.bn_score = nn.Parameter(torch.ones(1))
        # IN keeps no running statistics: each image is normalised by its own, train and test alike.
        self.inorm = nn.InstanceNorm2d(channels, affine=True, track_running_stats=False)
        self.in_score = nn.Parameter(torch.ones(1))

    def mix_weights(self) -> Tensor:
        """[w_bn, w_in] = softmax([s_bn, s_in])."""
        return torch.softmax(torch.cat([self.bn_score, self.in_score]), dim=0)

    def forward(self, x: Tensor) -> Tensor:
        w = self.mix_weights()
        return w[0] * self.bn(x) + w[1] * self.inorm(x)


def _xan(channels: int, dims: int) -> nn.Module:
    if dims != 2:
        # The IN side needs spatial maps: a [B, C] vector has no per-instance statistics.
        raise FedauditError("xan needs spatial feature maps, not feature vectors; use 'bn' or 'gn' there")
    return XAN(channels)


NORM_LAYERS["xan"] = _xan


def xan_layers(model: nn.Module) -> list[tuple[str, XAN]]:
    """Every XAN layer as (qualified name, module), in registration (= forward) order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, XAN)]


def xan_bn_side_keys(model: nn.Module) -> list[str]:
    """State keys of the BN side of every XAN layer: BN affine, running
    mean/var, ``num_batches_tracked`` and ``bn_score``, in state_dict order.
    Plain BatchNorm layers outside XAN are not part of it."""
    side: set[str] = set()
    for name, layer in xan_layers(model):
        side.update(f"{name}.bn.{k}" for k in layer.bn.state_dict())
        side.add(f"{name}.bn_score")
    return [k for k in model.state_dict() if k in side]


def encoder_stages(model: nn.Module) -> list[tuple[str, ...]]:
    """Module-name prefixes of the encoder's stages, in forward order: the
    CNN's 4 conv blocks, or ResNet's layer1..layer4 (the stem's norm counts
    with layer1, the stage it feeds)."""
    enc = getattr(model, "encoder", None)
    if isinstance(enc, CNNEncoder):
        return [(f"encoder.blocks.{i}.",) for i in range(len(enc.blocks))]
    if isinstance(enc, ResNetEncoder):
        return [("encoder.backbone.bn1", "encoder.backbone.layer1."),
                *((f"encoder.backbone.layer{i}.",) for i in range(2, 5))]
    raise FedauditError(f"cannot tell the stages of encoder {type(enc).__name__}; XAN stages need the cnn or a resnet")


def keep_xan_in_early_stages(model: nn.Module, stages: int) -> None:
    """Turn the XAN layers after the first ``stages`` encoder stages back into
    plain BatchNorm2d, in place (the paper: "BN layers in the first four /
    first two blocks are replaced"). A fresh BatchNorm2d has the same
    deterministic init as the BN side it replaces, so no randomness is used."""
    all_stages = encoder_stages(model)
    if not 1 <= stages <= len(all_stages):
        raise FedauditError(f"XAN stages must be between 1 and {len(all_stages)}, got {stages}")
    early = tuple(p for stage in all_stages[:stages] for p in stage)
    for name, layer in xan_layers(model):
        if not name.startswith(early):
            parent_name, _, child = name.rpartition(".")
            bn = nn.BatchNorm2d(layer.num_features).to(layer.bn.weight.device)
            setattr(model.get_submodule(parent_name), child, bn)
