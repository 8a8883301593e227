"""Readers of the requests arriving on one client connection: llhttp (through ``httptools``,
the parser uvicorn and Node.js use; the default) or the gateway's own
:mod:`actuators.gateway.http1`. Both sit behind one small contract, :class:`RequestParser`,
and pass the same request-smuggling tests (tests/gateway/test_request_parser.py).

::

    parser = make_request_parser("httptools", max_body_bytes=16 << 20)
    parser.feed(data)                  # raises ProtocolError (status 400, 413)
    while parser.ready:
        head, body = parser.ready.popleft()

A parser reads ahead: pipelined requests are parsed as they are fed and wait in ``ready``
(the connection feeds 8 KiB at a time while requests wait, and stops reading while one is
waiting, so what is held stays bounded by one read plus ``max_body_bytes``).

Whichever parser reads, the gateway refuses with 400: ``Content-Length`` together with
``Transfer-Encoding``, two ``Content-Length`` headers that disagree (llhttp: any two), a
``Content-Length`` that is not digits, a transfer coding other than ``chunked``, header names
with spaces or separators, obs-fold, bad chunk sizes, chunk data not followed by CRLF, versions
other than HTTP/1.0 and 1.1, heads over 64 KiB. A body over ``max_body_bytes`` is refused with
413.
"""

from __future__ import annotations

from collections import deque
from typing import Literal, Protocol

import httptools

from cotenant.gateway.http1 import (
    HOP_BY_HOP,
    MAX_HEAD_BYTES,
    ChunkedReader,
    Head,
    Headers,
    ProtocolError,
    parse_request_head,
    split_head,
)

ParserKind = Literal["httptools", "builtin"]
PARSERS: tuple[ParserKind, ...] = ("httptools", "builtin")


class RequestParser(Protocol):
    """Incremental reader of the requests of one client connection (see the module
    docstring)."""

    ready: deque[tuple[Head, bytes]]
    """Complete requests (head, decoded body), in arrival order."""

    def feed(self, data: bytes) -> None:
        """Parse ``data``; complete requests go to ``ready``. Raises :class:`ProtocolError`
        (its ``status`` is 400 or 413); the parser is then unusable."""

    @property
    def partial(self) -> bool:
        """True while bytes of a request not yet complete are held."""

    @property
    def held_bytes(self) -> int:
        """Bytes of the incomplete request held (head and body so far)."""

    def take_continue(self) -> bool:
        """True once when the incomplete request asked for ``100 Continue`` and its body is
        still to come (the caller answers ``100 Continue`` if it is free to write)."""


def make_request_parser(kind: ParserKind, max_body_bytes: int) -> RequestParser:
    """A fresh parser of ``kind`` for one connection."""
    if kind == "httptools":
        return HttptoolsRequestParser(max_body_bytes)
    return BuiltinRequestParser(max_body_bytes)


def _too_large(max_body: int) -> ProtocolError:
    return ProtocolError(f"request body larger than {max_body} bytes", status=413)


def _wants_continue(head: Head) -> bool:
    expect = head.get(b"expect")
    return expect is not None and expect.lower() == b"100-continue"


class BuiltinRequestParser:
    """:class:`RequestParser` on :mod:`actuators.gateway.http1` (the gateway's own parser)."""

    __slots__ = ("_body", "_buf", "_closing", "_continue", "_head", "_max_body", "ready")

    def __init__(self, max_body_bytes: int) -> None:
        self._max_body = max_body_bytes
        self._buf = bytearray()
        self._head: Head | None = None
        self._body: ChunkedReader | None = None
        self._continue = False
        self._closing = False
        self.ready: deque[tuple[Head, bytes]] = deque()

    def feed(self, data: bytes) -> None:
        if self._closing:
            return
        buf = self._buf
        buf += data
        max_body = self._max_body
        while buf or self._head is not None:
            head = self._head
            if head is None:
                raw = split_head(buf)
                if raw is None:
                    return
                head = self._head = parse_request_head(raw)
                if head.content_length is not None and head.content_length > max_body:
                    raise _too_large(max_body)
                if head.chunked:
                    self._body = ChunkedReader(decode=True)
                self._continue = _wants_continue(head)
            if self._body is not None:
                used = self._body.feed(buf)
                del buf[:used]
                if len(self._body.payload) > max_body:
                    raise _too_large(max_body)
                if not self._body.done:
                    return
                body = bytes(self._body.payload)
                self._body = None
            else:
                n = head.content_length or 0
                if len(buf) < n:
                    return
                body = bytes(buf[:n])
                del buf[:n]
            self._head = None
            self._continue = False
            self.ready.append((head, body))
            if not head.keep_alive:
                self._closing = True
                buf.clear()  # the connection closes after this answer: the rest is dropped
                return

    @property
    def partial(self) -> bool:
        return self._head is not None or bool(self._buf)

    @property
    def held_bytes(self) -> int:
        return len(self._buf) + (len(self._body.payload) if self._body is not None else 0)

    def take_continue(self) -> bool:
        wanted, self._continue = self._continue, False
        return wanted


