"""The numbers of a finished run besides its leakage: communication, privacy (the defense and what
it covers), provenance, and the mean over targets of a ``--target-domain all`` run."""

from __future__ import annotations

import platform
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from fedaudit.run.numerics import numerics
from fedaudit.run.results import RunMetrics
from fedaudit.run.stored.anonymity import AnonymityEvidence
from fedaudit.run.stored import (Accuracy, Communication, CoverageRow, Device, KindBytes, ModelInfo, Privacy,
                                 Provenance, SourceVal, TargetAccuracy)
from fedaudit.simulation.dp_accounting import coverage
from fedaudit.simulation.wire import ArtifactKind

if TYPE_CHECKING:
    from fedaudit.data import MultiDomainDataset
    from fedaudit.run.config import RunConfig
    from fedaudit.simulation.federation import Federation


Shares = tuple[tuple[ArtifactKind, str], ...]  # (kind, direction) pairs


def communication(fed: Federation, shares: Shares | None = None) -> Communication:
    """Traffic totals from the ledger, and ``declared``: what the method (or a recording's ledger, ``shares``)
    says is sent."""
    s = fed.wire.summary()
    rounds = max(fed.rounds_done, 1)
    return Communication(
        bytes_up=s["bytes_up"], bytes_down=s["bytes_down"],
        by_kind={kind: KindBytes(**sent) for kind, sent in s["by_kind"].items()},
        rounds=fed.rounds_done,
        clients=len(fed.clients),
        mb_up_per_round=s["bytes_up"] / rounds / 1e6,
        mb_down_per_round=s["bytes_down"] / rounds / 1e6,
        # what the configured method says it sends; tests hold the ledger to it
        declared=sorted(f"{k.value}{'↑' if d == 'up' else '↓'}" for k, d in (shares or fed.method.declared_shares())),
    )


def summarise_targets(cfg: RunConfig, per_target: dict[str, dict[str, Any]]) -> RunMetrics:
    """Mean over targets of the headline numbers, with every target's own (each target's metrics.json as written,
    or as a resumed run reads it back: read once here)."""
    def mean(values: list[float | None]) -> float | None:
        """None where a target scored no model (the mean would hide it)."""
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known and len(known) == len(values) else None

    def total(values: list[int | None]) -> int | None:
        """None where a target's file lost its count (a sum would hide it)."""
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    runs = {t: RunMetrics.from_json(m) for t, m in per_target.items()}
    accs = {t: r.accuracy for t, r in runs.items()}
    return RunMetrics(
        method=cfg.method, dataset=cfg.dataset, target_domain="all",
        accuracy=Accuracy(
            unseen_domain=mean([a.unseen_domain for a in accs.values()]),
            source_val=SourceVal(mean=mean([a.source_val.mean for a in accs.values()])),
            per_target={t: TargetAccuracy(unseen_domain=a.unseen_domain, source_val_mean=a.source_val.mean,
                                          selected_round=a.selected_round) for t, a in accs.items()},
        ),
        communication=Communication(
            bytes_up=total([r.communication.bytes_up for r in runs.values()]),
            bytes_down=total([r.communication.bytes_down for r in runs.values()]),
            per_target={t: r.communication for t, r in runs.items()},
        ),
        leakage={t: r.results for t, r in runs.items()},
        privacy={t: r.privacy if isinstance(r.privacy, Privacy) else None for t, r in runs.items()},
        verdict=[replace(row, target=t) for t, r in runs.items() for row in r.verdict],
        anonymity_evidence={t: r.anonymity_evidence for t, r in runs.items()
                            if isinstance(r.anonymity_evidence, AnonymityEvidence)},
        provenance=next(iter(runs.values())).provenance.with_(
            seconds={t: r.provenance.seconds for t, r in runs.items()}),
    )


NO_DP = "no DP: trained without a privacy mechanism"


