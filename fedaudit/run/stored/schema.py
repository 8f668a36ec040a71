"""metrics.schema.json's definitions of the typed blocks, generated from the models
(``python scripts/metrics_schema.py``; ``tests/test_results.py`` fails when the committed file differs)."""

from __future__ import annotations

from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue

from fedaudit.run.stored.accuracy import Accuracy, CanaryChange, FinalRound, SourceVal, TargetAccuracy, WithoutCanaries
from fedaudit.run.stored.communication import Communication, KindBytes
from fedaudit.run.stored.anonymity import AnonymityEvidence, AssessedObject, FamilyEvidence, LinkedRow, Measure
from fedaudit.run.stored.core import Stored
from fedaudit.run.stored.leakage import (Calibration, CanaryEstimate, Control, DomainTwin, ExactMatches, GdpBound, KRow,
                                         Leakage, MembershipTestResult, OneRunAudit, OperatingPoint, RocCurve)
from fedaudit.run.stored.privacy import DP, ClientDP, ClippingCheck, CoverageRow, DPClient, Privacy, RoundNoise
from fedaudit.run.stored.reconstruction import (Balanced, DomainAttribution, Identified, Judge, Judges, Lift, Matched,
                                                MatchedScores, Power, PowerSize, PsnrToSources, ReconstructionEntry,
                                                ReconstructionSection, ReconstructionSummary, Score, Twin, VictimScores)
from fedaudit.run.stored.provenance import (AuditorData, Broadcasts, DeployedModel, Device, DifferentBroadcast,
                                            Framework, ModelInfo, NonFinite, Participation, Provenance, AuditedRecording,
                                            Verification)
from fedaudit.run.stored.secure_aggregation import (AggregateSeen, Disaggregation, LeftInClear, SecureAggregation,
                                                    SolvedUpdate)


# The models whose definitions metrics.schema.json holds, by the definition's name there.
SCHEMA_DEFS: dict[str, type[Stored]] = {
    "communication": Communication, "kind_bytes": KindBytes, "auditor_data": AuditorData, "accuracy": Accuracy,
    "source_val": SourceVal, "final_round": FinalRound, "target_accuracy": TargetAccuracy,
    "without_canaries": WithoutCanaries, "canary_change": CanaryChange, "secure_aggregation": SecureAggregation,
    "left_in_clear": LeftInClear, "aggregate_seen": AggregateSeen, "disaggregation": Disaggregation,
    "solved_update": SolvedUpdate, "privacy_block": Privacy, "coverage_row": CoverageRow, "dp": DP,
    "dp_client": DPClient, "round_noise": RoundNoise, "clipping_check": ClippingCheck, "client_dp": ClientDP,
    "provenance": Provenance, "device": Device, "model_info": ModelInfo, "recording": AuditedRecording,
    "verification": Verification, "non_finite": NonFinite, "broadcasts": Broadcasts,
    "different_broadcast": DifferentBroadcast, "framework": Framework, "deployed_model": DeployedModel,
    "participation": Participation, "leakage": Leakage, "membership_entry": MembershipTestResult,
    "membership_control": Control, "operating_point": OperatingPoint, "roc_curve": RocCurve, "calibration": Calibration,
    "exact_matches": ExactMatches, "domain_twin": DomainTwin, "canary_entry": OneRunAudit, "k_row": KRow,
    "gdp_bound": GdpBound, "canary_estimate": CanaryEstimate, "reconstruction_section": ReconstructionSection,
    "reconstruction_entry": ReconstructionEntry, "reconstruction_summary": ReconstructionSummary,
    "reconstruction_scores": VictimScores, "score": Score, "identifiability": Identified, "balanced": Balanced,
    "matched": Matched, "matched_scores": MatchedScores, "power": Power, "power_size": PowerSize, "lift": Lift,
    "psnr_to_sources": PsnrToSources, "reconstruction_twin": Twin, "domain_attribution": DomainAttribution,
    "judges": Judges, "judge": Judge, "anonymity_evidence": AnonymityEvidence, "assessed_object": AssessedObject,
    "family_evidence": FamilyEvidence, "linked_row": LinkedRow, "measure": Measure}


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
        if isinstance(node, dict) and node.get("$ref", "").endswith("/JsonValue"):
            return {}  # any JSON value: an attack's own account
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


__all__ = ["SCHEMA_DEFS", "schema_defs"]
