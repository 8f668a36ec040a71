"""The auditor's data for a recording: what it scores attacks against.

Either a dataset fedaudit knows, split as fedaudit splits it; or the deployment's own records, in folders the user
gives (``--records``: each client's members and holdout records and an unseen domain's, :data:`RECORDS_LAYOUT`);
or none (:data:`NO_DATA`): the recording's public facts (classes, normalisation, flips) and its clients' names,
against which attacks run unscored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedaudit.data import MultiDomainDataset, load_dataset, lodo_split
from fedaudit.data.base import ClientData, LODOSplit
from fedaudit.data.split import stratified_split
from fedaudit.errors import FedauditError
from fedaudit.interop.manifest import Prior
from fedaudit.interop.recording_reader import Recording
from fedaudit.run.config import RunConfig
from fedaudit.run.seeds import derive_seed
from fedaudit.simulation.wire import SERVER

NO_DATA = "no-data"  # the dataset of an audit whose auditor holds none of the clients' records: attacks run unscored
UNSCORED = ("the auditor holds none of the clients' records (the recording's manifest names no data), so nothing "
            "could be scored against them")
PRIOR_KEYS = "classes, mean, std and hflip: the class names, the normalisation (x/255 - mean) / std, whether flips keep labels"
RECORDS_LAYOUT = ("records PATH holds members/<client>/<class>/<image> (what each client trained on), "
                  "holdout/<client>/<class>/<image> (its records it never trained on) and unseen/<domain>/<class>/<image> "
                  "(a domain no client holds)")
VAL_OF_HOLDOUT = 0.2  # of a client's holdout records, the share the auditor uses as validation (twin records,
# source accuracy); the rest are the membership test's non-members — fedaudit's own split keeps the same 1:4


def load_records(path: str, image_size: int, seed: int) -> tuple[MultiDomainDataset, LODOSplit]:
    """The auditor's data for a deployment fedaudit did not split: each client's members and holdout records,
    and an unseen domain's, in folders (:data:`RECORDS_LAYOUT`); the holdout is split into validation and
    non-members with ``seed``."""
    from fedaudit.data.folder import load_folder

    root = Path(path).expanduser()
    for part in ("members", "holdout", "unseen"):
        if not (root / part).is_dir():
            raise FedauditError(f"auditor records {root} have no {part}/ folder; {RECORDS_LAYOUT}; give the "
                                "auditor's records with --records PATH")
    members = load_folder(str(root / "members"), image_size, min_domains=1)
    holdout = load_folder(str(root / "holdout"), image_size, min_domains=1)
    unseen = load_folder(str(root / "unseen"), image_size, min_domains=1)
    for part, ds in (("holdout", holdout), ("unseen", unseen)):
        if ds.classes != members.classes:
            raise FedauditError(f"auditor records {root}: {part}/ has classes {ds.classes}, members/ has "
                                f"{members.classes}; every part needs the same class folders")
    missing = [d for d in members.domains if d not in holdout.domains]
    if missing:
        raise FedauditError(f"auditor records {root}: client {missing[0]!r} has members but no holdout/{missing[0]}/; "
                            f"{RECORDS_LAYOUT}")
    target = unseen.domains[0]
    sources = []
    for i, dom in enumerate(members.domains):
        hx, hy = holdout.images[dom], holdout.labels[dom]
        _, val, hold = stratified_split(hy, (0.0, VAL_OF_HOLDOUT, 1 - VAL_OF_HOLDOUT),
                                        torch.Generator().manual_seed(derive_seed(seed, i)))
        n = members.labels[dom].numel()
        sources.append(ClientData(domain=dom, train_x=members.images[dom], train_y=members.labels[dom],
                                  val_x=hx[val], val_y=hy[val], holdout_x=hx[hold], holdout_y=hy[hold],
                                  train_idx=torch.arange(n), val_idx=n + val, holdout_idx=n + hold))
    dataset = MultiDomainDataset(
        name=f"records:{path}", classes=members.classes, domains=[*members.domains, target],
        images={**{d: torch.cat([members.images[d], holdout.images[d]]) for d in members.domains},
                target: unseen.images[target]},
        labels={**{d: torch.cat([members.labels[d], holdout.labels[d]]) for d in members.domains},
                target: unseen.labels[target]},
        skipped=members.skipped + holdout.skipped + unseen.skipped)
    return dataset, LODOSplit(target=target, sources=sources, target_x=unseen.images[target],
                              target_y=unseen.labels[target])


def public_data(rec: Recording, image_size: int) -> tuple[MultiDomainDataset, LODOSplit]:
    """No records: what is public about the clients' data (the manifest's ``prior``: classes, normalisation,
    flips) and the recorded clients' names as its domains, each holding nothing. An attack needs no more."""
    prior = rec.manifest.prior or Prior()
    where = f"{rec.root}/manifest.json prior"
    classes = prior.classes
    if not classes:
        raise FedauditError(f"{where} has no list of class names (classes); give {PRIOR_KEYS}")
    declared = rec.manifest.model.num_classes if rec.manifest.model is not None else None
    if declared is not None and declared != len(classes):
        raise FedauditError(f"{where} names {len(classes)} classes but the model declares num_classes {declared}; "
                            "give one name per output of the model")
    norm = prior_normalisation(rec)
    clients = recorded_clients(rec)
    target = next(t for t in ("unknown", *(f"unknown-{i}" for i in range(1, len(clients) + 2))) if t not in clients)
    # ^ no unseen domain's records either: a name only, never a client's
    empty = torch.zeros(0, 3, image_size, image_size, dtype=torch.uint8)
    none = torch.zeros(0, dtype=torch.long)
    sources = [ClientData(domain=d, train_x=empty, train_y=none, val_x=empty, val_y=none, holdout_x=empty,
                          holdout_y=none, train_idx=none, val_idx=none, holdout_idx=none) for d in clients]
    dataset = MultiDomainDataset(name=NO_DATA, classes=list(classes), domains=[*clients, target],
                                 images={d: empty for d in [*clients, target]}, labels={d: none for d in [*clients, target]},
                                 mean=norm["mean"], std=norm["std"], hflip=norm["hflip"])
    return dataset, LODOSplit(target=target, sources=sources, target_x=empty, target_y=none)


