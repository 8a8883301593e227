"""The HTTP API of ``cotenant agent``: probes, ``/metrics`` and the drill-down.

* ``GET /metrics``: the agent's series (docs/metrics.md, "cotenant agent"). OpenMetrics, with
  the exemplars (trace ids) of the latency buckets, when the scraper's ``Accept`` header asks
  for ``application/openmetrics-text`` (Prometheus does); the classic text format otherwise.
* ``GET /api/v1/slowest?model=&since=&until=[&gpu=][&limit=]``: the slowest raw requests of a
  model completed in a range, slowest first, from the agent's local store. ``since`` and
  ``until`` are required ('now', '15m' ago, ISO 8601 or Unix s), the range at most
  ``agent.drill_max_range_h``, ``limit`` 1..1000 (default 20). Bad input answers 400 naming
  the parameter; the answer names the node. The agent's writer is flushed first
  (``before_read``): with ``[agent] spool`` an acknowledged export waits in the spool for up
  to ``flush_interval_s``, and a drill-down must see every acknowledged request.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from cotenant.app.api import ErrorResponse, http_status, validation_error
from cotenant.collectors.fleet_histogram import FleetHistogram
from cotenant.core.errors import CotenantError, QueryError
from cotenant.core.http_json import SafeJSONResponse
from cotenant.core.timerange import TimeRange
from cotenant.core.timespec import parse_time_ns
from cotenant.store.db import Store
from cotenant.store.queries import MAX_SLOWEST, slowest_requests


def create_agent_api(
    store: Store,
    registry: CollectorRegistry,
    readiness: Callable[[], str | None],
    *,
    node: str,
    max_range_s: float,
    histogram: FleetHistogram | None = None,
    before_read: Callable[[], object] | None = None,
) -> FastAPI:
    """The agent's app. ``readiness()`` returns None when ready, else the reason it is not;
    ``histogram``'s text is appended to the registry's exposition; ``before_read()`` runs
    before each drill-down query (the writer's flush: acknowledged rows become visible)."""
    app = FastAPI(
        title="cotenant agent",
        version="0.1.0",
        description="One GPU node's spans and counters: /metrics for Prometheus, and the raw "
        "requests behind them for drill-down.",
    )

    @app.exception_handler(CotenantError)
    async def _cotenant_error(_: Request, exc: CotenantError) -> SafeJSONResponse:
        return SafeJSONResponse({"error": str(exc)}, status_code=http_status(exc))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> SafeJSONResponse:
        out = validation_error(exc)
        return SafeJSONResponse(out, status_code=400)

    @app.get("/healthz", summary="Liveness: the process answers")
    def healthz() -> dict[str, str]:
        return {"status": "ok", "node": node}

    @app.get("/readyz", summary="Readiness", responses={503: {"model": ErrorResponse}})
    def readyz() -> Response:
        reason = readiness()
        if reason is None:
            return SafeJSONResponse({"status": "ready", "node": node})
        return SafeJSONResponse({"status": "not ready", "error": reason}, status_code=503)

    @app.get("/metrics", summary="Prometheus exposition", response_class=Response)
    def metrics(request: Request) -> Response:
        encode, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encode(registry)
        if histogram is not None:
            om = content_type.startswith("application/openmetrics-text")
            extra = histogram.render(openmetrics=om).encode()
            body = body.removesuffix(b"# EOF\n") + extra + (b"# EOF\n" if om else b"")
        return Response(body, media_type=content_type)

    @app.get(
        "/api/v1/slowest",
        summary="The slowest requests of a model in a time range",
        responses={400: {"model": ErrorResponse}},
    )
    def slowest(
        model: str = Query(..., min_length=1, max_length=256, description="the model"),
        since: str = Query(..., description="'now', '15m' (ago), ISO 8601 or Unix s"),
        until: str = Query(..., description="same forms as since"),
        gpu: str | None = Query(None, max_length=256, description="only this GPU"),
        limit: int = Query(20, description=f"1..{MAX_SLOWEST}"),
    ) -> SafeJSONResponse:
        lo = parse_time_ns(since, "since")
        hi = parse_time_ns(until, "until")
        if hi <= lo:
            raise QueryError("until: must be after since")
        if (hi - lo) / 1e9 > max_range_s:
            raise QueryError(
                f"since..until: {(hi - lo) / 3.6e12:.1f} h is longer than the "
                f"{max_range_s / 3600:g} h allowed (agent.drill_max_range_h)"
            )
        if not 1 <= limit <= MAX_SLOWEST:
            raise QueryError(f"limit: {limit} must be between 1 and {MAX_SLOWEST}")
        if before_read is not None:
            before_read()
        rows = slowest_requests(store, TimeRange(lo, hi), model, gpu=gpu, limit=limit)
        return SafeJSONResponse(
            {"node": node, "model": model, "count": len(rows), "requests": rows}
        )

    return app
