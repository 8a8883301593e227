"""A raw HTTP/1.1 upstream on loopback that misbehaves on purpose, for the gateway's fault
tests (tests/reliability/test_gateway_faults.py)."""

from __future__ import annotations

import asyncio
import threading

BIG = 256 * 1024 * 1024
"""Bytes the ``/big`` answer would send if the client read it (it never does)."""


class FaultyUpstream:
    """A raw HTTP/1.1 upstream on loopback whose answer is chosen by the request's path:
    ``/ok``, ``/garbage``, ``/endless-head``, ``/close-before-head``, ``/close-mid-body``,
    ``/close-mid-chunked``, ``/silent`` (never answers), ``/big`` (256 MiB, sent only as
    fast as the peer reads: ``sent`` counts what left)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.sent = 0
        self.open = 0
        self.transports: set[asyncio.Transport] = set()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.server = self.loop.run_until_complete(
                self.loop.create_server(self._protocol, "127.0.0.1", 0)
            )
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _protocol(self) -> asyncio.Protocol:
        outer = self

        class P(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                assert isinstance(transport, asyncio.Transport)
                self.t = transport
                self.buf = b""
                self.paused = False
                self.big_left = 0
                outer.open += 1
                outer.transports.add(transport)

            def connection_lost(self, exc: Exception | None) -> None:
                outer.open -= 1
                outer.transports.discard(self.t)

            def pause_writing(self) -> None:
                self.paused = True

            def resume_writing(self) -> None:
                self.paused = False
                self._pump()

            def _pump(self) -> None:
                piece = b"x" * 65536
                while self.big_left and not self.paused and not self.t.is_closing():
                    self.t.write(piece)
                    self.big_left -= len(piece)
                    outer.sent += len(piece)

            def data_received(self, data: bytes) -> None:
                self.buf += data
                head, sep, rest = self.buf.partition(b"\r\n\r\n")
                if not sep:
                    return
                lower = head.lower()
                n = 0
                if b"content-length:" in lower:
                    n = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
                if len(rest) < n:
                    return
                self.buf = rest[n:]
                path = head.split(b" ")[1]
                t = self.t
                if path == b"/ok":
                    t.write(b'HTTP/1.1 200 OK\r\ncontent-length: 11\r\n\r\n{"ok":true}')
                elif path == b"/garbage":
                    t.write(b"\x00\x01 not http at all\r\n\r\n")
                    t.close()
                elif path == b"/endless-head":
                    t.write(b"HTTP/1.1 200 OK\r\nx-endless: " + b"a" * (1024 * 1024))
                elif path == b"/close-before-head":
                    t.close()
                elif path == b"/close-mid-body":
                    t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"a" * 100)
                    t.close()
                elif path == b"/close-mid-chunked":
                    t.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
                    t.close()
                elif path == b"/big":
                    t.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % BIG)
                    self.big_left = BIG
                    self._pump()
                # /silent: nothing, ever

        return P()

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for t in list(self.transports):
                t.abort()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
