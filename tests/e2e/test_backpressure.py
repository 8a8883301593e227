"""Queue full: the real SDK exporters get 503/UNAVAILABLE with a retry hint, back off, and
deliver everything once the store catches up."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.trace.export import SpanExportResult
from spans import SpanFactory

from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.store.db import Store
from cotenant.store.queries import request_count


class GatedStore(Store):
    """A real store whose writes wait while ``gate`` is clear: a stalled disk, on demand."""

    def __init__(self, path: Path) -> None:
        self.gate = threading.Event()
        self.gate.set()
        super().__init__(path)

    def cursor(self) -> Any:
        self.gate.wait(60)
        return super().cursor()


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[tuple[Service, GatedStore]]:
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_PORT": "0",
            "COTENANT_STORE_QUEUE_MAX_ROWS": "100",
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.05",
            "COTENANT_OTLP_RETRY_AFTER_S": "1",
            # the queue filling up is what is tested: acknowledge once queued
            "COTENANT_STORE_ACK": "queued",
            # and only the exports fill it (a host CPU sample queued while the store stalls
            # made "an empty queue" a full one in a CI run)
            "COTENANT_PROCFS_ENABLED": "false",
            "COTENANT_NVML_ENABLED": "false",
        }
    )
    store = GatedStore(tmp_path / "s.duckdb")
    svc = Service(dataclasses.replace(cfg), store=store)
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(30)
    yield svc, store
    store.gate.set()
    svc.stop()
    t.join(60)


def _overloaded(svc: Service, protocol: str) -> float:
    assert svc.endpoints is not None
    text = httpx.get(f"{svc.endpoints.api}/metrics").text
    key = f'cotenant_otlp_exports_total{{outcome="overloaded",protocol="{protocol}"}} '
    return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(key))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_exporter_backs_off_on_a_full_queue_and_delivers_everything(
    stalled: tuple[Service, GatedStore], protocol: str
) -> None:
    svc, store = stalled
    ep = svc.endpoints
    assert ep is not None and ep.otlp_http and ep.otlp_grpc
    exporter: Any = (
        HttpExporter(endpoint=ep.otlp_http, timeout=30)
        if protocol == "http"
        else GrpcExporter(endpoint=ep.otlp_grpc, insecure=True, timeout=30)
    )
    f = SpanFactory()
    t0 = time.time_ns()
    batches = []
    for b in range(3):
        for i in range(60):
            f.ours(f"m-{protocol}", t0 + (b * 60 + i) * 1000, 5.0)
        batches.append(f.take())

    store.gate.clear()  # the store stalls: the queue (100 rows) fills with the first batch
    results: list[SpanExportResult] = []

    def send() -> None:
        results.extend(exporter.export(batch) for batch in batches)

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 30
    while _overloaded(svc, protocol) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _overloaded(svc, protocol) >= 1, "the full queue was never reported"
    ready = httpx.get(f"{ep.api}/readyz")
    store.gate.set()  # the store catches up; the exporter's retry now succeeds
    sender.join(60)
    exporter.shutdown()
    assert results == [SpanExportResult.SUCCESS] * 3
    assert svc.writer.flush(30)
    assert request_count(store, model=f"m-{protocol}") == 180
    assert ready.status_code in (200, 503)  # answered while stalled, never hung


def _payload(n: int) -> Any:
    f = SpanFactory()
    t0 = time.time_ns()
    for i in range(n):
        f.ours("m", t0 + i, 1.0)
    return f.otlp()


def test_http_answer_carries_retry_after(stalled: tuple[Service, GatedStore]) -> None:
    svc, store = stalled
    ep = svc.endpoints
    assert ep is not None and ep.otlp_http
    pb = {"Content-Type": "application/x-protobuf"}
    assert svc.writer.flush(30)  # the queue is empty
    store.gate.clear()
    # an empty queue takes even an export larger than the queue ...
    first = httpx.post(ep.otlp_http, content=_payload(150).SerializeToString(), headers=pb)
    assert first.status_code == 200
    # ... and then refuses more until the store catches up
    r = httpx.post(ep.otlp_http, content=_payload(10).SerializeToString(), headers=pb)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert "queue full" in r.content.decode(errors="replace")
    store.gate.set()
    assert svc.writer.flush(30)
    assert (
        httpx.post(ep.otlp_http, content=_payload(10).SerializeToString(), headers=pb).status_code
        == 200
    )


def test_grpc_answer_carries_retry_info(stalled: tuple[Service, GatedStore]) -> None:
    from google.rpc import error_details_pb2
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    svc, store = stalled
    assert svc.endpoints is not None and svc.endpoints.otlp_grpc
    assert svc.writer.flush(30)  # the queue is empty
    store.gate.clear()
    with grpc.insecure_channel(svc.endpoints.otlp_grpc) as ch:
        stub = trace_service_pb2_grpc.TraceServiceStub(ch)
        stub.Export(_payload(150), timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            stub.Export(_payload(10), timeout=10)
    store.gate.set()
    assert err.value.code() is grpc.StatusCode.UNAVAILABLE
    md = dict(err.value.trailing_metadata())
    info = error_details_pb2.RetryInfo()
    info.ParseFromString(md["google.rpc.retryinfo-bin"])
    assert info.retry_delay.seconds == 1
