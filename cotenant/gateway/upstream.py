"""Pooled keep-alive connections to the upstream serving stack.

An :class:`UpstreamConnection` sends one request at a time and streams the response to a
:class:`ResponseSink` as bytes arrive (no buffering of the body: a chunked body is passed
through as it came, its end found by :class:`~actuators.gateway.http1.ChunkedReader`).
:class:`UpstreamPool` keeps idle connections for reuse and opens new ones as needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import Protocol, cast

from cotenant.gateway.http1 import (
    ChunkedReader,
    Head,
    ProtocolError,
    parse_response_head,
    split_head,
)
from cotenant.gateway.settings import check_upstream

log = logging.getLogger(__name__)


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Turn off Nagle's algorithm: a proxy writes small pieces that must leave at once (asyncio
    only does it for sockets created with ``IPPROTO_TCP`` as their protocol)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class UpstreamFailure(Exception):
    """The upstream could not answer: ``kind`` is ``connect``, ``timeout``, ``reset`` or
    ``protocol``; ``started`` is True when part of the response was already passed on."""

    def __init__(self, kind: str, message: str, started: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.started = started


class ResponseSink(Protocol):
    """Receives one upstream response as it streams in (called on the event loop)."""

    head_only: bool
    """True for a HEAD request (the response has no body whatever its headers say)."""

    def on_head(self, head: Head, raw: bytes) -> None:
        """The response head (``raw`` without the final blank line)."""

    def on_body(self, data: bytes) -> None:
        """The next raw piece of the body, framing included (chunk sizes for chunked)."""

    def flush(self) -> None:
        """Pass on what ``on_head`` / ``on_body`` gathered from one read (one write, not two)."""

    def on_end(self, reusable: bool) -> None:
        """The response is complete (everything gathered is flushed first)."""

    def on_error(self, failure: UpstreamFailure) -> None:
        """The exchange failed; the connection is closed."""


_HEAD, _LENGTH, _CHUNKED, _CLOSE = range(4)


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection to the upstream; see the module docstring."""

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self._sink: ResponseSink | None = None
        self._buf = bytearray()
        self._state = _HEAD
        self._left = 0
        self._chunks: ChunkedReader | None = None
        self._keep_alive = True
        self._received = False
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0
        self.closed = False

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not asyncio.Transport subclasses)
        self.transport = cast(asyncio.Transport, transport)
        set_nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        sink, self._sink = self._sink, None
        if sink is None:
            self._pool.forget(self)
            return
        if self._state == _CLOSE:
            sink.on_end(False)  # a body delimited by the connection closing
        else:
            msg = "upstream closed the connection" + (f": {exc}" if exc else "")
            sink.on_error(UpstreamFailure("reset", msg, started=self._state != _HEAD))

    def data_received(self, data: bytes) -> None:
        sink = self._sink
        if sink is None:  # bytes on an idle connection: the upstream is confused
            self.abort()
            return
        self._received = True
        self._last = self._pool.loop.time()
        try:
            if self._state == _HEAD:
                self._buf += data
                self._parse_heads(sink)
            elif self._state == _LENGTH:
                self._length_body(sink, data)
            elif self._state == _CHUNKED:
                self._chunked_body(sink, data)
            else:
                sink.on_body(data)
            sink.flush()
        except Exception as exc:  # nothing the upstream sends may escape
            if not isinstance(exc, ProtocolError):
                log.exception("gateway: error handling the upstream's response")
            self._fail(
                UpstreamFailure(
                    "protocol", f"invalid upstream response: {exc}", started=self._state != _HEAD
                )
            )

    def pause_reading(self) -> None:
        """Stop reading from the upstream (the client is not keeping up)."""
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # -- sending -------------------------------------------------------------------------

    @property
    def used(self) -> bool:
        """True once a response was received on this connection (it was kept alive)."""
        return self._received

    def send(self, request: bytes, sink: ResponseSink, read_timeout_s: float) -> None:
        """Send ``request`` (a complete HTTP/1.1 message); the response goes to ``sink``.
        ``read_timeout_s`` bounds the wait for the head and for each later piece of body."""
        assert self.transport is not None and self._sink is None
        self._sink = sink
        self._state = _HEAD
        self._keep_alive = True
        loop = self._pool.loop
        self._last = loop.time()
        self._timer = loop.call_at(self._last + read_timeout_s, self._check_timeout, read_timeout_s)
        self.transport.write(request)

    def abort(self) -> None:
        """Drop the connection (its current exchange, if any, is abandoned silently)."""
        self._sink = None
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()
        self.closed = True

    # -- internals -----------------------------------------------------------------------

    def _parse_heads(self, sink: ResponseSink) -> None:
        while True:
            raw = split_head(self._buf)
            if raw is None:
                return
            head = parse_response_head(raw)
            code = int(head.start[1])
            if 100 <= code < 200:
                continue  # informational (100 Continue, 103 Early Hints): not passed on
            break
        self._keep_alive = head.keep_alive
        if sink.head_only or code in (204, 304):
            state = _LENGTH
            self._left = 0
        elif head.chunked:
            state = _CHUNKED
            self._chunks = ChunkedReader(decode=False)
        elif head.content_length is not None:
            state = _LENGTH
            self._left = head.content_length
        else:
            state = _CLOSE
            self._keep_alive = False
        self._state = state
        sink.on_head(head, raw)
        rest = bytes(self._buf)
        self._buf.clear()
        if state == _LENGTH:
            self._length_body(sink, rest)
        elif state == _CHUNKED:
            self._chunked_body(sink, rest)
        elif rest:
            sink.on_body(rest)

    def _length_body(self, sink: ResponseSink, data: bytes) -> None:
        left = self._left
        n = len(data)
        if n > left:
            raise ProtocolError("upstream sent more bytes than its Content-Length")
        if n:
            sink.on_body(data)
            self._left = left = left - n
        if left == 0:
            self._finish(sink)

    def _chunked_body(self, sink: ResponseSink, data: bytes) -> None:
        reader = self._chunks
        assert reader is not None
        used = reader.feed(data)
        if used:
            sink.on_body(data if used == len(data) else data[:used])
        if reader.done:
            if used != len(data):
                raise ProtocolError("upstream sent bytes after the end of its chunked body")
            self._finish(sink)

    def _finish(self, sink: ResponseSink) -> None:
        self._cancel_timer()
        self._sink = None
        self._state = _HEAD
        reusable = self._keep_alive and not self.closed
        if reusable:
            self._pool.release(self)
        elif self.transport is not None:
            self.transport.close()
        sink.on_end(reusable)

    def _fail(self, failure: UpstreamFailure) -> None:
        sink = self._sink
        self.abort()
        if sink is not None:
            sink.on_error(failure)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_timeout(self, timeout_s: float) -> None:
        # one timer per exchange, re-armed lazily: cheaper than re-arming on every chunk
        now = self._pool.loop.time()
        due = self._last + timeout_s
        if now < due:
            self._timer = self._pool.loop.call_at(due, self._check_timeout, timeout_s)
            return
        self._timer = None
        started = self._state != _HEAD
        self._fail(
            UpstreamFailure(
                "timeout",
                f"upstream sent nothing for {timeout_s:g} s"
                + (" in the middle of the response" if started else ""),
                started=started,
            )
        )


