"""Loss functions shared by methods (and by attacks that re-train a head).

Each takes model outputs, not a model, so it composes with any forward
pass; a method wraps it into a :data:`fedaudit.simulation.training.LossFn`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothing_loss(logits: Tensor, targets: Tensor, epsilon: float) -> Tensor:
    """Label-smoothed cross-entropy, ``(1−ε)·NLL + ε·mean_c(−log p_c)``, batch mean.

    The smoothed target puts ``1−ε+ε/C`` on the true class and ``ε/C`` on every
    class (FedSB, thesis eq. 4.1–4.4, written with the uniform part over all
    C classes). ε = 0 is plain cross-entropy.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be in [0, 1), got {epsilon}")
    log_p = F.log_softmax(logits.float(), dim=1)
    nll = -log_p.gather(1, targets[:, None]).squeeze(1)
    smooth = -log_p.mean(dim=1)
    return ((1.0 - epsilon) * nll + epsilon * smooth).mean()


def nt_xent_loss(z1: Tensor, z2: Tensor, temperature: float) -> Tensor:
    """SimCLR's NT-Xent: ``z1[i]`` and ``z2[i]`` are two views of record i.

    Every one of the 2B embeddings is L2-normalised; each must pick its
    partner out of the other 2B−1 by cosine similarity / ``temperature``
    (cross-entropy over the similarity row, self excluded), averaged over all 2B.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if z1.shape != z2.shape or z1.dim() != 2:
        raise ValueError(f"need two [B, d] views of the same shape, got {tuple(z1.shape)} and {tuple(z2.shape)}")
    b = z1.shape[0]
    z = F.normalize(torch.cat([z1, z2]).float(), dim=1)
    sim = z @ z.T / temperature
    sim.fill_diagonal_(float("-inf"))  # a view is not its own positive
    partner = torch.cat([torch.arange(b, 2 * b), torch.arange(0, b)]).to(z.device)
    return F.cross_entropy(sim, partner)
