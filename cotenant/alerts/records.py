"""The ``alerts`` table: one row per Alertmanager fingerprint with its diagnosis.

``diagnosis_state``: ``pending`` (queued or running), ``done``, ``failed`` (the diagnosis raised;
``diagnosis_json`` holds ``{"error": ...}``) or ``skipped`` (nothing to diagnose, e.g. no model
label; ``{"reason": ...}``).
"""

from __future__ import annotations

import threading
from typing import Any

from cotenant.alerts.payload import ReceivedAlert
from cotenant.core.errors import QueryError
from cotenant.store.alert_rows import (
    StoredAlert,
    alert_starts_at_ns,
    find_alerts,
    finish_alert,
    get_alert,
    link_alert,
    refresh_alert,
    replace_alert,
)
from cotenant.store.db import Store

STATES = ("pending", "done", "failed", "skipped")


def _as_dict(a: StoredAlert) -> dict[str, Any]:
    """The API's view of an alert: the row's fields plus ``incident_url`` and ``url``."""
    return {
        "fingerprint": a.fingerprint,
        "alertname": a.alertname,
        "status": a.status,
        "model": a.model,
        "gpu": a.gpu,
        "starts_at_ns": a.starts_at_ns,
        "received_ns": a.received_ns,
        "labels": a.labels,
        "annotations": a.annotations,
        "diagnosis_state": a.diagnosis_state,
        "diagnosis": a.diagnosis,
        "incident_id": a.incident_id,
        "incident_url": None if a.incident_id is None else f"/incident?id={a.incident_id}",
        "url": f"/api/v1/alerts/{a.fingerprint}",
    }


class AlertBook:
    """Reads and writes alert rows (through :mod:`store.alert_rows`). Thread-safe:
    :meth:`claim` decides under a lock whether a delivery needs a diagnosis, so concurrent
    deliveries of one alert run one."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()

    def claim(self, alert: ReceivedAlert, received_ns: int) -> bool:
        """Record a delivery; True when it needs a diagnosis: a fingerprint not seen before
        (or seen with another ``startsAt``: the alert fired again) that names a model."""
        with self._lock:
            stored = alert_starts_at_ns(self._store, alert.fingerprint)
            if stored is not None and stored == alert.starts_at_ns:
                refresh_alert(
                    self._store, alert.fingerprint, alert.status, alert.labels, alert.annotations
                )
                return False
            model = alert.model
            if model is None:
                state = "skipped"
                detail: dict[str, Any] | None = {
                    "reason": "the alert names no model (no label model, victim or "
                    "model_name), so there is nothing to diagnose"
                }
            else:
                state, detail = "pending", None
            # a new fingerprint, or one that fired again: the new episode replaces the old
            replace_alert(
                self._store,
                StoredAlert(
                    fingerprint=alert.fingerprint,
                    alertname=alert.alertname,
                    status=alert.status,
                    model=model,
                    gpu=alert.gpu,
                    starts_at_ns=alert.starts_at_ns,
                    received_ns=received_ns,
                    labels=alert.labels,
                    annotations=alert.annotations,
                    diagnosis_state=state,
                    diagnosis=detail,
                    incident_id=None,
                ),
            )
            return model is not None

    def finish(
        self, fingerprint: str, state: str, detail: dict[str, Any], incident_id: str | None
    ) -> None:
        """Store the outcome of a diagnosis (``state``: done or failed)."""
        finish_alert(self._store, fingerprint, state, detail, incident_id)

    def link(self, fingerprint: str, incident_id: str) -> None:
        link_alert(self._store, fingerprint, incident_id)

    def get(self, fingerprint: str) -> dict[str, Any] | None:
        a = get_alert(self._store, fingerprint)
        return None if a is None else _as_dict(a)

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
        found = find_alerts(
            self._store, incident_id=incident_id, diagnosis_state=state, limit=limit
        )
        return [_as_dict(a) for a in found]
