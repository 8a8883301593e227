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

from cotenant.cli.gateway_args import add_arguments
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
    add_arguments(p)
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
