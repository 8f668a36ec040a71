"""ResNet-18/50 encoders built from torchvision, random init (nothing downloaded)."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from fedaudit.models.norms import make_norm

SMALL_IMAGE_MAX = 64  # at or below this size the CIFAR stem is used

RESNETS = ("resnet18", "resnet50")


class ResNetEncoder(nn.Module):
    """torchvision ResNet without ``fc``: x -> pooled z (512-d for 18, 2048-d for 50).

    For ``image_size <= 64`` the small-image (CIFAR) stem is used: conv1 is a
    3x3 stride-1 conv with padding 1 and the stem max-pool is removed, because
    the ImageNet stem would shrink a 32-px image to 8 px before layer1. Larger
    images keep the ImageNet stem (7x7 stride-2 conv + max-pool).

    The torchvision model lives in ``backbone``, so its state_dict keys are
    torchvision's under the prefix ``encoder.backbone.``. ``mixstyle`` (if
    given) runs after layer1 and layer2, where the MixStyle paper puts it.
    """

    def __init__(self, arch: str, norm: str = "bn", image_size: int = 224, mixstyle: nn.Module | None = None) -> None:
        super().__init__()
        # torchvision is imported here, not with fedaudit: it loads its detection ops and torch's compiler (~2 s), which
        # every `fedaudit` command paid at start-up, --help included, for a model most runs never build.
        import torchvision.models

        if arch not in RESNETS:
            raise ValueError(f"unknown ResNet {arch!r}; use one of {', '.join(RESNETS)}")
        net = getattr(torchvision.models, arch)(weights=None, norm_layer=partial(make_norm, norm))
        if image_size <= SMALL_IMAGE_MAX:
            net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")  # as torchvision
            net.maxpool = nn.Identity()
        self.out_dim = net.fc.in_features
        net.fc = nn.Identity()
        self.backbone = net
        self.mixstyle = mixstyle
        self.proj: nn.Module = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        # Spelled out (not net(x)) so MixStyle can sit between the stages.
        n = self.backbone
        x = n.maxpool(n.relu(n.bn1(n.conv1(x))))
        x = n.layer1(x)
        if self.mixstyle is not None:
            x = self.mixstyle(x)
        x = n.layer2(x)
        if self.mixstyle is not None:
            x = self.mixstyle(x)
        x = n.layer4(n.layer3(x))
        return self.proj(torch.flatten(n.avgpool(x), 1))
