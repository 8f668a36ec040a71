"""The wire: every tensor that leaves a client or the server goes through here.

One object, two uses. The **ledger** (one row per message, with its size in
bytes) gives the communication metrics; the **views** (what an observer in a
role saw) give the attacks their inputs. An attack that needs something the
ledger did not record is an attack on a protocol that does not exist.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import torch
from torch import Tensor

from fedaudit.run.run_directory import safe_name

SERVER = "server"


def direction(receiver: str) -> str:
    """``up`` for client→server, ``down`` for server→client."""
    return "up" if receiver == SERVER else "down"


def client_role(domain: str) -> str:
    """The role name of the client that holds ``domain``."""
    return f"client:{domain}"


class ArtifactKind(str, Enum):  # noqa: UP042 (StrEnum would change str() of a kind, which messages print)
    """What a message is. Values are the names written to the ledger."""

    FULL_MODEL = "full_model"  # every parameter and buffer (BN running stats included)
    MODEL_DELTA = "model_delta"  # theta_k - theta_global
    PARTIAL_MODEL = "partial_model"  # a named subset of the state
    BN_STATS_ALL_LAYERS = "bn_stats_all_layers"  # running mean/var of every BN layer
    GLOBAL_STATS = "global_stats"  # server-aggregated BN statistics, broadcast
    CLASSIFIER_HEAD = "classifier_head"  # BN1d stats + linear weights of the head
    TRANSLATOR = "translator"  # latent translator weights
    IMPORTANCE = "importance"  # per-parameter importance weights
    STYLE_BANK = "style_bank"  # channel mean/std of features
    AMPLITUDE_BANK = "amplitude_bank"  # per-image Fourier amplitude spectra
    SCALARS = "scalars"  # small numbers: sample counts, val metrics
    RECORD = "record"  # a recorded framework message's record fedaudit has no kind for (its name in meta)


@dataclass(frozen=True)
class Artifact:
    """One message on the wire.

    ``tensors`` is everything that crosses (and is counted in bytes); small
    numbers that cross, such as a sample count, are 0-d tensors of a
    ``SCALARS`` artifact so they are counted too. ``meta`` is bookkeeping the
    simulation needs (never counted, never evidence for an attack).
    """

    kind: ArtifactKind
    sender: str
    receiver: str
    round: int
    tensors: dict[str, Tensor]
    meta: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def direction(self) -> str:
        return direction(self.receiver)


@dataclass(frozen=True)
class LedgerEntry:
    """One ledger row: what was sent, by whom, to whom, when, and its size."""

    kind: str
    sender: str
    receiver: str
    round: int
    nbytes: int
    tensors: int

    @property
    def direction(self) -> str:
        return direction(self.receiver)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "sender": self.sender,
            "receiver": self.receiver,
            "round": self.round,
            "direction": self.direction,
            "bytes": self.nbytes,
            "tensors": self.tensors,
        }

    @classmethod
    def from_json(cls, row: dict) -> LedgerEntry:
        return cls(row["kind"], row["sender"], row["receiver"], row["round"], row["bytes"], row["tensors"])


class WireView:
    """What one observer saw: the retained artifacts it sent or received.

    A server sees every upload; a client sees what was sent to it. Attacks get
    a view, never a client object, so their signature is their threat model.
    """

    def __init__(self, role: str, artifacts: list[Artifact]):
        self.role = role
        self.artifacts = artifacts

    def __iter__(self) -> Iterator[Artifact]:
        return iter(self.artifacts)

    def __len__(self) -> int:
        return len(self.artifacts)

    def kinds(self) -> set[ArtifactKind]:
        return {a.kind for a in self.artifacts}

    def of_kind(self, kind: ArtifactKind, sender: str | None = None) -> list[Artifact]:
        return [a for a in self.artifacts if a.kind == kind and (sender is None or a.sender == sender)]

    def latest(self, kind: ArtifactKind, sender: str | None = None) -> Artifact | None:
        found = self.of_kind(kind, sender)
        return max(found, key=lambda a: a.round) if found else None


class Wire:
    """Ledger of every message plus the artifacts observers can attack.

    Retention keeps memory bounded: in memory the wire holds the newest
    artifact per (kind, sender, receiver) — what an attack on the final state
    needs — and with ``artifact_dir`` every artifact is also written to disk as
    safetensors so per-round attacks can read any of them back.
    """

    def __init__(self, artifact_dir: Path | None = None):
        self.ledger: list[LedgerEntry] = []
        self.retained: dict[tuple[str, str, str], Artifact] = {}
        self.artifact_dir = artifact_dir
        # every round's messages to or from these roles, on the host (keep_history: an auditor that needs them)
        self.history_roles: frozenset[str] = frozenset()
        self.history: list[Artifact] = []

    def keep_history(self, roles: set[str] | frozenset[str]) -> None:
        """From now on keep every message sent by or to one of ``roles`` (not only the newest), on the host: the
        gradient canary audit sums a victim's update over all rounds. Set before training (and before a resume
        restores the checkpoint that holds the rounds already run)."""
        self.history_roles = self.history_roles | frozenset(roles)

    def send(self, artifact: Artifact) -> dict[str, Tensor]:
        """Record ``artifact`` and return its tensors as the receiver gets them.

        The receiver gets a detached copy: the sender keeps mutating its own
        tensors in place, and what was sent must not change after sending. The
        copy is contiguous whatever layout the sender trained in (CUDA runs train
        ``channels_last``): what crosses the wire is the same bytes on every
        device, and the attacks that stack states under ``vmap`` get a layout it
        can batch.
        """
        sent = {k: t.detach().clone(memory_format=torch.contiguous_format) for k, t in artifact.tensors.items()}
        stored = Artifact(artifact.kind, artifact.sender, artifact.receiver, artifact.round, sent, dict(artifact.meta))
        self.ledger.append(
            LedgerEntry(artifact.kind.value, artifact.sender, artifact.receiver, artifact.round, stored.nbytes, len(sent))
        )
        self.retained[(artifact.kind.value, artifact.sender, artifact.receiver)] = stored
        if self.history_roles & {artifact.sender, artifact.receiver}:
            from fedaudit.run.run_directory import HostSnapshot  # one batched copy to the host per dtype, not one per tensor

            self.history.append(Artifact(stored.kind, stored.sender, stored.receiver, stored.round,
                                         HostSnapshot(sent).tensors(), dict(stored.meta)))
        if self.artifact_dir is not None:
            self._persist(stored, len(self.ledger) - 1)
        return sent

    def _persist(self, artifact: Artifact, index: int) -> None:
        from safetensors.torch import save_file

        from fedaudit.run.run_directory import HostSnapshot, atomic_path

        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        name = f"{index:06d}-r{artifact.round:03d}-{artifact.kind.value}-{safe_name(artifact.sender)}-{safe_name(artifact.receiver)}.safetensors"
        tensors = HostSnapshot(artifact.tensors).tensors()  # one copy to the host per dtype, not one per tensor
        with atomic_path(self.artifact_dir / name) as tmp:
            save_file(tensors, str(tmp), metadata={"meta": json.dumps(artifact.meta, default=str)})

    def view(self, role: str) -> WireView:
        """What an observer in ``role`` (``"server"`` or ``"client:<domain>"``) saw."""
        if role == SERVER:
            # The server sees every upload and, of course, what it broadcast itself.
            seen = [a for a in self.retained.values() if SERVER in (a.receiver, a.sender)]
        else:
            seen = [a for a in self.retained.values() if a.receiver == role or a.sender == role]
        return WireView(role, sorted(seen, key=lambda a: (a.round, a.kind.value, a.sender, a.receiver)))

    def history_view(self, role: str) -> WireView:
        """Every kept round (:meth:`keep_history`) of what an observer in ``role`` saw, oldest first."""
        seen = [a for a in self.history if role in (a.receiver, a.sender)]
        return WireView(role, sorted(seen, key=lambda a: (a.round, a.kind.value, a.sender, a.receiver)))

    # -- communication metrics -------------------------------------------------

    def summary(self) -> dict:
        """Totals in bytes: up, down, and per kind and direction."""
        up = sum(e.nbytes for e in self.ledger if e.direction == "up")
        down = sum(e.nbytes for e in self.ledger if e.direction == "down")
        by_kind: dict[str, dict[str, int]] = {}
        for e in self.ledger:
            slot = by_kind.setdefault(e.kind, {"up": 0, "down": 0})
            slot[e.direction] += e.nbytes
        return {"bytes_up": up, "bytes_down": down, "by_kind": by_kind}

    def bytes_in_round(self, rnd: int) -> dict[str, int]:
        rows = [e for e in self.ledger if e.round == rnd]
        return {
            "up": sum(e.nbytes for e in rows if e.direction == "up"),
            "down": sum(e.nbytes for e in rows if e.direction == "down"),
        }

    # -- persistence (for resume) ---------------------------------------------

    def ledger_rows(self) -> list[dict]:
        return [e.to_json() for e in self.ledger]

    def retained_state(self) -> tuple[dict[str, Tensor], list[dict]]:
        """Flatten retained artifacts into (tensors, index) for a checkpoint."""
        tensors: dict[str, Tensor] = {}
        index = []
        kept = [(a, False) for a in self.retained.values()] + [(a, True) for a in self.history]
        for i, (a, history) in enumerate(kept):
            keys = []
            for k, t in a.tensors.items():
                tensors[f"{i}/{k}"] = t.detach()  # on its device: the checkpoint's HostSnapshot moves them in one copy
                keys.append(k)
            index.append({"kind": a.kind.value, "sender": a.sender, "receiver": a.receiver, "round": a.round,
                          "keys": keys, "meta": a.meta, **({"history": True} if history else {})})
        return tensors, index

    def restore(self, ledger_rows: list[dict], tensors: dict[str, Tensor], index: list[dict], device: torch.device) -> None:
        self.ledger = [LedgerEntry.from_json(r) for r in ledger_rows]
        self.retained = {}
        self.history = []
        for i, item in enumerate(index):
            history = bool(item.get("history"))
            a = Artifact(
                ArtifactKind(item["kind"]),
                item["sender"],
                item["receiver"],
                item["round"],
                {k: tensors[f"{i}/{k}"].to("cpu" if history else device) for k in item["keys"]},
                item["meta"],
            )
            if history:
                self.history.append(a)
            else:
                self.retained[(a.kind.value, a.sender, a.receiver)] = a


