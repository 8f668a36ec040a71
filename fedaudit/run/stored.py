"""metrics.json's blocks as typed models, declared once: the engine builds them, metrics.json is their dump, the
report reads the same models back, and metrics.schema.json's definitions of them are generated from them
(``python scripts/metrics_schema.py``; ``tests/test_results.py`` fails when the committed file differs).

A :class:`Stored` model is a pydantic model (v2: the ecosystem's typed-model library, with JSON Schema generation and
aliases built in). Writing is strict — a value of the wrong type (no conversion: "12" is not 12), or a key the
model does not declare, is an error where the block is built. Reading is lenient, as a stored file deserves (an older fedaudit's, a damaged one, a
recording's): :meth:`Stored.read` validates each field alone (a nested block through its own ``read``), and a field
that is absent or invalid takes its default; a legacy key is a ``validation_alias`` on its field, nowhere else.
``read(...).model_fields_set`` says which fields the file stored.

Issue 59 moves the blocks here one family at a time (communication and the auditor's data so far); a block without
its model is still read by :mod:`fedaudit.run.blocks` and :mod:`fedaudit.run.entries`, and kept by hand in the schema.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, WithJsonSchema
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue


class Stored(BaseModel):
    """A block of metrics.json (see the module's doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=True)
    # A field typed ``X | None`` reads None where the file has no value; a run writes null only for the fields named
    # here, and only those allow null in the schema (a stored null elsewhere reads as absent).
    stored_nulls: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def read(cls, data: object) -> Self:
        """The block as stored: each field validated alone (a nested block through its own ``read``), an absent or
        invalid one its default; not a mapping: every field its default."""
        found = data if isinstance(data, Mapping) else {}
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            key = next((k for k in _stored_keys(name, info) if k in found), None)
            if key is None or (found[key] is None and name not in cls.stored_nulls):
                continue
            value = None if found[key] is None else _read_value(info.annotation, found[key])
            if value is not _INVALID:
                values[name] = value
        block: Self = cls.model_construct(_fields_set=set(values), **values)  # type: ignore[assignment]
        return block

    def has(self, name: str) -> bool:
        """Whether the file stored this field (a null included): what a table shows as a dash, not leaves out."""
        return name in self.model_fields_set

    def dump(self) -> dict[str, Any]:
        """The block as metrics.json stores it: the fields its writer set, in declaration order."""
        return self.model_dump(mode="json", exclude_unset=True)


_INVALID = object()  # a stored value of the wrong type: the field reads as absent


def _stored_keys(name: str, info: FieldInfo) -> list[str]:
    """Where a field may be stored: its legacy names (``validation_alias``), then its own."""
    alias = info.validation_alias
    if isinstance(alias, str):
        return [alias, name]
    if isinstance(alias, AliasChoices):
        return [*(k for k in alias.choices if isinstance(k, str)), name]
    return [name]


def _read_value(annotation: Any, value: Any) -> Any:
    """One stored value as its field's type: nested blocks (alone, or a mapping of them) leniently, through their own
    ``read``; anything else strictly (no "12" for 12, no true for 1), else :data:`_INVALID`."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    inner = args[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1 else annotation
    if isinstance(inner, type) and issubclass(inner, Stored):
        return inner.read(value) if isinstance(value, Mapping) else _INVALID
    if typing.get_origin(inner) is dict and isinstance(block := typing.get_args(inner)[1], type) \
            and issubclass(block, Stored):
        if not isinstance(value, Mapping):
            return _INVALID
        return {str(k): block.read(v) for k, v in value.items() if isinstance(v, Mapping)}
    try:
        return _strict(annotation).validate_python(value)
    except ValidationError:
        return _INVALID


@cache
def _strict(annotation: Any) -> TypeAdapter[Any]:
    return TypeAdapter(annotation, config=ConfigDict(strict=True))


# -- communication ---------------------------------------------------------------------------------------


class KindBytes(Stored):
    """The bytes one artifact kind sent, each way."""

    up: int = 0
    down: int = 0


class Communication(Stored):
    """Traffic from the ledger, and what the method declares it sends."""

    # Required where a run writes them, absent in a file only when it is damaged: read as None then.
    model_config = ConfigDict(json_schema_extra={"required": ["bytes_up", "bytes_down"]})

    bytes_up: int | None = None
    bytes_down: int | None = None
    messages: int | None = Field(None, description="older runs only: the ledger's message count")
    by_kind: dict[str, KindBytes] = Field(default_factory=dict)
    rounds: int | None = None
    clients: int | None = None
    mb_up_per_round: float | None = None
    mb_down_per_round: float | None = None
    declared: list[str] = Field(default_factory=list, description="what the method (or recording) says it sends: "
                                "kind and arrow, e.g. full_model↑")
    per_target: dict[str, Communication] | None = Field(None, description="a --target-domain all run: each target's")


# -- the auditor's data ----------------------------------------------------------------------------------


class AuditorData(Stored):
    """fedaudit audit: whether the auditor held the clients' records."""

    model_config = ConfigDict(json_schema_extra={"required": ["status"]})

    status: Literal["held", "none"] | None = None
    dataset: str | None = None  # held: the records it scored with
    why: str | None = None  # none: why nothing could be scored
    left_out: dict[str, str] = Field(default_factory=dict, description="none: attacks left out, and why")
    needs_data: list[str] = Field(default_factory=list, description="none: what the records would have measured")


# -- accuracy --------------------------------------------------------------------------------------------


class SourceVal(Stored):
    """The deployed model's accuracy on the source domains' validation splits."""

    model_config = ConfigDict(json_schema_extra={"required": ["mean"]})
    stored_nulls = frozenset({"mean"})

    mean: float | None = None  # null: no model was scored
    per_domain: dict[str, float | None] = Field(default_factory=dict)


class FinalRound(Stored):
    """The last round's scores, beside the selected round's."""

    model_config = ConfigDict(json_schema_extra={"required": ["round"]})
    stored_nulls = frozenset({"unseen_domain", "source_val_mean"})

    round: int | None = None
    unseen_domain: float | None = None
    source_val_mean: float | None = None


class TargetAccuracy(Stored):
    """One target's headline accuracy in a --target-domain all run."""

    model_config = ConfigDict(json_schema_extra={"required": ["unseen_domain", "source_val_mean", "selected_round"]})
    stored_nulls = frozenset({"unseen_domain", "source_val_mean"})

    unseen_domain: float | None = None
    source_val_mean: float | None = None
    selected_round: int | None = None


class CanaryChange(Stored):
    """What the canaries changed: with − without."""

    unseen_domain: float | None = None
    source_val_mean: float | None = None


class Accuracy(Stored):
    """Accuracy at the selected round (the mean over targets in a --target-domain all run). ``status: unscored``
    (fedaudit audit without the clients' records): the deployed model was not scored."""

    model_config = ConfigDict(json_schema_extra={"required": ["unseen_domain", "source_val"]})
    stored_nulls = frozenset({"unseen_domain"})

    unseen_domain: float | None = None
    source_val: SourceVal = Field(default_factory=lambda: SourceVal.read({}))
    selected_round: int | None = None
    final_round: FinalRound | None = None
    rounds_without_deployed_model: list[int] = Field(
        default_factory=list, description="rounds after which the server held no deployable model: not scored, "
                                          "never selectable")
    method_specific: dict[str, float] = Field(default_factory=dict)
    without_canaries: WithoutCanaries | None = None
    note: str | None = None
    status: Literal["unscored"] | None = None
    why: str | None = None
    per_target: dict[str, TargetAccuracy] | None = None


class WithoutCanaries(Accuracy):
    """The same run (seeds, recipe) trained without the canary audit's canaries, and what they changed."""

    model_config = ConfigDict(json_schema_extra={"required": ["unseen_domain", "source_val", "change_with_canaries"]})

    change_with_canaries: CanaryChange = Field(default_factory=lambda: CanaryChange.read({}))


Accuracy.model_rebuild()  # its without_canaries block is declared after it


# -- secure aggregation ----------------------------------------------------------------------------------

# A block whose model is still to come (issue 59): kept as stored, its schema the hand-kept definition it names.
HAND_KEPT = "x-hand-kept"  # a marker schema_defs() turns into a reference (pydantic resolves a real one itself)
Leakage = Annotated[dict[str, Any], WithJsonSchema({HAND_KEPT: "leakage"})]


class LeftInClear(Stored):
    """An upload kind the mask does not cover, and why."""

    model_config = ConfigDict(json_schema_extra={"required": ["kind", "direction", "why"]})

    kind: str | None = None
    direction: str | None = None
    why: str | None = None


class AggregateSeen(Stored):
    """The first round's aggregate that server read: whose uploads it sums, and their total weight."""

    round: int | None = None
    clients: list[str] = Field(default_factory=list)
    total_weight: float | None = None


class SolvedUpdate(Stored):
    """A client's single update that disaggregation solved for, from two rounds' aggregates."""

    kind: str | None = None
    rounds: list[int] = Field(default_factory=list)


class Disaggregation(Stored):
    """Whether a server could solve the rounds' aggregates for single updates (Lam et al., ICML 2021)."""

    model_config = ConfigDict(json_schema_extra={"required": ["status", "reason"]})

    status: Literal["run", "not possible", "not applicable", "not run"] = "not run"  # not run: the file stores none
    reason: str = ""
    clients: dict[str, SolvedUpdate] = Field(default_factory=dict, description="run: whose update it solved for")


class SecureAggregation(Stored):
    """--secure-aggregation: what a server under secure aggregation sees of the same wire (the masked uploads'
    aggregate, every other message in clear), the attacks on it, and what the mask leaves."""

    model_config = ConfigDict(json_schema_extra={"required": ["observer", "masked", "leaves", "leakage"]})
    stored_nulls = frozenset({"aggregate"})

    observer: str | None = None
    masked: list[str] = Field(default_factory=list)
    leaves: list[LeftInClear] = Field(default_factory=list)
    aggregate: AggregateSeen | None = None  # null: no upload was masked
    disaggregation: Disaggregation = Field(default_factory=lambda: Disaggregation.read({}))
    leakage: Leakage = Field(default_factory=dict)


# -- privacy ---------------------------------------------------------------------------------------------


class CoverageRow(Stored):
    """Whether a guarantee covers one artifact the method sends, and why."""

    model_config = ConfigDict(json_schema_extra={"required": ["artifact", "direction", "covered", "why"]})

    artifact: str | None = None
    direction: Literal["up", "down"] | None = None
    covered: bool | None = None
    why: str = ""


class DPClient(Stored):
    """One client's DP-SGD mechanism and what its accountant has spent."""

    stored_nulls = frozenset({"noise_to_signal"})

    epsilon_spent: float | None = None
    epsilon_rdp: float | None = None
    accountant: str | None = None
    curve: dict[str, str | float] = Field(default_factory=dict, description="the privacy curve the accountant "
                                          "claims, as a canary audit tests it: gaussian (mu) or epsilon_delta")
    noise_multiplier: float | None = None
    batch_size: int | None = None
    lr_scale: float | None = None
    step_factor: float = 1
    noise_to_signal: float | None = None  # null: the trained parameters were not counted
    sample_rate: float | None = None
    steps: int | None = None
    planned_steps: int | None = None
    records: int | None = None


class RoundNoise(Stored):
    """A recording's round: the noise multiplier that protected its most exposed client."""

    round: int | None = None
    replies: int | None = None
    largest_share: float | None = None
    weights: str | None = None
    noise_multiplier: float | None = None


class ClippingCheck(Stored):
    """A recorded deployment's clipping, checked on the updates it recorded."""

    status: Literal["held", "violated", "not measured", "not visible"] | None = None
    updates: int | None = None
    over_norm: int | None = None
    skipped: int | None = None
    max_norm: float | None = None
    max_ratio: float | None = None
    worst: str | None = None
    largest_tensor: str | None = None
    why: str | None = None


class DP(Stored):
    """The record-level DP in force: DP-SGD per client (fedaudit's), or a recorded deployment's central DP
    (``recorded``); each mechanism stores its own fields, the rest stay None."""

    stored_nulls = frozenset({"noise_to_signal_target"})

    recorded: bool = False
    # DP-SGD (Opacus)
    epsilon_target: float | None = None
    max_grad_norm: float | None = None
    augmentations: int | None = None
    trained: str | None = None
    trained_parameters: int | None = None
    frozen_parameters: int | None = None
    noise_to_signal_target: float | None = None
    max_step_factor: int | None = None
    secure_rng: bool | None = None
    clients: dict[str, DPClient] = Field(default_factory=dict)
    # a recording's central DP
    mechanism: str | None = None
    clipping: str | None = None
    source: str | None = None
    noise_multiplier: float | None = None
    clipping_norm: float | None = None
    num_sampled_clients: int | None = None
    rounds: int | None = None
    epsilon: float | None = None
    epsilon_rdp: float | None = None
    sampling: str | None = None
    neighbours: str | None = None
    noise_std_on_sum: float | None = None
    per_round: list[RoundNoise] = Field(default_factory=list)
    clipping_check: ClippingCheck = Field(default_factory=lambda: ClippingCheck.read({}))
    weaker_rounds: str | None = None
    claim: str | None = None
    # both
    delta: float | None = None
    accountant: str | None = None
    unit: str | None = None

    @property
    def label_epsilon(self) -> float | None:
        """The ε a run is labelled with: DP-SGD's target, or a recorded deployment's accounted ε."""
        return self.epsilon_target if self.epsilon_target is not None else self.epsilon


class ClientDP(Stored):
    """Client-level DP on the aggregate (fedaudit.simulation.client_dp): its guarantee, its parameters, and what few
    clients cost."""

    epsilon: float | None = None
    epsilon_target: float | None = None
    delta: float | None = None
    mu: float | None = None
    noise_multiplier: float | None = None
    clip: float | None = None
    rounds: int | None = None
    clients: int | None = None
    noise_std_on_mean: float | None = None
    clipped_updates: int | None = None
    updates: int | None = None
    unit: str | None = None
    accountant: str | None = None
    covers: str | None = None


class Privacy(Stored):
    """The defense in force and what it covers."""

    model_config = ConfigDict(json_schema_extra={"required": ["dp", "coverage"]})
    stored_nulls = frozenset({"dp", "client_dp"})

    dp: DP | None = Field(None, description="the DP mechanism in force and its accounting (null: none)")
    coverage: list[CoverageRow] = Field(default_factory=list)
    client_dp: ClientDP | None = None
    client_coverage: list[CoverageRow] = Field(default_factory=list, description="what the client-level guarantee "
                                               "covers, per shared artifact")


# The models whose definitions metrics.schema.json holds, by the definition's name there.
SCHEMA_DEFS: dict[str, type[Stored]] = {
    "communication": Communication, "kind_bytes": KindBytes, "auditor_data": AuditorData, "accuracy": Accuracy,
    "source_val": SourceVal, "final_round": FinalRound, "target_accuracy": TargetAccuracy,
    "without_canaries": WithoutCanaries, "canary_change": CanaryChange, "secure_aggregation": SecureAggregation,
    "left_in_clear": LeftInClear, "aggregate_seen": AggregateSeen, "disaggregation": Disaggregation,
    "solved_update": SolvedUpdate, "privacy_block": Privacy, "coverage_row": CoverageRow, "dp": DP,
    "dp_client": DPClient, "round_noise": RoundNoise, "clipping_check": ClippingCheck, "client_dp": ClientDP}


class _Untitled(GenerateJsonSchema):
    """pydantic's JSON Schema without the titles it derives from names (the file documents with descriptions)."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def model_schema(self, schema: Any) -> JsonSchemaValue:
        out = super().model_schema(schema)
        out.pop("title", None)
        if "description" in out:  # a docstring, as one line
            out["description"] = " ".join(out["description"].split())
        return out


def schema_defs() -> dict[str, Any]:
    """The definitions of :data:`SCHEMA_DEFS` as metrics.schema.json holds them (references by those names)."""
    names = {cls.__name__: name for name, cls in SCHEMA_DEFS.items()}

    def renamed(node: Any) -> Any:
        if isinstance(node, dict) and HAND_KEPT in node:
            return {"$ref": f"#/$defs/{node[HAND_KEPT]}"}
        if isinstance(node, dict):
            return {k: (f"#/$defs/{names[v.rsplit('/', 1)[1]]}" if k == "$ref" else renamed(v)) for k, v in node.items()}
        return [renamed(x) for x in node] if isinstance(node, list) else node

    def written(schema: dict[str, Any], cls: type[Stored]) -> dict[str, Any]:
        """What a run writes: null only where the model names it (``stored_nulls``); None is a reading of absence."""
        for key, field in schema["properties"].items():
            if key in cls.stored_nulls or "anyOf" not in field:
                continue
            kept = [o for o in field.pop("anyOf") if o != {"type": "null"}]
            field.update(kept[0] if len(kept) == 1 else {"anyOf": kept})
            if field.get("default", 0) is None:
                del field["default"]
        return schema

    out = {}
    for name, cls in SCHEMA_DEFS.items():
        schema = cls.model_json_schema(schema_generator=_Untitled, mode="serialization")
        defs = schema.pop("$defs", {})
        out[name] = written(renamed(defs[cls.__name__] if "$ref" in schema else schema), cls)  # may nest itself
    return out


__all__ = ["DP", "SCHEMA_DEFS", "Accuracy", "AuditorData", "CanaryChange", "ClientDP", "ClippingCheck", "Communication",
           "CoverageRow", "DPClient", "FinalRound", "KindBytes", "Privacy", "RoundNoise",
           "LeftInClear", "SecureAggregation", "SourceVal", "Stored", "TargetAccuracy", "WithoutCanaries", "schema_defs"]
