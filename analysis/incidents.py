"""Incidents: diagnoses that open, update and resolve, persisted in the ``incidents`` table.

The continuous loop re-diagnoses a sliding horizon; :meth:`IncidentBook.update` merges each new
diagnosis into the incident it continues (same model and GPU, overlapping or within the
hysteresis gap) so an incident keeps its id while it grows, and resolves it when it ends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from analysis.diagnose import Diagnosis
from store.db import Store
from store.incident_rows import (
    StoredIncident,
    find_incidents,
    get_incident,
    upsert_incidents,
)


@dataclass
class Incident:
    id: str
    model: str
    gpu: str
    state: str  # open | resolved
    start_ns: int
    end_ns: int
    updated_ns: int
    peak_p99_ms: float | None
    baseline_p99_ms: float | None
    slo_ms: float | None
    detail: dict[str, Any]  # the latest Diagnosis.to_dict()

    @property
    def top(self) -> dict[str, Any] | None:
        return next((c for c in self.detail.get("causes", []) if c["kind"] != "unknown"), None)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.detail)
        d.update(
            id=self.id,
            model=self.model,
            gpu=self.gpu,
            state=self.state,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            updated_ns=self.updated_ns,
            peak_p99_ms=self.peak_p99_ms,
            baseline_p99_ms=self.baseline_p99_ms,
            slo_ms=self.slo_ms,
        )
        return d


def _from_stored(r: StoredIncident) -> Incident:
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
    )


def _to_stored(i: Incident) -> StoredIncident:
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
    )


class IncidentBook:
    """Reads and writes incidents. Thread-safe: :meth:`update` reads, merges and writes
    under the book's lock, so one book never rewrites an incident from two threads at once
    (``cotenant serve`` has one book, shared by the analysis loop, the API and the dashboard).
    """

    def __init__(self, store: Store, gap_ns: int = 10_000_000_000) -> None:
        self._store = store
        self._gap_ns = gap_ns
        self._lock = threading.Lock()

    def find(
        self,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        model: str | None = None,
        state: str | None = None,
        limit: int = 500,
    ) -> list[Incident]:
        """Incidents newest first; with ``since_ns`` / ``until_ns``, those overlapping the range
        (ending at or after ``since_ns``, starting before ``until_ns``)."""
        found = find_incidents(
            self._store,
            since_ns=since_ns,
            until_ns=until_ns,
            model=model,
            state=state,
            limit=limit,
        )
        return [_from_stored(r) for r in found]

    def get(self, incident_id: str) -> Incident | None:
        r = get_incident(self._store, incident_id)
        return None if r is None else _from_stored(r)

    def update(
        self, diags: list[Diagnosis], model: str, gpu: str, horizon_start_ns: int, now_ns: int
    ) -> list[Incident]:
        """Merge the diagnoses of one (model, gpu) over ``[horizon_start, now)``; resolve open
        incidents the horizon no longer shows spiking. Returns the incidents written."""
        with self._lock:
            current = [i for i in self.find(model=model, state="open") if i.gpu == gpu]
            current += [
                i
                for i in self.find(model=model, since_ns=horizon_start_ns, state="resolved")
                if i.gpu == gpu
            ]
            written: list[Incident] = []
            matched: set[str] = set()
            for d in diags:
                if not d.incident:
                    continue
                inc = next(
                    (
                        i
                        for i in current
                        if i.id not in matched
                        and d.start_ns <= i.end_ns + self._gap_ns
                        and d.end_ns >= i.start_ns - self._gap_ns
                    ),
                    None,
                )
                detail = d.to_dict()
                if inc is None:
                    inc = Incident(
                        d.id,
                        model,
                        gpu,
                        "open",
                        d.start_ns,
                        d.end_ns,
                        now_ns,
                        detail["peak_p99_ms"],
                        detail["baseline_p99_ms"],
                        d.slo_ms,
                        detail,
                    )
                else:
                    inc.start_ns = min(inc.start_ns, d.start_ns)
                    inc.end_ns = max(inc.end_ns, d.end_ns)
                    inc.peak_p99_ms = max(inc.peak_p99_ms or 0.0, detail["peak_p99_ms"] or 0.0)
                    inc.baseline_p99_ms = detail["baseline_p99_ms"]
                    inc.detail = detail
                    inc.updated_ns = now_ns
                inc.state = "open" if d.open else "resolved"
                inc.detail["id"] = inc.id
                matched.add(inc.id)
                written.append(inc)
            for inc in current:
                if (
                    inc.id not in matched
                    and inc.state == "open"
                    and inc.end_ns < now_ns - self._gap_ns
                ):
                    inc.state = "resolved"
                    inc.updated_ns = now_ns
                    written.append(inc)
            self._write(written)
            return written

    def _write(self, incidents: list[Incident]) -> None:
        upsert_incidents(self._store, [_to_stored(i) for i in incidents])
