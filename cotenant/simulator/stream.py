"""Stream a simulation as real OTLP spans, paced against the wall clock.

Each completed request becomes a root span carrying ``cotenant.*`` attributes with one child
per non-empty phase, built with the OpenTelemetry SDK and sent by its OTLP/HTTP exporter (which
retries on 503 / Retry-After, so a busy receiver slows the stream instead of losing spans).
Every model has its own resource (``service.name``, ``host.name``, ``process.pid``), as separate
serving processes would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Tracer, set_span_in_context

from cotenant.core.errors import CotenantError
from cotenant.simulator.engine import Simulation
from cotenant.simulator.scenario import Scenario

# (column, span name) of the phases emitted as children, in critical-path order
_PHASE_SPANS: tuple[tuple[str, str], ...] = (
    ("preprocess_ms", "preprocess"),
    ("lock_wait_ms", "lock.wait"),
    ("queue_ms", "queue"),
    ("h2d_ms", "transfer.h2d"),
    ("compute_ms", "compute"),
    ("d2h_ms", "transfer.d2h"),
    ("postprocess_ms", "postprocess"),
)


class _Collect(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


@dataclass
class StreamStats:
    requests: int = 0
    spans: int = 0
    wall_s: float = 0.0


class ScenarioSpanEmitter:
    """Turns simulator request columns into SDK spans and exports them with ``exporter``."""

    def __init__(
        self,
        scenario: Scenario,
        exporter: SpanExporter,
        gpu_names: dict[str, str] | None = None,
        pids: dict[str, int] | None = None,
    ) -> None:
        self._exporter = exporter
        self._collect = _Collect()
        self._tracers: dict[str, Tracer] = {}
        self._gpu_names = gpu_names or {}
        self._host = scenario.host
        for i, m in enumerate(scenario.models):
            pid = (pids or {}).get(m.name, 1000 + i)
            self._tracers[m.name] = self._tracer(m.name, pid, None)
            for r in m.replicas[1:]:  # each replica is its own process (the first: the model's)
                self._tracers[r.name] = self._tracer(m.name, r.pid, r.name)

    def _tracer(self, model: str, pid: int, replica: str | None) -> Tracer:
        attrs: dict[str, Any] = {"service.name": model, "host.name": self._host, "process.pid": pid}
        if replica is not None:
            attrs["cotenant.replica"] = replica
        tp = TracerProvider(resource=Resource.create(attrs))
        tp.add_span_processor(self._collect)
        return tp.get_tracer("cotenant.simulator")

    def emit(self, cols: dict[str, list[Any]]) -> tuple[int, int]:
        """Build and export spans for every request in ``cols``; returns (requests, spans)."""
        n = len(cols["rid"])
        for i in range(n):
            self._request(cols, i)
        spans = self._collect.spans
        self._collect.spans = []
        for k in range(0, len(spans), 4096):
            result = self._exporter.export(spans[k : k + 4096])
            if result is not SpanExportResult.SUCCESS:
                raise CotenantError(
                    "the OTLP receiver did not accept the simulator's spans "
                    "(is cotenant serve running at that address?)"
                )
        return n, len(spans)

    def _request(self, c: dict[str, list[Any]], i: int) -> None:
        model = c["model"][i]
        start = c["ts_start_ns"][i]
        end = c["ts_end_ns"][i]
        attrs: dict[str, Any] = {
            "cotenant.model": model,
            "cotenant.gpu": self._gpu_names.get(c["gpu"][i], c["gpu"][i]),
            "cotenant.batch_size": c["batch_size"][i],
            "cotenant.priority": c["priority"][i],
        }
        if c["tenant"][i]:
            attrs["cotenant.tenant"] = c["tenant"][i]
        replica = c["replica"][i]
        if replica is not None:
            attrs["cotenant.replica"] = replica
        if c["prompt_tokens"][i] is not None:
            attrs["gen_ai.usage.prompt_tokens"] = c["prompt_tokens"][i]
            attrs["gen_ai.usage.completion_tokens"] = c["output_tokens"][i]
        if c["ttft_ms"][i] is not None:  # an LLM model's first token (the vLLM attribute)
            attrs["gen_ai.latency.time_to_first_token"] = c["ttft_ms"][i] / 1000.0
        tracer = self._tracers.get(replica or model) or self._tracers[model]
        root = tracer.start_span("request", attributes=attrs, start_time=start)
        ctx = set_span_in_context(root)
        t = start
        for col, name in _PHASE_SPANS:
            d = int(c[col][i] * 1e6)
            if d <= 0:
                continue
            a = None
            if name == "lock.wait":
                a = {
                    "cotenant.lock.name": c["lock_name"][i] or "",
                    "cotenant.lock.holder": c["lock_holder"][i] or "",
                }
            child = tracer.start_span(name, context=ctx, start_time=t, attributes=a)
            t = min(end, t + d)
            child.end(end_time=t)
        root.end(end_time=end)


def stream(
    scenario: Scenario,
    endpoint: str,
    *,
    speed: float | None = 1.0,
    start_ns: int | None = None,
    tick_s: float = 0.25,
    on_tick: Callable[[Simulation, float], None] | None = None,
    progress: Callable[[str], None] = lambda _: None,
    gpu_names: dict[str, str] | None = None,
    stop: Callable[[], bool] = lambda: False,
    on_requests: Callable[[dict[str, list[Any]]], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> StreamStats:
    """Run ``scenario`` paced at ``speed`` x wall clock (None = as fast as possible), exporting
    spans to ``endpoint`` (an OTLP/HTTP base URL or ``…/v1/traces``). ``on_tick`` is called after
    each step with the simulation and virtual time (to drive a FakeNvml, for example);
    ``on_start`` once, with the wall clock (ns) at which virtual time 0 is paced from."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = (
        endpoint
        if endpoint.rstrip("/").endswith("/v1/traces")
        else endpoint.rstrip("/") + "/v1/traces"
    )
    exporter = OTLPSpanExporter(endpoint=url, timeout=30)
    return stream_to(
        scenario,
        exporter,
        speed=speed,
        start_ns=start_ns,
        tick_s=tick_s,
        on_tick=on_tick,
        progress=progress,
        gpu_names=gpu_names,
        stop=stop,
        on_requests=on_requests,
        on_start=on_start,
    )