class UpstreamPool:
    """Idle keep-alive connections to one upstream ``http://`` or ``https://`` URL."""

    def __init__(
        self,
        url: str,
        loop: asyncio.AbstractEventLoop,
        *,
        connect_timeout_s: float = 5.0,
        max_idle: int = 256,
    ) -> None:
        parts = check_upstream(url)
        port = parts.port
        self.url = url
        self.host: str = parts.hostname or ""  # check_upstream made sure there is one
        self.port = port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/").encode()
        default_port = (parts.scheme == "https" and self.port == 443) or self.port == 80
        self.host_header = (self.host if default_port else parts.netloc).encode()
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.loop = loop
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self._idle: list[UpstreamConnection] = []

    def idle_connection(self) -> UpstreamConnection | None:
        """An idle keep-alive connection (the most recently used), or None."""
        idle = self._idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def connect(self) -> UpstreamConnection:
        """A new connection. Raises :class:`UpstreamFailure` (``connect`` or ``timeout``)."""
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await self.loop.create_connection(
                    lambda: UpstreamConnection(self), self.host, self.port, ssl=self._ssl
                )
        except TimeoutError:
            raise UpstreamFailure(
                "timeout",
                f"connecting to upstream {self.url} timed out after {self.connect_timeout_s:g} s",
            ) from None
        except OSError as exc:
            raise UpstreamFailure(
                "connect", f"cannot connect to upstream {self.url}: {exc.strerror or exc}"
            ) from None
        return proto

    def release(self, conn: UpstreamConnection) -> None:
        """Keep ``conn`` for reuse (or close it when enough are idle)."""
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def forget(self, conn: UpstreamConnection) -> None:
        """``conn`` was closed while idle."""
        with contextlib.suppress(ValueError):
            self._idle.remove(conn)

    def close(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, []
        for conn in idle:
            if conn.transport is not None:
                conn.transport.close()
