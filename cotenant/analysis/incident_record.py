"""The incident record: states, :class:`Incident` (stored and served as JSON), the events a
pass reports about it, and its conversion to and from the store's rows.
:class:`analysis.incidents.IncidentBook` keeps them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cotenant.core.slos import BREACH, E2E
from cotenant.store.incident_rows import StoredIncident

DIAGNOSING = "diagnosing"
OPEN = "open"
RESOLVED = "resolved"
DISMISSED = "dismissed"  # a diagnosing incident whose slowdown was a transient: not stored
STATES = (DIAGNOSING, OPEN, RESOLVED)
UNNAMED_PUBLISH_WINDOWS = 60
"""Windows of a slowdown after which it is published even when no cause is named."""


@dataclass
class Incident:
    """One victim's slowdown on one (model, GPU, indicator), as stored and served."""

    id: str
    model: str
    gpu: str
    state: str  # diagnosing | open | resolved
    start_ns: int
    end_ns: int
    updated_ns: int
    peak_p99_ms: float | None
    baseline_p99_ms: float | None  # frozen when the incident opened
    slo_ms: float | None
    detail: dict[str, Any]  # the latest Diagnosis.to_dict(), plus cause_history
    severity: str = BREACH
    replica: str | None = None  # the slow replica, when the model's requests name replicas
    indicator: str = E2E  # the lead indicator: e2e | ttft | tpot (see .indicators)

    @property
    def top(self) -> dict[str, Any] | None:
        return next((c for c in self.detail.get("causes", []) if c["kind"] != "unknown"), None)

    @property
    def indicators(self) -> list[str]:
        """Every indicator this incident's event affected, its lead one first."""
        rest = sorted(i for i in self.detail.get("indicators") or {} if i != self.indicator)
        return [self.indicator, *rest]

    @property
    def live(self) -> bool:
        return self.state != RESOLVED

    @property
    def cause_history(self) -> list[dict[str, Any]]:
        return list(self.detail.get("cause_history", []))

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.detail)
        d.update(
            id=self.id,
            model=self.model,
            gpu=self.gpu,
            replica=self.replica,
            state=self.state,
            severity=self.severity,
            indicator=self.indicator,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            updated_ns=self.updated_ns,
            peak_p99_ms=self.peak_p99_ms,
            baseline_p99_ms=self.baseline_p99_ms,
            slo_ms=self.slo_ms,
        )
        return d


@dataclass(frozen=True)
class IncidentEvent:
    """One change a person would want to hear about, seen by the pass at ``at_ns``.

    ``kind``: ``diagnosing`` (a slowdown found, cause not settled), ``opened`` (published
    with its top cause), ``cause_changed``, ``escalated`` (a degradation crossed the SLO),
    ``resolved``, ``reopened`` (slow again within the cool-down), ``dismissed`` (a
    diagnosing slowdown that ended as a transient: withdrawn, never published)."""

    kind: str
    incident: Incident
    at_ns: int
    previous: dict[str, Any] | None = None  # cause_changed: the former top cause


def from_stored(r: StoredIncident) -> Incident:
    """An incident read back from the store."""
    return Incident(
        id=r.id,
        model=r.model,
        gpu=r.gpu,
        state=r.state,
        start_ns=r.start_ns,
        end_ns=r.end_ns,
        updated_ns=r.updated_ns,
        peak_p99_ms=r.peak_p99_ms,
        baseline_p99_ms=r.baseline_p99_ms,
        slo_ms=r.slo_ms,
        detail=r.detail,
        severity=r.severity or BREACH,
        replica=r.replica,
        indicator=r.indicator or E2E,
    )


def to_stored(i: Incident) -> StoredIncident:
    """The store's row of ``i`` (its top cause copied into columns for queries)."""
    top = i.top
    return StoredIncident(
        id=i.id,
        model=i.model,
        gpu=i.gpu,
        state=i.state,
        start_ns=i.start_ns,
        end_ns=i.end_ns,
        updated_ns=i.updated_ns,
        peak_p99_ms=i.peak_p99_ms,
        baseline_p99_ms=i.baseline_p99_ms,
        slo_ms=i.slo_ms,
        top_cause=None if top is None else top["kind"],
        top_culprit=None if top is None else top["culprit"],
        top_share=None if top is None else top["share"],
        detail=i.to_dict(),
        severity=i.severity,
        replica=i.replica,
        indicator=i.indicator,
    )
