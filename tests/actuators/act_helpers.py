"""Helpers for the actuator tests: request rows and incidents in a real DuckDB store, a fake
clock, the bundled gateway (its real control API) on its own event loop in a thread, and real
uvicorn servers in a thread for stand-in backends."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np
import pyarrow as pa
import uvicorn
from gateway_thread import RunningGateway

from cotenant.actuators.backends.gateway import GatewayBackend
from cotenant.actuators.backends.http import HttpCaller
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.gateway.settings import GatewaySettings
from cotenant.store.db import Store
from cotenant.store.schema import arrow_schema

S = 1_000_000_000
T0 = 1_700_000_000 * S
"""Origin of the tests' virtual time (ns)."""


def at(s: float, base: int = T0) -> int:
    return base + int(s * S)


def add_requests(
    store: Store,
    model: str,
    gpu: str,
    t0_s: float,
    t1_s: float,
    rps: float,
    latency_ms: float,
    base: int = T0,
) -> None:
    """``rps`` requests per second of ``model`` from ``t0_s`` to ``t1_s`` (test time), each
    taking ``latency_ms`` (all in compute)."""
    n = round((t1_s - t0_s) * rps)
    if n <= 0:
        return
    starts = np.array([at(t0_s + i / rps, base) for i in range(n)], dtype=np.int64)
    ends = starts + int(latency_ms * 1e6)
    schema = arrow_schema("requests")
    cols: dict[str, Any] = {c: pa.nulls(n, schema.field(c).type) for c in schema.names}
    cols.update(
        ts_start_ns=pa.array(starts),
        ts_end_ns=pa.array(ends),
        latency_ms=pa.array(np.full(n, latency_ms)),
        trace_id=pa.array([f"t{model}{i}{t0_s}" for i in range(n)]),
        span_id=pa.array([f"s{i}" for i in range(n)]),
        model=pa.array([model] * n),
        gpu=pa.array([gpu] * n),
        status=pa.array(["ok"] * n),
        source=pa.array(["test"] * n),
    )
    for c in PHASE_COLUMNS:
        cols[c] = pa.array(np.full(n, latency_ms if c == "compute_ms" else 0.0))
    tbl = pa.table([cols[c] for c in schema.names], schema=schema)  # noqa: F841 - read by SQL
    with store.cursor() as cur:
        cur.execute("INSERT INTO requests SELECT * FROM tbl")


def add_incident(
    store: Store,
    *,
    id: str = "inc-1",
    model: str = "tts",
    gpu: str = "gpu0",
    state: str = "open",
    start_s: float = 100.0,
    end_s: float = 130.0,
    slo_ms: float | None = 100.0,
    baseline_p99_ms: float = 40.0,
    peak_p99_ms: float = 300.0,
    causes: list[dict[str, Any]] | None = None,
    base: int = T0,
    severity: str = "breach",
    replica: str | None = None,
    siblings: list[dict[str, Any]] | None = None,
) -> None:
    causes = causes or [
        {"kind": "cotenant", "culprit": "sdxl", "share": 0.8, "confidence": 0.9, "evidence": {}}
    ]
    detail: dict[str, Any] = {"id": id, "model": model, "gpu": gpu, "causes": causes}
    if replica is not None:
        detail.update(replica=replica, siblings=siblings or [])
    top = causes[0]
    with store.cursor() as cur:
        cur.execute(
            "INSERT OR REPLACE INTO incidents VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                id,
                model,
                gpu,
                state,
                at(start_s, base),
                at(end_s, base),
                at(end_s, base),
                peak_p99_ms,
                baseline_p99_ms,
                slo_ms,
                top["kind"],
                top["culprit"],
                top["share"],
                json.dumps(detail),
                severity,
                replica,
                "e2e",
            ],
        )


class FakeClock:
    def __init__(self, s: float = 0.0) -> None:
        self.now = at(s)

    def __call__(self) -> int:
        return self.now

    def set(self, s: float) -> int:
        self.now = at(s)
        return self.now


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` (ASGI) with uvicorn on a free loopback port in a thread; yields its URL."""
    sock = free_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, access_log=False, lifespan="off", log_level="error")
    )
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()


GW_TOKEN = "gw-live-token-5e1d"
"""The bearer token of the gateways :class:`LiveGateway` starts."""


class LiveGateway(RunningGateway):
    """The bundled gateway (:class:`actuators.gateway.server.Gateway`, the code ``cotenant
    gateway`` runs) on its own event loop in a thread, both ports free loopback ones. The
    actuator drives its real control API (contract 4); tests read what it applied with
    ``GET /control/v1/state``. Its upstream is a port nobody listens on: these tests change
    limits and priorities, they send no model traffic."""

    def __init__(self) -> None:
        sock = free_socket()
        nobody = f"http://127.0.0.1:{sock.getsockname()[1]}"
        sock.close()
        super().__init__(
            GatewaySettings(
                upstream=f"nobody={nobody}",  # one replica, named "nobody"
                token=GW_TOKEN,
                listen=("127.0.0.1", 0),
                control=("127.0.0.1", 0),
            )
        )

    def backend(self, token: str = GW_TOKEN, **kw: Any) -> GatewayBackend:
        """The real gateway backend on this gateway's control API (fast retries)."""
        kw.setdefault("retries", 1)
        kw.setdefault("backoff_s", 0.01)
        http = HttpCaller(
            "gateway", self.control, headers={"Authorization": f"Bearer {token}"}, **kw
        )
        return GatewayBackend(http)

    def _call(self, method: str, path: str) -> Any:
        r = httpx.request(
            method,
            f"{self.control}{path}",
            headers={"Authorization": f"Bearer {GW_TOKEN}"},
            timeout=10,
        )
        r.raise_for_status()
        return r.json()

    def models(self) -> dict[str, dict[str, Any]]:
        """``GET /control/v1/state``'s models: what is applied, as the gateway has it."""
        return dict(self._call("GET", "/control/v1/state")["models"])

    def model(self, name: str) -> dict[str, Any]:
        """One model's ``rate_rps``, ``burst`` and ``priority`` (None when not set), and its
        route's ``weights`` and ``weights_set`` (as the gateway backend reports them)."""
        st = self._call("GET", "/control/v1/state")
        m = st["models"].get(name, {})
        own = st["routes"].get(name)
        route = own or st["routes"]["*"]
        return {
            **{k: m.get(k) for k in ("rate_rps", "burst", "priority")},
            "weights": route["weights"],
            "weights_set": bool(own and own["overridden"]),
        }

    def changed(self) -> dict[str, dict[str, Any]]:
        """Every model with a limit or a priority set."""
        return {
            name: m
            for name, m in self.models().items()
            if m["rate_rps"] is not None or m["priority"] is not None
        }

    def reset(self) -> None:
        """Remove every model's limit and priority through the control API."""
        for name in self.changed():
            self._call("DELETE", f"/control/v1/limits/{quote(name, safe='')}")
            self._call("DELETE", f"/control/v1/priority/{quote(name, safe='')}")


@contextlib.contextmanager
def live_gateway() -> Iterator[LiveGateway]:
    """A :class:`LiveGateway`, stopped on exit."""
    gw = LiveGateway()
    try:
        yield gw
    finally:
        gw.stop()
