"""One proxied request, from arrival to the end of its answer (:class:`ProxiedRequest`), and
what all requests share (:class:`ProxyCore`).

A request that need not wait (no limit hit, a free concurrency slot, an idle upstream
connection) goes through in plain callbacks, with no coroutine or task: that is most of the
gateway's speed. Only waiting (rate-limit wait, priority queue, a new upstream connection)
runs in a task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from cotenant.gateway.admission import Admission, Rejected, Ticket
from cotenant.gateway.conn_caps import ConnectionCaps
from cotenant.gateway.finished import FinishedRequest
from cotenant.gateway.http1 import HOP_BY_HOP, ChunkedReader, Head
from cotenant.gateway.identify import (
    UNKNOWN,
    BadRequest,
    Identifier,
    PriorityField,
    inject_priority,
    parse_json_body,
)
from cotenant.gateway.request_parser import ParserKind
from cotenant.gateway.telemetry import GatewayMetrics, SpanSink
from cotenant.gateway.upstream import UpstreamConnection, UpstreamFailure, UpstreamPool

log = logging.getLogger(__name__)

_SKIP_REQUEST_HEADERS = HOP_BY_HOP | {b"content-length", b"expect"}
CLIENT_GONE = 499
_MAX_REPLICA_TRIES = 2
"""Other replicas tried when a replica refuses the connection (nothing was sent yet)."""
"""Status recorded for a request whose client went away before its answer ended (nginx's)."""


class Client(Protocol):
    """What a request needs of its client connection
    (:class:`actuators.gateway.proxy.ClientConnection`, which imports this module: stating it
    here keeps the two modules free of an import cycle)."""

    core: ProxyCore
    loop: asyncio.AbstractEventLoop
    keep_alive: bool
    """False: close the connection once the current answer is sent."""
    http10: bool
    """The request came as HTTP/1.0 (no chunked answers)."""

    @property
    def busy(self) -> bool:
        """True while a request on this connection is in progress."""
        ...

    def write(self, data: bytes) -> None: ...

    def respond_error(self, status: int, message: str, headers: bytes = b"") -> None:
        """Answer with ``{"error": message}``."""
        ...

    def request_done(self) -> None:
        """The current request's answer is complete (or abandoned)."""
        ...

    def close(self) -> None:
        """Close after what was written is sent."""
        ...

    def abort(self) -> None:
        """Drop the connection now (shutdown)."""
        ...


@dataclass
class ProxyCore:
    """What every client connection shares."""

    admission: Admission
    """Admission, and through its router the replicas (each with its connection pool)."""
    identifier: Identifier
    metrics: GatewayMetrics
    spans: SpanSink | None
    priority_field: PriorityField
    read_timeout_s: float
    max_body_bytes: int
    idle_timeout_s: float = 75.0
    """A client connection with no request in progress is closed after this long."""
    parser: ParserKind = "httptools"
    """Which HTTP/1 request parser reads client connections."""
    caps: ConnectionCaps | None = None
    """Caps on open client connections (None: none)."""
    connections: set[Client] = field(default_factory=set)
    """The open client connections (closed by the gateway's ``stop``)."""


class ProxiedRequest:
    """One request from arrival to the end of its answer; it is also the
    :class:`~actuators.gateway.upstream.ResponseSink` of its upstream exchange."""

    __slots__ = (
        "_dechunk",
        "_out",
        "admit_ns",
        "attempt",
        "body",
        "client",
        "conn",
        "core",
        "doc",
        "finished",
        "first_byte_ns",
        "head",
        "head_only",
        "label",
        "model",
        "priority",
        "replica_name",
        "request_bytes",
        "retried",
        "reused",
        "sse",
        "start_ns",
        "status",
        "task",
        "tenant",
        "ticket",
    )

    def __init__(self, client: Client, head: Head, body: bytes) -> None:
        self.client = client
        self.core = core = client.core
        self.head = head
        self.body = body
        self.head_only = head.start[0] == b"HEAD"
        self.start_ns = self.admit_ns = time.time_ns()
        # label: the model as metrics name it (at most Admission.max_tracked distinct names)
        self.model = self.tenant = self.label = UNKNOWN
        self.priority = core.admission.default_priority
        self.doc: Any = None
        self.ticket: Ticket | None = None
        self.conn: UpstreamConnection | None = None
        self.task: asyncio.Task[None] | None = None
        self.status = 0
        self.first_byte_ns: int | None = None
        self.sse = False
        self._dechunk: ChunkedReader | None = None
        self._out: list[bytes] = []
        self.attempt = 0
        """Replicas tried after the first (their connection refused)."""
        self.retried = False
        """A reset keep-alive connection was retried on a fresh one."""
        self.reused = False
        self.finished = False
        self.request_bytes = b""
        self.replica_name = ""

    # -- admission -----------------------------------------------------------------------

    def begin(self) -> None:
        core = self.core
        try:
            self.model, self.tenant, self.doc = core.identifier.identify(self.head, self.body)
        except BadRequest as exc:
            core.metrics.rejections.labels(UNKNOWN, "bad_request").inc()
            self._answer(400, str(exc))
            self._finish()
            return
        self.label = core.admission.entry("models", self.model, create=False).name
        try:
            ticket = core.admission.try_admit(self.model, self.tenant)
        except Rejected as rej:
            self._rejected(rej)
            return
        if ticket is None:
            self.task = self.client.loop.create_task(self._admit_slowly())
        else:
            self._admitted(ticket)

    async def _admit_slowly(self) -> None:
        metrics = self.core.metrics
        metrics.queued.inc()
        try:
            ticket = await self.core.admission.admit(self.model, self.tenant)
        except Rejected as rej:
            self.task = None
            self._rejected(rej)
            return
        except asyncio.CancelledError:
            return  # the client went away; abort() records it
        finally:
            metrics.queued.dec()
        self.task = None
        self._admitted(ticket)

    def _admitted(self, ticket: Ticket) -> None:
        core = self.core
        self.ticket = ticket
        self.admit_ns = time.time_ns()
        self.priority = ticket.priority
        self.replica_name = ticket.replica.name if ticket.replica is not None else ""
        core.metrics.in_flight.inc()
        if ticket.explicit_priority and core.priority_field != "none" and self.body:
            self._write_priority()
        self.request_bytes = self._upstream_request()
        self._send()

    def _rejected(self, rej: Rejected) -> None:
        self.core.metrics.rejections.labels(self.label, rej.reason).inc()
        self._answer(rej.status, str(rej), b"retry-after: %s\r\n" % rej.retry_after_header.encode())
        self._finish()

    # -- the upstream exchange -----------------------------------------------------------

    def _pool(self) -> UpstreamPool:
        ticket = self.ticket
        assert ticket is not None and ticket.replica is not None and ticket.replica.pool
        return ticket.replica.pool

    def _send(self) -> None:
        conn = self._pool().idle_connection()
        if conn is None:
            self.task = self.client.loop.create_task(self._connect_and_send())
        else:
            self._send_on(conn)

    async def _connect_and_send(self) -> None:
        try:
            conn = await self._pool().connect()
        except UpstreamFailure as exc:
            self.task = None
            if self._replica_failed() and exc.kind == "connect" and self._try_elsewhere():
                return  # nothing was sent: another replica may take it
            self._upstream_failed(exc)
            return
        except asyncio.CancelledError:
            return
        self.task = None
        self._send_on(conn)

    def _replica_failed(self) -> bool:
        """Tell the replica's passive health; always True (so it reads in a condition)."""
        ticket = self.ticket
        if ticket is not None:
            replica = ticket.replica
            if self.core.admission.failed(ticket) and replica is not None:
                log.warning(
                    "gateway: replica %s (%s) ejected after %d failures in a row",
                    replica.name,
                    replica.url,
                    replica.health.failures,
                )
        return True

    def _try_elsewhere(self) -> bool:
        ticket = self.ticket
        if ticket is None or self.attempt >= _MAX_REPLICA_TRIES:
            return False
        if not self.core.admission.retry_elsewhere(ticket):
            return False
        self.attempt += 1
        self.reused = False
        self.replica_name = ticket.replica.name if ticket.replica is not None else ""
        self.request_bytes = self._upstream_request()  # its path prefix and Host may differ
        self._send()
        return True

    def _send_on(self, conn: UpstreamConnection) -> None:
        self.conn = conn
        self.reused = conn.used
        conn.send(self.request_bytes, self, self.core.read_timeout_s)

    def on_head(self, head: Head, raw: bytes) -> None:
        client = self.client
        self.status = int(head.start[1])
        ctype = head.get(b"content-type")
        self.sse = ctype is not None and ctype.startswith(b"text/event-stream")
        if not (head.chunked or head.content_length is not None or self.head_only):
            client.keep_alive = False  # the body ends when the upstream closes: so must we
        if client.http10 and head.chunked:
            self._dechunk = ChunkedReader(decode=True)  # HTTP/1.0 clients cannot read chunks
            client.keep_alive = False
        if not head.hop_headers and client.keep_alive and not client.http10:
            self._out += (raw, b"\r\n\r\n")
            return
        parts = [b"HTTP/1.1 ", head.start[1], b" ", head.start[2], b"\r\n"]
        for name, value in head.headers:
            lname = name.lower()
            if lname in HOP_BY_HOP and not (lname == b"transfer-encoding" and not self._dechunk):
                continue
            parts += (name, b": ", value, b"\r\n")
        parts.append(
            b"connection: keep-alive\r\n\r\n" if client.keep_alive else b"connection: close\r\n\r\n"
        )
        self._out.append(b"".join(parts))

    def on_body(self, data: bytes) -> None:
        if self.first_byte_ns is None:
            self.first_byte_ns = time.time_ns()
        if self._dechunk is not None:
            self._dechunk.feed(data)
            if self._dechunk.payload:
                self._out.append(bytes(self._dechunk.payload))
                self._dechunk.payload.clear()
            return
        self._out.append(data)

    def flush(self) -> None:
        out = self._out
        if out:
            self.client.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    def on_end(self, reusable: bool) -> None:
        self.flush()
        self.conn = None
        if self.ticket is not None:
            self.core.admission.succeeded(self.ticket)
        self._finish()

    def on_error(self, failure: UpstreamFailure) -> None:
        self.conn = None
        if not self.retried and self.reused and failure.kind == "reset" and not failure.started:
            # the upstream closed an idle keep-alive connection just as we used it: once more
            self.retried = True
            self._send()
            return
        self._replica_failed()
        self._upstream_failed(failure)

    def _upstream_failed(self, exc: UpstreamFailure) -> None:
        self.core.metrics.upstream_errors.labels(exc.kind).inc()
        if exc.started:
            self.flush()
            self.client.keep_alive = False  # the answer was cut short: the client must see it
            self.client.close()
        else:
            self._answer(504 if exc.kind == "timeout" else 502, str(exc))
        self._finish()

    # -- the end -------------------------------------------------------------------------

    def abort(self, status: int = CLIENT_GONE) -> None:
        """Give up (the client went away): stop waiting, drop the upstream exchange, record
        the request with ``status``."""
        if self.finished:
            return
        if self.task is not None:
            self.task.cancel()
            self.task = None
        if self.conn is not None:
            self.conn.abort()  # the upstream stops working on it too
            self.conn = None
        self.status = status
        self._finish()

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        core = self.core
        if self.ticket is not None:
            core.metrics.in_flight.dec()
            core.admission.release(self.ticket)
            self.ticket = None
        try:
            self._record(time.time_ns())
        except Exception:  # telemetry never breaks the data path
            log.exception("gateway: recording telemetry failed")
        self.client.request_done()

    def _record(self, end_ns: int) -> None:
        core = self.core
        core.metrics.observe(
            self.label,
            self.status,
            (self.admit_ns - self.start_ns) / 1e9,
            (end_ns - self.start_ns) / 1e9,
        )
        if core.spans is not None:
            method, target, _ = self.head.start
            core.spans.emit(
                FinishedRequest(
                    model=self.model,
                    replica=self.replica_name,
                    tenant=self.tenant,
                    priority=self.priority,
                    method=method.decode("latin-1"),
                    path=target.split(b"?", 1)[0].decode("latin-1")[:512],
                    status=self.status,
                    start_ns=self.start_ns,
                    admit_ns=self.admit_ns,
                    end_ns=end_ns,
                    ttft_ns=self.first_byte_ns if self.sse else None,
                )
            )

    # -- helpers -------------------------------------------------------------------------

    def _answer(self, status: int, message: str, headers: bytes = b"") -> None:
        self.status = status
        self.client.respond_error(status, message, headers)

    def _write_priority(self) -> None:
        doc = self.doc
        if doc is None:
            try:
                doc = parse_json_body(self.body)
            except BadRequest:
                return  # not JSON: nothing to write the priority into
        new = inject_priority(doc, self.core.priority_field, self.priority)
        if new is not None:
            self.body = new

    def _upstream_request(self) -> bytes:
        head = self.head
        method, target, _ = head.start
        pool = self._pool()
        parts = [method, b" ", pool.prefix + target, b" HTTP/1.1\r\n"]
        has_host = False
        for name, value in head.headers:
            lname = name.lower()
            if lname in _SKIP_REQUEST_HEADERS:
                continue
            if lname == b"host":
                has_host = True
            parts += (name, b": ", value, b"\r\n")
        if not has_host:
            parts += (b"host: ", pool.host_header, b"\r\n")
        body = self.body
        if body or head.content_length is not None or head.chunked:
            parts.append(b"content-length: %d\r\n" % len(body))
        parts.append(b"\r\n")
        parts.append(body)
        return b"".join(parts)
