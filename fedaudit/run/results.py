"""metrics.json as typed objects: what the auditor writes, and what the verdict, the report and the scripts read.

``RunMetrics`` is one run's ``metrics.json`` (one target, or the mean of a ``--target-domain all`` run);
``Leakage`` its attack sections, with the one walk over them that every reader uses (membership results by
variant, target and victim; reconstruction results by attack, artifact and victim); ``VerdictRow`` one stored
verdict row. The file's shape is declared in ``metrics.schema.json``, shipped beside this module and versioned by
``SCHEMA_VERSION``; ``validate`` holds a file to it (users can gate CI on the same file: ``python -m
fedaudit.run.results RUN_DIR/metrics.json``). Its blocks are the typed models of :mod:`fedaudit.run.stored`
(accuracy, communication, privacy, provenance, the auditor's data, secure aggregation, and the attack results:
:class:`~fedaudit.run.stored.leakage.Leakage`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from fedaudit.errors import FedauditError
from fedaudit.run.evidence_detail import Detail, PowerSummary, detail_of, power_of
from fedaudit.run.stored import Accuracy, AuditorData, Communication, Privacy, Provenance, SecureAggregation
from fedaudit.run.stored.anonymity import AnonymityEvidence
from fedaudit.run.stored.leakage import CANARY, CANARY_GRADIENT, MIA, Leakage, MembershipResult

log = logging.getLogger("fedaudit")

# 3: each verdict question at one level (records, client data, participation; issue 47); 2: one verdict row per
# artifact, question and observer (issue 36), and this schema; 1: runs before it.
SCHEMA_VERSION = 3
SCHEMA_FILE = Path(__file__).with_name("metrics.schema.json")
STRICT_ENV = "FEDAUDIT_STRICT_SCHEMA"  # set (tests do): a metrics.json that breaks the schema is an error, not a warning

@dataclass
class Evidence:
    """One test behind a verdict row: what it measured, the baseline it had to beat and that baseline's name, its
    p-value before and after the row's correction, and the tier it reached. ``detail`` is the test family's own block
    (its counts, its victim: :mod:`fedaudit.run.evidence_detail`), written by the rule that built it."""

    test: str
    source: str  # "deepinversion full_model / clean", "lira_online on global_model / clean"
    value: float
    baseline: float | None
    baseline_name: str
    p_value: float
    interval: list[float] | None = None
    nulls: dict[str, float] | None = None
    power: PowerSummary | None = None  # an inversion test's positive control
    p_adjusted: float = 1.0
    tier: str = "low"
    text: str = ""  # the plain-language sentence if this test decides the row (not stored)
    effect: float | None = None  # what the effect-size rule compares (lift, or the interval's low end)
    detail: Detail | None = None

    @property
    def victim(self) -> str | None:
        victim = getattr(self.detail, "victim", None)
        return victim if isinstance(victim, str) else None

    @property
    def attack(self) -> str:
        """The attack behind the test, as a reader names it: ``loss attack``, ``tracing test``."""
        return str(getattr(self.detail, "attack", None) or self.source.split(" ")[0])

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if v is not None and k != "text"}
        if self.power is not None:
            out["power"] = self.power.to_json()
        if self.detail is not None:
            out["detail"] = self.detail.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evidence:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "text"}
        read = cls(**{"test": "", "source": "", "value": float("nan"), "baseline": None, "baseline_name": "",
                      "p_value": 1.0, **known})
        read.detail = detail_of(read.test, data.get("detail"))
        read.power = power_of(data.get("power"))
        return read


@dataclass(frozen=True)
class VerdictRow:
    """One verdict row (built by :mod:`fedaudit.audit.verdict`, stored in metrics.json, read by the report and the
    terminal): one question about one artifact, asked at one level, judged from one observer's view."""

    row: str  # stable key: "full_model↑", "client_data:full_model↑", "membership:global_model", "participation:…"
    title: str
    question: str  # inversion, membership, dp_audit, consistency (records), client_data, participation
    artifact: str
    observer: str
    tier: str  # high, medium, low, inconclusive, not_assessed
    reason: str  # leads with the attack, its number, the null and p
    short: str  # the same facts in a few words, for a terminal
    rule: str | None = None
    correction: str | None = None
    evidence: tuple[Evidence, ...] = ()
    target: str | None = None  # the unseen target, in a --target-domain all run's list
    level: str = "records"  # records, client_data, participation (schema 3; older rows mixed records and domains)

    @property
    def cause(self) -> str:
        """The row's deciding fact in one sentence: its reason's first (every rule's reason leads with it)."""
        first = self.reason.split(". ", 1)[0].strip()
        return first if first.endswith(".") else first + "."

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerdictRow:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**{"title": "", "question": "", "artifact": "", "observer": "", "tier": "not_assessed",
                      "reason": "", "short": "", **known,
                      "evidence": tuple(Evidence.from_json(e) for e in data.get("evidence") or ()
                                        if isinstance(e, Mapping))})

    def to_json(self) -> dict[str, Any]:
        out = {"row": self.row, "title": self.title, "question": self.question, "level": self.level,
               "artifact": self.artifact, "observer": self.observer, "tier": self.tier, "reason": self.reason,
               "short": self.short, "rule": self.rule, "correction": self.correction,
               "evidence": [e.to_json() for e in self.evidence]}
        return out if self.target is None else {**out, "target": self.target}


