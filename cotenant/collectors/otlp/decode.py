"""Decode OTLP/HTTP trace bodies: protobuf or JSON, optionally gzip-compressed.

OTLP JSON differs from protobuf's canonical JSON in two ways handled here: trace and span ids
are hex strings (not base64), and enums may be integers. Unknown fields are ignored, as the
OTLP specification requires.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtoDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from cotenant.core.errors import DecodeError, PayloadTooLarge, UnsupportedMediaType

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


def media_type(content_type: str | None) -> str:
    """The bare media type of a Content-Type header, or raise UnsupportedMediaType."""
    mt = (content_type or "").split(";", 1)[0].strip().lower()
    if mt in (PROTOBUF, JSON):
        return mt
    raise UnsupportedMediaType(
        f"content type {content_type!r} is not OTLP: send {PROTOBUF} or {JSON}"
    )


def inflate(body: bytes, encoding: str | None, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (identity or gzip) without ever holding more than ``limit``."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        return body
    if enc != "gzip":
        raise UnsupportedMediaType(
            f"content encoding {encoding!r} is not supported: use gzip or none"
        )
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise DecodeError(f"body is not valid gzip: {exc}") from exc
    if len(out) > limit or d.unconsumed_tail:
        raise PayloadTooLarge(f"gzip body inflates past the {limit}-byte limit")
    if not d.eof:
        raise DecodeError("gzip body is truncated")
    return out


def decode(body: bytes, mtype: str) -> ExportTraceServiceRequest:
    """Parse an inflated body of media type ``mtype`` (see :func:`media_type`)."""
    msg = ExportTraceServiceRequest()
    if mtype == PROTOBUF:
        try:
            msg.ParseFromString(body)
        except (ProtoDecodeError, RuntimeError, ValueError) as exc:
            raise DecodeError(
                f"body is not a valid OTLP protobuf ExportTraceServiceRequest: {exc}"
            ) from exc
        return msg
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(f"body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise DecodeError("body is not valid OTLP JSON: nested too deeply") from exc
    if not isinstance(doc, dict):
        raise DecodeError("OTLP JSON body must be an object with 'resourceSpans'")
    try:
        _hex_ids_to_base64(doc)
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise DecodeError(
            f"body is not a valid OTLP JSON ExportTraceServiceRequest: {exc}"
        ) from exc
    except RecursionError as exc:  # attribute values (kvlist in kvlist …) nested past the stack
        raise DecodeError("body is not valid OTLP JSON: nested too deeply") from exc
    return msg


_ID_KEYS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _fix_ids(obj: dict[str, Any], where: str) -> None:
    for k in _ID_KEYS:
        v = obj.get(k)
        if v is None or v == "":
            continue
        if not isinstance(v, str):
            raise DecodeError(f"{where}.{k} must be a hex string, got {type(v).__name__}")
        try:
            raw = bytes.fromhex(v)
        except ValueError as exc:
            raise DecodeError(f"{where}.{k} is not hex: {v!r}") from exc
        obj[k] = base64.b64encode(raw).decode()


def _list(obj: dict[str, Any], *keys: str) -> list[Any]:
    for k in keys:
        v = obj.get(k)
        if v is not None:
            if not isinstance(v, list):
                raise DecodeError(f"{k} must be a list, got {type(v).__name__}")
            return v
    return []


def _hex_ids_to_base64(doc: dict[str, Any]) -> None:
    for i, rs in enumerate(_list(doc, "resourceSpans", "resource_spans")):
        if not isinstance(rs, dict):
            raise DecodeError(f"resourceSpans[{i}] must be an object")
        for j, ss in enumerate(_list(rs, "scopeSpans", "scope_spans")):
            if not isinstance(ss, dict):
                raise DecodeError(f"resourceSpans[{i}].scopeSpans[{j}] must be an object")
            for k, span in enumerate(_list(ss, "spans")):
                where = f"resourceSpans[{i}].scopeSpans[{j}].spans[{k}]"
                if not isinstance(span, dict):
                    raise DecodeError(f"{where} must be an object")
                _fix_ids(span, where)
                for m, link in enumerate(_list(span, "links")):
                    if isinstance(link, dict):
                        _fix_ids(link, f"{where}.links[{m}]")
