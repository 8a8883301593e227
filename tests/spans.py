"""Build spans of each supported shape with the real OpenTelemetry SDK, for tests and bench.

Timestamps are explicit so the expected decomposition is exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context

MS = 1_000_000


class SpanFactory:
    """A TracerProvider recording into memory; ``take()`` returns and clears the spans."""

    def __init__(self, resource: dict[str, Any] | None = None, scope: str = "tests") -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create(resource or {}))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer: Tracer = self.provider.get_tracer(scope)

    def take(self) -> list[ReadableSpan]:
        spans = list(self.exporter.get_finished_spans())
        self.exporter.clear()
        return spans

    def otlp(self) -> Any:
        """The finished spans as an OTLP ExportTraceServiceRequest (the SDK's own encoder)."""
        return encode_spans(self.take())

    def ours(
        self,
        model: str,
        t0: int,
        latency_ms: float,
        phases: Sequence[tuple[str, float, float]] = (),
        *,
        attrs: dict[str, Any] | None = None,
        lock: tuple[str, str] | None = None,
        error: bool = False,
    ) -> tuple[str, str]:
        """A root span with ``cotenant.*`` attributes and phase children given as
        ``(name, start_ms, end_ms)`` relative to ``t0``. Returns (trace_id, span_id) hex."""
        a = {"cotenant.model": model, **(attrs or {})}
        root = self.tracer.start_span("request", attributes=a, start_time=t0)
        ctx = set_span_in_context(root)
        for name, s, e in phases:
            ca: dict[str, Any] = {}
            if name == "lock.wait" and lock is not None:
                ca = {"cotenant.lock.name": lock[0], "cotenant.lock.holder": lock[1]}
            child = self.tracer.start_span(
                name, context=ctx, start_time=t0 + int(s * MS), attributes=ca
            )
            child.end(end_time=t0 + int(e * MS))
        if error:
            root.set_status(Status(StatusCode.ERROR, "boom"))
        root.end(end_time=t0 + int(latency_ms * MS))
        sc = root.get_span_context()
        return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"

    def vllm(
        self,
        t0: int,
        e2e_s: float,
        queue_s: float,
        inference_s: float,
        *,
        model: str | None = "meta-llama/Llama-3.1-8B",
        ttft_s: float = 0.05,
        prompt_tokens: int = 100,
        completion_tokens: int = 20,
    ) -> tuple[str, str]:
        """An ``llm_request`` span as vLLM emits it (latencies in float seconds)."""
        a: dict[str, Any] = {
            "gen_ai.request.id": "cmpl-1",
            "gen_ai.latency.time_in_queue": queue_s,
            "gen_ai.latency.time_to_first_token": ttft_s,
            "gen_ai.latency.e2e": e2e_s,
            "gen_ai.latency.time_in_model_prefill": inference_s * 0.2,
            "gen_ai.latency.time_in_model_decode": inference_s * 0.8,
            "gen_ai.latency.time_in_model_inference": inference_s,
            "gen_ai.usage.prompt_tokens": prompt_tokens,
            "gen_ai.usage.completion_tokens": completion_tokens,
        }
        if model is not None:
            a["gen_ai.response.model"] = model
        span = self.tracer.start_span(
            "llm_request", kind=SpanKind.SERVER, attributes=a, start_time=t0
        )
        span.end(end_time=t0 + int(e2e_s * 1e9))
        sc = span.get_span_context()
        return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"

    def triton(
        self,
        t0: int,
        model: str,
        *,
        queue_ms: float,
        input_ms: float,
        infer_ms: float,
        output_ms: float,
        overhead_ms: float = 1.0,
    ) -> tuple[str, str]:
        """``InferRequest`` -> model span -> ``compute`` with Triton's timestamp events."""
        root = self.tracer.start_span("InferRequest", kind=SpanKind.SERVER, start_time=t0)
        root.add_event("HTTP_RECV_START", timestamp=t0)
        t = t0 + int(overhead_ms / 2 * MS)
        mspan = self.tracer.start_span(
            model,
            context=set_span_in_context(root),
            kind=SpanKind.SERVER,
            start_time=t,
            attributes={
                "triton.model_name": model,
                "triton.model_version": 1,
                "triton.trace_id": 1,
                "triton.trace_parent_id": 0,
            },
        )
        mspan.add_event("REQUEST_START", timestamp=t)
        mspan.add_event("QUEUE_START", timestamp=t)
        c0 = t + int(queue_ms * MS)
        comp = self.tracer.start_span(
            "compute", context=set_span_in_context(mspan), kind=SpanKind.SERVER, start_time=c0
        )
        c1 = c0 + int(input_ms * MS)
        c2 = c1 + int(infer_ms * MS)
        c3 = c2 + int(output_ms * MS)
        for name, ts in (
            ("COMPUTE_START", c0),
            ("COMPUTE_INPUT_END", c1),
            ("COMPUTE_OUTPUT_START", c2),
            ("COMPUTE_END", c3),
        ):
            comp.add_event(name, timestamp=ts)
        comp.end(end_time=c3)
        mspan.add_event("REQUEST_END", timestamp=c3)
        mspan.end(end_time=c3)
        end = c3 + int(overhead_ms / 2 * MS)
        root.add_event("HTTP_SEND_END", timestamp=end)
        root.end(end_time=end)
        sc = root.get_span_context()
        return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"

    def rayserve(
        self,
        t0: int,
        deployment: str,
        *,
        app: str = "app",
        replica_id: str = "r1abcdef",
        latency_ms: float,
        queue_ms: float,
        compute_ms: float,
        replica: SpanFactory | None = None,
    ) -> tuple[str, str]:
        """Ray Serve 2.60's three spans: ``proxy_http_request`` -> ``route_to_replica`` ->
        ``replica_handle_request``, attributes as Ray sets them. The replica span is recorded
        by ``replica`` (another process's factory, with its own resource) when given, else
        by this one; ``replica=self`` with ``compute_ms=0`` still emits it. The route starts
        1 ms into the request and the replica span ``queue_ms`` after that."""
        common = {"deployment": deployment, "app": app, "request_id": "req-1"}
        root = self.tracer.start_span(
            f"proxy_http_request {deployment} GET /",
            kind=SpanKind.SERVER,
            start_time=t0,
            attributes={**common, "request_type": "http", "http.status_code": 200},
        )
        r0 = t0 + MS
        route = self.tracer.start_span(
            f"route_to_replica {deployment} __call__",
            context=set_span_in_context(root),
            kind=SpanKind.SERVER,
            start_time=r0,
            attributes={**common, "call_method": "__call__", "http.method": "__call__"},
        )
        s0 = r0 + int(queue_ms * MS)
        rep = (replica or self).tracer.start_span(
            f"replica_handle_request {deployment} __call__",
            context=set_span_in_context(route),
            kind=SpanKind.SERVER,
            start_time=s0,
            attributes={**common, "replica_id": replica_id, "http.status_code": "200"},
        )
        route.end(end_time=s0 + MS // 10)
        rep.end(end_time=s0 + int(compute_ms * MS))
        root.end(end_time=t0 + int(latency_ms * MS))
        sc = root.get_span_context()
        return f"{sc.trace_id:032x}", f"{sc.span_id:016x}"
