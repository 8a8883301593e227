"""The incident record: states, :class:`Incident` (stored and served as JSON), what it holds
of each indicator (:class:`IndicatorEntry`) and of its top cause's history
(:class:`CauseStep`), the events a pass reports about it, and its conversion to and from the
store's rows. :class:`analysis.incidents.IncidentBook` keeps them.

An incident is typed throughout; it becomes a dict only at the edges: :meth:`Incident.to_dict`
(the API's and the dashboard's JSON, and the store's ``detail_json``) and :func:`from_stored`
(a row read back, including rows written by earlier versions)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cotenant.analysis.attribution import Cause
from cotenant.analysis.diagnosis import Diagnosis, Judged, judged_from_dict, rounded
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.slos import BREACH, E2E
from cotenant.store.incident_rows import StoredIncident

DIAGNOSING = "diagnosing"
OPEN = "open"
RESOLVED = "resolved"
DISMISSED = "dismissed"  # a diagnosing incident whose slowdown was a transient: not stored
STATES = (DIAGNOSING, OPEN, RESOLVED)
UNNAMED_PUBLISH_WINDOWS = 60
"""Windows of a slowdown after which it is published even when no cause is named."""
NO_CULPRIT = "—"
"""The culprit of a :class:`CauseStep` that names no cause."""


@dataclass(frozen=True)
class IndicatorEntry:
    """What an incident shows of one indicator (e2e, ttft, tpot): its slowdown's extent (ns),
    whether it is still slow, its severity, baseline and peak p99 (ms; the baseline frozen when
    the indicator joined the incident), its SLO, how the detector judged it (frozen with the
    baseline; None for one judged by an earlier detector) and whether it began before the
    windows last read (``carried``)."""

    start_ns: int
    end_ns: int
    open: bool
    severity: str
    baseline_p99_ms: float | None
    peak_p99_ms: float | None
    slo_ms: float | None
    judged: Judged | None
    carried: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "open": self.open,
            "severity": self.severity,
            "baseline_p99_ms": self.baseline_p99_ms,
            "peak_p99_ms": self.peak_p99_ms,
            "slo_ms": self.slo_ms,
            "judged_on": None if self.judged is None else self.judged.to_dict(),
            "carried": self.carried,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> IndicatorEntry:
        """The inverse of :meth:`to_dict`. Raises KeyError for an entry without its extent."""
        return cls(
            int(d["start_ns"]),
            int(d["end_ns"]),
            bool(d.get("open", True)),
            str(d.get("severity") or BREACH),
            _float(d.get("baseline_p99_ms")),
            _float(d.get("peak_p99_ms")),
            _float(d.get("slo_ms")),
            judged_from_dict(d.get("judged_on")),
            bool(d.get("carried", False)),
        )


@dataclass(frozen=True)
class CauseStep:
    """One step of an incident's top-cause history: at ``at_ns`` (the pass that saw it) its top
    cause became ``kind`` / ``culprit`` with ``share`` of the excess (``unknown``, ``—`` and
    None when no cause was named)."""

    at_ns: int
    kind: str
    culprit: str
    share: float | None

    @classmethod
    def of(cls, at_ns: int, cause: Cause | None) -> CauseStep:
        if cause is None:
            return cls(at_ns, CauseKind.UNKNOWN, NO_CULPRIT, None)
        return cls(at_ns, cause.kind, cause.culprit, cause.share)

    @property
    def named(self) -> tuple[str, str] | None:
        """``(kind, culprit)``, or None when the step names no cause."""
        return None if self.kind == CauseKind.UNKNOWN else (self.kind, self.culprit)

    def to_dict(self) -> dict[str, Any]:
        share = None if self.share is None else round(self.share, 4)
        return {
            "at_ns": self.at_ns,
            "kind": str(self.kind),
            "culprit": self.culprit,
            "share": share,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CauseStep:
        return cls(
            int(d["at_ns"]),
            str(d.get("kind") or CauseKind.UNKNOWN),
            str(d.get("culprit") or NO_CULPRIT),
            _float(d.get("share")),
        )


@dataclass
class Incident:
    """One victim's slowdown on one (model, GPU, indicator), as stored and served.

    ``told``: the latest merged diagnosis of its lead indicator — its causes, notes, phases,
    siblings, how it was judged (frozen when the indicator joined), whether it is still open,
    and the p99 after it ended. The incident's own fields hold its extent, peak, baseline (frozen
    when it opened), SLO, severity, indicator and replica: they are what is served, whatever
    ``told`` says of them. ``by_indicator``: each indicator the event affected; ``cause_history``
    the top cause each time it changed; ``resolved_at_end_ns``: its end when it was
    resolved (a later slowdown, not its own episode again, re-opens it), until a fresh
    diagnosis continues it."""

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
    told: Diagnosis
    severity: str = BREACH
    replica: str | None = None  # the slow replica, when the model's requests name replicas
    indicator: str = E2E  # the lead indicator: e2e | ttft | tpot (see .indicators)
    by_indicator: dict[str, IndicatorEntry] = field(default_factory=dict)
    cause_history: list[CauseStep] = field(default_factory=list)
    resolved_at_end_ns: int | None = None

    @property
    def top(self) -> Cause | None:
        """The first named cause (not ``unknown``), or None."""
        return self.told.top

    @property
    def causes(self) -> list[Cause]:
        """Every cause, ranked, ``unknown`` last."""
        return self.told.causes

    @property
    def indicators(self) -> list[str]:
        """Every indicator this incident's event affected, its lead one first."""
        rest = sorted(i for i in self.by_indicator if i != self.indicator)
        return [self.indicator, *rest]

    @property
    def live(self) -> bool:
        return self.state != RESOLVED

    @property
    def open(self) -> bool:
        """Whether its slowdown was still going on when last judged (an open incident is not
        over until it has stayed quiet for the cool-down)."""
        return self.told.open

    @property
    def resolved_p99_ms(self) -> float | None:
        """The p99 (ms) of the windows after its slowdown ended; None while it lasts."""
        after = self.told.after_p99_ms
        return None if after is None else rounded(after)

    def to_dict(self) -> dict[str, Any]:
        """The incident as JSON: its lead indicator's diagnosis (:meth:`Diagnosis.to_dict`)
        with the incident's own fields, ``cause_history``, ``indicators`` (each indicator's
        :meth:`IndicatorEntry.to_dict`), ``resolved_at_end_ns`` once resolved, ``state`` and
        ``updated_ns``. The store keeps it as ``detail_json``; :func:`from_stored` reads it."""
        d = self.told.to_dict()
        d.update(
            id=self.id,
            model=self.model,
            gpu=self.gpu,
            replica=self.replica,
            severity=self.severity,
            indicator=self.indicator,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            peak_p99_ms=self.peak_p99_ms,
            baseline_p99_ms=self.baseline_p99_ms,
            slo_ms=self.slo_ms,
        )
        d["cause_history"] = [s.to_dict() for s in self.cause_history]
        if self.by_indicator:
            d["indicators"] = {k: e.to_dict() for k, e in self.by_indicator.items()}
        if self.resolved_at_end_ns is not None:
            d["resolved_at_end_ns"] = self.resolved_at_end_ns
        d["state"] = self.state
        d["updated_ns"] = self.updated_ns
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
    previous: Cause | None = None  # cause_changed: the former top cause


