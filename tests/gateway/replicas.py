"""Replica stand-ins for the routing tests: small HTTP/1.1 servers on loopback ports, all on one
event loop in a thread, each answering ``{"replica": NAME}`` so tests see where a request went.

A request whose path ends in ``/hold`` is answered only once the replica's ``hold`` event is
set (to keep requests in flight); ``stop(name)`` closes a replica's listening socket and its
connections (new connections are refused); ``start(name)`` opens it again on the same port.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class _Replica:
    name: str
    port: int
    hold: threading.Event = field(default_factory=threading.Event)
    server: asyncio.Server | None = None
    conns: set[asyncio.Transport] = field(default_factory=set)
    in_flight: int = 0


class _Conn(asyncio.Protocol):
    def __init__(self, owner: ReplicaServers, rep: _Replica) -> None:
        self.owner = owner
        self.rep = rep
        self.buf = bytearray()
        self.t: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.t = transport
        self.rep.conns.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.t is not None:
            self.rep.conns.discard(self.t)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buf) < end + 4 + length:
            return
        del self.buf[: end + 4 + length]
        path = head.split(" ")[1]
        self.rep.in_flight += 1
        self.owner.served[self.rep.name] += 1
        asyncio.get_running_loop().create_task(self._answer(path.endswith("/hold")))

    async def _answer(self, hold: bool) -> None:
        while hold and not self.rep.hold.is_set():
            await asyncio.sleep(0.005)
        self.rep.in_flight -= 1
        body = json.dumps({"replica": self.rep.name}).encode()
        if self.t is not None and not self.t.is_closing():
            self.t.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )


class ReplicaServers:
    """See the module docstring; :meth:`close` once done."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.replicas: dict[str, _Replica] = {}
        self.served: Counter[str] = Counter()
        """Requests each replica received (counted when the request arrives)."""

    def _run(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def add(self, name: str, *, listening: bool = True) -> str:
        """A new replica on a free port; its URL. ``listening=False``: refuses connections
        until :meth:`start`."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self.replicas[name] = _Replica(name, port)
        if listening:
            self.start(name)
        return f"http://127.0.0.1:{port}"

    def start(self, name: str) -> None:
        rep = self.replicas[name]

        async def go() -> None:
            rep.server = await self.loop.create_server(
                lambda: _Conn(self, rep), "127.0.0.1", rep.port, reuse_address=True
            )

        self._run(go())

    def stop(self, name: str) -> None:
        rep = self.replicas[name]

        async def go() -> None:
            if rep.server is not None:
                rep.server.close()
                rep.server = None
            for t in list(rep.conns):
                t.abort()

        self._run(go())

    def in_flight(self, name: str) -> int:
        return self.replicas[name].in_flight

    def release(self) -> None:
        """Answer every held request (and those held later)."""
        for rep in self.replicas.values():
            rep.hold.set()

    def close(self) -> None:
        self.release()

        async def drain() -> None:  # held answers finish (polled, 5 ms apart)
            for _ in range(400):
                if not any(r.in_flight for r in self.replicas.values()):
                    return
                await asyncio.sleep(0.005)

        self._run(drain())
        for name in list(self.replicas):
            self.stop(name)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
