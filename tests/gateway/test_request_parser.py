"""Both HTTP/1 request parsers (llhttp through httptools, and the gateway's own) against the
same cases: every request-smuggling refusal, and the requests they must read right."""

from __future__ import annotations

import pytest

from cotenant.gateway.http1 import MAX_HEAD_BYTES, ProtocolError
from cotenant.gateway.request_parser import PARSERS, ParserKind, make_request_parser

MAX_BODY = 1000

# (name, bytes, words the error must contain)
REFUSED = [
    ("garbage", b"GARBAGE\r\n\r\n", ""),
    ("cl not digits", b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n", "content-length"),
    ("cl signed", b"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc", "content-length"),
    ("cl list", b"POST / HTTP/1.1\r\nContent-Length: 3, 4\r\n\r\nabc", "content-length"),
    (
        "cl then te",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        "content-length",
    ),
    (
        "te then cl",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
        "content-length",
    ),
    (
        "two cl that differ",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        "content-length",
    ),
    ("te gzip", b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nabc", "transfer-encoding"),
    (
        "te chunked not last",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        "transfer-encoding",
    ),
    ("te xchunked", b"POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n", "transfer-encoding"),
    (
        "te over two headers",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\n",
        "transfer-encoding",
    ),
    ("space before colon", b"POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", ""),
    ("tab before colon", b"POST / HTTP/1.1\r\nContent-Length\t: 0\r\n\r\n", ""),
    ("no colon", b"POST / HTTP/1.1\r\nbad header\r\n\r\n", ""),
    ("obs-fold", b"POST / HTTP/1.1\r\nX-A: a\r\n b\r\nContent-Length: 0\r\n\r\n", ""),
    ("obs-fold te", b"POST / HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", ""),
    ("http/2.0", b"GET / HTTP/2.0\r\n\r\n", "version"),
    ("http/0.9", b"GET / HTTP/0.9\r\n\r\n", "version"),
    ("http/1.2", b"GET / HTTP/1.2\r\n\r\n", "version"),
    (
        "signed chunk size",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n+3\r\nabc\r\n0\r\n\r\n",
        "chunk",
    ),
    (
        "chunk size with underscore",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n" + b"a" * 16 + b"\r\n",
        "chunk",
    ),
    ("lower-case method", b"post / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "method"),
    ("space in target", b"GET /a b HTTP/1.1\r\n\r\n", ""),
    (
        "chunk size not hex",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        "chunk",
    ),
    (
        "negative chunk size",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-3\r\nabc\r\n0\r\n\r\n",
        "chunk",
    ),
    (
        "0x chunk size",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
        "chunk",
    ),
    (
        "chunk data without crlf",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX0\r\n\r\n",
        "",
    ),
]

# refused by llhttp only (the builtin parser reads them; neither is a way to smuggle)
REFUSED_BY_LLHTTP = [
    (
        "two equal cl",
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
        "content-length",
    ),
    ("bare lf", b"POST / HTTP/1.1\nContent-Length: 0\n\n", ""),
    ("custom method", b"FROB / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "method"),
    ("nul in a value", b"POST / HTTP/1.1\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n", ""),
    (
        "huge chunk size",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFFFF\r\nab\r\n",
        "chunk",
    ),
]


def _feed(kind: ParserKind, data: bytes, step: int = 0) -> list[tuple[bytes, bytes]]:
    parser = make_request_parser(kind, MAX_BODY)
    if step:
        for i in range(0, len(data), step):
            parser.feed(data[i : i + step])
    else:
        parser.feed(data)
    return [(h.start[1], b) for h, b in parser.ready]


@pytest.mark.parametrize("kind", PARSERS)
@pytest.mark.parametrize(("name", "data", "needle"), REFUSED, ids=[c[0] for c in REFUSED])
def test_smuggling_and_malformed_requests_are_refused_with_400(
    kind: ParserKind, name: str, data: bytes, needle: str
) -> None:
    for step in (0, 1):  # all at once, and byte by byte
        with pytest.raises(ProtocolError) as err:
            _feed(kind, data, step)
        assert err.value.status == 400, name
        assert needle in str(err.value).lower(), (name, str(err.value))


@pytest.mark.parametrize(
    ("name", "data", "needle"), REFUSED_BY_LLHTTP, ids=[c[0] for c in REFUSED_BY_LLHTTP]
)
def test_llhttp_is_stricter(name: str, data: bytes, needle: str) -> None:
    with pytest.raises(ProtocolError) as err:
        _feed("httptools", data)
    assert err.value.status == 400 and needle in str(err.value).lower(), str(err.value)


@pytest.mark.parametrize("kind", PARSERS)
def test_bodies_over_the_limit_are_413_and_heads_over_64k_400(kind: ParserKind) -> None:
    for data in (
        b"POST / HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1),
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n" % (MAX_BODY + 1)
        + b"a" * (MAX_BODY + 1),
    ):
        with pytest.raises(ProtocolError) as err:
            _feed(kind, data)
        assert err.value.status == 413
    big = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD_BYTES
    with pytest.raises(ProtocolError, match="head larger"):
        _feed(kind, big, step=4096)


@pytest.mark.parametrize("kind", PARSERS)
@pytest.mark.parametrize("step", [0, 1, 7])
def test_pipelined_chunked_and_plain_requests_are_read_in_order(
    kind: ParserKind, step: int
) -> None:
    data = (
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
        b"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nxyz\r\n2\r\nuv\r\n0\r\nX-Trailer: t\r\n\r\n"
        b"GET /c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
        b"POST /d HTTP/1.1\r\n\r\n"
        b"GET /e HTTP/1.1\r\nConnection: close\r\n\r\n"
        b"GET /after-close HTTP/1.1\r\n\r\nGARBAGE\r\n\r\n"  # dropped: the connection closes
    )
    assert _feed(kind, data, step) == [
        (b"/a", b"abc"),
        (b"/b", b"xyzuv"),
        (b"/c", b""),
        (b"/d", b""),
        (b"/e", b""),
    ]


@pytest.mark.parametrize("kind", PARSERS)
def test_heads_keep_what_the_proxy_needs(kind: ParserKind) -> None:
    parser = make_request_parser(kind, MAX_BODY)
    parser.feed(
        b"POST /v1/x?q=1 HTTP/1.1\r\nHost: h\r\nX-Tenant:  acme \r\nConnection: close\r\n"
        b"Expect: 100-continue\r\nContent-Length: 3\r\n\r\n"
    )
    assert parser.partial and not parser.ready and parser.take_continue()
    assert not parser.take_continue()  # once
    parser.feed(b"abc")
    head, body = parser.ready.popleft()
    assert head.start == (b"POST", b"/v1/x?q=1", b"HTTP/1.1") and body == b"abc"
    assert head.get(b"x-tenant") == b"acme" and head.content_length == 3
    assert not head.keep_alive and head.hop_headers and not head.chunked
    assert not parser.partial

    parser = make_request_parser(kind, MAX_BODY)
    parser.feed(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    head, _ = parser.ready.popleft()
    assert head.keep_alive and head.start[2] == b"HTTP/1.0"


@pytest.mark.parametrize("kind", PARSERS)
def test_upgrade_requests_go_on_as_plain_requests(kind: ParserKind) -> None:
    data = (
        b"GET /ws HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"
        b"GET /next HTTP/1.1\r\n\r\n"
    )
    assert _feed(kind, data) == [(b"/ws", b""), (b"/next", b"")]
