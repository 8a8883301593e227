"""Ray Serve's shape beyond the contract: who served a request when the proxy and the replica
are two processes, and what happens when their spans arrive apart (real payloads:
tests/test_engine_fixtures.py)."""

from __future__ import annotations

from spans import MS, SpanFactory

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.normalize import Normalizer

T0 = 1_764_000_000_000_000_000
PROXY = {"service.name": "ray", "host.name": "node-1", "process.pid": 100}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_replica_process_not_the_proxy_is_who_served_the_request() -> None:
    proxy = SpanFactory(PROXY)
    replica = SpanFactory({"host.name": "node-2", "process.pid": 200, "cotenant.gpu": "3"})
    proxy.rayserve(
        T0, "Llm", app="chat", replica_id="abc", latency_ms=20, queue_ms=4, compute_ms=10,
        replica=replica,
    )  # fmt: skip
    proxy.exporter.export(replica.take())
    resolver = GpuResolver()
    [row] = Normalizer(resolver).normalize(proxy.otlp()).requests.to_pylist()
    assert (row["model"], row["replica"], row["host"], row["pid"], row["gpu"]) == (
        "chat/Llm",
        "abc",
        "node-2",
        200,
        "3",
    )
    assert (row["queue_ms"], row["compute_ms"], row["other_ms"]) == (4.0, 10.0, 6.0)
    assert resolver.model_of("node-2", 200) == "chat/Llm"
    assert resolver.model_of("node-1", 100) is None  # the proxy serves every deployment


def test_without_the_replicas_pid_the_row_has_none_rather_than_the_proxys() -> None:
    proxy = SpanFactory(PROXY)
    replica = SpanFactory({"service.name": "unknown_service:python3"})  # Ray's default
    proxy.rayserve(T0, "Llm", latency_ms=20, queue_ms=4, compute_ms=10, replica=replica)
    proxy.exporter.export(replica.take())
    [row] = Normalizer(GpuResolver()).normalize(proxy.otlp()).requests.to_pylist()
    assert row["pid"] is None and row["host"] == "" and row["replica"] == "r1abcdef"


def test_a_root_arriving_before_its_replica_span_waits_for_it() -> None:
    # BatchSpanProcessors in two processes: the proxy's export often comes first (seen on
    # Ray 2.60 with `make engines`: 2 rows in 8 lost their pid, replica and phases)
    proxy = SpanFactory(PROXY)
    replica = SpanFactory({"process.pid": 200})
    proxy.rayserve(T0, "Llm", latency_ms=20, queue_ms=4, compute_ms=10, replica=replica)
    clock = Clock()
    norm = Normalizer(GpuResolver(), clock=clock, pending_ttl_s=30, root_wait_s=10)
    assert norm.normalize(proxy.otlp()).requests.num_rows == 0
    assert norm.waiting_roots == 1
    clock.now = 2
    [row] = norm.normalize(replica.otlp()).requests.to_pylist()
    assert (row["pid"], row["replica"], row["queue_ms"], row["compute_ms"]) == (
        200,
        "r1abcdef",
        4.0,
        10.0,
    )
    assert norm.waiting_roots == 0 and norm.pending_spans == 0 and norm.roots_given_up == 0


def test_a_replica_span_that_never_comes_leaves_a_row_without_phases_after_the_wait() -> None:
    proxy = SpanFactory(PROXY)
    replica = SpanFactory({"process.pid": 200})
    proxy.rayserve(T0, "Llm", latency_ms=20, queue_ms=4, compute_ms=10, replica=replica)
    clock = Clock()
    norm = Normalizer(GpuResolver(), clock=clock, pending_ttl_s=30, root_wait_s=10)
    assert norm.normalize(proxy.otlp()).requests.num_rows == 0
    clock.now = 9
    assert norm.normalize(SpanFactory().otlp()).requests.num_rows == 0  # still waiting
    clock.now = 11
    [row] = norm.normalize(SpanFactory().otlp()).requests.to_pylist()
    assert row["pid"] is None and row["replica"] is None
    assert row["other_ms"] == row["latency_ms"] == 20.0
    assert norm.roots_given_up == 1
    late = norm.normalize(replica.otlp())
    assert late.requests.num_rows == 0 and late.rejected == {}
    clock.now = 45
    norm.normalize(SpanFactory().otlp())
    assert norm.pending_spans == 0 and norm.expired == {"orphan_child": 1}


def test_held_roots_are_written_at_flush_and_without_a_wait_at_once() -> None:
    proxy = SpanFactory(PROXY)
    proxy.rayserve(T0, "Llm", latency_ms=20, queue_ms=4, compute_ms=10, replica=SpanFactory())
    body = proxy.otlp()
    norm = Normalizer(GpuResolver(), clock=Clock())
    assert norm.normalize(body).requests.num_rows == 0
    [row] = norm.flush().requests.to_pylist()
    assert row["model"] == "app/Llm" and row["pid"] is None and norm.waiting_roots == 0
    [row] = Normalizer(GpuResolver(), root_wait_s=0).normalize(body).requests.to_pylist()
    assert row["model"] == "app/Llm" and row["pid"] is None


def test_a_5xx_answer_marks_the_request_as_an_error() -> None:
    f = SpanFactory(PROXY)
    root = f.tracer.start_span(
        "proxy_http_request Llm POST /",
        start_time=T0,
        attributes={"deployment": "Llm", "app": "chat", "http.status_code": 503},
    )
    root.end(end_time=T0 + 5 * MS)
    [row] = Normalizer(GpuResolver()).normalize(f.otlp()).requests.to_pylist()
    assert row["status"] == "error" and row["model"] == "chat/Llm"


def test_a_proxy_span_without_a_deployment_is_not_a_request() -> None:
    # an unmatched route (404) is answered by the proxy alone and names no deployment
    f = SpanFactory(PROXY)
    f.tracer.start_span("proxy_http_request  GET /nope", start_time=T0).end(end_time=T0 + MS)
    res = Normalizer(GpuResolver()).normalize(f.otlp())
    assert res.requests.num_rows == 0 and res.ignored == {"unrecognized": 1}
