"""A stand-in for the gateway's control API (contract 3) for the actuator tests."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOKEN = "gw-token"


def gateway_standin(models: dict[str, dict[str, Any]]) -> Starlette:
    """Contract 3: bearer auth (401/403), 422 naming the field, state of every model."""

    def auth(req: Request) -> Response | None:
        h = req.headers.get("authorization")
        if not h:
            return JSONResponse({"error": "missing bearer token"}, 401)
        if h != f"Bearer {TOKEN}":
            return JSONResponse({"error": "wrong token"}, 403)
        return None

    def entry(m: str) -> dict[str, Any]:
        return models.setdefault(
            m,
            {
                "rate_rps": None,
                "burst": None,
                "priority": None,
                "in_flight": 0,
                "queued": 0,
                "admitted_total": 0,
                "rejected_total": 0,
            },
        )

    async def state(req: Request) -> Response:
        return auth(req) or JSONResponse({"models": models, "tenants": {}, "upstream": "u"})

    async def limits(req: Request) -> Response:
        if (bad := auth(req)) is not None:
            return bad
        m = req.path_params["model"]
        if req.method == "DELETE":
            entry(m).update(rate_rps=None, burst=None)
            return JSONResponse(entry(m))
        body = await req.json()
        if set(body) != {"rate_rps", "burst"}:
            return JSONResponse({"error": f"body keys {sorted(body)}: need rate_rps, burst"}, 422)
        if not (isinstance(body["rate_rps"], float | int) and body["rate_rps"] > 0):
            return JSONResponse({"error": "rate_rps must be > 0"}, 422)
        if not (isinstance(body["burst"], int) and body["burst"] >= 1):
            return JSONResponse({"error": "burst must be an integer >= 1"}, 422)
        entry(m).update(rate_rps=float(body["rate_rps"]), burst=body["burst"])
        return JSONResponse(entry(m))

    async def priority(req: Request) -> Response:
        if (bad := auth(req)) is not None:
            return bad
        m = req.path_params["model"]
        if req.method == "DELETE":
            entry(m)["priority"] = None
            return JSONResponse(entry(m))
        body = await req.json()
        if set(body) != {"priority"} or not isinstance(body["priority"], int):
            return JSONResponse({"error": "priority must be an integer"}, 422)
        entry(m)["priority"] = body["priority"]
        return JSONResponse(entry(m))

    return Starlette(
        routes=[
            Route("/control/v1/state", state, methods=["GET"]),
            Route("/control/v1/limits/{model}", limits, methods=["PUT", "DELETE"]),
            Route("/control/v1/priority/{model}", priority, methods=["PUT", "DELETE"]),
        ]
    )
