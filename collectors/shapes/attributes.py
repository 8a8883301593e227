"""OTLP attribute values as Python values, and the casts a shape applies to them.

The casts raise :class:`collectors.shapes.base.Rejected` (reason ``bad_attribute``) naming the
key and the value, so one malformed attribute rejects its request instead of storing garbage.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from collectors.shapes.base import Attrs, Rejected

_SCALARS = frozenset({"string_value", "bool_value", "int_value", "double_value", "bytes_value"})


def attributes(kvs: Iterable[Any]) -> Attrs:
    """OTLP ``KeyValue``s as a dict; arrays, maps and empty values become None.

    Decoding is inlined (no per-value helper): this runs for every root span."""
    out: Attrs = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = getattr(v, kind) if kind in _SCALARS else None
    return out


def as_int(attrs: Attrs, key: str) -> int | None:
    """``attrs[key]`` as an int (whole floats and numeric strings accepted); None if absent."""
    v = attrs.get(key)
    if v is None:
        return None
    if isinstance(v, bool):
        raise Rejected("bad_attribute", f"attribute {key} must be an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
    raise Rejected("bad_attribute", f"attribute {key} must be an integer, got {v!r}")


def as_seconds_ms(attrs: Attrs, key: str) -> float | None:
    """``attrs[key]``, a duration in seconds >= 0 (number or numeric string), in ms; None if
    absent."""
    v = attrs.get(key)
    if v is None:
        return None
    if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0:
        return float(v) * 1000.0
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            f = -1.0
        if f >= 0:
            return f * 1000.0
    raise Rejected("bad_attribute", f"attribute {key} must be seconds >= 0, got {v!r}")


def as_str(v: Any) -> str | None:
    """``v`` as a string (``str(v)`` for other scalars); None stays None."""
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)
