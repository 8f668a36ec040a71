"""Small 4-block CNN: the fast CPU default (the ``quick`` profile)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedaudit.models.norms import make_norm

WIDTHS = (32, 64, 128, 256)


def conv_block(in_ch: int, out_ch: int, norm: str) -> nn.Sequential:
    """conv3x3 -> norm -> ReLU -> maxpool2."""
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),  # the norm layer's shift replaces the bias
        make_norm(norm, out_ch),
        nn.ReLU(inplace=True),
        # ceil_mode keeps a 1x1 map at 1x1, so images as small as 8 px still pass 4 pools.
        nn.MaxPool2d(2, ceil_mode=True),
    )


class CNNEncoder(nn.Module):
    """x [B, 3, H, W] -> z [B, 256] (or [B, feature_dim] with a projection).

    ``blocks`` is an ``nn.ModuleList`` so methods can insert a module after
    block i; ``mixstyle`` (if given) runs after blocks 0 and 1, as in MixStyle.
    """

    def __init__(self, norm: str = "bn", mixstyle: nn.Module | None = None, in_channels: int = 3) -> None:
        super().__init__()
        chans = (in_channels, *WIDTHS)
        self.blocks = nn.ModuleList(conv_block(a, b, norm) for a, b in zip(chans[:-1], chans[1:]))
        self.mixstyle = mixstyle  # registered, so .train()/.eval() reach it
        self.proj: nn.Module = nn.Identity()
        self.out_dim = WIDTHS[-1]

    def forward(self, x: Tensor) -> Tensor:
        for i, block in enumerate(self.blocks):
            x = block(x)
            if self.mixstyle is not None and i < 2:
                x = self.mixstyle(x)
        return self.proj(torch.flatten(x.mean(dim=(2, 3)), 1))
