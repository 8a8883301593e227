"""Incidents: diagnoses that open, update and resolve, persisted in the ``incidents`` table.

The continuous loop re-diagnoses a sliding horizon; :meth:`IncidentBook.update` merges each new
diagnosis into the incident it continues (same model and GPU, overlapping or within the
hysteresis gap) so an incident keeps its id while it grows, and resolves it when it ends.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from analysis.diagnose import Diagnosis
from store.db import Store
from store.queries import select_rows


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


_COLS = (
    "id, model, gpu, state, start_ns, end_ns, updated_ns, peak_p99_ms, baseline_p99_ms, "
    "slo_ms, top_cause, top_culprit, top_share, detail_json"
)


def _row_to_incident(r: tuple[Any, ...]) -> Incident:
    return Incident(
        id=r[0],
        model=r[1],
        gpu=r[2],
        state=r[3],
        start_ns=r[4],
        end_ns=r[5],
        updated_ns=r[6],
        peak_p99_ms=r[7],
        baseline_p99_ms=r[8],
        slo_ms=r[9],
        detail=json.loads(r[13] or "{}"),
    )


class IncidentBook:
    """Reads and writes incidents. Thread-safe."""

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
        rows = select_rows(
            self._store,
            "incidents",
            _COLS,
            where={
                "end_ns >= ?": since_ns,
                "start_ns < ?": until_ns,
                "model": model,
                "state": state,
            },
            order_by="start_ns DESC",
            limit=limit,
        )
        return [_row_to_incident(r) for r in rows]

    def get(self, incident_id: str) -> Incident | None:
        with self._store.cursor() as cur:
            r = cur.execute(f"SELECT {_COLS} FROM incidents WHERE id = ?", [incident_id]).fetchone()
        return None if r is None else _row_to_incident(r)

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
        if not incidents:
            return
        rows = []
        for i in incidents:
            top = i.top
            rows.append(
                (
                    i.id,
                    i.model,
                    i.gpu,
                    i.state,
                    i.start_ns,
                    i.end_ns,
                    i.updated_ns,
                    i.peak_p99_ms,
                    i.baseline_p99_ms,
                    i.slo_ms,
                    None if top is None else top["kind"],
                    None if top is None else top["culprit"],
                    None if top is None else top["share"],
                    json.dumps(i.to_dict()),
                )
            )
        with self._store.cursor() as cur:
            cur.executemany(
                f"INSERT OR REPLACE INTO incidents ({_COLS}) VALUES ({', '.join('?' * 14)})", rows
            )
