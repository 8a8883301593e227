"""The ``alerts`` table: typed reads and writes, one row per Alertmanager fingerprint.

Deciding whether a delivery needs a diagnosis is :class:`alerts.records.AlertBook`'s job; this
module only moves rows. ``labels`` and ``annotations`` are stored as JSON with sorted keys,
``diagnosis`` as given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cotenant.store.db import Store
from cotenant.store.queries import select_rows


@dataclass(frozen=True)
class StoredAlert:
    """One ``alerts`` row. Times in ns UTC; ``labels`` / ``annotations`` / ``diagnosis`` are
    the parsed JSON columns (``{}``, ``{}`` and None when null). ``diagnosis_state``:
    pending, done, failed or skipped."""

    fingerprint: str
    alertname: str | None
    status: str
    model: str | None
    gpu: str | None
    starts_at_ns: int
    received_ns: int
    labels: dict[str, Any]
    annotations: dict[str, Any]
    diagnosis_state: str
    diagnosis: dict[str, Any] | None
    incident_id: str | None


_COLS = (
    "fingerprint, alertname, status, model, gpu, starts_at_ns, received_ns, labels_json, "
    "annotations_json, diagnosis_state, diagnosis_json, incident_id"
)


def _row(r: tuple[Any, ...]) -> StoredAlert:
    return StoredAlert(
        fingerprint=r[0],
        alertname=r[1],
        status=r[2],
        model=r[3],
        gpu=r[4],
        starts_at_ns=r[5],
        received_ns=r[6],
        labels=json.loads(r[7] or "{}"),
        annotations=json.loads(r[8] or "{}"),
        diagnosis_state=r[9],
        diagnosis=json.loads(r[10]) if r[10] else None,
        incident_id=r[11],
    )


def alert_starts_at_ns(store: Store, fingerprint: str) -> int | None:
    """``starts_at_ns`` of the stored episode of ``fingerprint``; None when none is stored
    (or it has none)."""
    with store.cursor() as cur:
        row = cur.execute(
            "SELECT starts_at_ns FROM alerts WHERE fingerprint = ?", [fingerprint]
        ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def refresh_alert(
    store: Store,
    fingerprint: str,
    status: str,
    labels: dict[str, Any],
    annotations: dict[str, Any],
) -> None:
    """Update the status, labels and annotations of a stored alert (a re-delivery of the
    same episode); its diagnosis is kept. No-op for an unknown fingerprint."""
    with store.cursor() as cur:
        cur.execute(
            "UPDATE alerts SET status = ?, labels_json = ?, annotations_json = ? "
            "WHERE fingerprint = ?",
            [
                status,
                json.dumps(labels, sort_keys=True),
                json.dumps(annotations, sort_keys=True),
                fingerprint,
            ],
        )


def replace_alert(store: Store, alert: StoredAlert) -> None:
    """Store ``alert`` as the only row of its fingerprint: any earlier episode's row
    (diagnosis included) is deleted first, in the same transaction."""
    row = [
        alert.fingerprint,
        alert.alertname,
        alert.status,
        alert.model,
        alert.gpu,
        alert.starts_at_ns,
        alert.received_ns,
        json.dumps(alert.labels, sort_keys=True),
        json.dumps(alert.annotations, sort_keys=True),
        alert.diagnosis_state,
        None if alert.diagnosis is None else json.dumps(alert.diagnosis),
        alert.incident_id,
    ]
    with store.cursor() as cur:
        cur.execute("BEGIN TRANSACTION")
        try:
            cur.execute("DELETE FROM alerts WHERE fingerprint = ?", [alert.fingerprint])
            cur.execute(f"INSERT INTO alerts ({_COLS}) VALUES ({', '.join('?' * 12)})", row)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise


def finish_alert(
    store: Store,
    fingerprint: str,
    state: str,
    diagnosis: dict[str, Any],
    incident_id: str | None,
) -> None:
    """Store the outcome of an alert's diagnosis (``state``: done or failed)."""
    with store.cursor() as cur:
        cur.execute(
            "UPDATE alerts SET diagnosis_state = ?, diagnosis_json = ?, incident_id = ? "
            "WHERE fingerprint = ?",
            [state, json.dumps(diagnosis), incident_id, fingerprint],
        )


def link_alert(store: Store, fingerprint: str, incident_id: str) -> None:
    """Set the incident an alert belongs to."""
    with store.cursor() as cur:
        cur.execute(
            "UPDATE alerts SET incident_id = ? WHERE fingerprint = ?", [incident_id, fingerprint]
        )


def get_alert(store: Store, fingerprint: str) -> StoredAlert | None:
    """The alert ``fingerprint``, or None when there is none."""
    with store.cursor() as cur:
        r = cur.execute(
            f"SELECT {_COLS} FROM alerts WHERE fingerprint = ?", [fingerprint]
        ).fetchone()
    return None if r is None else _row(r)


def find_alerts(
    store: Store,
    *,
    incident_id: str | None = None,
    diagnosis_state: str | None = None,
    limit: int = 500,
) -> list[StoredAlert]:
    """Alerts newest first (by ``starts_at_ns``, then fingerprint), optionally of one
    incident or one diagnosis state. Raises QueryError for a limit outside 1..10,000."""
    rows = select_rows(
        store,
        "alerts",
        _COLS,
        where={"incident_id": incident_id, "diagnosis_state": diagnosis_state},
        order_by="starts_at_ns DESC, fingerprint",
        limit=limit,
    )
    return [_row(r) for r in rows]
