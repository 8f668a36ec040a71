"""metrics.json's blocks as typed models, declared once: the engine builds them, metrics.json is their dump, the
report reads the same models back, and metrics.schema.json's definitions of them are generated from them
(``python scripts/metrics_schema.py``; ``tests/test_results.py`` fails when the committed file differs).

A :class:`Stored` model is a pydantic model (v2: the ecosystem's typed-model library, with JSON Schema generation and
aliases built in). Writing is strict — a value of the wrong type (no conversion: "12" is not 12), or a key the
model does not declare, is an error where the block is built. Reading is lenient, as a stored file deserves (an older fedaudit's, a damaged one, a
recording's): :meth:`Stored.read` validates each field alone (a nested block through its own ``read``), and a field
that is absent or invalid takes its default; a legacy key is a ``validation_alias`` on its field, nowhere else.
``read(...).model_fields_set`` says which fields the file stored.

One module per family: :mod:`~fedaudit.run.stored.core` (the base), accuracy, communication, privacy, provenance
(with a recording's, and the auditor's data), secure_aggregation, leakage (the attack results: membership tests,
one-run ε audits) with reconstruction (a reconstruction attack's section), and :mod:`~fedaudit.run.stored.schema`
(the generated definitions).
"""
from __future__ import annotations

from fedaudit.run.stored.accuracy import Accuracy, CanaryChange, FinalRound, SourceVal, TargetAccuracy, WithoutCanaries
from fedaudit.run.stored.communication import Communication, KindBytes
from fedaudit.run.stored.core import Stored
from fedaudit.run.stored.privacy import DP, ClientDP, ClippingCheck, CoverageRow, DPClient, Privacy, RoundNoise
from fedaudit.run.stored.provenance import (AuditorData, Broadcasts, DeployedModel, Device, DifferentBroadcast,
                                            Framework, ModelInfo, NonFinite, Participation, Provenance, AuditedRecording,
                                            Verification)
from fedaudit.run.stored.schema import SCHEMA_DEFS, schema_defs
from fedaudit.run.stored.secure_aggregation import (AggregateSeen, Disaggregation, LeftInClear, SecureAggregation,
                                                    SolvedUpdate)

__all__ = ["DP", "SCHEMA_DEFS", "Accuracy", "AggregateSeen", "AuditorData", "Broadcasts", "CanaryChange", "ClientDP",
           "ClippingCheck", "Communication", "CoverageRow", "DPClient", "DeployedModel", "Device", "DifferentBroadcast",
           "Disaggregation", "FinalRound", "Framework", "KindBytes", "LeftInClear", "ModelInfo", "NonFinite",
           "Participation", "Privacy", "Provenance", "AuditedRecording", "RoundNoise", "SecureAggregation", "SolvedUpdate",
           "SourceVal", "Stored", "TargetAccuracy", "Verification", "WithoutCanaries", "schema_defs"]
