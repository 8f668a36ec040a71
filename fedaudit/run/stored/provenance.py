"""Where and how the numbers were made: the command, the configuration and its hash, the data, the versions, the
device, the model, the stages' seconds — and, for ``fedaudit audit``, the recording it audited and whether the auditor
held the clients' records."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from fedaudit.run.stored.core import Stored


class AuditorData(Stored):
    """fedaudit audit: whether the auditor held the clients' records."""

    model_config = ConfigDict(json_schema_extra={"required": ["status"]})

    status: Literal["held", "none"] | None = None
    dataset: str | None = None  # held: the records it scored with
    why: str | None = None  # none: why nothing could be scored
    left_out: dict[str, str] = Field(default_factory=dict, description="none: attacks left out, and why")
    needs_data: list[str] = Field(default_factory=list, description="none: what the records would have measured")


class Device(Stored):
    """The device the run computed on."""

    model_config = ConfigDict(json_schema_extra={"required": ["type"]})

    type: str | None = None
    name: str | None = None
    threads: int | None = None


class ModelInfo(Stored):
    """The model trained or audited: fedaudit's architecture, or the user's factory (import path, arguments, module
    file and its sha256); its parameter count and the layer the attacks took as the classifier head."""

    stored_nulls = frozenset({"module_file", "sha256", "head_layer"})

    factory: str | None = None
    args: dict[str, Any] = Field(default_factory=dict)
    module_file: str | None = None
    sha256: str | None = None
    architecture: str | None = None
    norm: str | None = None
    class_name: str | None = Field(None, alias="class")
    parameters: int | None = None
    head_layer: str | None = None


class NonFinite(Stored):
    """A recorded tensor holding NaN or infinity: a finding, and refused where an attack would read it."""

    sender: str | None = None
    receiver: str | None = None
    round: int | None = None
    record: str | None = None
    tensor: str | None = None
    kind: str | None = None
    message_type: str | None = None


class DifferentBroadcast(Stored):
    """A broadcast whose clients received different content: the clients of each content, largest group first."""

    round: int | None = None
    record: str | None = None
    message_type: str | None = None
    recorded_by: str = "server"
    groups: list[list[str]] = Field(default_factory=list)


class Broadcasts(Stored):
    """The model-consistency check: did every client of a round receive the same model?"""

    compared: int | None = None
    recorded_by: str | None = None
    different: list[DifferentBroadcast] = Field(default_factory=list)


class Verification(Stored):
    """What was verified of a recording before it was audited."""

    status: str | None = None
    ledger_sha256: str | None = None
    sealed: bool | None = None
    mismatches: list[str] = Field(default_factory=list)
    messages: int | None = None
    rows: int | None = None
    bytes: int | None = None
    rounds: int | None = None
    clients: int | None = None
    non_finite: list[NonFinite] = Field(default_factory=list)
    broadcasts: Broadcasts | None = None
    seconds: float | None = None


class Framework(Stored):
    """The federated framework a recording came from: the manifest's framework block, as its recorder built it."""

    # Declared once (issue 71: NVFlare's recorder wrote two fields this model lacked, and every NVFlare audit ended in
    # a traceback): the manifest's model (fedaudit.interop.manifest.Manifest) holds it, so every recorder writes the
    # block through it, the reader validates it before anything is judged, and the audit stores it.

    name: str = "?"
    version: str = ""
    job_id: str | None = None  # NVFlare's job id: it names the job, not the run (its simulator calls every job "simulate_job")
    round_offset: int | None = None  # what the recorder added to the framework's round numbers (NVFlare counts from 0)



class DeployedModel(Stored):
    """The model the audit judged as the deployed one, and which it is."""

    round: int | None = None
    message_type: str | None = None
    released: bool | None = None
    what: str | None = None


class Participation(Stored):
    """Who answered: training uploads in all, and the rounds each client was sent a model and sent nothing back."""

    uploads: int | None = None
    rounds: list[int] = Field(default_factory=list)
    missed: dict[str, list[int]] = Field(default_factory=dict)


class AuditedRecording(Stored):
    """``fedaudit audit``: the recorded federation the run audited."""

    stored_nulls = frozenset({"framework", "run_id", "framework_run_id", "secure_aggregation", "verification"})

    path: str | None = None
    framework: Framework | str | None = None  # a name alone: older runs
    run_id: str | int | None = None
    framework_run_id: str | int | None = None
    nodes: dict[str, str] = Field(default_factory=dict)
    verification: Verification | None = None
    deployed_model: DeployedModel = Field(default_factory=lambda: DeployedModel.read({}))
    secure_aggregation: str | None = None  # the protocol recognised from its stage messages
    participation: Participation = Field(default_factory=lambda: Participation.read({}))

    @property
    def framework_block(self) -> Framework:
        """The framework as a block (an older run's bare name as its name)."""
        if isinstance(self.framework, Framework):
            return self.framework
        return Framework(name=self.framework) if self.framework is not None else Framework.read({})

    @property
    def framework_name(self) -> str | None:
        return self.framework.name if isinstance(self.framework, Framework) else self.framework


class Provenance(Stored):
    """Where and how the numbers were made."""

    model_config = ConfigDict(json_schema_extra={"required": ["command", "config_hash", "config", "seed", "versions",
                                                              "device", "seconds"]})

    command: str | None = None
    config_hash: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    dataset_fingerprint: str | None = None
    dataset_skipped_files: int | None = None
    dataset_empty_class_folders: list[str] = Field(default_factory=list)
    data_warnings: list[str] = Field(default_factory=list)
    seed: int | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    device: Device = Field(default_factory=lambda: Device.read({}))
    numerics: dict[str, Any] = Field(default_factory=dict)
    seconds: dict[str, float | dict[str, float]] = Field(
        default_factory=dict, description="wall-clock seconds per stage (per target in a --target-domain all run)")
    model: ModelInfo | None = None
    recording: AuditedRecording | None = None


__all__ = ["AuditedRecording", "AuditorData", "Broadcasts", "DeployedModel", "Device", "DifferentBroadcast", "Framework", "ModelInfo",
           "NonFinite", "Participation", "Provenance", "Verification"]