def stream_to(
    scenario: Scenario,
    exporter: SpanExporter,
    *,
    speed: float | None,
    start_ns: int | None = None,
    tick_s: float = 0.25,
    on_tick: Callable[[Simulation, float], None] | None = None,
    progress: Callable[[str], None] = lambda _: None,
    gpu_names: dict[str, str] | None = None,
    stop: Callable[[], bool] = lambda: False,
    on_requests: Callable[[dict[str, list[Any]]], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> StreamStats:
    sim = Simulation(scenario, start_ns=start_ns or time.time_ns())
    emitter = ScenarioSpanEmitter(scenario, exporter, gpu_names)
    stats = StreamStats()
    wall0 = time.monotonic()
    v = 0.0
    step = tick_s * (speed or 1.0) if speed else 5.0
    next_report = 0.0
    try:
        if on_start is not None:
            on_start(time.time_ns() - int((time.monotonic() - wall0) * 1e9))
        while v < scenario.duration_s and not stop():
            v = min(scenario.duration_s, v + step)
            sim.run_until(v)
            cols = sim.take_requests()
            r, s = emitter.emit(cols)
            if on_requests is not None:
                on_requests(cols)
            stats.requests += r
            stats.spans += s
            if on_tick is not None:
                on_tick(sim, v)
            if speed:
                lag = (wall0 + v / speed) - time.monotonic()
                if lag > 0:
                    time.sleep(lag)
            if v >= next_report:
                progress(
                    f"{scenario.name}: {v:.0f}/{scenario.duration_s:.0f} s simulated, "
                    f"{stats.requests} requests sent"
                )
                next_report = v + max(10.0, scenario.duration_s / 20)
    finally:
        exporter.shutdown()
        stats.wall_s = time.monotonic() - wall0
    return stats