def from_stored(r: StoredIncident) -> Incident:
    """An incident read back from the store (its ``detail`` as :meth:`Incident.to_dict`
    wrote it; keys an earlier version did not write take their defaults, and a ``judged_on``
    of an earlier detector loads as None)."""
    detail = r.detail
    told = Diagnosis.from_dict(
        {**detail, "model": r.model, "gpu": r.gpu, "start_ns": r.start_ns, "end_ns": r.end_ns}
    )
    entries = detail.get("indicators") or {}
    resolved_at = detail.get("resolved_at_end_ns")
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
        told=told,
        severity=r.severity or BREACH,
        replica=r.replica,
        indicator=r.indicator or E2E,
        by_indicator={str(k): IndicatorEntry.from_dict(e) for k, e in entries.items()},
        cause_history=[CauseStep.from_dict(s) for s in detail.get("cause_history") or []],
        resolved_at_end_ns=None if resolved_at is None else int(resolved_at),
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
        top_cause=None if top is None else str(top.kind),
        top_culprit=None if top is None else top.culprit,
        top_share=None if top is None else round(top.share, 4),
        detail=i.to_dict(),
        severity=i.severity,
        replica=i.replica,
        indicator=i.indicator,
    )


def _float(x: Any) -> float | None:
    return None if x is None else float(x)
