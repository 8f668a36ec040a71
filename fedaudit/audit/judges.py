"""The auditor's judges: how near a reconstruction is to a real record (PSNR, SSIM, LPIPS when its backbone file is
on disk, the nearest record of the same class), and the classifiers that attribute a reconstruction to a domain
or a class. The auditor trains them on real records; an attack never sees them."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedaudit.run.stored.reconstruction import Judge
from fedaudit.simulation.training import Preprocess, forward_chunks, index_batches

PSNR_CAP_DB = 100.0  # identical images: PSNR is infinite; a cap keeps metrics.json valid JSON
LPIPS_SIZE = 64  # AlexNet's stride-4 stem needs more than 16 px; inputs are resized to this
def psnr(a: Tensor, b: Tensor, cap: float = PSNR_CAP_DB) -> Tensor:
    """Per-pair PSNR in dB of images in [0, 1] ([N, C, H, W]); identical pairs give ``cap``."""
    mse = (a.float() - b.float()).pow(2).flatten(1).mean(1)
    out = 10.0 * torch.log10(1.0 / mse.clamp_min(1e-30))
    return out.clamp(max=cap)


def _gaussian_window(size: int, sigma: float, device: torch.device) -> Tensor:
    ax = torch.arange(size, device=device, dtype=torch.float32) - (size - 1) / 2
    g = torch.exp(-(ax**2) / (2 * sigma**2))
    g = g / g.sum()
    return g[:, None] * g[None, :]


def ssim(a: Tensor, b: Tensor, window: int = 11, sigma: float = 1.5) -> Tensor:
    """Per-pair SSIM (Wang et al. 2004) of images in [0, 1] ([N, C, H, W]).

    Gaussian window (11 px, sigma 1.5; shrunk to the image side for tiny
    images), constants K1 = 0.01, K2 = 0.03, valid convolution, mean over
    channels and positions — the reference definition.
    """
    a, b = a.float(), b.float()
    n, c, h, w = a.shape
    size = min(window, h, w)
    kernel = _gaussian_window(size, sigma, a.device).expand(c, 1, size, size)

    def blur(x: Tensor) -> Tensor:
        return F.conv2d(x, kernel, groups=c)

    c1, c2 = 0.01**2, 0.03**2
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    num = (2 * mu_a * mu_b + c1) * (2 * cov + c2)
    den = (mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2)
    return (num / den).flatten(1).mean(1)


def nearest_in_class(r: Tensor, r_y: Tensor, refs: Tensor, ref_y: Tensor) -> tuple[Tensor, Tensor]:
    """For each ``r[i]`` the pixel-L2 distance to, and index of, its nearest ``refs`` of class ``r_y[i]``.

    Distance is ``inf`` (index 0) when the class has no reference record.
    """
    d = torch.cdist(r.flatten(1).float(), refs.flatten(1).float())
    d = d.masked_fill(r_y[:, None] != ref_y[None, :], math.inf)
    dist, idx = d.min(1)
    return dist, idx


class AuditorNet(nn.Module):
    """The auditor's judge: a small CNN (three stride-2 conv-BN-ReLU, 32-64-128, global pool).

    Deliberately not the federation's architecture, so the judge does not
    share the inductive biases of the model the images were inverted from;
    strided convolutions keep it cheap enough to train four of them per run on CPU.
    """

    def __init__(self, num_classes: int, channels: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip((channels, 32, 64), (32, 64, 128)):
            layers += [nn.Conv2d(a, b, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.fc(self.features(x).mean(dim=(2, 3)))
        return logits


@dataclass
class AuditorClassifier:
    """A trained judge: ``predict`` takes [0, 1] images and returns class indices."""

    model: nn.Module
    mean: Tensor
    std: Tensor

    @torch.no_grad()
    def predict(self, images01: Tensor) -> Tensor:
        self.model.eval()
        out = [logits.argmax(1) for _, logits in forward_chunks(self.model, images01, self._standardise, "fp32")]
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long, device=images01.device)

    def _standardise(self, images01: Tensor) -> Tensor:
        return (images01.float() - self.mean) / self.std

    def accuracy(self, images01: Tensor, labels: Tensor) -> float:
        """Top-1 accuracy on real records (report it on records the judge never trained on)."""
        return float((self.predict(images01) == labels).float().mean()) if labels.numel() else float("nan")


def train_auditor_classifier(images: Tensor, labels: Tensor, num_classes: int, mean: tuple[float, ...],
                             std: tuple[float, ...], *, hflip: bool, seed: int, steps: int = 300,
                             batch_size: int = 64, lr: float = 3e-3) -> AuditorClassifier:
    """Train an :class:`AuditorNet` on real uint8 ``images`` (on their device) with shift/flip augmentation.

    Adam with cosine decay to zero: the judge is the last iterate, and a
    constant learning rate made its accuracy swing from run to run.
    """
    device = images.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = AuditorNet(num_classes, images.shape[1]).to(device)
    pre = Preprocess(mean, std, device, hflip=hflip)
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    model.train()
    for idx in index_batches(images.shape[0], batch_size, g, device, steps=steps):
        loss = F.cross_entropy(model(pre(images[idx], g)), labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch's stubs leave it untyped
        opt.step()
        sched.step()
    return AuditorClassifier(model.eval(), pre.mean, pre.std)


def lpips_backbone_path(override: str | None) -> Path:
    """Where the AlexNet backbone file is (or would be): ``override`` or the torch hub cache."""
    if override is not None:
        return Path(override).expanduser()
    import torchvision

    name = Path(torchvision.models.AlexNet_Weights.IMAGENET1K_V1.url).name
    return Path(torch.hub.get_dir()) / "checkpoints" / name


class LPIPS:
    """LPIPS (Zhang et al. 2018, AlexNet variant) with the backbone read from a local file.

    The ``lpips`` package ships only its linear layers and would fetch the
    AlexNet backbone at run time; here the backbone comes from ``path``
    (loaded with ``weights_only=True``) or LPIPS is not used at all — never a
    random backbone.
    """

    def __init__(self, path: Path, device: torch.device) -> None:
        import lpips
        import torchvision

        state = torch.load(path, map_location="cpu", weights_only=True)
        alex = torchvision.models.alexnet(weights=None)
        alex.load_state_dict(state)
        with warnings.catch_warnings():  # lpips calls torchvision's deprecated `pretrained=` argument
            warnings.simplefilter("ignore", UserWarning)
            net = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)  # linear layers from the package; backbone below
        for part in (net.net.slice1, net.net.slice2, net.net.slice3, net.net.slice4, net.net.slice5):
            for name, module in part.named_children():
                module.load_state_dict(alex.features[int(name)].state_dict())
        self.net = net.to(device).eval()

    @torch.no_grad()
    def __call__(self, a01: Tensor, b01: Tensor) -> Tensor:
        a = F.interpolate(a01.float(), size=LPIPS_SIZE, mode="bilinear", align_corners=False)
        b = F.interpolate(b01.float(), size=LPIPS_SIZE, mode="bilinear", align_corners=False)
        distance: Tensor = self.net(a, b, normalize=True).flatten()
        return distance


def load_lpips(override: str | None, device: torch.device) -> tuple[LPIPS | None, Judge]:
    """The LPIPS scorer if its backbone file exists, and its status for metrics.json."""
    path = lpips_backbone_path(override)
    if not path.is_file():
        return None, Judge(status="unavailable", looked_for=str(path),
                           fix="put torchvision's AlexNet weights there or pass --lpips-weights PATH")
    return LPIPS(path, device), Judge(status="available", weights=str(path))


