"""The arguments of ``cotenant gateway``, in groups; each flag's help quotes the default that
``GatewaySettings`` holds (flags left out keep it)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from cotenant.cli.argtypes import duration


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of ``cotenant gateway``, in the order ``--help`` lists them."""
    _replica_arguments(p)
    _endpoint_arguments(p)
    _identity_arguments(p)
    _queue_arguments(p)
    _timeout_arguments(p)
    _connection_arguments(p)
    _telemetry_arguments(p)
    _process_arguments(p)


def _default(name: str) -> Any:
    """``GatewaySettings``' default for ``name``: the one place a gateway default is written
    (flags left out keep it; their help quotes it)."""
    from cotenant.gateway.settings import GatewaySettings

    f = GatewaySettings.__dataclass_fields__[name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _source_text(name: str) -> str:
    src = _default(name)
    if src.kind == "header":
        return f"header:{src.header.decode()}"
    return f"{src.kind}:{src.field}" if src.field else str(src.kind)


def _address(name: str) -> str:
    host, port = _default(name)
    return f":{port}, all interfaces" if host in ("", "0.0.0.0") else f"{host}:{port}"


def _replica_arguments(p: argparse.ArgumentParser) -> None:
    """The replicas behind the gateway and how requests are shared among them."""
    p.add_argument(
        "--upstream",
        action="append",
        metavar="[NAME=]URL",
        help="a replica of the serving stack, e.g. http://127.0.0.1:8000 or gpu0=http://10.0.0.1:"
        "8000; repeat it for several replicas (named NAME, else host:port). Replicas may also be "
        "given as [upstreams.NAME] in --config",
    )
    p.add_argument(
        "--routing",
        choices=("weighted", "least-loaded"),
        help="how requests are shared among replicas: weighted (smooth weighted round robin, the "
        "default) or least-loaded (fewest in flight, of two drawn by weight)",
    )
    p.add_argument(
        "--eject-after",
        type=int,
        metavar="N",
        help="eject a replica after N failures in a row (connect, timeout, reset), probe it "
        "back later; 0: never (default 5)",
    )
    p.add_argument(
        "--eject-time",
        type=duration,
        metavar="S",
        help="seconds a replica stays ejected the first time; doubled each time in a row, up "
        "to 10x (default 30)",
    )


def _endpoint_arguments(p: argparse.ArgumentParser) -> None:
    """Where clients and the control API connect, and the files it reads."""
    p.add_argument(
        "--listen",
        metavar="[HOST]:PORT",
        help=f"where clients connect (default {_address('listen')})",
    )
    p.add_argument(
        "--control",
        metavar="[HOST]:PORT",
        help=f"control API and /metrics (default {_address('control')})",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="file holding the control API's bearer token (else $COTENANT_GATEWAY_TOKEN)",
    )
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML file of starting limits and priorities, replicas and routes (see "
        "docs/gateway.md)",
    )


def _identity_arguments(p: argparse.ArgumentParser) -> None:
    """Which model, tenant and priority a request has."""
    p.add_argument(
        "--model-from",
        metavar="SOURCE",
        help="where the model name is: body[:FIELD] (default: JSON 'model'), "
        "header:NAME, path[:REGEX], none",
    )
    p.add_argument(
        "--tenant-from",
        metavar="SOURCE",
        help=f"where the tenant name is (default {_source_text('tenant_from')}); same forms",
    )
    p.add_argument(
        "--priority-field",
        choices=("none", "vllm", "triton"),
        help="write the model's (or tenant's) priority into the JSON body: vllm = "
        f"top-level 'priority', triton = 'parameters.priority' (default "
        f"{_default('priority_field')})",
    )
    p.add_argument(
        "--default-priority",
        type=int,
        help="priority of requests with none set (lower is served first; default "
        f"{_default('default_priority')})",
    )


def _queue_arguments(p: argparse.ArgumentParser) -> None:
    """The concurrency limit, the priority queue and the rate limits' wait."""
    p.add_argument(
        "--max-concurrency",
        type=int,
        metavar="N",
        help="requests in flight to the upstream at once; the rest queue by priority (default "
        f"{_default('max_concurrency')})",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        metavar="N",
        help=f"requests that may wait; more answer 503 (default {_default('max_queue')})",
    )
    p.add_argument(
        "--queue-timeout",
        type=duration,
        metavar="S",
        help=f"longest wait in the queue before 503 (default {_default('queue_timeout_s'):g} s)",
    )
    p.add_argument(
        "--rate-limit-wait",
        type=duration,
        metavar="S",
        help="a rate-limited request waits up to S seconds for a token instead "
        f"of getting 429 at once (default {_default('rate_wait_s'):g})",
    )


def _timeout_arguments(p: argparse.ArgumentParser) -> None:
    """Upstream timeouts, body size and shutdown."""
    p.add_argument(
        "--connect-timeout",
        type=duration,
        metavar="S",
        help=f"upstream connect timeout (default {_default('connect_timeout_s'):g} s)",
    )
    p.add_argument(
        "--read-timeout",
        type=duration,
        metavar="S",
        help="longest upstream silence, before the response or between pieces of "
        f"it, before 504 (default {_default('read_timeout_s'):g} s)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="N",
        help=f"largest request body in bytes (default {_default('max_body_bytes') >> 20} MiB)",
    )
    p.add_argument(
        "--shutdown-grace",
        type=duration,
        default=10.0,
        metavar="S",
        help="on SIGTERM/SIGINT, let requests in progress finish for up to S seconds (default 10)",
    )


def _connection_arguments(p: argparse.ArgumentParser) -> None:
    """Client connections: idle timeout, caps and the HTTP parser."""
    p.add_argument(
        "--idle-timeout",
        type=duration,
        metavar="S",
        help="close a client connection idle (or sending a partial request) this long "
        f"(default {_default('idle_timeout_s'):g} s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="client connections open at once; more are answered 503 + Retry-After and "
        f"closed (0: no cap; default {_default('max_connections')})",
    )
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        metavar="N",
        help="the same, per client IP address (0: no cap; default "
        f"{_default('max_connections_per_client')})",
    )
    p.add_argument(
        "--http-parser",
        choices=("httptools", "builtin"),
        help="HTTP/1 request parser: httptools (llhttp, as uvicorn and Node.js use) or the "
        f"gateway's own (default {_default('http_parser')}; see docs/performance.md)",
    )


def _telemetry_arguments(p: argparse.ArgumentParser) -> None:
    """Spans (OTLP) of the requests through the gateway."""
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="send spans over OTLP/HTTP here, e.g. http://127.0.0.1:4318",
    )
    p.add_argument(
        "--otlp-sample-ratio",
        type=float,
        default=1.0,
        metavar="R",
        help="fraction of requests traced, 0 < R <= 1 (default 1: every request; see "
        "docs/performance.md for what tracing costs)",
    )
    p.add_argument(
        "--otlp-exporter",
        choices=("builtin", "sdk"),
        default="builtin",
        help="builtin: spans encoded to OTLP protobuf as requests end and sent by a thread "
        "(cheap; needs no SDK); sdk: the OpenTelemetry SDK's batch exporter (default builtin)",
    )
    p.add_argument(
        "--service-name",
        help=f"OTel service.name of the spans (default {_default('service_name')})",
    )


def _process_arguments(p: argparse.ArgumentParser) -> None:
    """The event loop and the log level."""
    p.add_argument(
        "--loop",
        default="auto",
        choices=("auto", "asyncio", "uvloop"),
        help="event loop: uvloop (libuv; less CPU per request), asyncio, or auto (uvloop when "
        "installed, the default)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