def privacy(fed: Federation, shares: Shares | None = None, no_dp: str = NO_DP) -> Privacy:
    """The defense in force and what it covers: per client ε spent (Opacus' accountant), and for every
    artifact the method sends (or a recording's ledger holds, ``shares``) whether that ε covers it;
    ``no_dp`` is why nothing is covered when no DP ran here."""
    shares = shares or fed.method.declared_shares()
    if fed.dp is None:
        block = Privacy(dp=None, coverage=[row.with_(covered=False, why=no_dp)
                                           for row in coverage(shares)])
    else:
        block = Privacy(dp=fed.dp.summary({c.index: c.domain for c in fed.clients}),
                        coverage=coverage(shares, fed.dp.train_which))
    client_dp = getattr(fed, "client_dp", None)
    if client_dp is not None:
        block = block.with_(client_dp=client_dp.summary(len(fed.clients)), client_coverage=client_coverage(shares))
    return block


def client_coverage(shares: Shares) -> list[CoverageRow]:
    """What client-level DP on the aggregate covers: the whole models the server sends (each one the noised mean, or
    post-processing of it), not what the clients upload."""
    rows = []
    for kind, direction in shares:
        covered = direction == "down" and kind == ArtifactKind.FULL_MODEL
        why = ("the noised mean of the clipped updates (and the released model, which is one of them)" if covered else
               "the server reads each upload before it adds noise" if direction == "up" else
               "sent outside the noised mean")
        rows.append(CoverageRow.model_validate({"artifact": kind.value, "direction": direction, "covered": covered,
                                                "why": why}))
    return rows


def provenance(cfg: RunConfig, dataset: MultiDomainDataset, device: torch.device, command: str,
               stages: dict[str, float], unpinned: list[str] | None = None,
               model: torch.nn.Module | None = None, data_warnings: list[str] | None = None) -> Provenance:
    """Where and how the numbers were made; called while the run's numeric settings are in force
    (:func:`fedaudit.run.numerics.run_numerics`, whose ``unpinned`` ops ran without a deterministic kernel)."""
    import numpy
    import sklearn
    import torchvision

    from fedaudit import __version__

    optional: dict[str, Any] = {}  # left out of metrics.json where there is none
    if model is not None:
        optional["model"] = model_provenance(cfg, model, len(dataset.classes))
    if data_warnings is not None:
        optional["data_warnings"] = data_warnings
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return Provenance(
        command=command,
        config_hash=cfg.hash(),
        config=cfg.to_json(),
        dataset_fingerprint=dataset.fingerprint(),
        dataset_skipped_files=dataset.skipped,
        dataset_empty_class_folders=list(dataset.empty_classes),
        seed=cfg.seed,
        versions={"fedaudit": __version__, "python": platform.python_version(), "torch": torch.__version__,
                  "torchvision": torchvision.__version__, "numpy": numpy.__version__, "scikit-learn": sklearn.__version__},
        device=Device(type=device.type, name=device_name, threads=torch.get_num_threads()),
        numerics={**numerics(device), **({"nondeterministic_ops": list(unpinned or [])} if cfg.deterministic else {})},
        seconds={k: round(v, 3) for k, v in stages.items()},
        **optional,
    )


def model_provenance(cfg: RunConfig, model: torch.nn.Module, num_classes: int | None = None) -> ModelInfo:
    """The model the run trained or audited: fedaudit's architecture, or the factory (import path, arguments, module
    file and sha256); its parameter count and the layer the attacks took as the classifier head."""
    from fedaudit.models import ModelFactory, head_layer, is_factory

    built = (ModelFactory(cfg.model, cfg.model_args).provenance() if is_factory(cfg.model) else
             {"architecture": cfg.model, "norm": cfg.norm})
    return ModelInfo(**built, class_name=type(model).__name__, parameters=sum(p.numel() for p in model.parameters()),
                     head_layer=head_layer(model, num_classes))


__all__ = ["communication", "model_provenance", "privacy", "provenance", "summarise_targets"]