def prior_normalisation(rec: Recording) -> dict[str, Any]:
    """What the manifest's ``prior`` says about the clients' inputs: normalisation ``(x/255 - mean) / std`` and
    whether flips keep labels (each checked, one line naming the problem)."""
    prior = rec.manifest.prior or Prior()
    where = f"{rec.root}/manifest.json prior"
    norm: dict[str, Any] = {"hflip": bool(prior.hflip)}
    for key in ("mean", "std"):
        v = getattr(prior, key)  # numbers, by the manifest's model; here: three, and a std above 0
        if v is None or len(v) != 3 or (key == "std" and min(v) <= 0):
            raise FedauditError(f"{where} {key} must be three numbers (one per RGB channel{', each > 0' if key == 'std' else ''}),"
                                f" got {v!r}; give {PRIOR_KEYS}")
        norm[key] = tuple(float(x) for x in v)
    return norm


def recorded_clients(rec: Recording) -> list[str]:
    """The clients' names, as the recording's ledger gives them, sorted."""
    return sorted({r[side][len("client:"):] for r in rec.rows for side in ("sender", "receiver") if r[side] != SERVER})


def auditor_data(cfg: RunConfig, data_seed: int, rec: Recording | None = None) -> tuple[MultiDomainDataset, LODOSplit]:
    """The records the auditor scores with: a dataset split as fedaudit splits it, or the deployment's own;
    with no data (:data:`NO_DATA`), the recording's public facts and no records."""
    if cfg.dataset == NO_DATA and rec is not None:
        return public_data(rec, cfg.image_size)
    if cfg.dataset.startswith("records:"):
        dataset, split = load_records(cfg.dataset[len("records:"):], cfg.image_size, cfg.seed)
        if rec is not None and rec.manifest.prior is not None:  # the deployment's own preprocessing, where it said it
            norm = prior_normalisation(rec)
            dataset.mean, dataset.std, dataset.hflip = norm["mean"], norm["std"], norm["hflip"]
        return dataset, split
    dataset = load_dataset(cfg.dataset, cfg.image_size, seed=data_seed, cache_mb=cfg.cache_mb)
    target = cfg.target_domain or dataset.domains[-1]
    return dataset, lodo_split(dataset, target, cfg.split, seed=cfg.seed)
