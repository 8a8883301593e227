"""The proxy's data path: one :class:`ClientConnection` per client connection, requests handled
one at a time per connection (HTTP/1.1 keep-alive and pipelining), each identified, admitted,
optionally given its priority, sent to the upstream and streamed back as it arrives (see
:mod:`actuators.gateway.request`).

Answers the gateway makes itself are JSON ``{"error": "..."}``: 400 (malformed request or JSON
body), 408 (a request begun and not received in full within the idle timeout: slow headers or
body), 413 (body too large), 429/503 with ``Retry-After`` (admission; 503 also for a
connection over a connection cap), 502 (upstream down or broken), 504 (upstream timeout).
Nothing a client or the upstream sends stops the process.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import cast

from cotenant.gateway.http1 import ProtocolError
from cotenant.gateway.identify import UNKNOWN
from cotenant.gateway.request import ProxiedRequest, ProxyCore
from cotenant.gateway.request_parser import RequestParser, make_request_parser
from cotenant.gateway.upstream import set_nodelay

log = logging.getLogger(__name__)

_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    413: b"Content Too Large",
    429: b"Too Many Requests",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}
_PAUSE_BUFFER = 1024 * 1024
_MAX_READY = 16
"""Parsed requests waiting behind the one in progress before parsing stops (pipelining)."""
_FEED_SLICE = 8192
"""Bytes parsed at a time while requests wait: a read of tiny pipelined requests (256 KiB of
18-byte GETs is 14,000 of them) is never all turned into request objects at once."""


class ClientConnection(asyncio.Protocol):
    """One client connection; see the module docstring."""

    def __init__(self, core: ProxyCore, loop: asyncio.AbstractEventLoop) -> None:
        self.core = core
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._parser: RequestParser = make_request_parser(core.parser, core.max_body_bytes)
        self._current: ProxiedRequest | None = None
        self._error: ProtocolError | None = None
        """A malformed request behind requests still to answer: refused after them."""
        self._closed = False
        self._paused = False
        self.keep_alive = True
        self.http10 = False
        self._last = loop.time()
        # when the first byte of a request not yet read in full arrived: the whole request
        # head and body must come within the idle timeout (a byte every second is no
        # keep-alive: slowloris)
        self._begun: float | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._peer = ""
        self._counted = False
        self._refused = False
        self._gone = False
        self._unparsed = bytearray()
        """Bytes read ahead and not parsed yet (while pipelined requests wait)."""

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport (uvloop's are not asyncio.Transport subclasses)
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self._peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        caps = self.core.caps
        if caps is not None:
            reason = caps.admit(self._peer)
            if reason is not None:
                self._refuse_connection(reason)
                return
            self._counted = True
        set_nodelay(transport)
        self.core.connections.add(self)
        timeout = self.core.idle_timeout_s
        self._idle_timer = self.loop.call_at(self._last + timeout, self._check_idle, timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = self._gone = True
        if self._counted and self.core.caps is not None:
            self._counted = False
            self.core.caps.release(self._peer)
        self.core.connections.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._current is not None:
            self._current.abort()

    def data_received(self, data: bytes) -> None:
        if self._refused or self._error is not None:
            return  # read and dropped: the connection is being refused or closed
        self._last = self.loop.time()
        parser = self._parser
        if not self._unparsed and len(data) <= _FEED_SLICE and len(parser.ready) < _MAX_READY:
            try:  # the usual case: one small request
                parser.feed(data)
            except ProtocolError as exc:
                self._error = exc
                self._pause()
        else:
            self._unparsed += data
            self._parse()
        if self._begun is None and (parser.partial or self._unparsed):
            self._begun = self._last
        if self._current is None:
            self._next_request()
        elif parser.ready or parser.held_bytes + len(self._unparsed) > _PAUSE_BUFFER:
            # a pipelined request waits for the one in progress: read no further meanwhile
            self._pause()

    def _parse(self) -> None:
        """Parse what was read ahead, a slice at a time, while few requests wait."""
        parser = self._parser
        buf = self._unparsed
        try:
            while buf and len(parser.ready) < _MAX_READY:
                if len(buf) <= _FEED_SLICE:
                    parser.feed(bytes(buf))
                    buf.clear()
                else:
                    parser.feed(bytes(buf[:_FEED_SLICE]))
                    del buf[:_FEED_SLICE]
        except ProtocolError as exc:
            self._error = exc
            buf.clear()
            self._pause()

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _refuse_connection(self, reason: str) -> None:
        """Over a connection cap: answer 503 at once, then drop what the client sends until
        it closes (closing with its request unread would reset the connection, and the client
        could lose the answer), for at most a second."""
        self._refused = True
        self.core.metrics.connections_refused.labels(reason).inc()
        what = "per client" if reason == "per_client" else "in all"
        self.keep_alive = False
        self.respond_error(503, f"too many connections {what}; retry later", b"retry-after: 1\r\n")
        transport = self.transport
        if transport is not None:
            if transport.can_write_eof():
                transport.write_eof()
            self.loop.call_later(1.0, transport.abort)

    def _check_idle(self, timeout: float) -> None:
        # one timer per connection, re-armed lazily (slowloris and forgotten keep-alives)
        self._idle_timer = None
        if self._closed:
            return
        now = self.loop.time()
        if self._current is not None:  # a request in progress is the upstream's to time out
            self._idle_timer = self.loop.call_at(now + timeout, self._check_idle, timeout)
            return
        deadline = self._last + timeout
        begun = self._begun
        if begun is not None:  # a request still arriving, however slowly
            deadline = min(deadline, begun + timeout)
        if now >= deadline:
            partial = self._parser.partial or bool(self._unparsed)
            if begun is not None and partial and self._error is None:
                # part of a request came, not all of it in time (slow headers or body)
                self._refuse(408, f"request not received in full within {timeout:g} s")
            else:
                self.close()  # an idle keep-alive connection: closed without a word
        else:
            self._idle_timer = self.loop.call_at(deadline, self._check_idle, timeout)

    def pause_writing(self) -> None:
        req = self._current
        if req is not None and req.conn is not None:
            req.conn.pause_reading()

    def resume_writing(self) -> None:
        req = self._current
        if req is not None and req.conn is not None:
            req.conn.resume_reading()

    # -- requests ------------------------------------------------------------------------

    def _next_request(self) -> None:
        if self._closed or self._current is not None:
            return
        ready = self._parser.ready
        if len(ready) <= 1 and self._unparsed and self._error is None:
            self._parse()
        if not ready:
            if self._error is not None:
                self._refuse(self._error.status, str(self._error))
            elif self._parser.take_continue():
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        head, body = ready.popleft()
        self.keep_alive = head.keep_alive
        self.http10 = head.start[2] == b"HTTP/1.0"
        if not ready and not self._parser.partial and not self._unparsed:
            self._begun = None
        req = self._current = ProxiedRequest(self, head, body)
        try:
            req.begin()
        except Exception:  # the data path must never take the process down
            log.exception("gateway: unexpected error handling %r", head.start[1][:200])
            self.keep_alive = False
            if req.status == 0:
                self.respond_error(500, "internal gateway error")
            req.abort(500)
            self.close()

    def _refuse(self, status: int, message: str) -> None:
        reason = "request_timeout" if status == 408 else "bad_request"
        self.core.metrics.rejections.labels(UNKNOWN, reason).inc()
        self.core.metrics.requests.labels(UNKNOWN, str(status)).inc()
        self.keep_alive = False
        self.respond_error(status, message)
        self.close()

    def request_done(self) -> None:
        """The current request's answer is complete (or abandoned)."""
        self._current = None
        self._last = self.loop.time()
        # a request already (partly) read starts its clock now
        parser = self._parser
        pending = parser.ready or parser.partial or self._unparsed
        self._begun = self._last if pending else None
        if self._closed:
            return
        if not self.keep_alive:
            self.close()
            return
        if self._paused and self._error is None and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        if pending or self._error is not None:
            # a pipelined request: on the next loop turn, so answers made at once (429s)
            # never nest one inside the other
            self.loop.call_soon(self._next_request)

    # -- writing -------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self._closed and self.transport is not None:
            self.transport.write(data)

    def respond_error(self, status: int, message: str, headers: bytes = b"") -> None:
        """Answer with ``{"error": message}`` (the gateway's own answers)."""
        body = json.dumps({"error": message}).encode()
        self.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s%s\r\n%s"
            % (
                status,
                _REASONS.get(status, b"Error"),
                len(body),
                headers,
                b"connection: keep-alive\r\n" if self.keep_alive else b"connection: close\r\n",
                body,
            )
        )

    @property
    def busy(self) -> bool:
        """True while a request on this connection is in progress."""
        return self._current is not None

    def abort(self) -> None:
        """Drop the connection now (shutdown)."""
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        """Close after what was written is sent; a client that does not read it within the
        idle timeout is dropped (its unsent bytes with it)."""
        transport = self.transport
        if transport is not None and not self._closed:
            transport.close()
            if transport.get_write_buffer_size():
                self.loop.call_later(self.core.idle_timeout_s, self._drop_if_open)
        self._closed = True

    def _drop_if_open(self) -> None:
        if not self._gone and self.transport is not None:
            self.transport.abort()
