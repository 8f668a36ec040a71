"""MixStyle (Zhou et al., ICLR 2021): mix instance feature statistics in a batch.

A feature map's per-channel mean and standard deviation over space carry
much of an image's style. In training, with probability ``p`` per forward,
every sample is re-normalised with a convex mix of its own statistics and
those of another sample of the batch (random pairing), weights drawn from
Beta(α, α). In eval it is the identity. The encoders apply it after their
first two blocks (``build_model(..., mixstyle=MixStyle())``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class MixStyle(nn.Module):
    """Style mixing between the samples of a batch; no parameters, no buffers.

    Randomness comes from torch's global RNG (the engine reseeds it per round),
    so a run is reproducible. The statistics are detached, as in the paper:
    gradients flow through the normalised content only.
    """

    def __init__(self, p: float = 0.5, alpha: float = 0.1, eps: float = 1e-6) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"MixStyle p must be in [0, 1], got {p}")
        if alpha <= 0:
            raise ValueError(f"MixStyle alpha must be positive, got {alpha}")
        self.p = p
        self.alpha = alpha
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # The coin is drawn on the CPU generator, so deciding costs no device sync.
        if not self.training or torch.rand(()).item() >= self.p:
            return x
        b = x.shape[0]
        xf = x.float()  # statistics in fp32 under bf16 autocast
        mu = xf.mean(dim=(2, 3), keepdim=True).detach()
        sig = (xf.var(dim=(2, 3), keepdim=True) + self.eps).sqrt().detach()
        content = (xf - mu) / sig
        conc = torch.full((b, 1, 1, 1), self.alpha, device=x.device)
        # validate_args=False: checking the concentrations would sync a CUDA device every forward.
        lam = torch.distributions.Beta(conc, conc, validate_args=False).sample()
        perm = torch.randperm(b, device=x.device)
        mu_mix = lam * mu + (1 - lam) * mu[perm]
        sig_mix = lam * sig + (1 - lam) * sig[perm]
        return (content * sig_mix + mu_mix).to(x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}, alpha={self.alpha}"
