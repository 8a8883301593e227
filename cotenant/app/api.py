"""The HTTP API on port 8050: health, readiness, /metrics, request drill-down, OpenAPI."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel

from cotenant.alerts.records import AlertBook
from cotenant.analysis.analyzer import Analyzer
from cotenant.core.errors import (
    ActionError,
    AlertPayloadError,
    BackendError,
    CotenantError,
    Forbidden,
    NotFoundError,
    QueryError,
    Unauthorized,
)
from cotenant.core.http_json import SafeJSONResponse
from cotenant.core.timerange import TimeRange
from cotenant.core.timespec import parse_time_ns
from cotenant.store.db import Store
from cotenant.store.queries import MAX_LIMIT, requests_rows


class RequestRow(BaseModel):
    """One served request (see the ``requests`` table in docs/architecture.md)."""

    ts_start_ns: int
    ts_end_ns: int
    latency_ms: float
    trace_id: str
    span_id: str
    model: str
    tenant: str | None = None
    host: str | None = None
    pid: int | None = None
    gpu: str | None = None
    priority: int | None = None
    batch_size: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    status: str
    source: str
    queue_ms: float
    lock_wait_ms: float
    preprocess_ms: float
    h2d_ms: float
    compute_ms: float
    d2h_ms: float
    postprocess_ms: float
    other_ms: float
    lock_name: str | None = None
    lock_holder: str | None = None
    ttft_ms: float | None = None
    replica: str | None = None


class RequestsResponse(BaseModel):
    count: int
    requests: list[RequestRow]


class ErrorResponse(BaseModel):
    error: str


class DiagnoseRequest(BaseModel):
    """Diagnose ``model`` between ``start`` and ``end`` ('now', '15m' ago, ISO 8601 or Unix s)."""

    model: str
    start: str
    end: str = "now"


_STATUS: tuple[tuple[type[CotenantError], int], ...] = (
    (NotFoundError, 404),
    (QueryError, 400),
    (AlertPayloadError, 400),
    (Unauthorized, 401),
    (Forbidden, 403),
    (ActionError, 409),
    (BackendError, 502),
)


def http_status(exc: CotenantError) -> int:
    """The HTTP status an error of the exception tree answers with (500 when unmapped)."""
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def validation_error(exc: RequestValidationError) -> dict[str, Any]:
    """FastAPI's 422 body without the client's input echoed back (it may hold NaN or lone
    surrogates, which FastAPI's own handler cannot serialise), plus ``error`` naming the
    first field, like every other error of the API."""
    detail = [
        {
            "loc": [str(x) for x in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": e.get("type"),
        }
        for e in exc.errors()
    ]
    first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"]) or "request"
    return {"error": f"{where}: {first['msg']}", "detail": detail}


def create_api(
    store: Store,
    registry: CollectorRegistry,
    readiness: Callable[[], str | None],
    analyzer: Analyzer | None = None,
) -> FastAPI:
    """The API app. ``readiness()`` returns None when ready, else the reason it is not;
    ``analyzer`` adds the diagnosis and incident routes."""
    app = FastAPI(
        title="cotenant",
        version="0.1.0",
        description="Why did this model's latency spike, who caused it, and what should we change?",
    )

    @app.exception_handler(CotenantError)
    async def _cotenant_error(_: Request, exc: CotenantError) -> SafeJSONResponse:
        status = http_status(exc)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return SafeJSONResponse({"error": str(exc)}, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> SafeJSONResponse:
        return SafeJSONResponse(validation_error(exc), status_code=422)

    @app.get("/healthz", summary="Liveness: the process answers")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        summary="Readiness: the store is open and the writer accepts data",
        responses={503: {"model": ErrorResponse}},
    )
    def readyz() -> Response:
        reason = readiness()
        if reason is None:
            return SafeJSONResponse({"status": "ready"})
        return SafeJSONResponse({"status": "not ready", "error": reason}, status_code=503)

    @app.get("/metrics", summary="Prometheus exposition", response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/api/v1/requests",
        summary="Raw requests, newest first",
        responses={200: {"model": RequestsResponse}, 400: {"model": ErrorResponse}},
    )
    def list_requests(
        model: str | None = Query(None, description="only this model"),
        gpu: str | None = Query(None, description="only this GPU"),
        since: str | None = Query(None, description="'now', '15m' (ago), ISO 8601 or Unix s"),
        until: str | None = Query(None, description="same forms as since"),
        limit: int = Query(1000, description=f"1..{MAX_LIMIT}"),
    ) -> SafeJSONResponse:
        rng = TimeRange(
            None if since is None else parse_time_ns(since, "since"),
            None if until is None else parse_time_ns(until, "until"),
        )
        rows: list[dict[str, Any]] = requests_rows(store, rng, model=model, gpu=gpu, limit=limit)
        return SafeJSONResponse({"count": len(rows), "requests": rows})

    if analyzer is not None:
        _analysis_routes(app, analyzer, AlertBook(store))
    return app


def _analysis_routes(app: FastAPI, analyzer: Analyzer, alerts: AlertBook) -> None:
    errors: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorResponse},
        404: {"model": ErrorResponse},
    }

    @app.post("/api/v1/diagnose", summary="Diagnose a model over a time range", responses=errors)
    def diagnose(body: DiagnoseRequest) -> SafeJSONResponse:
        start = parse_time_ns(body.start, "start")
        end = parse_time_ns(body.end, "end")
        if end <= start:
            raise QueryError("end must be after start")
        return SafeJSONResponse(analyzer.diagnose(body.model, start, end))

    @app.get("/api/v1/incidents", summary="Incidents, newest first", responses=errors)
    def incidents(
        since: str | None = Query(None, description="only incidents still going at or after"),
        model: str | None = Query(None, description="only this victim model"),
        state: str | None = Query(None, description="diagnosing, open or resolved"),
        severity: str | None = Query(None, description="breach or degradation"),
        limit: int = Query(500, description="1..10000"),
        indicator: str | None = Query(
            None,
            description="e2e, ttft or tpot: incidents that affected this latency indicator "
            "(the one they are told by, or another they list)",
        ),
    ) -> SafeJSONResponse:
        since_ns = None if since is None else parse_time_ns(since, "since")
        rows = analyzer.incidents(
            since_ns=since_ns,
            model=model,
            state=state,
            severity=severity,
            limit=limit,
            indicator=indicator,
        )
        return SafeJSONResponse({"count": len(rows), "incidents": rows})

    @app.get(
        "/api/v1/incidents/{incident_id}", summary="One incident with its causes", responses=errors
    )
    def incident(incident_id: str) -> SafeJSONResponse:
        out = analyzer.incident(incident_id)
        out["alerts"] = alerts.find(incident_id=incident_id)  # Alertmanager alerts linked to it
        return SafeJSONResponse(out)
