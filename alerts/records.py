"""The ``alerts`` table: one row per Alertmanager fingerprint with its diagnosis.

``diagnosis_state``: ``pending`` (queued or running), ``done``, ``failed`` (the diagnosis raised;
``diagnosis_json`` holds ``{"error": ...}``) or ``skipped`` (nothing to diagnose, e.g. no model
label; ``{"reason": ...}``).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from alerts.payload import ReceivedAlert
from store.db import Store
from store.errors import QueryError
from store.queries import select_rows

STATES = ("pending", "done", "failed", "skipped")

_COLS = (
    "fingerprint, alertname, status, model, gpu, starts_at_ns, received_ns, labels_json, "
    "annotations_json, diagnosis_state, diagnosis_json, incident_id"
)


def _row(r: tuple[Any, ...]) -> dict[str, Any]:
    fp = r[0]
    incident = r[11]
    return {
        "fingerprint": fp,
        "alertname": r[1],
        "status": r[2],
        "model": r[3],
        "gpu": r[4],
        "starts_at_ns": r[5],
        "received_ns": r[6],
        "labels": json.loads(r[7] or "{}"),
        "annotations": json.loads(r[8] or "{}"),
        "diagnosis_state": r[9],
        "diagnosis": json.loads(r[10]) if r[10] else None,
        "incident_id": incident,
        "incident_url": None if incident is None else f"/incident?id={incident}",
        "url": f"/api/v1/alerts/{fp}",
    }


class AlertBook:
    """Reads and writes alert rows. Thread-safe: :meth:`claim` decides under a lock whether a
    delivery needs a diagnosis, so concurrent deliveries of one alert run one."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()

    def claim(self, alert: ReceivedAlert, received_ns: int) -> bool:
        """Record a delivery; True when it needs a diagnosis: a fingerprint not seen before
        (or seen with another ``startsAt``: the alert fired again) that names a model."""
        labels = json.dumps(alert.labels, sort_keys=True)
        annotations = json.dumps(alert.annotations, sort_keys=True)
        with self._lock, self._store.cursor() as cur:
            row = cur.execute(
                "SELECT starts_at_ns FROM alerts WHERE fingerprint = ?", [alert.fingerprint]
            ).fetchone()
            if row is not None and row[0] == alert.starts_at_ns:
                cur.execute(
                    "UPDATE alerts SET status = ?, labels_json = ?, annotations_json = ? "
                    "WHERE fingerprint = ?",
                    [alert.status, labels, annotations, alert.fingerprint],
                )
                return False
            model = alert.model
            if model is None:
                state = "skipped"
                detail: str | None = json.dumps(
                    {
                        "reason": "the alert names no model (no label model, victim or "
                        "model_name), so there is nothing to diagnose"
                    }
                )
            else:
                state, detail = "pending", None
            if row is not None:  # fired again: a new episode replaces the old one
                cur.execute("DELETE FROM alerts WHERE fingerprint = ?", [alert.fingerprint])
            cur.execute(
                f"INSERT INTO alerts ({_COLS}) VALUES ({', '.join('?' * 12)})",
                [
                    alert.fingerprint,
                    alert.alertname,
                    alert.status,
                    model,
                    alert.gpu,
                    alert.starts_at_ns,
                    received_ns,
                    labels,
                    annotations,
                    state,
                    detail,
                    None,
                ],
            )
            return model is not None

    def finish(
        self, fingerprint: str, state: str, detail: dict[str, Any], incident_id: str | None
    ) -> None:
        """Store the outcome of a diagnosis (``state``: done or failed)."""
        with self._store.cursor() as cur:
            cur.execute(
                "UPDATE alerts SET diagnosis_state = ?, diagnosis_json = ?, incident_id = ? "
                "WHERE fingerprint = ?",
                [state, json.dumps(detail), incident_id, fingerprint],
            )

    def link(self, fingerprint: str, incident_id: str) -> None:
        with self._store.cursor() as cur:
            cur.execute(
                "UPDATE alerts SET incident_id = ? WHERE fingerprint = ?",
                [incident_id, fingerprint],
            )

    def get(self, fingerprint: str) -> dict[str, Any] | None:
        with self._store.cursor() as cur:
            r = cur.execute(
                f"SELECT {_COLS} FROM alerts WHERE fingerprint = ?", [fingerprint]
            ).fetchone()
        return None if r is None else _row(r)

    def find(
        self,
        *,
        incident_id: str | None = None,
        state: str | None = None,
        limit: int = 500,
    ) -> list[dict[str, Any]]:
        """Alerts newest first, optionally of one incident or one diagnosis state."""
        if state is not None and state not in STATES:
            raise QueryError(f"state {state!r} must be one of {', '.join(STATES)}")
        rows = select_rows(
            self._store,
            "alerts",
            _COLS,
            where={"incident_id": incident_id, "diagnosis_state": state},
            order_by="starts_at_ns DESC, fingerprint",
            limit=limit,
        )
        return [_row(r) for r in rows]
