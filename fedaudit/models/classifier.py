"""Classifier = encoder (x -> z) + head (z -> logits), ``build_model``, and the parts found in any model."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn
from torch.nn.modules.instancenorm import _InstanceNorm

from fedaudit.errors import FedauditError, unknown_choice
from fedaudit.models.cnn import CNNEncoder
from fedaudit.models.factory import OWN_NORM, ModelFactory, check_logits, is_factory
from fedaudit.models.norms import NORM_LAYERS
from fedaudit.models.resnet import ResNetEncoder

ARCHITECTURES: dict[str, str] = {
    "cnn": "4 blocks conv3x3-norm-ReLU-maxpool (32-64-128-256) + global pool, 256-d; fast on CPU",
    "resnet18": "torchvision ResNet-18, random init, 512-d pooled features",
    "resnet50": "torchvision ResNet-50, random init, 2048-d pooled features",
}

HEADS: dict[str, str] = {
    "linear": "Linear(p, classes)",
    "bn_linear": "BatchNorm1d(p, affine=False) -> Linear(p, classes) (FedLSI's head)",
}


def make_head(kind: str, dim: int, num_classes: int) -> nn.Module:
    """Build the classifier head ``kind`` mapping ``dim``-d features to logits."""
    if kind == "linear":
        return nn.Linear(dim, num_classes)
    if kind == "bn_linear":
        # Named children: FedLSI reads head.bn's running stats; head[0]/head[1] work too.
        return nn.Sequential(
            OrderedDict(bn=nn.BatchNorm1d(dim, affine=False), fc=nn.Linear(dim, num_classes))
        )
    raise unknown_choice("head", kind, HEADS)


class Classifier(nn.Module):
    """logits = head(encoder(x)); ``features(x)`` returns the encoder's z."""

    def __init__(self, encoder: nn.Module, head: nn.Module, feature_dim: int, num_classes: int,
                 arch: str, norm: str, head_kind: str = "linear") -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.feature_dim = feature_dim
        self.num_classes = num_classes
        self.arch = arch
        self.norm = norm
        self.head_kind = head_kind

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))

    def features(self, x: Tensor) -> Tensor:
        return self.encoder(x)

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, norm={self.norm!r}, feature_dim={self.feature_dim}, num_classes={self.num_classes}"


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FedauditError(f"{name} must be a positive integer, got {value!r}")
    return value




def build_model(arch: str, num_classes: int, image_size: int = 32, norm: str = "bn", head: str = "linear",
                feature_dim: int | None = None, pretrained: str | None = None,
                mixstyle: nn.Module | None = None, model_args: Mapping[str, Any] | None = None,
                validate: bool = True) -> nn.Module:
    """Build a randomly initialised Classifier (then load ``pretrained``, a local state_dict, if given),
    or the model of a factory ``arch`` (``PKG.MODULE:CALLABLE``, called with ``model_args``; its logits are
    checked unless ``validate`` is False).

    ``feature_dim`` appends Linear(backbone_dim, feature_dim) to the encoder
    (FedLSI uses p = 512). ``mixstyle`` is applied after the first two blocks.
    """
    if is_factory(arch):
        changed = [what for what, off in (("--norm " + str(norm), norm in (OWN_NORM, "bn")), (f"a {head} head", head == "linear"),
                                          ("a feature projection", feature_dim is None), ("MixStyle", mixstyle is None)) if not off]
        if changed:
            raise FedauditError(f"--model {arch} builds its own layers; fedaudit cannot give it {changed[0]}: choose "
                                "--model cnn, resnet18 or resnet50 for that")
        model = ModelFactory(arch, dict(model_args or {})).build(_positive_int("num_classes", num_classes))
        if validate:
            check_logits(model, arch, num_classes, _positive_int("image_size", image_size))
        if pretrained is not None:
            from fedaudit.models.pretrained import load_whole_state  # late import: pretrained imports this module

            load_whole_state(model, pretrained)
        return model
    # Validate every choice up front so the user sees the real mistake, not a torchvision traceback.
    if arch not in ARCHITECTURES:
        raise unknown_choice("architecture", arch, ARCHITECTURES)
    if norm not in NORM_LAYERS:
        raise unknown_choice("norm layer", norm, NORM_LAYERS)
    if head not in HEADS:
        raise unknown_choice("head", head, HEADS)
    _positive_int("num_classes", num_classes)
    _positive_int("image_size", image_size)
    if feature_dim is not None:
        _positive_int("feature_dim", feature_dim)

    encoder: CNNEncoder | ResNetEncoder
    if arch == "cnn":
        encoder = CNNEncoder(norm=norm, mixstyle=mixstyle)
    else:
        encoder = ResNetEncoder(arch, norm=norm, image_size=image_size, mixstyle=mixstyle)
    dim = encoder.out_dim
    if feature_dim is not None:
        encoder.proj = nn.Linear(dim, feature_dim)
        dim = feature_dim

    model = Classifier(encoder, make_head(head, dim, num_classes), dim, num_classes, arch, norm, head)
    if pretrained is not None:
        from fedaudit.models.pretrained import load_pretrained  # late import: pretrained imports this module

        load_pretrained(model, pretrained)
    return model


def bn_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every batch-normalisation layer as (qualified name, module), in registration (= forward) order: found by
    its ``running_mean``, ``running_var`` and ``num_batches_tracked`` buffers, whatever its class (BatchNorm,
    SyncBatchNorm, a user's own): statistics that training updates from the clients' batches. Left out:
    torchvision's FrozenBatchNorm2d (no counter: its statistics are pretrained, never the clients'), and instance
    norms (their statistics average per-image normalisations, not the batch moments a reconstruction matches)."""
    return [(name, m) for name, m in model.named_modules()
            if all(isinstance(getattr(m, b, None), Tensor) for b in ("running_mean", "running_var", "num_batches_tracked"))
            and not isinstance(m, _InstanceNorm)]


def head_layer(model: nn.Module, num_classes: int | None = None) -> str | None:
    """The qualified name of the model's classifier head: ``head`` for fedaudit's Classifier, else the last
    ``nn.Linear`` with ``num_classes`` outputs (the layer whose weights map features to logits), or the last
    ``nn.Linear`` when none has; None when the model has no linear layer."""
    if isinstance(model, Classifier):
        return "head"
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    to_logits = [name for name, m in linears if m.out_features == num_classes]
    return (to_logits or [name for name, _ in linears] or [None])[-1]
