"""HTTP route for reports: ``GET /api/v1/reports/{week}/summary`` — a week's summary computed
by the running service (``cotenant report --url`` renders it locally, since the store file
has one writer process)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from cotenant.core.errors import QueryError, ReportError
from cotenant.core.http_json import SafeJSONResponse
from cotenant.reports.compute import ReportBuilder
from cotenant.reports.isoweek import parse_week


def reports_router(builder: ReportBuilder) -> APIRouter:
    router = APIRouter()

    @router.get("/api/v1/reports/{week}/summary", summary="A week's contention-report numbers")
    def week_summary(week: str) -> SafeJSONResponse:
        try:
            w = parse_week(week)
        except ReportError as exc:
            raise QueryError(str(exc)) from exc
        summary: dict[str, Any] = builder.build(w).to_dict()
        return SafeJSONResponse(summary)

    return router
