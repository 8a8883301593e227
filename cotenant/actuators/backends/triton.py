"""Backend for Triton Inference Server's model repository API (``--model-control-mode=explicit``).

Reads the model's configuration with ``GET /v2/models/{name}/config`` and reloads it modified
with ``POST /v2/repository/models/{name}/load`` and body ``{"parameters": {"config": "<the
whole config as a JSON string>"}}`` — Triton swaps to the new configuration only once it has
loaded, so a refused load leaves the serving model as it was.

* ``priority``: ``dynamic_batching.default_priority_level = max(1, priority)`` (Triton level 1
  is served first, like cotenant's lower-first priority) and ``priority_levels`` raised to at
  least that level. A model without ``dynamic_batching`` has no priority queue: refused.
* ``rate_limit``: each ``instance_group`` count becomes ``max(1, floor(count x fraction))``,
  or ``params.instance_count`` split over the groups when given.

The revert loads the configuration read before the change.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any
from urllib.parse import quote

from cotenant.actuators.backend import Change
from cotenant.actuators.backends.http import HttpCaller
from cotenant.core.errors import BackendError


def _int(v: Any, default: int = 0) -> int:
    # protobuf's JSON mapping writes 64-bit integers (priority_levels) as strings
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


class TritonBackend:
    name = "triton"

    def __init__(self, http: HttpCaller) -> None:
        self._http = http

    def _config(self, model: str) -> dict[str, Any]:
        cfg = self._http.json("GET", f"/v2/models/{quote(model, safe='')}/config")
        if not isinstance(cfg, dict):
            raise BackendError(f"triton backend: config of {model!r} is not a JSON object")
        return cfg

    def current(self, target: str) -> dict[str, Any]:
        cfg = self._config(target)
        db = cfg.get("dynamic_batching") or {}
        return {
            "priority_levels": _int(db.get("priority_levels")) if db else None,
            "default_priority_level": _int(db.get("default_priority_level")) if db else None,
            "instance_count": sum(_int(g.get("count"), 1) for g in cfg.get("instance_group") or []),
            "config": cfg,
        }

    def _load(self, model: str, cfg: dict[str, Any]) -> None:
        body = {"parameters": {"config": json.dumps(cfg, separators=(",", ":"))}}
        self._http.request("POST", f"/v2/repository/models/{quote(model, safe='')}/load", json=body)

    def apply(self, change: Change) -> dict[str, Any]:
        cfg = copy.deepcopy(self._config(change.target))
        p = change.params
        if change.kind == "priority":
            db = cfg.get("dynamic_batching")
            if not isinstance(db, dict):
                raise BackendError(
                    f"triton backend: model {change.target!r} has no dynamic_batching, so no "
                    "priority levels; add dynamic_batching to its config.pbtxt first"
                )
            level = max(1, int(p["priority"]))
            db["priority_levels"] = max(_int(db.get("priority_levels")), level)
            db["default_priority_level"] = level
        elif change.kind == "rate_limit":
            groups = cfg.get("instance_group") or [{"kind": "KIND_GPU", "count": 1}]
            if "instance_count" in p:
                total = max(len(groups), int(p["instance_count"]))
                share = [
                    total // len(groups) + (i < total % len(groups)) for i in range(len(groups))
                ]
            else:
                f = float(p.get("fraction", 1.0))
                share = [max(1, math.floor(_int(g.get("count"), 1) * f)) for g in groups]
            cfg["instance_group"] = [{**g, "count": n} for g, n in zip(groups, share, strict=True)]
        else:
            raise BackendError(f"triton backend: cannot apply a {change.kind!r} change")
        self._load(change.target, cfg)
        return self.current(change.target)

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        cfg = before.get("config")
        if not isinstance(cfg, dict):
            raise BackendError(f"triton backend: no configuration of {target!r} to restore")
        self._load(target, cfg)
        return self.current(target)
