"""A recording's manifest, declared once (issue 71): every recorder writes it through :func:`checked_manifest` and the
reader reads it through the same models, so a field one recorder adds and the reader does not know fails where the
recorder is written and tested, in one line naming the field, never in a user's audit.

The blocks are what a deployment declares about itself (``start_recording``'s arguments): the framework, the
architecture to rebuild, the auditor's data, the clients' public recipe, the public prior and the DP mechanism; the
rest is what the recorders keep (run ids, the model's state shapes, the seal, the merged shards). A recording is
untrusted evidence: every field is checked strictly (no ``"0.01"`` for a number, no ``true`` for a count), and a field
nothing declares refuses the recording instead of being silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fedaudit.errors import FedauditError
from fedaudit.run.stored.core import first_problem
from fedaudit.run.stored.provenance import Framework

FORMAT_NAME = "fedaudit-recording"
FORMAT_VERSION = 1  # raise it only with a reader for the older versions, or a one-line refusal naming them
FORMAT = f"{FORMAT_NAME}/{FORMAT_VERSION}"
NO_FRAMEWORK = "none"  # the framework block's name for a loop no framework ran (fedaudit's Recorder)


class Block(BaseModel):
    """A block of the manifest: strict, closed, immutable."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class Architecture(Block):
    """``model``: what ``fedaudit audit`` rebuilds the model from — fedaudit's own architecture, or a factory
    ``"pkg.module:Callable"`` it imports only when the user passes ``--model``."""

    model: str
    args: dict[str, Any] = Field(default_factory=dict)
    norm: str | None = None
    num_classes: int | None = None
    image_size: int | None = None
    channels: Literal[3] | None = None  # the input's: fedaudit's models and data are RGB


class AuditorDataDeclared(Block):
    """``data``: the records the auditor scores with — a dataset fedaudit splits (``dataset``, ``seed``,
    ``target_domain``), or the deployment's own (``records``, a folder inside the recording)."""

    dataset: str | None = None
    records: str | None = None
    seed: int | None = None
    target_domain: str | None = None


class Recipe(Block):
    """``recipe``: the clients' public training recipe, which the auditor's counterfactuals and an informed
    attacker's reference models follow (a key left out takes fedaudit's default, which the audit stores)."""

    rounds: int | None = None
    local_epochs: int | None = None
    batch_size: int | None = None
    optimizer: str | None = None
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    augment: bool | None = None


class Prior(Block):
    """``prior``: what is public about the inputs when the auditor holds no records (class names, the normalisation
    ``(x/255 - mean) / std``, whether flips keep labels); checked further where it is used."""

    classes: list[str] | None = None
    mean: list[float] | None = None
    std: list[float] | None = None
    hflip: bool | None = None


class DPDeclared(Block):
    """``dp``: the DP mechanism the deployment ran (:func:`fedaudit.interop.recorded_dp.check_dp` checks its values)."""

    mechanism: str
    noise_multiplier: float
    clipping_norm: float
    num_sampled_clients: int
    delta: float | None = None
    weighted_by_key: str | None = None
    source: str | None = None  # who declared it: Flower's DP wrapper, or the manifest


class MergedShard(Block):
    """``shards.<name>``: a process's shard as sealed into the recording's ledger."""

    ledger_sha256: str
    rows: int
    host: str | None = None
    recorded_by: list[str] = Field(default_factory=list)


class Manifest(Block):
    """``manifest.json``: the deployment's declarations and the recorders' own bookkeeping."""

    format: str = FORMAT
    run_id: str
    framework: Framework = Field(default_factory=lambda: Framework(name=NO_FRAMEWORK))
    framework_run_id: int | str | None = None
    method: str | None = None  # never written by a recorder: a manifest written by hand may name the method run
    model: Architecture | None = None
    model_state: dict[str, list[int]] | None = None  # the architecture's state_dict shapes: whole model or part
    model_order: list[str] | None = None  # its keys in the model's order (the file's keys are sorted)
    record_kinds: dict[str, str] = Field(default_factory=dict)
    data: AuditorDataDeclared | None = None
    recipe: Recipe | None = None
    prior: Prior | None = None
    dp: DPDeclared | None = None
    nodes: dict[str, str] | None = None  # node id → client name, where the recorder knew them at the start
    server_node_id: int | None = None
    appended: bool | None = None  # a deployment resumed into the same recording
    ledger_sha256: str | None = None  # the seal
    sealed_at: float | None = None
    shards: dict[str, MergedShard] | None = None

    @field_validator("framework", mode="before")
    @classmethod
    def _framework(cls, value: object) -> object:
        # an older manifest's bare name (or none) is a name; a block is validated by Framework's own declaration
        return {"name": value or NO_FRAMEWORK} if isinstance(value, str) or value is None else value


DECLARED = "a manifest holds only the fields fedaudit.interop.manifest.Manifest declares, each of its type"


def checked_manifest(data: Mapping[str, Any], where: str, fix: str = DECLARED) -> Manifest:
    """``data`` as a :class:`Manifest`, or one line naming the first field that is not declared or not of its type,
    and ``fix``."""
    try:
        return Manifest.model_validate(dict(data))
    except ValidationError as exc:
        raise FedauditError(f"{where}: {first_problem(exc)}; {fix}") from None


def format_refusal(declared: object, where: str) -> str | None:
    """Why a manifest's format cannot be read by this fedaudit (None when it can): not a recording, or a version
    newer (or older) than this reader's."""
    if declared == FORMAT:
        return None
    name, _, version = str(declared).partition("/")
    if name != FORMAT_NAME or not version.isdigit():
        return f"{where} has format {declared!r}, not a fedaudit recording ({FORMAT!r})"
    if int(version) > FORMAT_VERSION:
        return (f"{where} is format version {version}, newer than the version {FORMAT_VERSION} this fedaudit reads; "
                "upgrade fedaudit, or audit it with the fedaudit that recorded it")
    return (f"{where} is format version {version}, which this fedaudit (version {FORMAT_VERSION}) no longer reads; "
            "audit it with a fedaudit of its time")


__all__ = ["FORMAT", "Architecture", "AuditorDataDeclared", "DPDeclared", "Manifest", "MergedShard", "Prior", "Recipe",
           "checked_manifest", "format_refusal"]
