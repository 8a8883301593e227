"""Overload and recovery: a stalled store under concurrent exports answers 200 or 503 with a
small whole-second ``Retry-After`` (never a 500, never a hang), keeps its memory bounds, and
once the store catches up every acknowledged request is there and the service is healthy."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from spans import SpanFactory

from cotenant.app.service import Service
from cotenant.collectors.otlp.admission import InflightBytes
from cotenant.core.errors import Overloaded
from cotenant.store.db import Store
from cotenant.store.queries import request_count

from .conftest import healthy, service

PB = {"Content-Type": "application/x-protobuf"}


class GatedStore(Store):
    """A real store whose writes wait while ``gate`` is clear: a stalled disk, on demand."""

    def __init__(self, path: Path) -> None:
        self.gate = threading.Event()
        self.gate.set()
        super().__init__(path)

    def cursor(self) -> Any:
        self.gate.wait(60)
        return super().cursor()


def test_the_inflight_budget_admits_one_export_of_any_size_and_refuses_past_it() -> None:
    budget = InflightBytes(1000, retry_after_s=2.0)
    with budget.hold(5000):  # alone: admitted, however large
        with pytest.raises(Overloaded) as err:
            budget.acquire(1)
        assert err.value.retry_after_s == 2.0
    with budget.hold(600), budget.hold(400):
        assert budget.held == 1000
        with pytest.raises(Overloaded):
            budget.acquire(1)
    assert budget.held == 0


def test_an_export_of_undeclared_length_takes_its_share_chunk_by_chunk() -> None:
    budget = InflightBytes(1000, retry_after_s=1.0)
    with budget.hold(0) as alone:
        alone.grow(5000)  # alone: never refused
    with budget.hold(600), budget.hold(0) as chunked:
        chunked.grow(300)
        with pytest.raises(Overloaded):
            chunked.grow(200)
        assert budget.held == 900
    assert budget.held == 0


def test_a_chunked_otlp_export_is_stored(live: Service) -> None:
    f = SpanFactory()
    for i in range(30):
        f.ours("chunked", time.time_ns() - 10**9 + i, 2.0)
    body = f.otlp().SerializeToString()
    assert live.endpoints is not None and live.endpoints.otlp_http

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 100):
            yield body[i : i + 100]

    r = httpx.post(live.endpoints.otlp_http, content=chunks(), headers=PB)
    assert r.status_code == 200
    live.writer.flush()
    assert request_count(live.store, model="chunked") == 30


@pytest.mark.parametrize("length", ["\u00b2", "9" * 5000, "-1", "1e3", "12abc"])
def test_an_odd_content_length_is_never_a_500(live: Service, length: str) -> None:
    assert live.endpoints is not None and live.endpoints.otlp_http
    host, port = live.endpoints.otlp_http.removeprefix("http://").split("/")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        head = (
            f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
        )
        s.sendall(head.encode("latin-1"))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 4") or data == b"", data[:200]
    assert healthy(live)


@pytest.mark.timeout(180)
def test_a_flood_on_a_stalled_store_gets_503s_then_everything_acked_is_stored(
    tmp_path: Path,
) -> None:
    store = GatedStore(tmp_path / "s.duckdb")
    svc = service(
        Path(store.path),
        {
            "COTENANT_STORE_QUEUE_MAX_ROWS": "400",
            "COTENANT_OTLP_MAX_INFLIGHT_BYTES": "60000",
            "COTENANT_STORE_ACK_TIMEOUT_S": "30",
            "COTENANT_DASHBOARD_ENABLED": "false",
            "COTENANT_ANALYSIS_ENABLED": "false",
        },
        store,
    )
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(60) and svc.endpoints is not None and svc.endpoints.otlp_http
    url = svc.endpoints.otlp_http
    bodies = []
    f = SpanFactory()
    t0 = time.time_ns() - 10**10
    for b in range(24):
        for i in range(100):
            f.ours("flood", t0 + (b * 100 + i) * 1000, 3.0, [("compute", 0.5, 2.5)])
        bodies.append(f.otlp().SerializeToString())

    statuses: list[int] = []
    hints: list[str] = []
    acked = [0]
    lock = threading.Lock()

    def client(mine: list[bytes]) -> None:
        with httpx.Client(timeout=60) as c:
            for body in mine:
                for _ in range(200):  # bounded retries, as an exporter's
                    r = c.post(url, content=body, headers=PB)
                    with lock:
                        statuses.append(r.status_code)
                    if r.status_code == 200:
                        with lock:
                            acked[0] += 100
                        break
                    with lock:
                        hints.append(r.headers.get("retry-after", ""))
                    time.sleep(0.05)

    store.gate.clear()  # the disk stalls
    clients = [threading.Thread(target=client, args=(bodies[i::6],)) for i in range(6)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(hints) < 5:
        time.sleep(0.05)
    ready = httpx.get(f"{svc.endpoints.api}/readyz", timeout=10)
    assert httpx.get(f"{svc.endpoints.api}/healthz", timeout=10).status_code == 200
    assert svc.pipeline.inflight_bytes <= 60000 + max(len(b) for b in bodies)
    store.gate.set()  # it catches up
    for c in clients:
        c.join(120)
    try:
        assert set(statuses) <= {200, 503}, sorted(set(statuses))
        assert 503 in statuses and hints and all(h.isdigit() and 1 <= int(h) <= 300 for h in hints)
        assert ready.status_code in (200, 503)
        assert acked[0] == 2400  # every export was acknowledged in the end
        assert request_count(store, model="flood") == 2400
        assert healthy(svc)
        # every hold released; the queue drains a moment after the last ack (the writer
        # settles receipts before it clears its in-flight count, and samples from procfs and
        # NVML wait up to store.flush_interval_s): poll
        deadline = time.monotonic() + 30
        while True:
            text = httpx.get(f"{svc.endpoints.api}/metrics", timeout=10).text
            drained = "cotenant_store_queue_bytes 0.0" in text
            if drained or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert "cotenant_otlp_inflight_bytes 0.0" in text
        assert drained, [x for x in text.splitlines() if "queue_bytes" in x]
    finally:
        svc.stop()
        t.join(60)
