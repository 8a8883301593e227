"""Backend for the bundled gateway's control API (``cotenant gateway``, contract 4; a contract 3
gateway still takes limits and priorities).

``rate_limit`` -> ``PUT /control/v1/limits/{model}`` ``{"rate_rps", "burst"}``; ``priority`` ->
``PUT /control/v1/priority/{model}`` ``{"priority"}``; ``reroute`` -> ``PUT
/control/v1/weights/{model}`` ``{"weights"}``; ``reserve`` -> ``PUT
/control/v1/reservations/{replica}`` ``{"slots", "priority"}``. Current settings come from
``GET /control/v1/state`` (with contract 4: ``weights`` of the target's route and whether they
were set, ``weights_set``; for a replica, its ``reservation``); a revert puts back the settings
read before the change (``DELETE`` where there were none). Each change is one call, so a failed
call changes nothing.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.http import HttpCaller
from cotenant.core.errors import BackendError

_KEYS = ("rate_rps", "burst", "priority")


class GatewayBackend:
    name = "gateway"

    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    def current(self, target: str) -> dict[str, Any]:
        state = self._http.json("GET", "/control/v1/state")
        models = state.get("models") if isinstance(state, dict) else None
        if not isinstance(models, dict):
            raise BackendError(
                f"gateway backend GET {self._http.base_url}/control/v1/state: answer has no "
                "'models' object"
            )
        m = models.get(target) or {}
        out = {k: m.get(k) for k in _KEYS}
        routes = state.get("routes")
        if isinstance(routes, dict):  # contract 4: the target's route
            own = routes.get(target)
            route = own if isinstance(own, dict) else routes.get("*") or {}
            out["weights"] = dict(route.get("weights") or {})
            out["weights_set"] = isinstance(own, dict) and bool(own.get("overridden"))
        replicas = state.get("replicas")
        if isinstance(replicas, dict) and isinstance(replicas.get(target), dict):
            out["reservation"] = replicas[target].get("reservation")
        return out

    def apply(self, change: Change) -> dict[str, Any]:
        m = quote(change.target, safe="")
        p = change.params
        if change.kind == "rate_limit":
            body: dict[str, Any] = {"rate_rps": float(p["rate_rps"]), "burst": int(p["burst"])}
            self._http.request("PUT", f"/control/v1/limits/{m}", json=body)
        elif change.kind == "priority":
            self._http.request(
                "PUT", f"/control/v1/priority/{m}", json={"priority": int(p["priority"])}
            )
        elif change.kind == "reroute":
            if p.get("states"):
                raise BackendError(
                    "gateway backend: reroute 'states' are not a gateway lever: a weight of 0 "
                    "sends a replica none of the model's requests, and an ejection (control "
                    "API) takes it out for every model"
                )
            self._http.request(
                "PUT", f"/control/v1/weights/{m}", json={"weights": dict(p["weights"])}
            )
        elif change.kind == "reserve":
            body = {"slots": int(p["slots"]), "priority": int(p["priority"])}
            self._http.request("PUT", f"/control/v1/reservations/{m}", json=body)
        else:
            raise BackendError(f"gateway backend: cannot apply a {change.kind!r} change")
        return self.current(change.target)

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        m = quote(target, safe="")
        now = self.current(target)
        if (now.get("rate_rps"), now.get("burst")) != (before.get("rate_rps"), before.get("burst")):
            if before.get("rate_rps") is None:
                self._http.request("DELETE", f"/control/v1/limits/{m}", ok=(404,))
            else:
                body = {
                    "rate_rps": float(before["rate_rps"]),
                    "burst": int(before.get("burst") or 1),
                }
                self._http.request("PUT", f"/control/v1/limits/{m}", json=body)
        if now.get("priority") != before.get("priority"):
            if before.get("priority") is None:
                self._http.request("DELETE", f"/control/v1/priority/{m}", ok=(404,))
            else:
                self._http.request(
                    "PUT", f"/control/v1/priority/{m}", json={"priority": int(before["priority"])}
                )
        if "weights" in before and (
            now.get("weights"),
            now.get("weights_set"),
        ) != (before["weights"], before.get("weights_set")):
            if not before.get("weights_set"):
                self._http.request("DELETE", f"/control/v1/weights/{m}", ok=(404,))
            else:
                self._http.request(
                    "PUT", f"/control/v1/weights/{m}", json={"weights": dict(before["weights"])}
                )
        if "reservation" in before and now.get("reservation") != before["reservation"]:
            r = before["reservation"]
            if r is None:
                self._http.request("DELETE", f"/control/v1/reservations/{m}", ok=(404,))
            else:
                body = {"slots": int(r["slots"]), "priority": int(r["priority"])}
                self._http.request("PUT", f"/control/v1/reservations/{m}", json=body)
        return self.current(target)
