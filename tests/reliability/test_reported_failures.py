"""Each failure reported in issue 15 (items 2-5), replayed against a running service: the
exact input the tester sent, and what a user must see instead of a 500."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pyarrow as pa
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from spans import SpanFactory

from cotenant.app.service import Service
from cotenant.store.queries import request_count
from cotenant.store.schema import arrow_schema

from .conftest import healthy

PB = {"Content-Type": "application/x-protobuf"}
T0 = time.time_ns() - 60 * 1_000_000_000


def _export(svc: Service, msg: Any) -> tuple[int, ExportTraceServiceResponse]:
    assert svc.endpoints is not None and svc.endpoints.otlp_http
    r = httpx.post(svc.endpoints.otlp_http, content=msg.SerializeToString(), headers=PB)
    resp = ExportTraceServiceResponse()
    if r.status_code == 200:
        resp.ParseFromString(r.content)
    return r.status_code, resp


def _api(svc: Service) -> str:
    assert svc.endpoints is not None
    return svc.endpoints.api


def _ninety_nine_and(model: str, bad: dict[str, Any] | None = None) -> Any:
    f = SpanFactory()
    for i in range(99):
        f.ours(model, T0 + i * 1000, 5.0)
    f.ours(model, T0 + 100_000, 5.0, attrs=bad)
    return f.otlp()


@pytest.mark.parametrize(
    ("model", "spoil"),
    [
        ("batch-2-62", lambda m: None),  # the attribute is set below
        ("end-2-64", lambda m: setattr(_last(m), "end_time_unix_nano", 2**64 - 1)),
    ],
)
def test_one_out_of_range_span_is_rejected_alone_and_the_99_others_stored(
    live: Service, model: str, spoil: Any
) -> None:
    bad = {"cotenant.batch_size": 2**62} if model == "batch-2-62" else None
    msg = _ninety_nine_and(model, bad)
    spoil(msg)
    status, resp = _export(live, msg)
    assert status == 200
    assert resp.partial_success.rejected_spans == 1
    assert "out_of_range" in resp.partial_success.error_message
    live.writer.flush()
    assert request_count(live.store, model=model) == 99
    assert healthy(live)


def _last(msg: Any) -> Any:
    return msg.resource_spans[-1].scope_spans[-1].spans[-1]


def test_the_same_over_grpc_answers_ok_with_partial_success(live: Service) -> None:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    msg = _ninety_nine_and("grpc-2-62", {"cotenant.batch_size": 2**62})
    assert live.endpoints is not None and live.endpoints.otlp_grpc
    with grpc.insecure_channel(live.endpoints.otlp_grpc) as ch:
        resp = trace_service_pb2_grpc.TraceServiceStub(ch).Export(msg, timeout=30)
    assert resp.partial_success.rejected_spans == 1
    live.writer.flush()
    assert request_count(live.store, model="grpc-2-62") == 99


def test_a_non_finite_duration_is_refused_at_ingest(live: Service) -> None:
    f = SpanFactory()
    f.vllm(T0, 0.5, 0.1, 0.3, model="ttft-1e308", ttft_s=1e308)
    f.vllm(T0, 0.5, 0.1, 0.3, model="ttft-1e308")
    status, resp = _export(live, f.otlp())
    assert status == 200 and resp.partial_success.rejected_spans == 1
    assert "time_to_first_token" in resp.partial_success.error_message
    live.writer.flush()
    r = httpx.get(f"{_api(live)}/api/v1/requests", params={"since": "1h", "model": "ttft-1e308"})
    assert r.status_code == 200 and r.json()["count"] == 1


def test_a_stored_infinity_does_not_break_the_requests_api(live: Service) -> None:
    # a store written before ingest refused them may hold one: write it past the normalizer
    schema = arrow_schema("requests")
    row = {f.name: None for f in schema}
    row.update(
        ts_start_ns=T0,
        ts_end_ns=T0 + 1,
        latency_ms=0.0,
        trace_id="ab" * 16,
        span_id="cd" * 8,
        model="stored-inf",
        status="ok",
        source="ours",
        ttft_ms=float("inf"),
    )
    for c in schema.names:
        if c.endswith("_ms") and row[c] is None:
            row[c] = 0.0
    live.writer.submit("requests", pa.Table.from_pylist([row], schema=schema))
    live.writer.flush()
    for params in ({"since": "1h"}, {"since": "1h", "model": "stored-inf"}):
        r = httpx.get(f"{_api(live)}/api/v1/requests", params=params)
        assert r.status_code == 200, r.text
    assert r.json()["requests"][0]["ttft_ms"] is None


DEEP = b"[" * 100_000 + b"]" * 100_000


def test_deeply_nested_json_is_a_400_on_otlp_and_alerts(live: Service) -> None:
    assert live.endpoints is not None and live.endpoints.otlp_http
    r = httpx.post(
        live.endpoints.otlp_http,
        content=b'{"resourceSpans":' + DEEP + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "nested" in r.json()["message"]
    r = httpx.post(f"{_api(live)}/api/v1/alerts", content=b'{"version":"4","alerts":' + DEEP + b"}")
    assert r.status_code == 400 and "nested" in r.json()["error"]
    # and in attribute values (kvlist in kvlist …), which protobuf's JSON parser recurses into
    n = 5000
    value = '{"kvlistValue":{"values":[{"key":"k","value":' * n + '{"stringValue":"x"}'
    value += "}]}}" * n
    body = (
        '{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"'
        + "ab" * 16
        + '","spanId":"'
        + "cd" * 8
        + '","name":"x","attributes":[{"key":"deep","value":'
        + value
        + "}]}]}]}]}"
    )
    r = httpx.post(
        live.endpoints.otlp_http,
        content=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert healthy(live)


def test_a_report_for_year_zero_is_a_400(live: Service) -> None:
    for week in ("0000-W01", "9999-W01", "2262-W20"):
        r = httpx.get(f"{_api(live)}/api/v1/reports/{week}/summary")
        assert r.status_code == 400 and "out of range" in r.json()["error"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","start":NaN}',
        b'{"model":"m","start":Infinity}',
        b'{"model":"\\ud800"}',
        b'{"model":"\\ud800","start":-Infinity,"\\udfff":1}',
    ],
)
def test_diagnose_with_nan_or_a_lone_surrogate_is_a_422_naming_the_field(
    live: Service, body: bytes
) -> None:
    r = httpx.post(
        f"{_api(live)}/api/v1/diagnose", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith("body.start")


def test_diagnose_with_a_date_out_of_range_is_a_400(live: Service) -> None:
    for start in ("9999-01-01T00:00:00Z", "1677-06-01", "2262-06-01", "0001-01-01T00:00:00+01:00"):
        r = httpx.post(f"{_api(live)}/api/v1/diagnose", json={"model": "m", "start": start})
        assert r.status_code == 400 and "start" in r.json()["error"], (start, r.text)


@pytest.mark.parametrize("year", ["9999", "0001", "1677", "2262"])
def test_an_alert_starting_out_of_range_is_a_400_naming_the_field(live: Service, year: str) -> None:
    body = {
        "version": "4",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "LatencyHigh", "model": "m"},
                "startsAt": f"{year}-06-01T00:00:00Z",
                "fingerprint": f"fp{year}",
            }
        ],
    }
    r = httpx.post(f"{_api(live)}/api/v1/alerts", json=body)
    assert r.status_code == 400 and "alerts[0].startsAt" in r.json()["error"]


def test_an_alert_label_with_a_lone_surrogate_is_a_400(live: Service) -> None:
    body = (
        b'{"version":"4","alerts":[{"status":"firing","labels":{"alertname":"x",'
        b'"model":"\\ud800"},"startsAt":"2026-01-01T00:00:00Z","fingerprint":"ab"}]}'
    )
    r = httpx.post(f"{_api(live)}/api/v1/alerts", content=body)
    assert r.status_code == 400 and "alerts[0].labels" in r.json()["error"]


@pytest.mark.parametrize(
    "path",
    [
        "/_dash-component-suites/../x",
        "/assets/../../../etc/passwd",
        "/assets/%2e%2e/%2e%2e/etc/passwd",
        "/_dash-component-suites/dash/../../cotenant/app/config.py",
    ],
)
def test_a_dashboard_asset_path_with_dot_dot_is_a_400(live: Service, path: str) -> None:
    status, body = _raw_get(live, path)
    assert status == 400 and "path" in json.loads(body)["error"]


def _raw_get(live: Service, path: str) -> tuple[int, bytes]:
    """GET ``path`` as written (HTTP clients normalise '.' and '..' away before sending)."""
    host, port = _api(live).removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    "path",
    [
        "/_dash-component-suites/./.",
        "/_dash-component-suites/nope/x.js",
        "/_dash-component-suites/dash/x",
    ],
)
def test_an_unknown_dashboard_script_is_a_404(live: Service, path: str) -> None:
    # found by the fuzzer: Dash raised DependencyException, answered 500
    status, body = _raw_get(live, path)
    assert status == 404 and "asset" in json.loads(body)["error"]


def test_otlp_json_partial_success_names_the_reason(live: Service) -> None:
    f = SpanFactory()
    f.ours("json-range", T0, 5.0)
    f.ours("json-range", T0 + 1, 5.0, attrs={"cotenant.priority": 2**40})
    body = json_format.MessageToJson(f.otlp())
    doc = json.loads(body)
    for rs in doc["resourceSpans"]:  # OTLP JSON: hex ids
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        import base64

                        sp[k] = base64.b64decode(sp[k]).hex()
    assert live.endpoints is not None and live.endpoints.otlp_http
    r = httpx.post(
        live.endpoints.otlp_http,
        content=json.dumps(doc).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200
    ps = r.json()["partialSuccess"]
    assert ps["rejectedSpans"] == "1" and "cotenant.priority" in ps["errorMessage"]
