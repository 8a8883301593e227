"""``/api/v1/actions``: read the action log, approve a proposal, roll a change back.

The mutating calls need ``Authorization: Bearer <token>`` (``[actuators] token`` or
``token_file``): 401 without it, 403 with a wrong one. The token is never logged or echoed.
Errors are the exception tree's; the app that includes this router maps them to statuses
(``cotenant.app.api``): unknown action 404, wrong state 409, backend down 502.
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Body, Header, Query
from pydantic import BaseModel, Field

from cotenant.core.actions import ActionControl
from cotenant.core.http_json import SafeJSONResponse
from cotenant.core.timespec import parse_time_ns


class ActionDetail(Protocol):
    """One action with its audit trail (:class:`actuators.controller.ActionController`)."""

    def action(self, action_id: str) -> dict[str, Any]:
        """The action dict plus ``audit``: its rows oldest first (``ts_ns, actor, event,
        detail``); NotFoundError when there is no such action."""
        ...


class ErrorBody(BaseModel):
    error: str


class ApproveBody(BaseModel):
    actor: str | None = Field(None, max_length=200, description="who approves (audit)")


_DEFAULT_REASON = "rolled back through the API"


class RollbackBody(BaseModel):
    reason: str = Field(_DEFAULT_REASON, max_length=2000)
    actor: str | None = Field(None, max_length=200, description="who rolls back (audit)")


_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorBody} for s in (400, 401, 403, 404, 409, 502)
}


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def actions_router(control: ActionControl, detail: ActionDetail | None = None) -> APIRouter:
    """The routes over ``control``; ``detail`` adds ``GET /api/v1/actions/{id}`` (the action
    with its audit trail)."""
    router = APIRouter(prefix="/api/v1/actions", tags=["actions"])

    @router.get("", summary="Actions, newest first", responses=_ERRORS)
    def list_actions(
        since: str | None = Query(None, description="updated at or after: '15m', ISO, Unix s"),
        incident: str | None = Query(None, description="only this incident's actions"),
        limit: int = Query(200, description="1..10000"),
    ) -> SafeJSONResponse:
        since_ns = None if since is None else parse_time_ns(since, "since")
        rows = control.list_actions(since_ns=since_ns, incident_id=incident, limit=limit)
        return SafeJSONResponse({"mode": control.mode, "count": len(rows), "actions": rows})

    if detail is not None:

        @router.get("/{action_id}", summary="One action with its audit trail", responses=_ERRORS)
        def one_action(action_id: str) -> SafeJSONResponse:
            return SafeJSONResponse(detail.action(action_id))

    @router.post(
        "/{action_id}/approve", summary="Approve a proposed action (manual mode)", responses=_ERRORS
    )
    def approve(
        action_id: str,
        body: Annotated[ApproveBody | None, Body()] = None,
        authorization: str | None = Header(None),
    ) -> SafeJSONResponse:
        control.authorize(_bearer(authorization))
        actor = (body.actor if body else None) or "api"
        return SafeJSONResponse(control.approve(action_id, actor=actor))

    @router.post("/{action_id}/rollback", summary="Revert an applied change now", responses=_ERRORS)
    def rollback(
        action_id: str,
        body: Annotated[RollbackBody | None, Body()] = None,
        authorization: str | None = Header(None),
    ) -> SafeJSONResponse:
        control.authorize(_bearer(authorization))
        actor = (body.actor if body else None) or "api"
        reason = body.reason if body else _DEFAULT_REASON
        return SafeJSONResponse(control.rollback(action_id, actor=actor, reason=reason))

    return router
