"""Why the tracing test is whitened: its AUC on the BatchNorm statistics of a few records, standardised only
against whitened (the README's and ``fedaudit.attacks.mia.scorers.tracing_scores``' figure).

A freshly initialised ``cnn`` (seed 0) on the first ``shapes`` domain: ``k`` records' per-channel input means and
mean squares at every BN layer are averaged into the shared statistics; the candidates are those k records and
420 others. Mean AUC over 5 draws, for each k.

    python scripts/tracing_whitening.py
"""

from __future__ import annotations

import math

import torch

from fedaudit.attacks.mia.artifact import _layer_moments
from fedaudit.data import load_dataset
from fedaudit.models.classifier import build_model
from fedaudit.simulation.training import Preprocess
from fedaudit.statistics.membership_statistics import membership_metrics
from fedaudit.attacks.mia.scorers import tracing_scores
from fedaudit.tensor_ops.bn_statistics import bn_modules

import results_page  # scripts/ is on sys.path when run as python scripts/tracing_whitening.py

NONMEMBERS, DRAWS = 420, 5


def standardised_only(features: torch.Tensor, shared: torch.Tensor) -> torch.Tensor:
    """The test without whitening: each statistic standardised by the candidates' spread, summed."""
    y, a = features.double(), shared.double().reshape(1, -1)
    p, var = y.mean(0, keepdim=True), y.var(0, keepdim=True).clamp_min(1e-12)
    return ((y - p) * (a - p) / var).sum(1) / math.sqrt(y.shape[1])


def main() -> None:
    torch.manual_seed(0)
    ds = load_dataset("shapes")
    images = ds.images[ds.domains[0]]
    model = build_model("cnn", ds.num_classes).eval()
    with torch.no_grad():
        feats = _layer_moments(model, bn_modules(model), images, Preprocess(ds.mean, ds.std, torch.device("cpu"),
                                                                               hflip=ds.hflip), "fp32")
    lines = ["| records behind the statistics | standardised only | whitened |", "|---|---|---|"]
    for k in (7, 14, 28, 70):
        aucs = {"standardised": [], "whitened": []}
        for draw in range(DRAWS):
            order = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(draw))
            members, others = order[:k], order[k:k + NONMEMBERS]
            candidates, shared = torch.cat([feats[members], feats[others]]), feats[members].mean(0)
            for name, test in (("standardised", standardised_only), ("whitened", tracing_scores)):
                s = test(candidates, shared)
                aucs[name].append(membership_metrics(s[:k], s[k:])["auc"])
        lines.append(f"| {k} | {sum(aucs['standardised']) / DRAWS:.2f} | {sum(aucs['whitened']) / DRAWS:.2f} |")
    results_page.write("tracing_whitening", "Why the tracing test is whitened", "\n".join(lines),
                       f"A freshly initialised `cnn` (seed 0) on the first `shapes` domain, {feats.shape[1]} BatchNorm "
                       f"statistics per record; the candidates are the k records behind the shared statistics and "
                       f"{NONMEMBERS} others. AUC of the tracing test, mean over {DRAWS} draws, with the records' "
                       f"statistics standardised only and whitened.", reads_runs=False)


if __name__ == "__main__":
    main()
