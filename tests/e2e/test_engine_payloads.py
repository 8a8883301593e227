"""The real engines' bodies (tests/fixtures/engines) posted to a running ``cotenant serve``
exactly as the engines sent them: tritonserver's OTLP/JSON (its C++ exporter cannot send
protobuf over HTTP), pytriton's and Ray Serve's protobuf."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import Served, start_serve
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

FIXTURES = Path(__file__).parents[1] / "fixtures" / "engines"
TYPES = {".json": "application/json", ".pb": "application/x-protobuf"}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    # the recorded spans are from December 2026: keep them past the default 24 h retention
    s = start_serve(tmp_path, tmp_path / "s.duckdb", {"COTENANT_STORE_RAW_RETENTION_H": "1e6"})
    yield s
    s.stop()


def post(s: Served, path: Path, content: bytes | None = None) -> httpx.Response:
    return httpx.post(
        s.otlp_http,
        content=path.read_bytes() if content is None else content,
        headers={"Content-Type": TYPES[path.suffix]},
        timeout=10,
    )


def rows_of(s: Served, model: str, n: int) -> list[dict]:
    deadline = time.monotonic() + 20
    rows: list[dict] = []
    while time.monotonic() < deadline:
        r = httpx.get(f"{s.api}/api/v1/requests", params={"model": model, "limit": 100}, timeout=10)
        assert r.status_code == 200, r.text
        rows = r.json()["requests"]
        if len(rows) >= n:
            break
        time.sleep(0.1)
    return rows


def status_message(resp: httpx.Response) -> str:
    st = status_pb2.Status()
    json_format.Parse(resp.text, st)
    return st.message


def test_every_engine_body_is_accepted_and_lands_its_requests(served: Served) -> None:
    for engine in ("triton-2.51.0", "pytriton-0.7.0", "rayserve-2.60.0/process-detector"):
        for path in sorted((FIXTURES / engine).glob("v1_traces_*")):
            resp = post(served, path)
            assert resp.status_code == 200, (path.name, resp.text)
            assert resp.headers["content-type"] == TYPES[path.suffix]
            if path.suffix == ".json":
                assert resp.json() == {}  # no partial_success: every span accepted
    triton = rows_of(served, "matmul", 11)
    assert len(triton) == 11 and {r["source"] for r in triton} == {"triton"}
    assert "0af7651916cd43dd8448eb211c80319c" in {r["trace_id"] for r in triton}
    assert all(r["compute_ms"] > 0 and r["queue_ms"] > 0 for r in triton)
    ray = rows_of(served, "mm/MatMul", 3)
    assert len(ray) == 3
    assert {(r["source"], r["replica"], r["pid"]) for r in ray} == {("rayserve", "scp6oo7i", 14621)}


def test_a_broken_triton_body_gets_a_400_that_says_what_is_wrong(served: Served) -> None:
    path = FIXTURES / "triton-2.51.0" / "v1_traces_0002.json"
    raw = path.read_bytes()
    resp = post(served, path, raw[: len(raw) // 2])
    assert resp.status_code == 400 and "not valid JSON" in status_message(resp)

    # ids base64-encoded, as protobuf's own JSON mapping would write them: OTLP/JSON says hex
    doc = json.loads(raw)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["traceId"] = base64.b64encode(bytes.fromhex(span["traceId"])).decode()
    resp = post(served, path, json.dumps(doc).encode())
    msg = status_message(resp)
    assert resp.status_code == 400
    assert "resourceSpans[0].scopeSpans[0].spans[0].traceId is not hex" in msg

    # nothing of the refused bodies was stored; the intact one still goes through
    assert post(served, path).status_code == 200
    assert len(rows_of(served, "matmul", 1)) == 1


RAY_PD = FIXTURES / "rayserve-2.60.0" / "process-detector"
# one request, one span per body: the route span and the proxy's root (proxy process), the
# replica's span (replica process, pid 14621, replica scp6oo7i)
ROUTE, REPLICA, ROOT = (RAY_PD / f"v1_traces_000{n}.pb" for n in (1, 2, 3))


def test_a_ray_root_sent_before_its_replica_span_still_gets_the_replica(served: Served) -> None:
    # the arrival order two BatchSpanProcessors (proxy, replica) often give
    for body in (ROUTE, ROOT):
        assert post(served, body).status_code == 200
    # the root waits for the replica's span (normalized before the export was answered)
    metrics = httpx.get(f"{served.api}/metrics", timeout=10).text
    assert "cotenant_otlp_waiting_root_spans 1.0" in metrics.splitlines()
    assert post(served, REPLICA).status_code == 200
    [row] = rows_of(served, "mm/MatMul", 1)
    assert (row["pid"], row["replica"]) == (14621, "scp6oo7i")
    assert row["queue_ms"] > 0 and row["compute_ms"] > 0


def test_a_ray_root_still_waiting_at_shutdown_is_written(tmp_path: Path) -> None:
    env = {"COTENANT_STORE_RAW_RETENTION_H": "1e6"}
    s = start_serve(tmp_path, tmp_path / "s.duckdb", env)
    try:
        for body in (ROUTE, ROOT):
            assert post(s, body).status_code == 200
    finally:
        assert s.stop() == 0
    s = start_serve(tmp_path, tmp_path / "s.duckdb", env)
    try:
        [row] = rows_of(s, "mm/MatMul", 1)
        assert row["pid"] is None and row["latency_ms"] > 0
    finally:
        s.stop()


def test_vllm_bodies_land_their_requests_and_a_nameless_model_is_refused_by_name(
    served: Served,
) -> None:
    for path in sorted((FIXTURES / "vllm-0.32.0").glob("v1_traces_*")):
        resp = post(served, path)
        assert resp.status_code == 200, (path.name, resp.text)
        answer = ExportTraceServiceResponse.FromString(resp.content)
        assert answer.partial_success.rejected_spans == 0, path.name
    rows = rows_of(served, "tiny", 17)
    assert len(rows) == 17
    assert {(r["source"], r["pid"]) for r in rows} == {("vllm", 26412)}
    assert all(r["ttft_ms"] > 0 and r["output_tokens"] > 0 for r in rows)
    # vLLM's default resource (no OTEL_SERVICE_NAME): the client is told what is missing
    rejected = 0
    for path in sorted((FIXTURES / "vllm-0.32.0" / "default").glob("v1_traces_*")):
        resp = post(served, path)
        assert resp.status_code == 200
        partial = ExportTraceServiceResponse.FromString(resp.content).partial_success
        rejected += partial.rejected_spans
        if partial.rejected_spans:
            assert "names no model" in partial.error_message, partial.error_message
    assert rejected == 3
