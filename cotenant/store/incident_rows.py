"""The ``incidents`` table: typed reads and upserts.

One row per incident, rewritten in place (``INSERT OR REPLACE`` on ``id``) each time the
analysis loop or a backfill merges a new diagnosis into it. ``detail`` is the incident's whole
diagnosis as JSON (``analysis.incident_record.Incident.to_dict()``); ``top_*`` copy its first known
cause so SQL (the weekly report, retention) can read it without parsing JSON. Merging
diagnoses into incidents is :class:`analysis.incidents.IncidentBook`'s job; this module only
moves rows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cotenant.store.db import Store
from cotenant.store.queries import select_rows


@dataclass(frozen=True)
class StoredIncident:
    """One ``incidents`` row. Times in ns UTC, latencies in ms; ``detail`` is the parsed
    ``detail_json`` (``{}`` when the column is null)."""

    id: str
    model: str
    gpu: str
    state: str
    start_ns: int
    end_ns: int
    updated_ns: int
    peak_p99_ms: float | None
    baseline_p99_ms: float | None
    slo_ms: float | None
    top_cause: str | None
    top_culprit: str | None
    top_share: float | None
    detail: dict[str, Any]
    severity: str | None = None  # breach | degradation (schema 4; None on older rows)
    replica: str | None = None  # the slow replica (schema 5)
    indicator: str | None = None  # e2e | ttft | tpot (schema 6; None on older rows: e2e)


_COLS = (
    "id, model, gpu, state, start_ns, end_ns, updated_ns, peak_p99_ms, baseline_p99_ms, "
    "slo_ms, top_cause, top_culprit, top_share, detail_json, severity, replica, indicator"
)


def _row(r: tuple[Any, ...]) -> StoredIncident:
    return StoredIncident(
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
        top_cause=r[10],
        top_culprit=r[11],
        top_share=r[12],
        detail=json.loads(r[13] or "{}"),
        severity=r[14],
        replica=r[15],
        indicator=r[16],
    )


def find_incidents(
    store: Store,
    *,
    since_ns: int | None = None,
    until_ns: int | None = None,
    model: str | None = None,
    state: str | None = None,
    severity: str | None = None,
    limit: int = 500,
    indicator: str | None = None,
) -> list[StoredIncident]:
    """Incidents newest first (by start); with ``since_ns`` / ``until_ns``, those overlapping
    the range (ending at or after ``since_ns``, starting before ``until_ns``); ``indicator``:
    those that affected it (lead or not). Filters left None do not apply. Raises QueryError
    for a limit outside 1..10,000."""
    rows = select_rows(
        store,
        "incidents",
        _COLS,
        where={
            "end_ns >= ?": since_ns,
            "start_ns < ?": until_ns,
            "model": model,
            "state": state,
            "coalesce(severity, 'breach') = ?": severity,
            # the lead indicator or any other the incident lists (detail's "indicators")
            "list_contains(list_concat([coalesce(indicator, 'e2e')], "
            "coalesce(json_keys(detail_json, '$.indicators'), [])), ?)": indicator,
        },
        order_by="start_ns DESC",
        limit=limit,
    )
    return [_row(r) for r in rows]


def get_incident(store: Store, incident_id: str) -> StoredIncident | None:
    """The incident ``incident_id``, or None when there is none."""
    with store.cursor() as cur:
        r = cur.execute(f"SELECT {_COLS} FROM incidents WHERE id = ?", [incident_id]).fetchone()
    return None if r is None else _row(r)


def upsert_incidents(store: Store, incidents: Sequence[StoredIncident]) -> None:
    """Insert each incident, or replace the row with its ``id``, in one batch.

    Callers serialise upserts of one incident (two threads rewriting the same row at once
    conflict in DuckDB; see :mod:`store.writer`)."""
    if not incidents:
        return
    rows = [
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
            i.top_cause,
            i.top_culprit,
            i.top_share,
            json.dumps(i.detail),
            i.severity,
            i.replica,
            i.indicator,
        )
        for i in incidents
    ]
    with store.cursor() as cur:
        cur.executemany(
            f"INSERT OR REPLACE INTO incidents ({_COLS}) VALUES ({', '.join('?' * 17)})", rows
        )


def delete_incidents(store: Store, ids: Sequence[str]) -> None:
    """Remove the incidents ``ids`` (withdrawn before they were ever published)."""
    if not ids:
        return
    with store.cursor() as cur:
        cur.executemany("DELETE FROM incidents WHERE id = ?", [[i] for i in ids])


def live_incident_counts(store: Store) -> dict[str, dict[str, int]]:
    """Model -> state (``open``, ``diagnosing``) -> how many of its incidents are in it now
    (models with neither are absent, and so is a state with none)."""
    with store.cursor() as cur:
        rows = cur.execute(
            "SELECT model, state, count(*) FROM incidents"
            " WHERE state IN ('open', 'diagnosing') GROUP BY 1, 2"
        ).fetchall()
    out: dict[str, dict[str, int]] = {}
    for m, state, n in rows:
        out.setdefault(str(m), {})[str(state)] = int(n)
    return out


def incidents_version(store: Store) -> int:
    """A number that changes whenever an incident is written or expired: the newest
    ``updated_ns`` plus the row count (0 for an empty table). Pollers re-read the incident
    list only when it moves."""
    with store.cursor() as cur:
        row = cur.execute(
            "SELECT coalesce(max(updated_ns), 0) + count(*) FROM incidents"
        ).fetchone()
    return int(row[0]) if row else 0