@dataclass
class RunMetrics:
    """One run's metrics.json."""

    method: str
    dataset: str
    target_domain: str  # "all" for the mean over targets
    accuracy: Accuracy
    communication: Communication
    leakage: Leakage | dict[str, Leakage]  # a --target-domain all run: each target's
    privacy: Privacy | dict[str, Privacy | None] | None  # a --target-domain all run: each target's
    provenance: Provenance
    source_domains: list[str] | None = None  # None in the mean over targets
    auditor_data: AuditorData | None = None  # fedaudit audit: whether the auditor held the clients' records
    verdict: list[VerdictRow] = field(default_factory=list)
    verdict_thresholds: dict[str, Any] | None = None
    # --secure-aggregation: what that server sees, the attacks on it, what the mask leaves (audit/session.py)
    secure_aggregation: SecureAggregation | None = None
    # the verdict's rows as an anonymity assessment and a DPIA read them (fedaudit.audit.attack_families); a
    # --target-domain all run: each target's
    anonymity_evidence: AnonymityEvidence | dict[str, AnonymityEvidence] | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        """The dict written as metrics.json (keys in a fixed order; absent optional blocks left out)."""
        auditor_data = None if self.auditor_data is None else self.auditor_data.dump()
        out = {"schema_version": self.schema_version, "method": self.method, "dataset": self.dataset,
               "target_domain": self.target_domain, "source_domains": self.source_domains,
               "auditor_data": auditor_data, "accuracy": self.accuracy.dump(), "communication": self.communication.dump(),
               "leakage": _dumped_leakage(self.leakage), "privacy": _dumped(self.privacy), "provenance": self.provenance.dump(),
               "secure_aggregation": None if self.secure_aggregation is None else self.secure_aggregation.dump(),
               "verdict": [row.to_json() for row in self.verdict], "verdict_thresholds": self.verdict_thresholds,
               "anonymity_evidence": _dumped_evidence(self.anonymity_evidence)}
        optional = ("source_domains", "auditor_data", "verdict_thresholds", "secure_aggregation", "anonymity_evidence")
        return {k: v for k, v in out.items() if v is not None or k not in optional}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str | Path = "metrics.json") -> RunMetrics:
        """A stored metrics.json; one written by a newer fedaudit is a one-line error naming the version it needs."""
        version = schema_version(data, where)
        fields = [f for f in cls.__dataclass_fields__ if f != "schema_version"]
        blank: dict[str, Any] = {"method": "?", "dataset": "?", "target_domain": "?"}  # a damaged file
        read = {f: data.get(f, blank.get(f)) for f in fields}
        stored, seen = data.get("auditor_data"), data.get("secure_aggregation")
        return cls(**{**read, "accuracy": Accuracy.read(data.get("accuracy")),
                      "provenance": Provenance.read(data.get("provenance")),
                      "communication": Communication.read(data.get("communication")),
                      "auditor_data": AuditorData.read(stored) if isinstance(stored, Mapping) else None,
                      "secure_aggregation": SecureAggregation.read(seen) if isinstance(seen, Mapping) else None,
                      "leakage": _read_leakage(data.get("leakage"), all_targets=data.get("target_domain") == "all"),
                      "privacy": _read_privacy(data.get("privacy"), all_targets=data.get("target_domain") == "all"),
                      "anonymity_evidence": _read_evidence(data.get("anonymity_evidence"),
                                                           all_targets=data.get("target_domain") == "all"),
                      "verdict": [VerdictRow.from_json(r) for r in data.get("verdict") or []
                                  if isinstance(r, Mapping) and "row" in r]},
                   schema_version=version)

    @property
    def results(self) -> Leakage:
        """The attack results (empty for the mean over targets: each target's are its own run's)."""
        return self.leakage if isinstance(self.leakage, Leakage) else Leakage()

    def rows(self) -> list[VerdictRow]:
        return list(self.verdict)


def _dumped(privacy: Privacy | dict[str, Privacy | None] | None) -> dict[str, Any] | None:
    if isinstance(privacy, Privacy):
        return privacy.dump()
    return None if privacy is None else {t: None if p is None else p.dump() for t, p in privacy.items()}


def _dumped_leakage(leakage: Leakage | dict[str, Leakage]) -> dict[str, Any]:
    if isinstance(leakage, Leakage):
        return leakage.dump()
    return {t: block.dump() for t, block in leakage.items()}


