"""A small, fast HTTP/1.1 message parser for the gateway's hot path.

Only what a reverse proxy needs: the head of a request or response (start line + headers, as
bytes), the body framing (``Content-Length``, ``chunked``, or until close) and an incremental
chunked-encoding reader that can either decode a body or find where a raw one ends (so the
gateway can pass a chunked response through byte for byte, streaming).

Everything here works on ``bytes``; names of headers are kept as sent and compared in lower
case. Malformed input raises :class:`ProtocolError` with a message naming what is wrong; the
caller answers 400 (client side) or 502 (upstream side).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024
"""The largest request or response head (start line + headers) accepted, in bytes."""

MAX_CHUNK_LINE = 4096
"""The longest chunk-size line (size + extensions) accepted, in bytes."""

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""Headers that belong to one connection and are never forwarded as they are (RFC 9110 7.6.1)."""

_HEX = b"0123456789abcdefABCDEF"
_TOKEN_BAD = frozenset(b' \t"(),/:;<=>?@[\\]{}')


class ProtocolError(Exception):
    """A message is not valid HTTP/1.1 (or is refused); the message says what is wrong and
    ``status`` is what a client is answered (400, or 413 for a body over the limit)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


Headers = list[tuple[bytes, bytes]]
"""Header (name as sent, value stripped) pairs in order."""


@dataclass(slots=True)
class Head:
    """A parsed request or response head.

    For a request ``start`` is ``(method, target, version)``; for a response it is
    ``(version, status code, reason)``. ``content_length`` is None when absent; ``chunked`` is
    True when the final transfer coding is chunked; ``keep_alive`` follows the version and the
    ``Connection`` header.
    """

    start: tuple[bytes, bytes, bytes]
    headers: Headers
    content_length: int | None
    chunked: bool
    keep_alive: bool
    hop_headers: bool
    """True when some header is hop-by-hop (so the head must be rewritten before forwarding)."""

    def get(self, lname: bytes) -> bytes | None:
        """The first value of the header whose lower-case name is ``lname``, or None."""
        for name, value in self.headers:
            if name.lower() == lname:
                return value
        return None


def _parse_headers(lines: list[bytes]) -> tuple[Headers, int | None, bool, bool, bool | None]:
    headers: Headers = []
    content_length: int | None = None
    chunked = False
    hop = False
    conn: bool | None = None
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name[-1:] in (b" ", b"\t") or _TOKEN_BAD.intersection(name):
            raise ProtocolError(f"malformed header line {line[:80]!r}")
        value = value.strip(b" \t")
        lname = name.lower()
        if lname in HOP_BY_HOP:
            hop = True
            if lname == b"transfer-encoding":
                codings = [c.strip().lower() for c in value.split(b",")]
                if codings[-1] != b"chunked":
                    raise ProtocolError(f"unsupported Transfer-Encoding {value[:80]!r}")
                chunked = True
            elif lname == b"connection":
                tokens = {t.strip().lower() for t in value.split(b",")}
                if b"close" in tokens:
                    conn = False
                elif b"keep-alive" in tokens and conn is None:
                    conn = True
        elif lname == b"content-length":
            if not value.isdigit() or len(value) > 18:
                raise ProtocolError(f"invalid Content-Length {value[:40]!r}")
            n = int(value)
            if content_length is not None and content_length != n:
                raise ProtocolError("conflicting Content-Length headers")
            content_length = n
        headers.append((name, value))
    if chunked and content_length is not None:
        # RFC 9112 6.3: a message with both is a smuggling attempt; refuse it.
        raise ProtocolError("both Transfer-Encoding and Content-Length given")
    return headers, content_length, chunked, hop, conn


def parse_request_head(data: bytes) -> Head:
    """Parse a request head (without the final blank line). Raises :class:`ProtocolError`."""
    lines = data.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise ProtocolError(f"malformed request line {lines[0][:100]!r}")
    method, target, version = parts
    if version not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise ProtocolError(f"unsupported HTTP version {version[:20]!r}")
    if not method.isalpha() or not method.isupper():
        raise ProtocolError(f"malformed method {method[:20]!r}")
    headers, cl, chunked, hop, conn = _parse_headers(lines[1:])
    keep_alive = conn if conn is not None else version == b"HTTP/1.1"
    return Head((method, target, version), headers, cl, chunked, keep_alive, hop)


def parse_response_head(data: bytes) -> Head:
    """Parse a response head (without the final blank line). Raises :class:`ProtocolError`."""
    lines = data.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"malformed status line {lines[0][:100]!r}")
    headers, cl, chunked, hop, conn = _parse_headers(lines[1:])
    keep_alive = conn if conn is not None else version == b"HTTP/1.1"
    return Head((version, code, reason), headers, cl, chunked, keep_alive, hop)


def split_head(buf: bytearray) -> bytes | None:
    """Remove and return the head at the start of ``buf`` (without ``\\r\\n\\r\\n``), or None
    when it is not complete yet. Raises :class:`ProtocolError` when it is too large."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > MAX_HEAD_BYTES:
            raise ProtocolError(f"message head larger than {MAX_HEAD_BYTES} bytes")
        return None
    if end > MAX_HEAD_BYTES:
        raise ProtocolError(f"message head larger than {MAX_HEAD_BYTES} bytes")
    head = bytes(buf[:end])
    del buf[: end + 4]
    return head


_SIZE, _DATA, _DATA_CRLF, _TRAILER, _DONE = range(5)


class ChunkedReader:
    """Incremental reader of a chunked body (RFC 9112 7.1).

    :meth:`feed` consumes bytes from the front of a buffer and returns how many it consumed;
    the decoded payload is appended to ``payload`` when ``decode`` is True. ``done`` turns True
    after the last chunk and trailers. Raises :class:`ProtocolError` on a malformed body.
    """

    __slots__ = ("_decode", "_left", "_state", "done", "payload")

    def __init__(self, decode: bool) -> None:
        self._state = _SIZE
        self._left = 0
        self.done = False
        self.payload = bytearray()
        self._decode = decode

    def feed(self, buf: bytearray | bytes) -> int:
        pos = 0
        n = len(buf)
        while pos < n and not self.done:
            state = self._state
            if state == _DATA:
                take = min(self._left, n - pos)
                if self._decode:
                    self.payload += buf[pos : pos + take]
                pos += take
                self._left -= take
                if self._left == 0:
                    self._state = _DATA_CRLF
            elif state == _DATA_CRLF:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("chunk data not followed by CRLF")
                pos += 2
                self._state = _SIZE
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    if n - pos > MAX_CHUNK_LINE:
                        raise ProtocolError("chunk size line too long")
                    break
                line = bytes(buf[pos:eol])
                pos = eol + 2
                if state == _SIZE:
                    size_text = line.split(b";", 1)[0].rstrip(b" \t")
                    # hex digits only: int() would also take "0x3", "+3", "1_0" and spaces,
                    # which a stricter parser behind us could read otherwise (smuggling)
                    if not size_text or len(size_text) > 16 or size_text.strip(_HEX):
                        raise ProtocolError(f"invalid chunk size {size_text[:20]!r}")
                    size = int(size_text, 16)
                    if size == 0:
                        self._state = _TRAILER
                    else:
                        self._left = size
                        self._state = _DATA
                elif not line:  # the blank line that ends the trailers
                    self.done = True
                    self._state = _DONE
        return pos
