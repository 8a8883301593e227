"""Faults of what cotenant depends on: every actuator backend against an upstream that is
down, answers garbage, closes mid-body, stalls or errs (only ``BackendError``, within its
timeout: never another exception into the control loop); and a running service whose NVML
loses a GPU, loses its driver and recovers while spans keep arriving (ingest unaffected, the
service healthy, GPU samples again after recovery)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from spans import SpanFactory

from cotenant.actuators.backend import Backend, Change
from cotenant.actuators.backends.gateway import GatewayBackend
from cotenant.actuators.backends.http import HttpCaller
from cotenant.actuators.backends.rayserve import RayServeBackend
from cotenant.actuators.backends.triton import TritonBackend
from cotenant.actuators.backends.webhook import WebhookBackend
from cotenant.app.service import Service
from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.core.errors import BackendError
from cotenant.store.queries import request_count

from .conftest import healthy, service

# -- actuator backends against a faulty upstream ---------------------------------------------

FAULTS: dict[str, bytes | None] = {
    "garbage": b"\x00\x01not http at all\r\n\r\n",
    "closed_mid_body": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n"
        b'{"models": {"sdxl": '
    ),
    "not_json": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\n<html>hi<",
    "wrong_json": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n"
        b"Connection: close\r\n\r\n[1, 2, 3, NaN]"
    ),
    "server_error": b"HTTP/1.1 500 Oops\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    "slow": None,  # accepts, reads, never answers
}


@contextmanager
def faulty_upstream(answer: bytes | None) -> Iterator[str]:
    """A loopback server that answers every connection with ``answer`` (then closes), or
    with nothing at all (``None``: held open until the test ends)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.settimeout(1.0)
            with suppress(OSError):
                conn.recv(65536)
            if answer is None:
                held.append(conn)
                continue
            with suppress(OSError):
                conn.sendall(answer)
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()


def _down_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()  # nothing listens there now
    return url


BACKENDS: dict[str, Callable[[HttpCaller], Backend]] = {
    "gateway": GatewayBackend,
    "rayserve": RayServeBackend,
    "triton": TritonBackend,
    "webhook": lambda http: WebhookBackend(http, "s3cret"),
}
CALLS: dict[str, Callable[[Backend], Any]] = {
    "current": lambda b: b.current("sdxl"),
    "apply": lambda b: b.apply(Change("rate_limit", "sdxl", {"rate_rps": 2.0, "burst": 2})),
    "revert": lambda b: b.revert("sdxl", {"rate_rps": None, "burst": None, "priority": None}),
}


@pytest.mark.parametrize("fault", [*FAULTS, "down"])
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_faulty_upstream_is_only_ever_a_backend_error(kind: str, fault: str) -> None:
    def check(url: str) -> None:
        backend = BACKENDS[kind](HttpCaller(kind, url, timeout_s=0.5, retries=0))
        for name, call in CALLS.items():
            t0 = time.monotonic()
            try:
                call(backend)
            except BackendError as exc:
                assert url in str(exc) or kind in str(exc), (name, str(exc))
            else:  # a backend may have nothing to do for a call (e.g. webhook's current)
                assert fault not in ("down", "garbage", "closed_mid_body", "slow") or (
                    name == "current" and kind == "webhook"
                ), f"{kind}.{name} succeeded against a {fault} upstream"
            assert time.monotonic() - t0 < 30  # bounded: never hangs the control loop

    if fault == "down":
        check(_down_url())
    else:
        with faulty_upstream(FAULTS[fault]) as url:
            check(url)


# -- NVML faults in a running service ---------------------------------------------------------


def _gpu_rows(svc: Service) -> int:
    with svc.store.cursor() as cur:
        row = cur.execute("SELECT count(*) FROM gpu_samples").fetchone()
    return int(row[0]) if row else 0


def _wait(cond: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(180)
def test_nvml_faults_do_not_touch_ingest_and_samples_resume(tmp_path: Path) -> None:
    fake = FakeNvml()
    fake.model.add_gpu()
    fake.model.add_gpu()
    svc = service(
        tmp_path / "s.duckdb",
        {
            "COTENANT_NVML_ENABLED": "true",
            "COTENANT_NVML_POLL_INTERVAL_S": "0.05",
            "COTENANT_NVML_PROCESS_INTERVAL_S": "0.05",
            "COTENANT_NVML_BACKOFF_MAX_S": "0.2",
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.05",
            "COTENANT_DASHBOARD_ENABLED": "false",
            "COTENANT_ANALYSIS_ENABLED": "false",
        },
        nvml=fake,
    )
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    try:
        assert svc.started.wait(60) and svc.endpoints is not None and svc.endpoints.otlp_http
        url, f = svc.endpoints.otlp_http, SpanFactory()
        sent = 0

        def export() -> None:
            nonlocal sent
            for i in range(10):
                f.ours("nvml-faults", time.time_ns() - 10**9 + i, 2.0)
            r = httpx.post(
                url,
                content=f.otlp().SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
                timeout=30,
            )
            assert r.status_code == 200
            sent += 10

        _wait(lambda: _gpu_rows(svc) > 0, "the first GPU samples")
        fake.model.lose_gpu(0)  # falls off the bus
        fake.model.set_unsupported(1, "pcie_throughput")  # a counter this GPU does not have
        export()
        fake.model.unload_driver()  # every call fails, nvmlInit included
        export()
        assert healthy(svc)
        metrics = httpx.get(f"{svc.endpoints.api}/metrics", timeout=10)
        assert metrics.status_code == 200
        fake.model.load_driver()
        fake.model.recover_gpu(0)
        svc.writer.flush()
        before = _gpu_rows(svc)
        _wait(lambda: (svc.writer.flush(), _gpu_rows(svc))[1] > before + 2, "samples again")
        export()
        assert request_count(svc.store, model="nvml-faults") == sent
        assert healthy(svc)
    finally:
        svc.stop()
        t.join(60)
