"""What the gateway reports: Prometheus metrics and OpenTelemetry spans per request.

Spans follow cotenant's conventions (docs/instrumenting.md): one root span per request with
``cotenant.model``, ``cotenant.tenant`` and ``cotenant.priority``, and a ``queue`` child from
the request's arrival to its admission (rate-limit wait + priority queue), so cotenant shows the
gateway's queueing as ``queue_ms`` of the request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from cotenant.gateway.finished import FinishedRequest

if TYPE_CHECKING:
    from cotenant.gateway.routing import Router

QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)


class GatewayMetrics:
    """The gateway's Prometheus metrics, registered on ``registry`` (never the global one)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "cotenant_gateway_requests",
            "Requests answered by the gateway, by model and HTTP status code",
            ["model", "code"],
            registry=registry,
        )
        self.rejections = Counter(
            "cotenant_gateway_rejections",
            "Requests the gateway refused, by model and reason (rate_limit_model, "
            "rate_limit_tenant, queue_full, queue_timeout, bad_request, request_timeout)",
            ["model", "reason"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "cotenant_gateway_upstream_errors",
            "Upstream failures (connect, timeout, reset, protocol)",
            ["kind"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            "cotenant_gateway_queue_wait_seconds",
            "Time from a request's arrival to its admission to the upstream",
            ["model"],
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            "cotenant_gateway_request_duration_seconds",
            "Time from a request's arrival to the end of its response",
            ["model"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "cotenant_gateway_in_flight",
            "Requests sent to the upstream and not yet answered",
            registry=registry,
        )
        self.queued = Gauge(
            "cotenant_gateway_queued",
            "Requests waiting in the gateway (rate-limit wait or priority queue)",
            registry=registry,
        )
        self.connections = Gauge(
            "cotenant_gateway_connections",
            "Client connections open now (refused ones not included)",
            registry=registry,
        )
        self.connections_refused = Counter(
            "cotenant_gateway_connections_refused",
            "Client connections refused with 503 at a connection cap, by reason (per_client: "
            "--max-connections-per-client, total: --max-connections)",
            ["reason"],
            registry=registry,
        )
        self._per_model: dict[str, tuple[Any, Any]] = {}

    def observe(self, model: str, code: int, queue_s: float, total_s: float) -> None:
        """One finished request (``code`` as answered to the client)."""
        pair = self._per_model.get(model)
        if pair is None:
            pair = self._per_model[model] = (
                self.queue_wait.labels(model),
                self.duration.labels(model),
            )
        self.requests.labels(model, str(code)).inc()
        pair[0].observe(queue_s)
        pair[1].observe(total_s)


class ReplicaCollector:
    """Per-replica series, read from the router when Prometheus scrapes (nothing is counted
    twice on the data path): ``cotenant_gateway_replica_requests_total``, ``…_failures_total``,
    ``…_ejections_total``, ``…_in_flight``, ``…_up`` (1: takes new requests) and
    ``cotenant_gateway_route_weight`` (per route and replica; route ``*`` is the default)."""

    def __init__(self, router: Router) -> None:
        self._router = router

    def collect(self) -> Iterator[Metric]:
        router = self._router
        sent = CounterMetricFamily(
            "cotenant_gateway_replica_requests", "Requests sent to each replica", labels=["replica"]
        )
        failed = CounterMetricFamily(
            "cotenant_gateway_replica_failures",
            "Exchanges with each replica that failed (connect, timeout, reset, protocol)",
            labels=["replica"],
        )
        ejections = CounterMetricFamily(
            "cotenant_gateway_replica_ejections",
            "Times passive health ejected each replica",
            labels=["replica"],
        )
        in_flight = GaugeMetricFamily(
            "cotenant_gateway_replica_in_flight",
            "Requests at each replica now",
            labels=["replica"],
        )
        up = GaugeMetricFamily(
            "cotenant_gateway_replica_up",
            "1 when the replica takes new requests, 0 while ejected (by an operator or health)",
            labels=["replica"],
        )
        for name, r in router.replicas.items():
            st = r.state(router.clock())
            sent.add_metric([name], r.sent_total)
            failed.add_metric([name], r.failed_total)
            ejections.add_metric([name], r.health.ejections_total)
            in_flight.add_metric([name], r.in_flight)
            up.add_metric([name], 0 if st["state"] == "ejected" else 1)
        weight = GaugeMetricFamily(
            "cotenant_gateway_route_weight",
            "Weight of each replica in each model's route (route '*': the default route)",
            labels=["route", "replica"],
        )
        for route, rs in router.state()["routes"].items():
            for name, w in rs["weights"].items():
                weight.add_metric([route, name], w)
        yield from (sent, failed, ejections, in_flight, up, weight)


class SpanSink(Protocol):
    """Receives one finished request (on the event loop thread; must be quick and must not
    block): :class:`SpanEmitter` (the OTel SDK) or
    :class:`actuators.gateway.span_export.OtlpSpanExporter` (pre-encoded OTLP)."""

    def emit(self, req: FinishedRequest) -> None: ...


class SpanEmitter:
    """Emits the request span and its ``queue`` child through ``tracer`` (an OTel SDK tracer
    with an OTLP exporter, set up by the caller)."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    def emit(self, req: FinishedRequest) -> None:
        attrs: dict[str, Any] = {
            "cotenant.model": req.model,
            "cotenant.replica": req.replica,
            "cotenant.tenant": req.tenant,
            "cotenant.priority": req.priority,
            "http.request.method": req.method,
            "url.path": req.path,
            "http.response.status_code": req.status,
        }
        start_ns = req.start_ns
        if req.ttft_ns is not None:
            attrs["gen_ai.latency.time_to_first_token"] = (req.ttft_ns - start_ns) / 1e9
        root = self._tracer.start_span(
            "gateway.request", kind=SpanKind.SERVER, attributes=attrs, start_time=start_ns
        )
        if req.status >= 500:
            root.set_status(Status(StatusCode.ERROR, f"HTTP {req.status}"))
        q = self._tracer.start_span("queue", context=set_span_in_context(root), start_time=start_ns)
        q.end(end_time=req.admit_ns)
        root.end(end_time=req.end_ns)
