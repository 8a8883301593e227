"""``cotenant gateway``: run the admission gateway in front of a serving stack."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cotenant.argtypes import duration
from cotenant.core.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from cotenant.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


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


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "gateway",
        help="run the admission gateway (rate limits + priority) in front of a serving stack",
        description="An asynchronous reverse proxy in front of vLLM, Triton or any HTTP model "
        "server: per-model and per-tenant token buckets, a priority queue under a concurrency "
        "limit, streaming passthrough, OTel spans and /metrics. Its control API (on --control) "
        "is what cotenant's actuator drives. See docs/gateway.md.",
    )
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
    p.add_argument(
        "--loop",
        default="auto",
        choices=("auto", "asyncio", "uvloop"),
        help="event loop: uvloop (libuv; less CPU per request), asyncio, or auto (uvloop when "
        "installed, the default)",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=cmd_gateway)


def read_token(token_file: Path | None, env: dict[str, str] | os._Environ[str]) -> str:
    """The bearer token from ``--token-file``, else ``$COTENANT_GATEWAY_TOKEN``; raises
    :class:`ConfigError` when there is none (the gateway never runs unprotected)."""
    from cotenant.gateway.settings import TOKEN_ENV

    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(
                f"--token-file {token_file}: cannot read: {exc.strerror or exc}"
            ) from None
        if not token:
            raise ConfigError(f"--token-file {token_file}: the file is empty")
        return token
    token = env.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigError(
            f"no control API token: pass --token-file PATH or set {TOKEN_ENV} "
            "(the gateway refuses to run its control API without one)"
        )
    return token


def _positive(value: float, flag: str, *, zero_ok: bool = False) -> None:
    if not (value >= 0 if zero_ok else value > 0) or value != value or value == float("inf"):
        raise UsageError(f"{flag} {value!r}: give a finite number {'>= 0' if zero_ok else '> 0'}")


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """Check the flags and build :class:`actuators.gateway.settings.GatewaySettings`."""
    from cotenant.gateway.identify import parse_source
    from cotenant.gateway.routing_config import RoutingSpec, check_routing, parse_upstream_flag
    from cotenant.gateway.settings import (
        GatewayFile,
        GatewaySettings,
        load_gateway_file,
        parse_address,
    )

    cli = [parse_upstream_flag(u) for u in args.upstream or ()]
    file = load_gateway_file(args.config) if args.config else GatewayFile()
    routing = dict(file.routing)
    if args.routing is not None:
        routing["policy"] = args.routing
    if args.eject_after is not None:
        if args.eject_after < 0:
            raise UsageError(f"--eject-after {args.eject_after}: give an integer >= 0")
        routing["eject_after"] = args.eject_after
    if args.eject_time is not None:
        _positive(args.eject_time, "--eject-time")
        routing["eject_s"] = args.eject_time
    spec = check_routing(RoutingSpec((*cli, *file.replicas), file.routes, **routing))
    given = {
        name: value
        for name, value in (
            ("max_concurrency", args.max_concurrency),
            ("max_queue", args.max_queue),
            ("queue_timeout_s", args.queue_timeout),
            ("rate_wait_s", args.rate_limit_wait),
            ("default_priority", args.default_priority),
            ("connect_timeout_s", args.connect_timeout),
            ("read_timeout_s", args.read_timeout),
            ("max_body_bytes", args.max_body_bytes),
            ("idle_timeout_s", args.idle_timeout),
            ("max_connections", args.max_connections),
            ("max_connections_per_client", args.max_connections_per_client),
            ("priority_field", args.priority_field),
            ("http_parser", args.http_parser),
            ("service_name", args.service_name),
        )
        if value is not None
    }
    for name, flag, zero_ok in (
        ("max_concurrency", "--max-concurrency", False),
        ("max_queue", "--max-queue", True),
        ("queue_timeout_s", "--queue-timeout", False),
        ("rate_wait_s", "--rate-limit-wait", True),
        ("connect_timeout_s", "--connect-timeout", False),
        ("read_timeout_s", "--read-timeout", False),
        ("max_body_bytes", "--max-body-bytes", False),
        ("idle_timeout_s", "--idle-timeout", False),
        ("max_connections", "--max-connections", True),
        ("max_connections_per_client", "--max-connections-per-client", True),
    ):
        if name in given:
            _positive(given[name], flag, zero_ok=zero_ok)
    _positive(args.shutdown_grace, "--shutdown-grace", zero_ok=True)
    if not 0 < args.otlp_sample_ratio <= 1:
        raise UsageError(f"--otlp-sample-ratio {args.otlp_sample_ratio!r}: give 0 < R <= 1")
    if args.listen is not None:
        given["listen"] = parse_address(args.listen, "--listen")
    if args.control is not None:
        given["control"] = parse_address(args.control, "--control")
    if args.model_from is not None:
        given["model_from"] = parse_source(args.model_from, "--model-from")
    if args.tenant_from is not None:
        given["tenant_from"] = parse_source(args.tenant_from, "--tenant-from")
    return GatewaySettings(
        upstream=spec.replicas[0].url,
        token=read_token(args.token_file, os.environ),
        otlp_endpoint=args.otlp_endpoint,
        initial=file.initial,
        routing=spec,
        **given,
    )


def _tracer_provider(endpoint: str, service_name: str, ratio: float) -> Any:
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON, TraceIdRatioBased
    except ImportError as exc:
        raise ConfigError(
            f"--otlp-endpoint needs the OpenTelemetry SDK and OTLP/HTTP exporter ({exc.name} "
            "is missing): pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"
        ) from None
    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        # by trace id, so a request's root and its queue child are kept or dropped together
        sampler=ALWAYS_ON if ratio >= 1.0 else TraceIdRatioBased(ratio),
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return provider


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``--loop`` asks for (None: asyncio's default). UsageError when uvloop is
    asked for and not installed."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:
        if choice == "uvloop":
            raise UsageError(
                "--loop uvloop: uvloop is not installed (pip install uvloop), or use --loop asyncio"
            ) from exc
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def cmd_gateway(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from cotenant.gateway.server import Gateway
    from cotenant.gateway.span_export import OtlpSpanExporter, SpanExportCollector
    from cotenant.gateway.telemetry import SpanEmitter

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    settings = settings_from_args(args)
    registry = CollectorRegistry()
    provider: Any = None
    exporter: Any = None
    spans: Any = None
    if settings.otlp_endpoint and args.otlp_exporter == "sdk":
        provider = _tracer_provider(
            settings.otlp_endpoint, settings.service_name, args.otlp_sample_ratio
        )
        spans = SpanEmitter(provider.get_tracer("cotenant.gateway"))
    elif settings.otlp_endpoint:
        exporter = spans = OtlpSpanExporter(
            settings.otlp_endpoint,
            service_name=settings.service_name,
            sample_ratio=args.otlp_sample_ratio,
        )
        registry.register(SpanExportCollector(exporter))
        exporter.start()
    gateway = Gateway(settings, registry=registry, spans=spans)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await gateway.start()
        print(
            f"listening proxy={gateway.listen_url} control={gateway.control_url} "
            f"upstream={settings.upstream} replicas={','.join(gateway.router.replicas)}",
            flush=True,
        )
        await stop.wait()
        log.info("gateway: stopping; draining requests for up to %g s", args.shutdown_grace)
        await gateway.stop(drain_s=args.shutdown_grace)

    try:
        with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
            runner.run(run())
    finally:
        if provider is not None:
            provider.shutdown()  # flushes the spans still queued
        if exporter is not None:
            exporter.shutdown()  # sends the spans still queued
    print("gateway stopped", file=sys.stderr)
    return 0
