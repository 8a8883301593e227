"""The gateway's request spans encoded straight into OTLP protobuf bytes, without the OTel SDK.

One request is two spans in cotenant's conventions (docs/instrumenting.md): the root
``gateway.request`` (kind SERVER; ``cotenant.model``, ``cotenant.replica``, ``cotenant.tenant``,
``cotenant.priority``, ``http.request.method``, ``url.path``, ``http.response.status_code``, and
``gen_ai.latency.time_to_first_token`` for event streams; status ERROR for 5xx) and its child
``queue`` (kind INTERNAL) from arrival to admission. :meth:`SpanEncoder.encode` returns them
as two ``ScopeSpans.spans`` fields (bytes ready to concatenate); :func:`export_request` wraps any
number of those into an ``ExportTraceServiceRequest`` body for ``POST /v1/traces``
(``application/x-protobuf``).

Why by hand: the SDK builds Python objects per span and encodes a batch of 512 at a time
(about 20 ms holding the GIL on the proxy's core: the +9 ms p99 of docs/performance.md). Here
the work per request is a few ``bytes`` joins, most pieces cached (the attributes of a model,
a tenant, a path repeat), spread evenly over requests. Field numbers are those of
``opentelemetry/proto/trace/v1/trace.proto`` and ``common/v1/common.proto``; the tests decode
the bytes with ``opentelemetry-proto`` to check them.
"""

from __future__ import annotations

import random
import struct

from cotenant.gateway.finished import FinishedRequest

_Q = struct.Struct("<Q").pack
_D = struct.Struct("<d").pack
_SMALL = [bytes((i,)) for i in range(128)]
_CACHE_MAX = 4096


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of ``n`` (>= 0; a negative int64 as its 10-byte two's
    complement)."""
    if n < 0:
        n += 1 << 64
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (``tag`` < 128: field number < 16): tag, length, payload."""
    return _SMALL[tag] + varint(len(payload)) + payload


def _key(key: str) -> bytes:
    return _len(0x0A, key.encode())  # KeyValue.key


def string_attr(key: str, value: str) -> bytes:
    """``Span.attributes`` entry (field 9) with a string value."""
    kv = _key(key) + _len(0x12, _len(0x0A, value.encode("utf-8", "replace")))
    return _len(0x4A, kv)


def int_attr(key: str, value: int) -> bytes:
    kv = _key(key) + _len(0x12, b"\x18" + varint(value))
    return _len(0x4A, kv)


def double_attr(key: str, value: float) -> bytes:
    kv = _key(key) + _len(0x12, b"\x21" + _D(value))
    return _len(0x4A, kv)


_ROOT_NAME = _len(0x2A, b"gateway.request") + b"\x30\x02"  # name, kind SERVER
_QUEUE_NAME = _len(0x2A, b"queue") + b"\x30\x01"  # name, kind INTERNAL


class SpanEncoder:
    """Encodes one request's two spans (see the module docstring). Not thread-safe: one per
    event loop. ``rng`` makes the trace and span ids (seed it for reproducible tests)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._bits = (rng or random.Random()).getrandbits
        self._strings: dict[tuple[str, str], bytes] = {}
        self._ints: dict[tuple[str, int], bytes] = {}

    def _s(self, key: str, value: str) -> bytes:
        k = (key, value)
        b = self._strings.get(k)
        if b is None:
            if len(self._strings) >= _CACHE_MAX:
                self._strings.clear()  # bounded under arbitrary client input (paths)
            b = self._strings[k] = string_attr(key, value)
        return b

    def _i(self, key: str, value: int) -> bytes:
        k = (key, value)
        b = self._ints.get(k)
        if b is None:
            if len(self._ints) >= _CACHE_MAX:
                self._ints.clear()
            b = self._ints[k] = int_attr(key, value)
        return b

    def encode(self, req: FinishedRequest) -> bytes:
        """The two spans as ``ScopeSpans.spans`` fields."""
        start_ns, status = req.start_ns, req.status
        bits = self._bits
        trace = b"\x0a\x10" + (bits(128) | 1).to_bytes(16, "little")
        root_id = (bits(64) | 1).to_bytes(8, "little")
        queue_id = (bits(64) | 1).to_bytes(8, "little")
        start = b"\x39" + _Q(start_ns)
        s = self._s
        parts = [
            trace,
            b"\x12\x08",
            root_id,
            _ROOT_NAME,
            start,
            b"\x41",
            _Q(req.end_ns),
            s("cotenant.model", req.model),
            s("cotenant.replica", req.replica),
            s("cotenant.tenant", req.tenant),
            self._i("cotenant.priority", req.priority),
            s("http.request.method", req.method),
            s("url.path", req.path),
            self._i("http.response.status_code", status),
        ]
        if req.ttft_ns is not None:
            parts.append(
                double_attr("gen_ai.latency.time_to_first_token", (req.ttft_ns - start_ns) / 1e9)
            )
        if status >= 500:
            parts.append(_len(0x7A, _len(0x12, b"HTTP %d" % status) + b"\x18\x02"))
        root = b"".join(parts)
        queue = b"".join(
            (
                trace,
                b"\x12\x08",
                queue_id,
                b"\x22\x08",
                root_id,
                _QUEUE_NAME,
                start,
                b"\x41",
                _Q(req.admit_ns),
            )
        )
        return b"\x12" + varint(len(root)) + root + b"\x12" + varint(len(queue)) + queue


def resource_prefix(service_name: str, scope_name: str = "cotenant.gateway") -> tuple[bytes, bytes]:
    """The constant parts of every export: the ``Resource`` field (``service.name``) of
    ``ResourceSpans`` and the ``InstrumentationScope`` field of ``ScopeSpans``."""
    resource = _len(
        0x0A, _len(0x0A, _key("service.name") + _len(0x12, _len(0x0A, service_name.encode())))
    )
    scope = _len(0x0A, _len(0x0A, scope_name.encode()))
    return resource, scope


def export_request(resource: bytes, scope: bytes, spans: list[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` holding ``spans`` (outputs of
    :meth:`SpanEncoder.encode`) under one resource and scope."""
    scope_spans = _len(0x12, scope + b"".join(spans))
    return _len(0x0A, resource + scope_spans)
