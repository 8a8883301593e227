"""The gateway's replicas and routes as configured: ``--upstream [NAME=]URL`` flags and the
``[upstreams.NAME]``, ``[routes."MODEL"]`` and ``[routing]`` tables of ``--config``::

    [upstreams.gpu0]
    url = "http://10.0.0.1:8000"
    weight = 1            # its weight in the default route (0: only models that name it)
    max_in_flight = 64    # requests at once (default: no limit of its own)
    reserve_slots = 16    # of those, kept for priorities <= reserve_priority
    reserve_priority = 0

    [routes."meta-llama/Llama-3.1-8B-Instruct"]
    policy = "least-loaded"
    weights = { gpu0 = 3, gpu1 = 1 }

    [routing]
    policy = "weighted"   # of the default route and of routes that name none
    eject_after = 5       # failures in a row that eject a replica (0: never)
    eject_time_s = 30     # first ejection; each one in a row doubles it (up to 10x)

A model without a route of its own uses the default route: every replica with its ``weight``.
Every check raises :class:`ConfigError` naming the flag or the key and the value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from cotenant.core.errors import ConfigError

Policy = Literal["weighted", "least-loaded"]
POLICIES: tuple[Policy, ...] = ("weighted", "least-loaded")
MAX_WEIGHT = 256
"""Weights are integers 0..256 (HAProxy's range, so one reroute action fits both)."""

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")
"""Replica names: letters, digits, ``. _ : -``; 1 to 64 characters."""


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica as configured."""

    name: str
    url: str
    weight: int = 1
    """Its weight in the default route."""
    max_in_flight: int | None = None
    reserve_slots: int = 0
    reserve_priority: int = 0


@dataclass(frozen=True)
class RouteSpec:
    """A model's own route: weights by replica name, and its policy (None: the default's)."""

    weights: dict[str, int]
    policy: Policy | None = None


@dataclass(frozen=True)
class RoutingSpec:
    """Everything the router is built from."""

    replicas: tuple[ReplicaSpec, ...] = ()
    routes: dict[str, RouteSpec] = field(default_factory=dict)
    policy: Policy = "weighted"
    eject_after: int = 5
    eject_s: float = 30.0


def check_url(url: Any, where: str) -> str:
    """An ``http://`` or ``https://`` URL with a host (and a valid port)."""
    if not isinstance(url, str):
        raise ConfigError(f"{where} must be a string URL, not {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{where} {url!r}: give an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 (validates the port)
    except ValueError:
        raise ConfigError(f"{where} {url!r}: invalid port") from None
    return url


def check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ConfigError(
            f"{where} {name!r}: a replica name is 1-64 letters, digits, '.', '_', ':' or '-'"
        )
    return name


def check_int(value: Any, where: str, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]`` (an integral float such as ``3.0`` is accepted)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be an integer, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ConfigError(f"{where} must be an integer from {lo} to {hi}, not {value!r}")
    return value


def check_policy(value: Any, where: str) -> Policy:
    for p in POLICIES:
        if value == p:
            return p
    raise ConfigError(f"{where} {value!r}: use {' or '.join(POLICIES)}")


def parse_upstream_flag(text: str) -> ReplicaSpec:
    """``--upstream [NAME=]URL``; without a name the replica is named after the URL's
    ``host:port``."""
    name, sep, url = text.partition("=")
    if not sep or "/" in name or name.endswith(("http:", "https:")):
        name, url = "", text
    check_url(url, "--upstream")
    if not name:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        name = re.sub(r"[^A-Za-z0-9._:-]", "-", f"{parts.hostname}:{port}").lstrip(":._-")
    return ReplicaSpec(check_name(name, "--upstream name"), url)


_REPLICA_KEYS = ("url", "weight", "max_in_flight", "reserve_slots", "reserve_priority")


def parse_replica_table(name: str, item: Any, where: str) -> ReplicaSpec:
    """``[upstreams.NAME]`` of the config file."""
    check_name(name, f"{where}: upstreams.{name}: name")
    where = f"{where}: upstreams.{name}"
    if not isinstance(item, dict):
        raise ConfigError(f"{where} must be a table with url (and weight, max_in_flight, ...)")
    unknown = sorted(set(item) - set(_REPLICA_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (use {', '.join(_REPLICA_KEYS)})")
    if "url" not in item:
        raise ConfigError(f"{where}: url is required")
    limit = item.get("max_in_flight")
    spec = ReplicaSpec(
        name=name,
        url=check_url(item["url"], f"{where}.url"),
        weight=check_int(item.get("weight", 1), f"{where}.weight", 0, MAX_WEIGHT),
        max_in_flight=None
        if limit is None
        else check_int(limit, f"{where}.max_in_flight", 1, 10**6),
        reserve_slots=check_int(item.get("reserve_slots", 0), f"{where}.reserve_slots", 0, 10**6),
        reserve_priority=check_int(
            item.get("reserve_priority", 0), f"{where}.reserve_priority", -(2**31), 2**31 - 1
        ),
    )
    if spec.reserve_slots and spec.max_in_flight is None:
        raise ConfigError(
            f"{where}.reserve_slots: slots are reserved out of max_in_flight; set max_in_flight"
        )
    if spec.max_in_flight is not None and spec.reserve_slots > spec.max_in_flight:
        raise ConfigError(
            f"{where}.reserve_slots {spec.reserve_slots} is more than max_in_flight "
            f"{spec.max_in_flight}"
        )
    return spec


def parse_route_table(model: str, item: Any, where: str) -> RouteSpec:
    """``[routes."MODEL"]`` of the config file (replica names are checked later, against
    every replica)."""
    where = f"{where}: routes.{model}"
    if not isinstance(item, dict):
        raise ConfigError(f"{where} must be a table with weights (and policy)")
    unknown = sorted(set(item) - {"weights", "policy"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (use weights, policy)")
    weights = item.get("weights")
    if not isinstance(weights, dict) or not weights:
        raise ConfigError(f"{where}.weights must be a table of replica name = weight")
    out = {
        check_name(n, f"{where}.weights: name"): check_int(w, f"{where}.weights.{n}", 0, MAX_WEIGHT)
        for n, w in weights.items()
    }
    policy = item.get("policy")
    return RouteSpec(out, None if policy is None else check_policy(policy, f"{where}.policy"))


def parse_routing_table(item: Any, where: str) -> dict[str, Any]:
    """``[routing]``: ``policy``, ``eject_after``, ``eject_time_s`` (only the keys given)."""
    where = f"{where}: routing"
    if not isinstance(item, dict):
        raise ConfigError(f"{where} must be a table")
    out: dict[str, Any] = {}
    for key, value in item.items():
        if key == "policy":
            out["policy"] = check_policy(value, f"{where}.policy")
        elif key == "eject_after":
            out["eject_after"] = check_int(value, f"{where}.eject_after", 0, 10**6)
        elif key == "eject_time_s":
            out["eject_s"] = check_seconds(value, f"{where}.eject_time_s")
        else:
            raise ConfigError(
                f"{where}: unknown key {key!r} (use policy, eject_after, eject_time_s)"
            )
    return out


def check_seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0 or value > 86400:
        raise ConfigError(f"{where} must be a number of seconds > 0 and <= 86400, not {value!r}")
    return float(value)


def check_routing(spec: RoutingSpec) -> RoutingSpec:
    """Cross-checks: at least one replica, names unique, routes name known replicas and keep
    one weight > 0, the default route has one weight > 0."""
    if not spec.replicas:
        raise ConfigError("no upstream: give --upstream URL or [upstreams.NAME] in --config")
    names: set[str] = set()
    for r in spec.replicas:
        if r.name in names:
            raise ConfigError(f"upstream {r.name!r} is given twice (names must be unique)")
        names.add(r.name)
    if not any(r.weight > 0 for r in spec.replicas):
        raise ConfigError(
            "every upstream has weight 0: models without a route would have nowhere to go"
        )
    for model, route in spec.routes.items():
        for n in route.weights:
            if n not in names:
                raise ConfigError(
                    f"routes.{model}.weights: no upstream named {n!r} "
                    f"(upstreams: {', '.join(sorted(names))})"
                )
        if not any(w > 0 for w in route.weights.values()):
            raise ConfigError(f"routes.{model}.weights: at least one weight must be > 0")
    return spec
