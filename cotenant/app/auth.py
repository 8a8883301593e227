"""Bearer tokens on the HTTP API and the OTLP receivers, one per scope.

Three scopes, kept apart: a token of one grants nothing of another.

* **read** (``[auth] token``): every route of the API port but ``/healthz`` and ``/readyz``
  — the dashboard, ``/metrics``, the API's reads, ``POST /api/v1/diagnose``, the Alertmanager
  webhook, the agent's drill-down. Browsers cannot send a bearer header: they send the token
  as the password of HTTP Basic auth (any user name), which a 401 asks them for.
* **act** (``[actuators] token``): the mutating calls of ``/api/v1/actions`` (approve, roll
  back, propose), checked by :meth:`actuators.controller.ActionController.authorize`; this
  module lets them through to it, and only them.
* **ingest** (``[auth] otlp_token``): OTLP/HTTP exports (:class:`RequireToken` on the OTLP
  port) and OTLP/gRPC calls (:class:`GrpcTokenInterceptor`).

No credentials answers 401 with ``WWW-Authenticate``; a wrong token 401 too (RFC 6750
``invalid_token``); a token of another scope 403, naming the scope it needs. Tokens are
compared in constant time and never logged, echoed or kept in an error message.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import grpc

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
"""Routes every caller may reach: the kubelet's probes send no token."""
ACT_PREFIX = "/api/v1/actions"
"""Its mutating (non-GET) calls carry the act token, checked by the action controller."""


@dataclass(frozen=True)
class Tokens:
    """The token of each scope ('' = that scope is open to anyone)."""

    read: str = ""
    act: str = ""
    ingest: str = ""

    def others(self, scope: str) -> dict[str, str]:
        """Token -> scope name of every scope but ``scope`` that has a token."""
        named = {"read": self.read, "act": self.act, "ingest": self.ingest}
        return {tok: name for name, tok in named.items() if tok and name != scope}


def presented(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization`` header: ``Bearer <token>``, or the password of
    ``Basic base64(user:password)``; None when there is none."""
    for name, value in headers:
        if name.lower() != b"authorization":
            continue
        scheme, _, rest = value.decode("latin-1").strip().partition(" ")
        rest = rest.strip()
        if scheme.lower() == "bearer" and rest:
            return rest
        if scheme.lower() == "basic" and rest:
            try:
                decoded = base64.b64decode(rest, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
            password = decoded.partition(":")[2]
            return password or None
    return None


def verdict(token: str | None, want: str, others: Mapping[str, str]) -> int:
    """200 when ``token`` is ``want``; 403 when it is another scope's; 401 otherwise."""
    if token is not None and hmac.compare_digest(token.encode(), want.encode()):
        return 200
    if token is not None:
        for other in others:
            if hmac.compare_digest(token.encode(), other.encode()):
                return 403
    return 401


class RequireToken:
    """ASGI middleware: the wrapped app answers only requests bearing ``token`` (of scope
    ``scope``), but for :data:`OPEN_PATHS` and what ``exempt(scope)`` lets through."""

    def __init__(
        self,
        app: ASGIApp,
        token: str,
        *,
        scope: str,
        others: Mapping[str, str] | None = None,
        exempt: Callable[[Scope], bool] | None = None,
        basic: bool = True,
    ) -> None:
        """``others``: tokens of the other scopes (403 rather than 401 for them);
        ``basic``: whether a 401 invites a browser to ask for Basic credentials."""
        self.app = app
        self._token = token
        self._scope = scope
        self._others = dict(others or {})
        self._exempt = exempt
        self._challenge = 'Bearer realm="cotenant"'
        if basic:
            self._challenge += ', Basic realm="cotenant", charset="UTF-8"'

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self._exempt is not None and self._exempt(scope):
            await self.app(scope, receive, send)
            return
        status = verdict(presented(scope.get("headers", ())), self._token, self._others)
        if status == 200:
            await self.app(scope, receive, send)
            return
        if status == 403:
            message = f"this token does not grant the {self._scope} scope this call needs"
            headers = [(b"content-type", b"application/json")]
        else:
            message = f"this call needs a bearer token of the {self._scope} scope"
            headers = [
                (b"content-type", b"application/json"),
                (b"www-authenticate", self._challenge.encode()),
            ]
        body = json.dumps({"error": message}).encode()
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def act_call(scope: Scope) -> bool:
    """Whether a request is a mutating call of the actions API (the act scope's)."""
    path = str(scope.get("path", ""))
    return scope.get("method") != "GET" and (
        path == ACT_PREFIX or path.startswith(ACT_PREFIX + "/")
    )


def protect_api(app: ASGIApp, tokens: Tokens) -> ASGIApp:
    """The API port's app behind the read token (unchanged when there is none)."""
    if not tokens.read:
        return app
    return RequireToken(
        app, tokens.read, scope="read", others=tokens.others("read"), exempt=act_call
    )


def protect_otlp(app: ASGIApp, tokens: Tokens) -> ASGIApp:
    """The OTLP/HTTP port's app behind the ingest token (unchanged when there is none)."""
    if not tokens.ingest:
        return app
    return RequireToken(
        app, tokens.ingest, scope="ingest", others=tokens.others("ingest"), basic=False
    )


class GrpcTokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Refuses OTLP/gRPC calls without the ingest token in their ``authorization`` metadata
    (``UNAUTHENTICATED``; ``PERMISSION_DENIED`` for another scope's token)."""

    def __init__(self, token: str, others: Mapping[str, str] | None = None) -> None:
        self._token = token
        self._others = dict(others or {})

        def deny(code: grpc.StatusCode, message: str) -> Any:
            def abort(_request: Any, context: grpc.ServicerContext) -> Any:
                context.abort(code, message)

            return grpc.unary_unary_rpc_method_handler(abort)

        self._unauthenticated = deny(
            grpc.StatusCode.UNAUTHENTICATED, "this call needs a bearer token of the ingest scope"
        )
        self._denied = deny(
            grpc.StatusCode.PERMISSION_DENIED,
            "this token does not grant the ingest scope this call needs",
        )

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        headers = [
            (k.encode(), v.encode() if isinstance(v, str) else v)
            for k, v in handler_call_details.invocation_metadata or ()
        ]
        status = verdict(presented(headers), self._token, self._others)
        if status == 200:
            return continuation(handler_call_details)
        return self._denied if status == 403 else self._unauthenticated