class _Refused(Exception):
    """Raised inside an httptools callback: the request is refused (llhttp stops there)."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(str(error))
        self.error = error


class HttptoolsRequestParser:
    """:class:`RequestParser` on llhttp through ``httptools`` (strict mode: none of llhttp's
    leniencies are turned on), with the gateway's own checks on top: HTTP/1.0 and 1.1 only,
    ``chunked`` as the only transfer coding, heads within 64 KiB, bodies within the limit."""

    __slots__ = (
        "_body",
        "_body_len",
        "_chunked",
        "_closing",
        "_content_length",
        "_continue",
        "_fed_in_head",
        "_headers",
        "_hop",
        "_in_head",
        "_max_body",
        "_parser",
        "_pending",
        "_te_seen",
        "_url",
        "ready",
    )

    def __init__(self, max_body_bytes: int) -> None:
        self._max_body = max_body_bytes
        self._parser = httptools.HttpRequestParser(self)
        self.ready: deque[tuple[Head, bytes]] = deque()
        self._continue = False
        self._closing = False
        self._reset()
        self._pending: Head | None = None

    def _reset(self) -> None:
        self._url = b""
        self._headers: Headers = []
        self._content_length: int | None = None
        self._chunked = False
        self._te_seen = False
        self._hop = False
        self._body: list[bytes] = []
        self._body_len = 0
        self._in_head = False
        self._fed_in_head = 0

    # -- RequestParser -------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if self._closing:
            return  # the connection closes after the last request's answer
        if self._in_head or not self.partial:
            # llhttp has no head-size limit of its own, and httptools gathers a header's
            # name and value across reads before calling on_header: count what arrives
            self._fed_in_head += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            # Upgrade and CONNECT: the gateway does not tunnel; the request was read whole
            # and goes on as a plain one (Upgrade is hop-by-hop, not forwarded). What follows
            # is the next request, for a fresh parser.
            if self._pending is not None:
                raise ProtocolError("a request body after an Upgrade is not supported") from None
            offset = int(exc.args[0]) if exc.args else len(data)
            self._parser = httptools.HttpRequestParser(self)
            self._reset()
            if offset < len(data):
                self.feed(data[offset:])
            return
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _Refused):
                raise cause.error from None
            raise ProtocolError(f"malformed request: {exc}") from None
        except httptools.HttpParserError as exc:
            if self._closing:  # "Data after Connection: close": dropped, as it will be
                return
            raise ProtocolError(f"malformed request: {exc}") from None
        if self._in_head and self._fed_in_head > MAX_HEAD_BYTES:
            raise ProtocolError(f"message head larger than {MAX_HEAD_BYTES} bytes")

    @property
    def partial(self) -> bool:
        return self._in_head or self._pending is not None

    @property
    def held_bytes(self) -> int:
        return self._fed_in_head if self._in_head else self._body_len

    def take_continue(self) -> bool:
        wanted, self._continue = self._continue, False
        return wanted and self._pending is not None

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a trailer of a chunked body: dropped, as the builtin parser does
        lname = name.lower()
        if lname in HOP_BY_HOP:
            self._hop = True
            if lname == b"transfer-encoding":
                # llhttp accepts "gzip, chunked" and repeated headers; the gateway decodes
                # chunked only, and forwarding a still-gzipped body as plain would be wrong
                if self._te_seen or value.strip(b" \t").lower() != b"chunked":
                    raise _Refused(ProtocolError(f"unsupported Transfer-Encoding {value[:80]!r}"))
                self._te_seen = True
                self._chunked = True
        elif lname == b"content-length":
            # llhttp checked it: digits only, one header, no Transfer-Encoding beside it
            if len(value) > 18:
                raise _Refused(ProtocolError(f"invalid Content-Length {value[:40]!r}"))
            self._content_length = int(value)
        self._headers.append((name, value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        parser = self._parser
        version = parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise _Refused(ProtocolError(f"unsupported HTTP version {version[:20]!r}"))
        cl = self._content_length
        if cl is not None and cl > self._max_body:
            raise _Refused(_too_large(self._max_body))
        head = Head(
            (parser.get_method(), self._url, b"HTTP/1.1" if version == "1.1" else b"HTTP/1.0"),
            self._headers,
            cl,
            self._chunked,
            parser.should_keep_alive(),
            self._hop,
        )
        self._pending = head
        self._in_head = False
        self._continue = _wants_continue(head)

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self._max_body:
            raise _Refused(_too_large(self._max_body))
        self._body.append(body)

    def on_message_complete(self) -> None:
        head = self._pending
        if head is None:  # cannot happen: llhttp completes a message after its head
            return
        body = self._body
        self.ready.append((head, body[0] if len(body) == 1 else b"".join(body)))
        self._pending = None
        self._continue = False
        self._closing = not head.keep_alive
        self._reset()
