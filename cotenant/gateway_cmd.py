"""``cotenant gateway``: run the admission gateway in front of a serving stack."""

from __future__ import annotations

import argparse
import asyncio
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
        default=":8080",
        metavar="[HOST]:PORT",
        help="where clients connect (default :8080, all interfaces)",
    )
    p.add_argument(
        "--control",
        default="127.0.0.1:8081",
        metavar="[HOST]:PORT",
        help="control API and /metrics (default 127.0.0.1:8081)",
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
        default="body",
        metavar="SOURCE",
        help="where the model name is: body[:FIELD] (default: JSON 'model'), "
        "header:NAME, path[:REGEX], none",
    )
    p.add_argument(
        "--tenant-from",
        default="header:X-Tenant",
        metavar="SOURCE",
        help="where the tenant name is (default header:X-Tenant); same forms",
    )
    p.add_argument(
        "--priority-field",
        choices=("none", "vllm", "triton"),
        default="none",
        help="write the model's (or tenant's) priority into the JSON body: vllm = "
        "top-level 'priority', triton = 'parameters.priority' (default none)",
    )
    p.add_argument(
        "--default-priority",
        type=int,
        default=0,
        help="priority of requests with none set (lower is served first; default 0)",
    )
    p.add_argument(
        "--max-concurrency",
        type=int,
        default=256,
        metavar="N",
        help="requests in flight to the upstream at once; the rest queue by priority (default 256)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=4096,
        metavar="N",
        help="requests that may wait; more answer 503 (default 4096)",
    )
    p.add_argument(
        "--queue-timeout",
        type=duration,
        default=30.0,
        metavar="S",
        help="longest wait in the queue before 503 (default 30 s)",
    )
    p.add_argument(
        "--rate-limit-wait",
        type=duration,
        default=0.0,
        metavar="S",
        help="a rate-limited request waits up to S seconds for a token instead "
        "of getting 429 at once (default 0)",
    )
    p.add_argument(
        "--connect-timeout",
        type=duration,
        default=5.0,
        metavar="S",
        help="upstream connect timeout (default 5 s)",
    )
    p.add_argument(
        "--read-timeout",
        type=duration,
        default=300.0,
        metavar="S",
        help="longest upstream silence, before the response or between pieces of "
        "it, before 504 (default 300 s)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=16 * 1024 * 1024,
        metavar="N",
        help="largest request body (default 16 MiB)",
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
        default=75.0,
        metavar="S",
        help="close a client connection idle (or sending a partial request) this long "
        "(default 75 s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=4096,
        metavar="N",
        help="client connections open at once; more are answered 503 + Retry-After and "
        "closed (0: no cap; default 4096)",
    )
    p.add_argument(
        "--max-connections-per-client",
        type=int,
        default=512,
        metavar="N",
        help="the same, per client IP address (0: no cap; default 512)",
    )
    p.add_argument(
        "--http-parser",
        choices=("httptools", "builtin"),
        default="httptools",
        help="HTTP/1 request parser: httptools (llhttp, as uvicorn and Node.js use) or the "
        "gateway's own (default httptools; see docs/performance.md)",
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
        default="cotenant-gateway",
        help="OTel service.name of the spans (default cotenant-gateway)",
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
    _positive(args.max_concurrency, "--max-concurrency")
    _positive(args.max_queue, "--max-queue", zero_ok=True)
    _positive(args.queue_timeout, "--queue-timeout")
    _positive(args.rate_limit_wait, "--rate-limit-wait", zero_ok=True)
    _positive(args.connect_timeout, "--connect-timeout")
    _positive(args.read_timeout, "--read-timeout")
    _positive(args.max_body_bytes, "--max-body-bytes")
    _positive(args.idle_timeout, "--idle-timeout")
    _positive(args.shutdown_grace, "--shutdown-grace", zero_ok=True)
    _positive(args.max_connections, "--max-connections", zero_ok=True)
    _positive(args.max_connections_per_client, "--max-connections-per-client", zero_ok=True)
    if not 0 < args.otlp_sample_ratio <= 1:
        raise UsageError(f"--otlp-sample-ratio {args.otlp_sample_ratio!r}: give 0 < R <= 1")
    return GatewaySettings(
        upstream=spec.replicas[0].url,
        token=read_token(args.token_file, os.environ),
        listen=parse_address(args.listen, "--listen"),
        control=parse_address(args.control, "--control"),
        model_from=parse_source(args.model_from, "--model-from"),
        tenant_from=parse_source(args.tenant_from, "--tenant-from"),
        priority_field=args.priority_field,
        max_concurrency=args.max_concurrency,
        max_queue=args.max_queue,
        queue_timeout_s=args.queue_timeout,
        rate_wait_s=args.rate_limit_wait,
        default_priority=args.default_priority,
        connect_timeout_s=args.connect_timeout,
        read_timeout_s=args.read_timeout,
        max_body_bytes=args.max_body_bytes,
        idle_timeout_s=args.idle_timeout,
        http_parser=args.http_parser,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        otlp_endpoint=args.otlp_endpoint,
        service_name=args.service_name,
        initial=file.initial,
        routing=spec,
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
