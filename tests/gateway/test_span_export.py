"""The gateway's own OTLP span path: the protobuf it encodes (decoded with opentelemetry-proto),
and the exporter's batching, bounded queue, failures and shutdown against a stand-in
collector on loopback."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client import CollectorRegistry, generate_latest

from cotenant.gateway.finished import FinishedRequest
from cotenant.gateway.otlp_spans import SpanEncoder, export_request, resource_prefix, varint
from cotenant.gateway.span_export import OtlpSpanExporter, SpanExportCollector

REQ: dict[str, Any] = dict(
    model="meta-llama/Llama-3.1-8B",
    replica="gpu1",
    tenant="acme",
    priority=-3,
    method="POST",
    path="/v1/completions",
    status=200,
    start_ns=1_700_000_000_000_000_000,
    admit_ns=1_700_000_000_002_000_000,
    end_ns=1_700_000_000_050_000_000,
    ttft_ns=None,
)


def _attrs(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        field = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, field)
    return out


def _decode(body: bytes) -> list[Span]:
    req = ExportTraceServiceRequest.FromString(body)
    (rs,) = req.resource_spans
    assert {kv.key: kv.value.string_value for kv in rs.resource.attributes} == {
        "service.name": "gw-test"
    }
    (ss,) = rs.scope_spans
    assert ss.scope.name == "cotenant.gateway"
    return list(ss.spans)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"status": 503, "ttft_ns": REQ["start_ns"] + 30_000_000},
        {"model": "ü" * 300, "path": "/x" * 100, "priority": 2**31 - 1},
    ],
)
def test_encoded_spans_are_otlp_in_cotenants_conventions(extra: dict[str, Any]) -> None:
    req = {**REQ, **extra}
    resource, scope = resource_prefix("gw-test")
    enc = SpanEncoder(random.Random(3))
    body = export_request(
        resource, scope, [enc.encode(FinishedRequest(**req)), enc.encode(FinishedRequest(**req))]
    )
    spans = _decode(body)
    assert [s.name for s in spans] == ["gateway.request", "queue"] * 2
    root, queue, root2, _ = spans
    assert len(root.trace_id) == 16 and len(root.span_id) == 8
    assert queue.trace_id == root.trace_id and queue.parent_span_id == root.span_id
    assert root2.trace_id != root.trace_id  # one trace per request
    assert root.kind == Span.SPAN_KIND_SERVER and queue.kind == Span.SPAN_KIND_INTERNAL
    assert (root.start_time_unix_nano, root.end_time_unix_nano) == (req["start_ns"], req["end_ns"])
    assert (queue.start_time_unix_nano, queue.end_time_unix_nano) == (
        req["start_ns"],
        req["admit_ns"],
    )
    want = {
        "cotenant.model": req["model"],
        "cotenant.replica": req["replica"],
        "cotenant.tenant": req["tenant"],
        "cotenant.priority": req["priority"],
        "http.request.method": req["method"],
        "url.path": req["path"],
        "http.response.status_code": req["status"],
    }
    if req["ttft_ns"] is not None:
        want["gen_ai.latency.time_to_first_token"] = 0.03
    got = _attrs(root)
    if "gen_ai.latency.time_to_first_token" in got:
        got["gen_ai.latency.time_to_first_token"] = round(
            got["gen_ai.latency.time_to_first_token"], 9
        )
    assert got == want
    if req["status"] >= 500:
        assert root.status.code == 2 and root.status.message == "HTTP 503"
    else:
        assert root.status.code == 0


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**35, -1, -(2**63)])
def test_varint_matches_protobuf(n: int) -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue

    assert b"\x18" + varint(n) == AnyValue(int_value=n).SerializeToString()


class _Collector:
    """An OTLP/HTTP stand-in: records bodies, answers ``statuses`` in turn (then 200)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.statuses: list[int] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                status = owner.statuses.pop(0) if owner.statuses else 200
                if status == 200:
                    owner.bodies.append(body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[Span]:
        return [s for b in self.bodies for s in _decode(b)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[_Collector]:
    c = _Collector()
    yield c
    c.close()


def _exporter(url: str, **kw: Any) -> OtlpSpanExporter:
    kw.setdefault("backoff_s", 0.01)
    return OtlpSpanExporter(url, service_name="gw-test", rng=random.Random(1), **kw)


def test_exporter_sends_batches_to_v1_traces(collector: _Collector) -> None:
    exp = _exporter(collector.url, max_batch=4)
    for _ in range(10):
        exp.emit(FinishedRequest(**REQ))
    assert exp.queued == 10
    exp.flush()
    assert [len(_decode(b)) for b in collector.bodies] == [8, 8, 4]  # at most 4 requests each
    assert exp.exported == 20 and exp.queued == 0
    text = generate_latest(_registry(exp)).decode()
    assert "cotenant_gateway_spans_exported_total 20.0" in text


def _registry(exp: OtlpSpanExporter) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(SpanExportCollector(exp))
    return reg


def test_a_full_queue_drops_and_counts(collector: _Collector) -> None:
    exp = _exporter(collector.url, max_queue=3)
    for _ in range(5):
        exp.emit(FinishedRequest(**REQ))
    assert exp.queued == 3 and exp.dropped_queue_full == 4
    exp.flush()
    assert len(collector.spans()) == 6
    text = generate_latest(_registry(exp)).decode()
    assert 'cotenant_gateway_spans_dropped_total{reason="queue_full"} 4.0' in text


def test_a_down_collector_drops_counts_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # nobody listens once closed
    exp = _exporter(url, retries=1)
    with caplog.at_level(logging.WARNING, logger="cotenant.gateway.span_export"):
        for _ in range(2):
            exp.emit(FinishedRequest(**REQ))
            exp.flush()
    assert exp.dropped_failed == 4 and exp.exported == 0
    assert len(caplog.records) == 1 and "ConnectionRefusedError" in caplog.text


def test_busy_collector_is_retried_then_refusal_drops(collector: _Collector) -> None:
    exp = _exporter(collector.url, retries=2)
    collector.statuses = [503, 429]
    exp.emit(FinishedRequest(**REQ))
    exp.flush()
    assert exp.exported == 2 and len(collector.bodies) == 1
    collector.statuses = [400]  # a refusal is not retried
    exp.emit(FinishedRequest(**REQ))
    exp.flush()
    assert exp.dropped_failed == 2 and len(collector.bodies) == 1


def test_sampling_keeps_a_requests_spans_together(collector: _Collector) -> None:
    exp = _exporter(collector.url, sample_ratio=0.25)
    for _ in range(400):
        exp.emit(FinishedRequest(**REQ))
    assert 60 <= exp.queued <= 140
    exp.flush()
    spans = collector.spans()
    assert len(spans) == 2 * exp.exported // 2 and len(spans) % 2 == 0
    roots = {s.span_id for s in spans if s.name == "gateway.request"}
    assert {s.parent_span_id for s in spans if s.name == "queue"} == roots


def test_shutdown_sends_what_is_queued(collector: _Collector) -> None:
    exp = _exporter(collector.url, interval_s=3600)
    exp.start()
    for _ in range(7):
        exp.emit(FinishedRequest(**REQ))
    exp.shutdown(timeout_s=10)
    assert len(collector.spans()) == 14


def test_bad_endpoints_are_refused() -> None:
    from cotenant.core.errors import UsageError

    with pytest.raises(UsageError, match="give an http:// or https:// URL"):
        OtlpSpanExporter("localhost:4318")
    with pytest.raises(UsageError, match="invalid port"):
        OtlpSpanExporter("http://h:99999")
