"""The gateway against faulty upstreams and faulty clients, over real loopback sockets.

Upstream: down (connection refused), silent past ``--read-timeout``, answering garbage or an
endless head, closing before its answer or in the middle of its body. Clients: slow headers,
slow body, a client that never reads a large answer, and connections over the caps. Each ends
in the status docs/reliability.md documents; afterwards the gateway answers a normal request,
holds no client or upstream connection, no task and no slot of what the fault used, and what
it buffered stayed bounded.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_thread import RunningGateway

from cotenant.gateway.identify import parse_source
from cotenant.gateway.proxy import ClientConnection
from cotenant.gateway.request_parser import PARSERS, ParserKind
from cotenant.gateway.routing_config import ReplicaSpec, RouteSpec, RoutingSpec
from cotenant.gateway.settings import GatewaySettings

from .faulty_upstream import BIG, FaultyUpstream


def _socket_buffers_max() -> int:
    """The most the kernel buffers on one loopback TCP path: one receive buffer and two send
    buffers at their autotuning maxima (net.ipv4.tcp_rmem / tcp_wmem)."""
    rmem = int(Path("/proc/sys/net/ipv4/tcp_rmem").read_text().split()[2])
    wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return rmem + 2 * wmem


class FaultGateway(RunningGateway):
    """A running gateway that remembers how many tasks its loop had once started."""

    baseline_tasks = 0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultyUpstream]:
    up = FaultyUpstream()
    yield up
    up.close()


@pytest.fixture
def start(upstream: FaultyUpstream) -> Iterator[Callable[..., FaultGateway]]:
    """A gateway in front of the faulty upstream (replica ``up``) and of a closed port
    (replica ``down``, weight 0: only model ``down`` goes there); short timeouts."""
    running: list[FaultGateway] = []

    def run(**kw: Any) -> FaultGateway:
        base = GatewaySettings(
            upstream=upstream.url,
            token="fault-token",
            listen=("127.0.0.1", 0),
            control=("127.0.0.1", 0),
            model_from=parse_source("header:X-Model", "-"),
            read_timeout_s=0.5,
            connect_timeout_s=2.0,
            idle_timeout_s=0.5,
            routing=RoutingSpec(
                replicas=(
                    ReplicaSpec("up", upstream.url),
                    ReplicaSpec("down", f"http://127.0.0.1:{_closed_port()}", weight=0),
                ),
                routes={"down": RouteSpec({"down": 1})},
                eject_after=0,  # every fault is seen as it is, not as an ejected replica
            ),
        )
        gw = FaultGateway(replace(base, **kw))
        running.append(gw)
        gw.baseline_tasks = _tasks(gw)
        return gw

    yield run
    for gw in running:
        gw.stop()


def _tasks(gw: FaultGateway) -> int:
    return int(gw.call(lambda: len(asyncio.all_tasks())))


def _leftovers(gw: FaultGateway) -> dict[str, int]:
    """What the gateway still holds: client connections, connection counts, requests in
    flight or queued, upstream connections idle in a pool, tasks beyond those at start."""

    def read() -> dict[str, int]:
        core = gw.gateway._core
        assert core is not None and core.caps is not None
        caps = core.caps
        adm = gw.gateway.admission
        pools = [r.pool for r in gw.gateway.router.replicas.values() if r.pool is not None]
        return {
            "client_connections": len(core.connections),
            "counted_connections": caps.total + sum(caps.per_client.values()),
            "in_flight": adm.in_flight,
            "queued": adm.queued,
            "closed_idle_upstream": sum(1 for p in pools for c in p._idle if c.closed),
            "extra_tasks": len(asyncio.all_tasks()) - gw.baseline_tasks,
        }

    return dict(gw.call(read))


def assert_healthy_and_clean(gw: FaultGateway) -> None:
    """A normal request succeeds, then nothing of the fault is left behind."""
    r = httpx.get(f"{gw.url}/ok", headers={"X-Model": "m"}, timeout=10)
    assert r.status_code == 200 and r.json() == {"ok": True}
    deadline = time.monotonic() + 10
    while (left := _leftovers(gw)) != dict.fromkeys(left, 0):
        assert time.monotonic() < deadline, f"left behind: {left}"
        time.sleep(0.02)


def _metrics(gw: RunningGateway) -> str:
    return httpx.get(f"{gw.control}/metrics", timeout=10).text


# -- upstream faults --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "model", "status", "error", "kind"),
    [
        ("/ok", "down", 502, "cannot connect to upstream", "connect"),
        ("/silent", "m", 504, "upstream sent nothing for 0.5 s", "timeout"),
        ("/garbage", "m", 502, "invalid upstream response", "protocol"),
        ("/endless-head", "m", 502, "head larger than 65536 bytes", "protocol"),
        ("/close-before-head", "m", 502, "upstream closed the connection", "reset"),
    ],
    ids=["down", "silent", "garbage", "endless-head", "close-before-head"],
)
def test_an_upstream_fault_before_the_answer_is_a_502_or_504(
    start: Callable[..., FaultGateway],
    path: str,
    model: str,
    status: int,
    error: str,
    kind: str,
) -> None:
    gw = start()
    r = httpx.post(f"{gw.url}{path}", headers={"X-Model": model}, json={"x": 1}, timeout=10)
    assert r.status_code == status and error in r.json()["error"], r.text
    assert f'cotenant_gateway_upstream_errors_total{{kind="{kind}"}} 1.0' in _metrics(gw)
    assert_healthy_and_clean(gw)


@pytest.mark.parametrize("path", ["/close-mid-body", "/close-mid-chunked"])
def test_an_upstream_closing_mid_body_cuts_the_answer_short_visibly(
    start: Callable[..., FaultGateway], path: str
) -> None:
    gw = start()
    # the head (200) was already passed on: the client sees the body end early and the
    # connection close, never a complete-looking answer
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"{gw.url}{path}", headers={"X-Model": "m"}, timeout=10)
    assert 'cotenant_gateway_upstream_errors_total{kind="reset"} 1.0' in _metrics(gw)
    assert_healthy_and_clean(gw)


# -- client faults ----------------------------------------------------------------------------


def _connect(gw: RunningGateway) -> socket.socket:
    host, port = gw.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_all(s: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize(
    "first",
    [
        b"POST /ok HTTP/1.1\r\nX-Model: m\r\nX-Slow: ",  # slow headers
        b'POST /ok HTTP/1.1\r\nX-Model: m\r\nContent-Length: 100\r\n\r\n{"a":',  # slow body
        b"POST /ok HTTP/1.1\r\nX-Model: m\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nab",
    ],
    ids=["slow-headers", "slow-body", "slow-chunked-body"],
)
def test_a_slow_client_gets_408_within_the_idle_timeout(
    start: Callable[..., FaultGateway], parser: ParserKind, first: bytes
) -> None:
    gw = start(http_parser=parser)
    with _connect(gw) as s:
        s.sendall(first)
        t0 = time.monotonic()
        # a byte every 0.1 s keeps it alive no longer than the idle timeout (0.5 s)
        while time.monotonic() - t0 < 5:
            try:
                s.sendall(b"a")
            except OSError:
                break
            time.sleep(0.1)
            s.settimeout(0.01)
            try:
                peek = s.recv(1, socket.MSG_PEEK)
            except TimeoutError:
                continue
            if peek:
                break
        s.settimeout(10)
        reply = _read_all(s)
        elapsed = time.monotonic() - t0
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    assert b"connection: close" in reply.lower()
    # the idle timeout is 0.5 s; the bound leaves a loaded machine room to schedule the
    # gateway, and is still well short of the 5 s the trickle would otherwise keep it open
    assert elapsed < 4
    assert 'cotenant_gateway_requests_total{code="408",model="unknown"} 1.0' in _metrics(gw)
    assert_healthy_and_clean(gw)


def test_a_client_that_never_reads_holds_bounded_memory_and_is_dropped(
    start: Callable[..., FaultGateway], upstream: FaultyUpstream
) -> None:
    gw = start()
    sent0 = upstream.sent
    with _connect(gw) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(b"GET /big HTTP/1.1\r\nX-Model: m\r\n\r\n")
        # backpressure: the gateway stops reading the upstream once its client buffer is
        # full, so the upstream stalls too; then, silent past --read-timeout, it is dropped

        def buffered() -> int:
            core = gw.gateway._core
            assert core is not None
            return sum(
                c.transport.get_write_buffer_size()
                for c in core.connections
                if isinstance(c, ClientConnection) and c.transport is not None
            )

        core = gw.gateway._core
        assert core is not None
        peak = 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            peak = max(peak, gw.call(buffered))
            if not gw.call(lambda: len(core.connections)):
                break
            time.sleep(0.05)
        else:
            pytest.fail("a client that never reads was never dropped")
    moved = upstream.sent - sent0
    # what left the upstream sits in kernel socket buffers (the upstream's send buffer, the
    # gateway's receive and send buffers, the client's receive buffer) plus the gateway's own
    # buffer: bounded by the kernel's maxima, never the 256 MiB answer
    assert moved < min(BIG // 2, _socket_buffers_max() + 8 * 1024 * 1024), moved
    assert peak < 4 * 1024 * 1024, peak
    assert 'cotenant_gateway_upstream_errors_total{kind="timeout"} 1.0' in _metrics(gw)
    assert_healthy_and_clean(gw)


# -- connection caps --------------------------------------------------------------------------


def test_connections_over_the_caps_get_503_and_are_counted(
    start: Callable[..., FaultGateway],
) -> None:
    gw = start(max_connections_per_client=3, max_connections=5, idle_timeout_s=30.0)
    held = [_connect(gw) for _ in range(3)]
    try:
        for s in held:  # each is served
            s.sendall(b"GET /ok HTTP/1.1\r\nX-Model: m\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
        with _connect(gw) as extra:
            extra.sendall(b"GET /ok HTTP/1.1\r\nX-Model: m\r\n\r\n")
            reply = _read_all(extra)
        assert reply.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1\r\n" in reply
        assert b"too many connections per client" in reply
        # from another address on loopback (127.0.0.2): its own per-client count, but the
        # total cap (5) still holds
        host, port = gw.url.removeprefix("http://").split(":")
        others = []
        for _ in range(3):
            s = socket.create_connection(
                (host, int(port)), timeout=10, source_address=("127.0.0.2", 0)
            )
            others.append(s)
        held += others
        for s in others[:2]:
            s.sendall(b"GET /ok HTTP/1.1\r\nX-Model: m\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200 ")
        others[2].sendall(b"GET /ok HTTP/1.1\r\nX-Model: m\r\n\r\n")
        reply = _read_all(others[2])
        assert reply.startswith(b"HTTP/1.1 503 ") and b"too many connections in all" in reply
        metrics = _metrics(gw)
        assert 'cotenant_gateway_connections_refused_total{reason="per_client"} 1.0' in metrics
        assert 'cotenant_gateway_connections_refused_total{reason="total"} 1.0' in metrics
        assert "cotenant_gateway_connections 5.0" in metrics
    finally:
        for s in held:
            s.close()
    # closing frees the places, once the gateway has read the closes (on a loaded machine a
    # request sent at once could still find the caps full)
    deadline = time.monotonic() + 10
    while "cotenant_gateway_connections 0.0" not in _metrics(gw):
        assert time.monotonic() < deadline, "the closed connections still hold their places"
        time.sleep(0.02)
    assert_healthy_and_clean(gw)
