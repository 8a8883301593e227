"""Alertmanager webhook receiver: ``POST /api/v1/alerts`` and ``GET /api/v1/alerts/{fp}``.

Point an Alertmanager ``webhook_configs`` receiver at ``http://<cotenant>/api/v1/alerts``. A
delivery is parsed and recorded at once (202); each new firing alert naming a model is
diagnosed in the background (:class:`alerts.diagnosis.AlertDiagnoser`). The same alert
delivered again — Alertmanager repeats notifications and sends ``resolved`` — updates its
status and runs no second diagnosis. A malformed body gets 400 naming the field.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Query, Request
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool

from cotenant.alerts.diagnosis import AlertDiagnoser, find_incident
from cotenant.alerts.payload import ReceivedAlert, parse_payload
from cotenant.alerts.records import AlertBook
from cotenant.alerts.settings import AlertSettings
from cotenant.analysis.analyzer import Analyzer
from cotenant.core.errors import AlertPayloadError, NotFoundError
from cotenant.core.http_body import read_body
from cotenant.core.http_json import SafeJSONResponse
from cotenant.store.db import Store

MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest webhook body accepted (Alertmanager groups rarely pass a few hundred KiB)."""


class AlertReceiver:
    """Records deliveries in an :class:`AlertBook` and queues their diagnoses."""

    def __init__(
        self,
        store: Store,
        analyzer: Analyzer,
        *,
        lookback_s: float = AlertSettings.lookback_s,
        lookahead_s: float = AlertSettings.lookahead_s,
        clock_ns: Callable[[], int] = time.time_ns,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.book = AlertBook(store)
        self._analyzer = analyzer
        self._clock = clock_ns
        self.diagnoser = AlertDiagnoser(
            self.book,
            analyzer,
            lookback_s=lookback_s,
            lookahead_s=lookahead_s,
            clock_ns=clock_ns,
            registry=registry,
        )
        self.resumed = self._resume()

    def _resume(self) -> int:
        """Queue the alerts a previous run left ``pending`` (stopped before diagnosing them)."""
        rows = self.book.find(state="pending", limit=10_000)
        for row in rows:
            self.diagnoser.submit(
                ReceivedAlert(
                    row["fingerprint"],
                    row["status"],
                    row["labels"],
                    row["annotations"],
                    row["starts_at_ns"],
                )
            )
        return len(rows)

    def receive(self, body: bytes) -> dict[str, Any]:
        """Parse and record a webhook body; returns what was done with it. Raises
        AlertPayloadError (nothing recorded) when any part of it is malformed."""
        alerts = parse_payload(body)
        now = self._clock()
        queued = []
        for alert in alerts:
            if self.book.claim(alert, now):
                self.diagnoser.submit(alert)
                queued.append(alert.fingerprint)
        return {
            "received": len(alerts),
            "diagnosing": queued,
            "alerts": [f"/api/v1/alerts/{a.fingerprint}" for a in alerts],
        }

    def alert(self, fingerprint: str) -> dict[str, Any]:
        """The stored alert; links it to its incident when the analysis loop has opened one
        since the diagnosis ran. Raises NotFoundError for an unknown fingerprint."""
        row = self.book.get(fingerprint)
        if row is None:
            raise NotFoundError(f"no alert with fingerprint {fingerprint!r}")
        if row["incident_id"] is None and row["diagnosis_state"] == "done":
            d = row["diagnosis"] or {}
            incident = find_incident(
                self._analyzer,
                row["model"],
                row["gpu"],
                row["starts_at_ns"],
                int(d.get("start_ns") or row["starts_at_ns"]),
                int(d.get("end_ns") or row["starts_at_ns"]),
            )
            if incident is not None:
                self.book.link(fingerprint, incident)
                row = self.book.get(fingerprint) or row
        return row

    def close(self) -> None:
        self.diagnoser.close()


def alerts_router(receiver: AlertReceiver) -> APIRouter:
    """The webhook and alert routes; include it in the API app (its CotenantError handler
    turns AlertPayloadError into 400 and NotFoundError into 404)."""
    router = APIRouter()
    err: dict[int | str, dict[str, Any]] = {
        400: {"description": "malformed payload or query; the error names the field"},
        404: {"description": "unknown fingerprint"},
    }

    @router.post(
        "/api/v1/alerts",
        summary="Alertmanager webhook (payload version 4): record and diagnose alerts",
        status_code=202,
        responses=err,
    )
    async def post_alerts(request: Request) -> SafeJSONResponse:
        body = await read_body(request, MAX_BODY_BYTES, AlertPayloadError)
        result = await run_in_threadpool(receiver.receive, body)
        return SafeJSONResponse(result, status_code=202)

    @router.get("/api/v1/alerts", summary="Received alerts, newest first", responses=err)
    def list_alerts(
        incident: str | None = Query(None, description="only alerts linked to this incident"),
        state: str | None = Query(None, description="pending, done, failed or skipped"),
        limit: int = Query(500, description="1..10000"),
    ) -> SafeJSONResponse:
        rows = receiver.book.find(incident_id=incident, state=state, limit=limit)
        return SafeJSONResponse({"count": len(rows), "alerts": rows})

    @router.get(
        "/api/v1/alerts/{fingerprint}",
        summary="One alert with its diagnosis and incident",
        responses=err,
    )
    def get_alert(fingerprint: str) -> SafeJSONResponse:
        return SafeJSONResponse(receiver.alert(fingerprint))

    return router
