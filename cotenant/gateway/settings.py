"""The gateway's settings, checked once (flags and the optional ``--config`` TOML file)."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from cotenant.core.errors import ConfigError, UsageError
from cotenant.gateway.identify import PriorityField, Source, parse_source
from cotenant.gateway.request_parser import ParserKind
from cotenant.gateway.routing_config import (
    ReplicaSpec,
    RouteSpec,
    RoutingSpec,
    parse_replica_table,
    parse_route_table,
    parse_routing_table,
    parse_upstream_flag,
)

TOKEN_ENV = "COTENANT_GATEWAY_TOKEN"


def parse_address(text: str, flag: str) -> tuple[str, int]:
    """``":8080"`` (all interfaces), ``"host:8080"`` or ``"[::1]:8080"`` -> ``(host, port)``;
    raises :class:`UsageError` naming ``flag`` and the value."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"{flag} {text!r}: give :PORT or HOST:PORT with a port 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or "0.0.0.0", int(port_text))


def check_upstream(url: str) -> SplitResult:
    """The parts of an ``http://`` or ``https://`` upstream URL; raises :class:`UsageError`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--upstream {url!r}: give an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 (validates the port)
    except ValueError:
        raise UsageError(f"--upstream {url!r}: invalid port") from None
    return parts


MIN_RATE = 0.001
"""The smallest rate (or duration) accepted: one request in about 17 minutes. Below it a
``Retry-After`` would run to hundreds of digits."""
MAX_RATE = 1_000_000.0


def check_rate(value: Any, where: str) -> float:
    """A rate in requests/s (or a duration in s): a finite number in [MIN_RATE, MAX_RATE]
    (not a bool); else :class:`ValueError` naming ``where`` and the bounds."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} must be a number, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where} must be a finite number > 0, not {value!r}")
    if not MIN_RATE <= value <= MAX_RATE:
        raise ValueError(f"{where} must be between {MIN_RATE:g} and {MAX_RATE:g}, not {value!r}")
    return float(value)


def check_burst(value: Any, where: str) -> int:
    """A burst: an integer >= 1 (an integral float such as ``5.0`` is accepted)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an integer, not {type(value).__name__}")
    if not 1 <= value <= 1_000_000_000:
        raise ValueError(f"{where} must be an integer from 1 to 1e9, not {value!r}")
    return value


def check_priority(value: Any, where: str) -> int:
    """A priority: an integer in the signed 32-bit range (lower is served first)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be an integer, not {type(value).__name__}")
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"{where} must fit in 32 bits, not {value!r}")
    return value


@dataclass(frozen=True)
class InitialState:
    """Limits and priorities to start with (``--config``); keyed by model or tenant name."""

    model_limits: dict[str, tuple[float, int]] = field(default_factory=dict)
    tenant_limits: dict[str, tuple[float, int]] = field(default_factory=dict)
    model_priorities: dict[str, int] = field(default_factory=dict)
    tenant_priorities: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GatewaySettings:
    """Everything ``cotenant gateway`` runs with; see docs/gateway.md for each flag.

    ``upstream`` is the one-replica form (``--upstream URL``); ``routing`` (replicas, routes,
    policy, passive health), when it names replicas, replaces it."""

    upstream: str
    token: str
    listen: tuple[str, int] = ("0.0.0.0", 8080)  # clients reach it from other hosts
    control: tuple[str, int] = ("127.0.0.1", 8081)
    model_from: Source = field(default_factory=lambda: parse_source("body", "--model-from"))
    tenant_from: Source = field(default_factory=lambda: parse_source("header:X-Tenant", "-"))
    priority_field: PriorityField = "none"
    max_concurrency: int = 256
    max_queue: int = 4096
    queue_timeout_s: float = 30.0
    rate_wait_s: float = 0.0
    default_priority: int = 0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 300.0
    max_body_bytes: int = 16 * 1024 * 1024
    idle_timeout_s: float = 75.0
    http_parser: ParserKind = "httptools"
    max_connections: int = 4096
    max_connections_per_client: int = 512
    otlp_endpoint: str | None = None
    service_name: str = "cotenant-gateway"
    initial: InitialState = field(default_factory=InitialState)
    routing: RoutingSpec = field(default_factory=RoutingSpec)

    def routing_spec(self) -> RoutingSpec:
        """``routing``, or one replica at ``upstream`` when it names none."""
        if self.routing.replicas:
            return self.routing
        return replace(self.routing, replicas=(parse_upstream_flag(self.upstream),))


_TABLES = {
    "limits": "model_limits",
    "tenant_limits": "tenant_limits",
    "priorities": "model_priorities",
    "tenant_priorities": "tenant_priorities",
}


@dataclass(frozen=True)
class GatewayFile:
    """What a ``--config`` file holds: starting limits and priorities, replicas, routes, and
    the ``[routing]`` keys it sets (``policy``, ``eject_after``, ``eject_s``)."""

    initial: InitialState = field(default_factory=InitialState)
    replicas: tuple[ReplicaSpec, ...] = ()
    routes: dict[str, RouteSpec] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)


_ROUTING_TABLES = ("upstreams", "routes", "routing")


def load_gateway_file(path: Path) -> GatewayFile:
    """Read a TOML file of starting limits and priorities, and of replicas and routes (see
    :mod:`actuators.gateway.routing_config`)::

        [limits."llama-3-8b"]
        rate_rps = 20.0
        burst = 40
        [tenant_limits.batch]
        rate_rps = 5.0
        burst = 5
        [priorities]
        "llama-3-8b" = 0
        [tenant_priorities]
        batch = 10

    Raises :class:`ConfigError` naming the file, the key and what is wrong.
    """
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: not valid TOML: {exc}") from None
    out: dict[str, Any] = {v: {} for v in _TABLES.values()}
    where_file = f"--config {path}"
    replicas: list[ReplicaSpec] = []
    routes: dict[str, RouteSpec] = {}
    routing: dict[str, Any] = {}
    for table, value in doc.items():
        if table not in _TABLES and table not in _ROUTING_TABLES:
            raise ConfigError(
                f"--config {path}: unknown table [{table}] "
                f"(use {', '.join([*_TABLES, *_ROUTING_TABLES])})"
            )
        if not isinstance(value, dict):
            raise ConfigError(f"--config {path}: [{table}] must be a table")
        if table == "routing":
            routing = parse_routing_table(value, where_file)
            continue
        for name, item in value.items():
            if table == "upstreams":
                replicas.append(parse_replica_table(name, item, where_file))
                continue
            if table == "routes":
                routes[name] = parse_route_table(name, item, where_file)
                continue
            where = f"--config {path}: {table}.{name}"
            try:
                if table.endswith("limits"):
                    if not isinstance(item, dict) or set(item) != {"rate_rps", "burst"}:
                        raise ValueError(f"{where} must be a table with rate_rps and burst")
                    out[_TABLES[table]][name] = (
                        check_rate(item["rate_rps"], f"{where}.rate_rps"),
                        check_burst(item["burst"], f"{where}.burst"),
                    )
                else:
                    out[_TABLES[table]][name] = check_priority(item, where)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
    return GatewayFile(InitialState(**out), tuple(replicas), routes, routing)
