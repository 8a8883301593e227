"""A running ``cotenant serve`` fed by the real OpenTelemetry exporters and raw bodies."""

from __future__ import annotations

import gzip
import json
import os
import signal
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
from conftest import Served, start_serve
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace.export import SpanExportResult
from spans import SpanFactory

from cotenant.core.phases import PHASE_COLUMNS
from cotenant.store.db import Store

PB = {"Content-Type": "application/x-protobuf"}
T0 = time.time_ns() - 60 * 1_000_000_000


def get_requests(s: Served, **params: object) -> list[dict]:
    r = httpx.get(f"{s.api}/api/v1/requests", params={"limit": 10000, **params}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["requests"]


def wait_rows(s: Served, n: int, **params: object) -> list[dict]:
    deadline = time.monotonic() + 20
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = get_requests(s, **params)
        if len(rows) >= n:
            return rows
        time.sleep(0.1)
    raise AssertionError(f"expected {n} rows, have {len(rows)}")


def metric(s: Served, line_prefix: str) -> float:
    text = httpx.get(f"{s.api}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(line_prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_sdk_http_and_grpc_exporters_land_normalized_rows(serve: Served) -> None:
    f = SpanFactory({"host.name": "node-a", "process.pid": 4242})
    for i in range(20):
        f.ours(
            "llama",
            T0 + i * 1_000_000,
            50.0,
            [
                ("queue", 0, 10),
                ("preprocess", 10, 15),
                ("compute", 15, 45),
                ("postprocess", 45, 48),
            ],
            attrs={"cotenant.gpu": "0"},
        )
    http_exp = HttpExporter(endpoint=serve.otlp_http, compression=Compression.Gzip)
    assert http_exp.export(f.take()) is SpanExportResult.SUCCESS
    g = SpanFactory({"host.name": "node-a", "process.pid": 4343})
    for i in range(30):
        g.ours(
            "sdxl",
            T0 + i * 1_000_000,
            80.0,
            [("transfer.h2d", 0, 5), ("compute", 5, 75)],
            attrs={"cotenant.gpu": "0", "cotenant.batch_size": 4},
        )
    grpc_exp = GrpcExporter(
        endpoint=serve.otlp_grpc, insecure=True, compression=grpc.Compression.Gzip
    )
    assert grpc_exp.export(g.take()) is SpanExportResult.SUCCESS
    http_exp.shutdown()
    grpc_exp.shutdown()

    llama = wait_rows(serve, 20, model="llama")
    assert len(llama) == 20
    r = llama[0]
    assert (
        r["queue_ms"],
        r["preprocess_ms"],
        r["compute_ms"],
        r["postprocess_ms"],
    ) == pytest.approx((10, 5, 30, 3))
    assert r["other_ms"] == pytest.approx(2.0) and r["host"] == "node-a" and r["pid"] == 4242
    sdxl = wait_rows(serve, 30, model="sdxl")
    assert all(x["batch_size"] == 4 and x["h2d_ms"] == pytest.approx(5) for x in sdxl)
    for x in llama + sdxl:
        assert sum(x[c] for c in PHASE_COLUMNS) == pytest.approx(x["latency_ms"])

    assert (
        metric(serve, 'cotenant_otlp_spans_received_total{format="protobuf",protocol="http"}')
        == 20 * 5
    )
    assert (
        metric(serve, 'cotenant_otlp_spans_received_total{format="protobuf",protocol="grpc"}')
        == 30 * 3
    )
    assert (
        metric(
            serve, 'cotenant_request_duration_seconds_count{gpu="0",model="llama",phase="total"}'
        )
        == 20
    )
    assert metric(serve, 'cotenant_store_rows_written_total{table="requests"}') == 50


def test_raw_otlp_json_with_hex_ids_int_enums_and_unknown_fields(serve: Served) -> None:
    start = T0
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": "host.name", "value": {"stringValue": "n1"}},
                        {"key": "process.pid", "value": {"intValue": "77"}},
                    ]
                },
                "someFutureField": {"x": 1},
                "scopeSpans": [
                    {
                        "scope": {"name": "hand"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "name": "request",
                                "kind": 2,
                                "startTimeUnixNano": str(start),
                                "endTimeUnixNano": str(start + 20_000_000),
                                "attributes": [
                                    {"key": "cotenant.model", "value": {"stringValue": "whisper"}},
                                    {"key": "cotenant.gpu", "value": {"stringValue": "1"}},
                                ],
                                "status": {"code": 1},
                                "unknownSpanField": True,
                            },
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b175",
                                "parentSpanId": "eee19b7ec3c1b174",
                                "name": "compute",
                                "kind": 1,
                                "startTimeUnixNano": str(start + 5_000_000),
                                "endTimeUnixNano": str(start + 15_000_000),
                            },
                        ],
                    }
                ],
            }
        ]
    }
    r = httpx.post(
        f"{serve.otlp_http}",
        content=json.dumps(body),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == {}
    [row] = wait_rows(serve, 1, model="whisper")
    assert row["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert row["gpu"] == "1" and row["pid"] == 77
    assert row["compute_ms"] == pytest.approx(10.0) and row["other_ms"] == pytest.approx(10.0)


def _protobuf_payload(n: int, model: str = "m", t0: int = T0) -> tuple[bytes, list[str]]:
    f = SpanFactory()
    ids = [f.ours(model, t0 + i * 1000, 10.0, [("compute", 1, 9)])[0] for i in range(n)]
    return f.otlp().SerializeToString(), ids


def _status_message(resp: httpx.Response) -> str:
    st = status_pb2.Status()
    if resp.headers["content-type"].startswith("application/json"):
        json_format.Parse(resp.text, st)
    else:
        st.ParseFromString(resp.content)
    return st.message


def test_bad_input_gets_the_documented_answer_and_nothing_acknowledged_is_lost(
    tmp_path: Path,
) -> None:
    limit = 64 * 1024
    s = start_serve(tmp_path, tmp_path / "s.duckdb", {"COTENANT_OTLP_MAX_BODY_BYTES": str(limit)})
    try:
        good, ids = _protobuf_payload(10, "keep")
        assert httpx.post(s.otlp_http, content=good, headers=PB).status_code == 200
        wait_rows(s, 10, model="keep")

        truncated = good[: len(good) // 2]
        cases: list[tuple[str, bytes, dict[str, str], int, str]] = [
            ("random bytes", os.urandom(4096), PB, 400, "protobuf"),
            ("truncated protobuf", truncated, PB, 400, "protobuf"),
            ("not json", b"{nope", {"Content-Type": "application/json"}, 400, "JSON"),
            (
                "json wrong types",
                json.dumps(
                    {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz", "name": 5}]}]}]}
                ).encode(),
                {"Content-Type": "application/json"},
                400,
                "traceId",
            ),
            ("json not an object", b"[1,2]", {"Content-Type": "application/json"}, 400, "object"),
            ("over the limit", b"\0" * (limit + 1), PB, 413, "limit"),
            (
                "gzip bomb",
                gzip.compress(b"\0" * (limit * 64)),
                {**PB, "Content-Encoding": "gzip"},
                413,
                "inflates",
            ),
            ("bad gzip", b"\x1f\x8bnot gzip", {**PB, "Content-Encoding": "gzip"}, 400, "gzip"),
            (
                "wrong content type",
                good,
                {"Content-Type": "text/plain"},
                415,
                "application/x-protobuf",
            ),
            ("unknown encoding", good, {**PB, "Content-Encoding": "br"}, 415, "encoding"),
        ]
        for name, body, headers, status, words in cases:
            resp = httpx.post(s.otlp_http, content=body, headers=headers, timeout=10)
            assert resp.status_code == status, name
            assert words in _status_message(resp), (name, _status_message(resp))

        # spans missing required fields: 200 with partial_success naming the reasons
        f = SpanFactory()
        f.ours("ok-model", T0, 5.0)
        req = f.otlp()
        bad = req.resource_spans[0].scope_spans[0].spans.add()
        bad.CopyFrom(req.resource_spans[0].scope_spans[0].spans[0])
        bad.trace_id = b"short"
        noname = req.resource_spans[0].scope_spans[0].spans.add()
        noname.CopyFrom(req.resource_spans[0].scope_spans[0].spans[0])
        del noname.attributes[:]
        noname.name = "llm_request"
        resp = httpx.post(s.otlp_http, content=req.SerializeToString(), headers=PB)
        assert resp.status_code == 200
        out = ExportTraceServiceResponse()
        out.ParseFromString(resp.content)
        assert out.partial_success.rejected_spans == 2
        assert "bad_ids" in out.partial_success.error_message
        assert "missing_model" in out.partial_success.error_message
        wait_rows(s, 1, model="ok-model")

        assert httpx.get(f"{s.api}/healthz").status_code == 200
        assert metric(s, 'cotenant_otlp_spans_rejected_total{reason="bad_ids"}') == 1
        assert sorted(r["trace_id"] for r in get_requests(s, model="keep")) == sorted(ids)
        assert s.stop() == 0
    finally:
        s.close()


def test_grpc_partial_success_and_bad_protobuf(serve: Served) -> None:
    channel = grpc.insecure_channel(serve.otlp_grpc)
    stub = trace_service_pb2_grpc.TraceServiceStub(channel)
    f = SpanFactory()
    f.vllm(T0, 1.0, 0.1, 0.5, model=None)  # no model anywhere -> rejected
    f.vllm(T0, 1.0, 0.1, 0.5)
    resp = stub.Export(f.otlp(), timeout=10)
    assert resp.partial_success.rejected_spans == 1
    assert "missing_model" in resp.partial_success.error_message
    raw = channel.unary_unary(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.RpcError) as err:
        raw(b"\xff\xff\xff\xff garbage", timeout=10)
    assert err.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
    assert wait_rows(serve, 1, model="meta-llama/Llama-3.1-8B")[0]["source"] == "vllm"
    channel.close()


def test_every_acknowledged_span_survives_sigterm_and_restart(tmp_path: Path) -> None:
    store = tmp_path / "durable.duckdb"
    s = start_serve(tmp_path, store)
    acked: list[str] = []
    stop = threading.Event()
    errors: list[str] = []

    def sender() -> None:
        i = 0
        with httpx.Client(timeout=10) as client:
            while not stop.is_set() and i < 2000:
                body, ids = _protobuf_payload(50, "steady", T0 + i * 100_000)
                try:
                    r = client.post(s.otlp_http, content=body, headers=PB)
                except httpx.HTTPError:
                    return  # the server went away
                if r.status_code == 200:
                    acked.extend(ids)
                elif r.status_code != 503:
                    errors.append(f"{r.status_code} {r.text}")
                i += 1

    t = threading.Thread(target=sender)
    t.start()
    deadline = time.monotonic() + 30
    while len(acked) < 500 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert s.stop(signal.SIGTERM) == 0
    stop.set()
    t.join(30)
    assert not errors
    assert len(acked) >= 500
    with Store(store, read_only=True) as st, st.cursor() as cur:
        stored = {r[0] for r in cur.execute("SELECT trace_id FROM requests").fetchall()}
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged requests lost"

    again = start_serve(tmp_path, store)  # restart on the same store: data is there
    try:
        assert len(get_requests(again, model="steady", limit=100000)) >= len(set(acked))
    finally:
        again.stop()


def test_openapi_health_and_query_errors(serve: Served) -> None:
    spec = httpx.get(f"{serve.api}/openapi.json").json()
    assert "/api/v1/requests" in spec["paths"] and "/readyz" in spec["paths"]
    assert httpx.get(f"{serve.api}/readyz").json() == {"status": "ready"}
    r = httpx.get(f"{serve.api}/api/v1/requests", params={"since": "yesterday-ish"})
    assert r.status_code == 400 and "since" in r.json()["error"]
    r = httpx.get(f"{serve.api}/api/v1/requests", params={"limit": 0})
    assert r.status_code == 400 and "limit" in r.json()["error"]
    # the OTLP port serves only OTLP
    assert httpx.get(serve.otlp_http.replace("/v1/traces", "/healthz")).status_code == 404
