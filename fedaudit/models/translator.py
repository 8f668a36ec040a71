"""FedLSI's latent translator: a StarGAN in latent space (Choi et al. CVPR
2018, as used on images by DIRT, Nguyen et al. NeurIPS 2021).

``G(z, c_src, c_trg)`` maps a latent of client ``c_src`` to what it would be
at client ``c_trg`` (same class); the discriminator has a real/fake head and
a client-classification head. Both are MLPs of three linear layers: the two
hidden layers are each followed by LeakyReLU(0.2), LayerNorm and dropout, as
the FedLSI paper describes; the output layer is linear (a latent, or the
critic's score and the client logits, cannot be squashed or dropped out).
Training is StarGAN's recipe with the WGAN-GP loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _hidden_layers(in_dim: int, hidden: int, dropout: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(2):
        layers += [nn.Linear(in_dim if i == 0 else hidden, hidden), nn.LeakyReLU(0.2), nn.LayerNorm(hidden), nn.Dropout(dropout)]
    return nn.Sequential(*layers)


class LatentTranslator(nn.Module):
    """z [B, p], source and target client indices [B] -> translated z [B, p]."""

    def __init__(self, latent_dim: int, num_domains: int, hidden: int = 1024, dropout: float = 0.5) -> None:
        super().__init__()
        self.num_domains = num_domains
        # Both client codes are inputs (one-hot), as in DIRT's generator.
        self.net = nn.Sequential(_hidden_layers(latent_dim + 2 * num_domains, hidden, dropout), nn.Linear(hidden, latent_dim))

    def forward(self, z: Tensor, src: Tensor, trg: Tensor) -> Tensor:
        codes = torch.cat([F.one_hot(src, self.num_domains), F.one_hot(trg, self.num_domains)], dim=1).to(z.dtype)
        return self.net(torch.cat([z, codes], dim=1))


class LatentDiscriminator(nn.Module):
    """z [B, p] -> (critic score [B], client logits [B, num_domains])."""

    def __init__(self, latent_dim: int, num_domains: int, hidden: int = 1024, dropout: float = 0.5) -> None:
        super().__init__()
        self.trunk = _hidden_layers(latent_dim, hidden, dropout)
        self.src = nn.Linear(hidden, 1)
        self.cls = nn.Linear(hidden, num_domains)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor]:
        h = self.trunk(z)
        return self.src(h).squeeze(1), self.cls(h)


def _class_table(classes: Tensor) -> tuple[Tensor, Tensor]:
    """Per present class, the indices of its samples (rows padded) and their count."""
    present, counts = torch.unique(classes, return_counts=True)
    order = torch.argsort(classes, stable=True)
    table = torch.zeros(len(present), int(counts.max()), dtype=torch.long, device=classes.device)
    start = 0
    for row, n in enumerate(counts.tolist()):  # once, before the training loop
        table[row, :n] = order[start:start + n]
        start += n
    return table, counts


def train_latent_translator(latents: Tensor, domains: Tensor, classes: Tensor, num_domains: int, *, iterations: int,
                            generator: torch.Generator, hidden: int = 1024, dropout: float = 0.5, batch_size: int = 16,
                            lr: float = 1e-4, n_critic: int = 5, lambda_cls: float = 1.0, lambda_rec: float = 10.0,
                            lambda_gp: float = 10.0) -> tuple[LatentTranslator, LatentDiscriminator]:
    """Train G and D on ``latents`` [N, p] labelled with their client (``domains``) and class.

    Every minibatch holds latents of one class (from all clients), so G learns
    to move a latent between clients within its class. Targets are the
    batch's client labels shuffled (StarGAN). Adam (β = 0.5, 0.999) for both,
    one G step per ``n_critic`` D steps, learning rates decayed linearly to 0
    over the second half. Dropout and initialisation draw from torch's global
    RNG (seed it for a reproducible run); batches from ``generator``.
    Returns (G, D) in eval mode.
    """
    if iterations < 0 or batch_size < 2 or n_critic < 1:
        raise ValueError("need iterations >= 0, batch_size >= 2 and n_critic >= 1")
    device = latents.device
    dim = latents.shape[1]
    G = LatentTranslator(dim, num_domains, hidden, dropout).to(device)
    D = LatentDiscriminator(dim, num_domains, hidden, dropout).to(device)
    opt_g = torch.optim.Adam(G.parameters(), lr=lr, betas=(0.5, 0.999), foreach=True)
    opt_d = torch.optim.Adam(D.parameters(), lr=lr, betas=(0.5, 0.999), foreach=True)
    decay = max(iterations - iterations // 2, 1)
    table, counts = _class_table(classes)
    rows = torch.randint(len(table), (iterations,), generator=generator, device=device)
    G.train()
    D.train()
    for i in range(iterations):
        for group in (*opt_g.param_groups, *opt_d.param_groups):
            group["lr"] = lr * min(1.0, (iterations - i) / decay)
        row = rows[i]
        pick = (torch.rand(batch_size, generator=generator, device=device) * counts[row]).long()
        idx = table[row, pick]
        z, src = latents[idx], domains[idx]
        trg = src[torch.randperm(batch_size, generator=generator, device=device)]

        # Critic and client classifier: real latents vs translated ones, and the
        # gradient penalty on points between them. D has no batch-coupled layer,
        # so the three sets go through it in one call.
        with torch.no_grad():
            fake = G(z, src, trg)
        alpha = torch.rand(batch_size, 1, generator=generator, device=device)
        mix = (alpha * z + (1 - alpha) * fake).requires_grad_(True)
        scores, logits = D(torch.cat([z, fake, mix]))
        real_score, fake_score, mix_score = scores.split(batch_size)
        (grad,) = torch.autograd.grad(mix_score.sum(), mix, create_graph=True)
        penalty = (grad.norm(dim=1) - 1).pow(2).mean()
        d_loss = (fake_score.mean() - real_score.mean() + lambda_cls * F.cross_entropy(logits[:batch_size], src)
                  + lambda_gp * penalty)
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_d.step()

        if (i + 1) % n_critic == 0:
            fake = G(z, src, trg)
            fake_score, fake_cls = D(fake)
            rec = G(fake, trg, src)
            g_loss = (-fake_score.mean() + lambda_cls * F.cross_entropy(fake_cls, trg)
                      + lambda_rec * (z - rec).abs().mean())
            opt_g.zero_grad(set_to_none=True)
            g_loss.backward()
            opt_g.step()
    return G.eval(), D.eval()
