"""The gateway's control API (contract 4) and ``/metrics``, served on the control port.

* ``PUT /control/v1/limits/{model}`` ``{"rate_rps": float > 0, "burst": int >= 1}`` -> 200 and
  the model's state; ``DELETE`` removes the limit (idempotent).
* ``PUT /control/v1/priority/{model}`` ``{"priority": int}``; ``DELETE`` restores the default.
* ``PUT|DELETE /control/v1/tenant-limits/{tenant}`` and ``/control/v1/tenant-priority/{tenant}``:
  the same for tenants.
* ``GET /control/v1/routes/{model}`` -> the model's route (``*``: the default route);
  ``PUT /control/v1/weights/{model}`` ``{"weights": {replica: int 0..256}}`` sets the named
  replicas' weights for the model (the others keep theirs); ``DELETE`` goes back to the
  configured route (idempotent).
* ``PUT /control/v1/ejections/{replica}`` ``{}`` or ``{"duration_s": float > 0}``: no new
  requests to the replica (until restored, or for that long); ``DELETE`` restores it (and ends
  a passive ejection).
* ``PUT /control/v1/reservations/{replica}`` ``{"slots": int >= 0, "priority": int}``: keep
  ``slots`` of its ``max_in_flight`` for priorities <= ``priority``; ``DELETE`` removes it.
* ``GET /control/v1/state`` -> ``{"contract": 4, "models": {...}, "tenants": {...},
  "replicas": {...}, "routes": {...}, "upstream": url of the first replica}``.
* ``GET /metrics`` (no token: Prometheus scrapes it), ``GET /healthz``.

Contract 4 adds routes, weights, ejections and reservations to contract 3; every contract 3
call answers as before.

Every ``/control`` call needs ``Authorization: Bearer <token>``: 401 without one, 403 with a
wrong one. A bad body answers 422 ``{"error": "..."}`` naming the field. Model names may
contain ``/`` (``meta-llama/Llama-3.1-8B``).
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from cotenant.gateway.admission import Admission, Entry, Kind
from cotenant.gateway.identify import MAX_NAME_CHARS
from cotenant.gateway.replica import Replica
from cotenant.gateway.settings import check_burst, check_priority, check_rate

log = logging.getLogger(__name__)
MAX_CONTROL_BODY = 64 * 1024
CONTRACT = 4
"""The control API's contract version (``GET /control/v1/state`` answers it)."""
MAX_EJECT_S = 7 * 86400.0