def _dumped_evidence(evidence: AnonymityEvidence | dict[str, AnonymityEvidence] | None) -> dict[str, Any] | None:
    if isinstance(evidence, AnonymityEvidence):
        return evidence.dump()
    return None if evidence is None else {t: e.dump() for t, e in evidence.items()}


def _read_evidence(stored: Any, all_targets: bool) -> AnonymityEvidence | dict[str, AnonymityEvidence] | None:
    if not isinstance(stored, Mapping):
        return None  # a run made before the evidence file
    if all_targets:
        return {str(t): AnonymityEvidence.read(e) for t, e in stored.items() if isinstance(e, Mapping)}
    return AnonymityEvidence.read(stored)


def _read_leakage(stored: Any, all_targets: bool) -> Leakage | dict[str, Leakage]:
    if all_targets and isinstance(stored, Mapping):
        return {str(t): Leakage.read(block) for t, block in stored.items()}
    return Leakage.read(stored)


def _read_privacy(stored: Any, all_targets: bool) -> Privacy | dict[str, Privacy | None] | None:
    """The privacy block as stored (a --target-domain all run: each target's; None: a run from before fedaudit
    recorded defenses)."""
    if not isinstance(stored, Mapping):
        return None
    if all_targets:
        return {str(t): Privacy.read(p) if isinstance(p, Mapping) else None for t, p in stored.items()}
    return Privacy.read(stored)


def schema_version(data: Mapping[str, Any], where: str | Path = "metrics.json") -> int:
    """The file's schema version (1 when it names none); a newer one than this fedaudit reads is a user error."""
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FedauditError(f"{where}: schema_version {version!r} is not a version number; the file is damaged — "
                            "re-run it")
    if version > SCHEMA_VERSION:
        raise FedauditError(f"{where} is metrics schema {version}; this fedaudit reads schema {SCHEMA_VERSION} and "
                            "earlier: upgrade fedaudit (pip install -U fedaudit)")
    return version


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The JSON Schema of metrics.json (this version)."""
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    return loaded


def problems(data: Any, definition: str | None = None) -> list[str]:
    """Where ``data`` breaks the schema (or its ``$defs/<definition>``), one line each: path and what is wrong."""
    import jsonschema

    root = schema()
    target = root if definition is None else {"$ref": f"#/$defs/{definition}", "$defs": root["$defs"]}
    validator = jsonschema.Draft202012Validator(target)
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))]


def validate(metrics: Mapping[str, Any], where: str | Path = "metrics.json") -> None:
    """Hold a metrics dict about to be written to the schema: a breach is a bug in fedaudit, so it warns (the run's
    numbers are kept) — or raises under ``FEDAUDIT_STRICT_SCHEMA=1``, as the tests run."""
    try:
        found = problems(metrics)
    except ImportError:  # a bare environment (a GPU machine with torch only): the run is written unvalidated
        if os.environ.get(STRICT_ENV):
            raise
        log.info("%s written without a schema check: jsonschema is not installed (pip install jsonschema)", where)
        return
    if not found:
        return
    message = f"{where} does not match metrics.schema.json v{SCHEMA_VERSION}: {found[0]}" + (
        f" (and {len(found) - 1} more)" if len(found) > 1 else "")
    if os.environ.get(STRICT_ENV):
        raise AssertionError(message + "\n" + "\n".join(found))
    log.warning("%s; the run is kept — please report this as a fedaudit bug", message)


def write_metrics(path: Path, metrics: RunMetrics) -> dict[str, Any]:
    """Validate and write a run's metrics.json; returns the dict written."""
    from fedaudit.run import run_directory

    data = metrics.to_json()
    validate(json.loads(run_directory.json_text(data)), path)  # as it will be read back (tensors, paths as JSON)
    run_directory.write_json(path, data)
    return data


def main(argv: list[str] | None = None) -> int:
    """``python -m fedaudit.run.results FILE...``: check metrics.json files against the schema (exit 1 on a breach)."""
    failed = 0
    for name in argv if argv is not None else sys.argv[1:]:
        try:
            data = json.loads(Path(name).read_text(encoding="utf-8"))
            version = schema_version(data, name)
        except (OSError, ValueError, FedauditError) as exc:
            print(f"{name}: {exc}")
            failed += 1
            continue
        found = problems(data) if version == SCHEMA_VERSION else [
            f"(top): metrics schema {version}; the shipped schema describes version {SCHEMA_VERSION}"]
        failed += bool(found)
        print(f"{name}: " + (f"valid (metrics schema {version})" if not found else "\n  ".join(["invalid", *found])))
    return 1 if failed else 0


__all__ = ["CANARY", "CANARY_GRADIENT", "MIA", "SCHEMA_VERSION", "Evidence",
           "Leakage", "MembershipResult", "RunMetrics", "VerdictRow", "problems",
           "schema", "schema_version", "validate", "write_metrics"]


if __name__ == "__main__":
    raise SystemExit(main())

