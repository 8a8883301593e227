"""OTLP attribute values as Python values, and the casts a shape applies to them.

The casts raise :class:`collectors.shapes.base.Rejected` (reason ``bad_attribute``) naming the
key and the value, so one malformed attribute rejects its request instead of storing garbage.
Every cast is range-checked against the column it feeds: integers within ``INTEGER`` (32-bit)
unless the caller widens the bounds, durations finite and under :data:`MAX_SECONDS`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Any

from cotenant.collectors.shapes.base import Attrs, Rejected

SCALAR_KINDS = frozenset({"string_value", "bool_value", "int_value", "double_value", "bytes_value"})
"""The ``AnyValue`` kinds decoded to a Python value; the others (arrays, maps) become None."""


def attributes(kvs: Iterable[Any]) -> Attrs:
    """OTLP ``KeyValue``s as a dict; arrays, maps and empty values become None.

    Decoding is inlined (no per-value helper): this runs for every root span."""
    out: Attrs = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = getattr(v, kind) if kind in SCALAR_KINDS else None
    return out


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_SECONDS = 1e9
"""Longest duration attribute accepted (about 31 years): anything longer is a broken timer,
and refusing it keeps every phase column finite."""


def as_int(attrs: Attrs, key: str, lo: int = -INT32_MAX - 1, hi: int = INT32_MAX) -> int | None:
    """``attrs[key]`` as an int in ``lo..hi`` (whole floats and numeric strings accepted);
    None if absent. The default bounds are those of an ``INTEGER`` column."""
    v = attrs.get(key)
    if v is None:
        return None
    n: int | None = None
    if isinstance(v, bool):
        pass
    elif isinstance(v, int):
        n = v
    elif isinstance(v, float) and v.is_integer():
        n = int(v)
    elif isinstance(v, str) and len(v) <= 20:  # int() of a long digit string is quadratic
        with contextlib.suppress(ValueError):
            n = int(v)
    if n is None:
        raise Rejected("bad_attribute", f"attribute {key} must be an integer, got {_short(v)}")
    if not lo <= n <= hi:
        raise Rejected("out_of_range", f"attribute {key} = {n} is outside {lo}..{hi}")
    return n


def as_seconds_ms(attrs: Attrs, key: str) -> float | None:
    """``attrs[key]``, a duration in seconds in ``0..MAX_SECONDS`` (number or numeric string),
    in ms; None if absent. NaN and infinities are refused."""
    v = attrs.get(key)
    if v is None:
        return None
    f = math.nan
    if isinstance(v, int | float) and not isinstance(v, bool):
        f = float(v)
    elif isinstance(v, str) and len(v) <= 64:
        with contextlib.suppress(ValueError):
            f = float(v)
    if 0 <= f <= MAX_SECONDS:  # False for NaN
        return f * 1000.0
    reason = "out_of_range" if f == f else "bad_attribute"
    raise Rejected(
        reason, f"attribute {key} must be finite seconds in 0..{MAX_SECONDS:g}, got {_short(v)}"
    )


def _short(v: Any) -> str:
    """``repr(v)``, cut to 80 characters: it goes back to the client and into logs."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def as_str(v: Any) -> str | None:
    """``v`` as a string (``str(v)`` for other scalars); None stays None."""
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


ATTR_REPLICA = "cotenant.replica"


def replica_of(attrs: Attrs, resource: Attrs) -> str | None:
    """Which replica of its model served a request, as the GPU is found: the span's
    ``cotenant.replica``, else its resource's; None (no replica named) when neither says or
    the value is empty."""
    v = attrs.get(ATTR_REPLICA)
    if v is None or v == "":
        v = resource.get(ATTR_REPLICA)
    return None if v is None or v == "" else as_str(v)