class _Invalid(Exception):
    """A control request is refused; ``status`` and a message for ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _reject_constant(name: str) -> Any:
    raise _Invalid(422, f"body: {name} is not a valid JSON number")


async def _json_object(
    request: Request, fields: dict[str, str], optional: dict[str, str] | None = None
) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_CONTROL_BODY:
        raise _Invalid(422, f"body: larger than {MAX_CONTROL_BODY} bytes")
    try:
        doc = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise _Invalid(422, f"body: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise _Invalid(422, f"body: must be a JSON object with {', '.join(fields)}")
    for name in fields:
        if name not in doc:
            raise _Invalid(422, f"field {name!r} is required ({fields[name]})")
    allowed = {**fields, **(optional or {})}
    extra = sorted(set(doc) - set(allowed))
    if extra:
        raise _Invalid(422, f"field {extra[0]!r} is not allowed (use {', '.join(allowed)})")
    return doc


def _name(request: Request) -> str:
    name = str(request.path_params["name"])
    if not name or len(name) > MAX_NAME_CHARS:
        raise _Invalid(422, f"name: must be 1 to {MAX_NAME_CHARS} characters")
    return name


def create_control_app(admission: Admission, token: str, registry: CollectorRegistry) -> Starlette:
    """The control app; ``token`` is compared in constant time and never logged."""
    expected = token.encode()
    router = admission.router

    def guarded(
        fn: Callable[[Request], Awaitable[dict[str, Any]]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            auth = request.headers.get("authorization")
            if auth is None or not auth.lower().startswith("bearer "):
                return JSONResponse(
                    {"error": "missing bearer token (Authorization: Bearer <token>)"},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
            if not hmac.compare_digest(auth[7:].strip().encode(), expected):
                return JSONResponse({"error": "wrong bearer token"}, status_code=403)
            try:
                return JSONResponse(await fn(request))
            except _Invalid as exc:
                return JSONResponse({"error": str(exc)}, status_code=exc.status)

        return endpoint

    def state_of(kind: Kind, e: Entry) -> dict[str, Any]:
        key = "model" if kind == "models" else "tenant"
        return {key: e.name, **e.state()}

    def limits(kind: Kind) -> Callable[[Request], Awaitable[dict[str, Any]]]:
        async def handler(request: Request) -> dict[str, Any]:
            name = _name(request)
            if request.method == "DELETE":
                return state_of(kind, admission.clear_limit(kind, name))
            doc = await _json_object(request, {"rate_rps": "a number > 0", "burst": "an int >= 1"})
            try:
                rate = check_rate(doc["rate_rps"], "field 'rate_rps'")
                burst = check_burst(doc["burst"], "field 'burst'")
            except ValueError as exc:
                raise _Invalid(422, str(exc)) from None
            e = admission.set_limit(kind, name, rate, burst)
            log.info("gateway: %s %r limited to %g rps, burst %d", kind, name, rate, burst)
            return state_of(kind, e)

        return handler

    def priority(kind: Kind) -> Callable[[Request], Awaitable[dict[str, Any]]]:
        async def handler(request: Request) -> dict[str, Any]:
            name = _name(request)
            if request.method == "DELETE":
                return state_of(kind, admission.set_priority(kind, name, None))
            doc = await _json_object(request, {"priority": "an integer, lower is served first"})
            try:
                value = check_priority(doc["priority"], "field 'priority'")
            except ValueError as exc:
                raise _Invalid(422, str(exc)) from None
            log.info("gateway: %s %r priority set to %d", kind, name, value)
            return state_of(kind, admission.set_priority(kind, name, value))

        return handler

    async def state(_: Request) -> dict[str, Any]:
        return {
            "contract": CONTRACT,
            **admission.state(),
            **router.state(),
            "upstream": router.first_url(),
        }

    async def route(request: Request) -> dict[str, Any]:
        return router.route_state(_name(request))

    async def weights(request: Request) -> dict[str, Any]:
        model = _name(request)
        if request.method == "DELETE":
            router.clear_weights(model)
            log.info("gateway: weights of %r back to the configured route", model)
        else:
            doc = await _json_object(request, {"weights": "an object of replica name: weight"})
            w = doc["weights"]
            if not isinstance(w, dict):
                raise _Invalid(
                    422,
                    f"field 'weights' must be an object of replica: weight, not {type(w).__name__}",
                )
            try:
                router.set_weights(model, w)
            except ValueError as exc:
                raise _Invalid(422, str(exc)) from None
            log.info("gateway: weights of %r set to %s", model, router.route_for(model).weights)
        admission.routing_changed()
        return router.route_state(model)

    def replica_of(request: Request) -> Replica:
        try:
            return router.replica(_name(request))
        except KeyError as exc:
            raise _Invalid(404, str(exc.args[0])) from None

    def replica_state(r: Replica) -> dict[str, Any]:
        return {"replica": r.name, **r.state(router.clock())}

    async def ejection(request: Request) -> dict[str, Any]:
        r = replica_of(request)
        if request.method == "DELETE":
            router.restore(r.name)
            log.info("gateway: replica %r restored", r.name)
        else:
            doc = await _json_object(request, {}, {"duration_s": "seconds, a number > 0"})
            duration = doc.get("duration_s")
            if duration is not None:
                try:
                    duration = check_rate(duration, "field 'duration_s'")
                except ValueError as exc:
                    raise _Invalid(422, str(exc)) from None
                if duration > MAX_EJECT_S:
                    raise _Invalid(
                        422, f"field 'duration_s' must be at most {MAX_EJECT_S:g}, not {duration!r}"
                    )
            router.eject(r.name, duration)
            log.info(
                "gateway: replica %r ejected %s",
                r.name,
                "until restored" if duration is None else f"for {duration:g} s",
            )
        admission.routing_changed()
        return replica_state(r)

    async def reservation(request: Request) -> dict[str, Any]:
        r = replica_of(request)
        if request.method == "DELETE":
            router.clear_reservation(r.name)
            log.info("gateway: reservation on replica %r removed", r.name)
        else:
            doc = await _json_object(
                request,
                {"slots": "an int >= 0", "priority": "an integer, the class's highest priority"},
            )
            try:
                slots = check_priority(doc["slots"], "field 'slots'")
                if slots < 0:
                    raise ValueError(f"field 'slots' must be an integer >= 0, not {slots!r}")
                prio = check_priority(doc["priority"], "field 'priority'")
                router.set_reservation(r.name, slots, prio)
            except ValueError as exc:
                raise _Invalid(422, str(exc)) from None
            log.info("gateway: replica %r keeps %d slots for priorities <= %d", r.name, slots, prio)
        admission.routing_changed()
        return replica_state(r)

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    both = ["PUT", "DELETE"]
    routes = [
        Route("/control/v1/state", guarded(state), methods=["GET"]),
        Route("/control/v1/limits/{name:path}", guarded(limits("models")), methods=both),
        Route("/control/v1/priority/{name:path}", guarded(priority("models")), methods=both),
        Route("/control/v1/tenant-limits/{name:path}", guarded(limits("tenants")), methods=both),
        Route(
            "/control/v1/tenant-priority/{name:path}", guarded(priority("tenants")), methods=both
        ),
        Route("/control/v1/routes/{name:path}", guarded(route), methods=["GET"]),
        Route("/control/v1/weights/{name:path}", guarded(weights), methods=both),
        Route("/control/v1/ejections/{name:path}", guarded(ejection), methods=both),
        Route("/control/v1/reservations/{name:path}", guarded(reservation), methods=both),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    return Starlette(routes=routes)
