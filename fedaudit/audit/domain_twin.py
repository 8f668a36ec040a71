"""Domain twins: the null of the participation question (issue 47).

The domain-level attack scores a source domain's holdout records against the unseen domain's records on the
released model (its AUC). A domain that is simply easier than the unseen one — nearer the other clients' data, less
noisy — shows that gap whether or not it took part. Its null is the same federation trained **without** that domain:
same method, configuration and records of every other client, the domain's records left out of training and kept
as the challenge. The same attack scores the same records on each twin's released model.

One twin is not enough: retrained with another seed, a small federation's AUC on a domain it never saw moves by
about ±0.1 (digits, fedavg, 10 rounds: standard deviation 0.12 of the difference between two seeds, against 0.024
for the records' sampling alone), so a test that held the models fixed would find "participation" in half of the
federations where the domain never took part. Each domain therefore gets ``--domain-twins`` twins (default 2), each
with its own seed derived from the run's; under the null the released model is one more draw of the same kind, and
the verdict (:mod:`fedaudit.audit.verdict.participation`) compares its AUC with the twins' mean against their
spread, pooled over the row's domains (a prediction interval for one new draw).

Stored beside each source domain's domain-level entry as ``domain_twin``: the twins' AUCs on the same records, their
seeds, clients and unseen-domain accuracies — or why none was trained (a recording: fedaudit cannot re-run the
deployment's loop; a federation of one source domain has no twin; ``--domain-twins 0``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from fedaudit.run.seeds import derive_seed, stable_int
from fedaudit.run.stored.leakage import DomainTwin
from fedaudit.statistics.membership_statistics import auc, roc

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch import Tensor

    from fedaudit.run.config import RunConfig
    from fedaudit.simulation.federation import Federation
    from fedaudit.simulation.method import Method

log = logging.getLogger("fedaudit")

TWIN_STREAM = 9_047  # derive_seed stream of the domain twins' seeds
SEED_RANGE = 2**31  # a twin's seed, small enough for every RNG the engine seeds with it


def twin_seed(seed: int, domain: str, index: int) -> int:
    """The seed of ``domain``'s ``index``-th twin: its own, derived from the run's."""
    return derive_seed(seed, TWIN_STREAM, stable_int(domain), index) % SEED_RANGE


def train_domain_twin(cfg: RunConfig, method: Method, fed: Federation, domain: str, index: int) -> Federation | str:
    """The federation trained without ``domain`` with its ``index``-th twin seed, or why there is none."""
    from fedaudit.simulation.federation import Federation as Twin
    from fedaudit.simulation.federation import TrainingDiverged
    from fedaudit.simulation.wire import Wire

    others = [c for c in fed.split.sources if c.domain != domain]
    if not others:
        return f"{domain} is the only source domain: a federation without it has no client"
    twin_cfg = replace(cfg, seed=twin_seed(cfg.seed, domain, index))
    twin = Twin(twin_cfg, type(method)(twin_cfg), fed.dataset, replace(fed.split, sources=others), fed.device, Wire(None))
    if twin.client_dp is not None:  # DP's neighbour: the same mechanism (sum over the full K, noise σC) on one client fewer
        twin.client_dp.denominator = len(fed.split.sources)
    with torch.random.fork_rng(devices=[fed.device] if fed.device.type == "cuda" else []):  # the attacks' draws stay
        twin.setup()
        try:
            twin.run()
        except TrainingDiverged as exc:  # a twin is evidence, not the run: its failure leaves the row without it
            return f"a twin trained without {domain} diverged ({exc})"
    return twin


def domain_twins(score: Callable[[Any], Tensor], truth: Sequence[str | None], cfg: RunConfig, method: Method,
                 fed: Federation, victims: Sequence[str], count: int,
                 query_of: Callable[[Method, Federation], Any]) -> dict[str, DomainTwin]:
    """Per source domain in ``victims``: ``count`` twins' AUCs on the domain-level challenge (``truth``: each record's
    domain, None for the unseen one). ``score(query)`` runs the attack's domain-level scoring against a model's query
    access; ``query_of`` builds that access for a twin."""
    if count < 1:
        return {d: DomainTwin(status="not available", reason="no domain twin was asked for (--domain-twins 0)")
                for d in victims}
    unseen = torch.tensor([t is None for t in truth])
    out: dict[str, DomainTwin] = {}
    for domain in victims:
        mine = torch.tensor([t == domain for t in truth])
        t0, aucs, seeds, accuracy = time.perf_counter(), [], [], []
        for index in range(count):
            twin = train_domain_twin(cfg, method, fed, domain, index)
            if isinstance(twin, str):
                out[domain] = DomainTwin(status="not available", reason=twin)
                break
            query = query_of(twin.method, twin)
            if query is None:
                out[domain] = DomainTwin(status="not available", reason="a twin deploys no global model to query")
                break
            scores = score(query).cpu().double()
            if not bool(torch.isfinite(scores).all()):
                out[domain] = DomainTwin(status="not available", reason="a twin's outputs are not finite (its weights "
                                                                        "destroyed by noise, or diverged): nothing to rank")
                break
            aucs.append(auc(*roc(scores[mine].numpy(), scores[unseen].numpy())[:2]))
            seeds.append(twin.cfg.seed)
            accuracy.append(twin.results().unseen_domain)
        else:
            out[domain] = DomainTwin(status="measured", aucs=aucs, seeds=seeds,
                                     clients=[c.domain for c in fed.split.sources if c.domain != domain],
                                     unseen_domain_accuracy=accuracy)
            log.info("mia: %d domain twin(s) of %s (trained without it) in %.1fs: AUC %s", count, domain,
                     time.perf_counter() - t0, ", ".join(f"{a:.3f}" for a in aucs))
    return out


__all__ = ["domain_twins", "train_domain_twin", "twin_seed"]
