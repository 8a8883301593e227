"""Backend for Ray Serve's REST API (the dashboard port, 8265 by default).

Reads ``GET /api/serve/applications/`` and answers a change with ``PUT /api/serve/applications/``
carrying the whole declarative config as read (every application's ``deployed_app_config``,
``proxy_location``, ``http_options``, ``grpc_options``, ``target_capacity``), changing only the
target deployment's ``max_ongoing_requests`` (and ``num_replicas`` when the change gives one):

* ``rate_limit``: ``max_ongoing_requests`` = ``params.max_ongoing_requests`` when given, else
  ``max(1, floor(current x params.fraction))`` (the rate cut the policy sized).
* ``priority``: Ray Serve has no request priorities — refused (use the gateway in front).

Ray 2.60 turns token authentication on by default for clusters ``ray.init`` starts (and for
``ray start`` once ``~/.ray/auth_token`` exists): the dashboard then answers 401 without
``Authorization: Bearer <token>``. The factory sends the token of ``backend_token_file``, else
the one Ray's own clients would find (:func:`actuators.backends.factory.ray_token`); a 401 or
403 is refused with an error saying so.

Ray applies a PUT asynchronously (the application goes ``DEPLOYING``; a GET right after still
shows the old value, seen on Ray 2.60): ``apply`` and ``revert`` poll the GET until the
deployment shows the value set (``max_ongoing_requests`` is updated in place, no replica
restart) for up to ``settle_s``, and return what it shows then.

A PUT removes applications it does not list, so an application deployed without a config
(``serve.run`` from Python, no ``deployed_app_config``) makes the change refused rather than
risk deleting it. The target is a deployment name, or ``app/deployment`` when ambiguous.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

import httpx

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.http import HttpCaller
from cotenant.core.errors import BackendError

PATH = "/api/serve/applications/"
RAY_DEFAULT_MAX_ONGOING = 5
"""Ray Serve's default ``max_ongoing_requests`` (since Ray 2.32)."""


class RayServeBackend:
    name = "rayserve"

    def __init__(
        self,
        http: HttpCaller,
        *,
        settle_s: float = 30.0,
        poll_s: float = 0.25,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = http
        self._settle_s = settle_s
        self._poll_s = poll_s
        self._sleep = sleep
        self._clock = clock

    def _fail(self, why: str) -> BackendError:
        return BackendError(f"rayserve backend {self._http.base_url}{PATH}: {why}")

    def _send(self, method: str, body: dict[str, Any] | None = None) -> httpx.Response:
        r = self._http.request(method, PATH, json=body, ok=(401, 403))
        if r.status_code in (401, 403):
            raise self._fail(
                f"{method} refused with {r.status_code} ({r.text[:200].strip()}): the dashboard "
                "has token authentication on; set actuators.backend_token_file to a file holding "
                "the cluster's token (or RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH, as for Ray's CLI)"
            )
        return r

    def _read(self) -> dict[str, Any]:
        r = self._send("GET")
        try:
            state = r.json()
        except ValueError as exc:
            raise self._fail(f"answer is not JSON: {r.text[:200]!r}") from exc
        if not isinstance(state, dict) or not isinstance(state.get("applications"), dict):
            raise self._fail("answer has no 'applications' object")
        return state

    def _locate(self, state: dict[str, Any], target: str) -> tuple[str, str]:
        app_name, _, dep = target.rpartition("/")
        found = [
            (a, dep)
            for a, detail in state["applications"].items()
            if (not app_name or a == app_name) and dep in (detail.get("deployments") or {})
        ]
        if not found:
            raise self._fail(f"no deployment named {target!r}")
        if len(found) > 1:
            raise self._fail(f"{dep!r} is in several applications; name it as app/deployment")
        return found[0]

    @staticmethod
    def _declared(state: dict[str, Any], app: str, dep: str) -> dict[str, Any] | None:
        cfg = state["applications"][app].get("deployed_app_config") or {}
        return next((d for d in cfg.get("deployments") or [] if d.get("name") == dep), None)

    def _summary(self, state: dict[str, Any], app: str, dep: str) -> dict[str, Any]:
        detail = state["applications"][app]["deployments"][dep]
        dc = detail.get("deployment_config") or {}
        return {
            "app": app,
            "deployment": dep,
            "max_ongoing_requests": dc.get("max_ongoing_requests"),
            "num_replicas": dc.get("num_replicas"),
            "declared": copy.deepcopy(self._declared(state, app, dep)),
        }

    def current(self, target: str) -> dict[str, Any]:
        state = self._read()
        return self._summary(state, *self._locate(state, target))

    def _settled(self, target: str, want: Any) -> dict[str, Any]:
        """:meth:`current` once it shows ``max_ongoing_requests == want`` (None: whatever the
        deployment's own default is), or when ``settle_s`` has passed."""
        deadline = self._clock() + self._settle_s
        while True:
            now = self.current(target)
            if want is None or now["max_ongoing_requests"] == want or self._clock() >= deadline:
                return now
            self._sleep(self._poll_s)

    def _config(self, state: dict[str, Any]) -> dict[str, Any]:
        apps = []
        for name, detail in state["applications"].items():
            cfg = detail.get("deployed_app_config")
            if not cfg:
                raise self._fail(
                    f"application {name!r} was not deployed from a config: a PUT would remove "
                    "it, so cotenant will not change this cluster"
                )
            apps.append(copy.deepcopy(cfg))
        body: dict[str, Any] = {"applications": apps}
        for key in ("proxy_location", "http_options", "grpc_options", "target_capacity"):
            if state.get(key) is not None:
                body[key] = copy.deepcopy(state[key])
        return body

    def _put(self, state: dict[str, Any], app: str, dep: str, entry: dict[str, Any] | None) -> None:
        body = self._config(state)
        cfg = next(a for a in body["applications"] if a.get("name", app) == app)
        deps = [d for d in cfg.get("deployments") or [] if d.get("name") != dep]
        if entry is not None:
            deps.append(entry)
        cfg["deployments"] = deps
        self._send("PUT", body)

    def apply(self, change: Change) -> dict[str, Any]:
        if change.kind != "rate_limit":
            raise self._fail(
                f"cannot apply a {change.kind!r} change: Ray Serve has no request priorities "
                "(put the cotenant gateway in front of it)"
            )
        state = self._read()
        app, dep = self._locate(state, change.target)
        now = self._summary(state, app, dep)
        p = change.params
        if "max_ongoing_requests" in p:
            limit = int(p["max_ongoing_requests"])
        else:
            cur = int(now["max_ongoing_requests"] or RAY_DEFAULT_MAX_ONGOING)
            limit = max(1, math.floor(cur * float(p.get("fraction", 1.0))))
        entry = copy.deepcopy(now["declared"]) or {"name": dep}
        entry["max_ongoing_requests"] = limit
        if "num_replicas" in p:
            entry["num_replicas"] = int(p["num_replicas"])
        self._put(state, app, dep, entry)
        return self._settled(change.target, limit)

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        state = self._read()
        app, dep = self._locate(state, target)
        self._put(state, app, dep, copy.deepcopy(before.get("declared")))
        return self._settled(target, before.get("max_ongoing_requests"))
