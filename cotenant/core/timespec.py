"""Parse the time arguments users type: ``--since 15m``, ``?until=2026-12-02T10:00:00Z``.

Accepted: ``now``; a duration ago (``90s``, ``15m``, ``2h``, ``7d``, optionally with a leading
``-``); an ISO 8601 / RFC 3339 timestamp (naive means UTC); Unix seconds (``1764662400.5``).
Every result lies in :data:`MIN_NS` .. :data:`MAX_NS` (1970 to 2262, what a BIGINT of
nanoseconds holds): anything else is a :class:`QueryError` naming the argument, never a
value that overflows a query later.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

from cotenant.core.errors import QueryError

_UNITS_NS = {
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
    "d": 86_400_000_000_000,
    "w": 604_800_000_000_000,
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DURATION = re.compile(r"^-?(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
MIN_NS = 0
MAX_NS = 2**63 - 1
"""The times a store column (BIGINT nanoseconds UTC) can hold: 1970-01-01 to 2262-04-11."""


def _in_range(ns: int, name: str, text: str) -> int:
    if not MIN_NS <= ns <= MAX_NS:
        raise QueryError(f"{name} {text!r} is out of range: times go from 1970 to 2262")
    return ns


def parse_duration_ns(text: str, name: str = "duration") -> int:
    m = _DURATION.match(text.strip())
    if not m:
        raise QueryError(f"{name} {text!r} is not a duration like 90s, 15m, 2h or 7d")
    ns = float(m.group(1)) * _UNITS_NS[m.group(2)]
    if not ns <= MAX_NS:  # 1e400s is inf: refused too
        raise QueryError(f"{name} {text!r} is too long: at most about 292 years")
    return int(ns)


def parse_time_ns(text: str, name: str = "time", now_ns: int | None = None) -> int:
    """Nanoseconds UTC for ``text``; raises QueryError naming ``name`` when it is not a time."""
    now = time.time_ns() if now_ns is None else now_ns
    s = text.strip()
    if not s:
        raise QueryError(f"{name} is empty")
    if s == "now":
        return now
    if _DURATION.match(s):
        return _in_range(now - parse_duration_ns(s, name), name, text)
    try:
        secs = float(s)
    except ValueError:
        pass
    else:
        if not 0 <= secs <= 1e11:  # also refuses nan, which int() cannot convert
            raise QueryError(f"{name} {text!r} is not a plausible Unix time in seconds")
        return _in_range(int(secs * 1e9), name, text)
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError as exc:
        raise QueryError(
            f"{name} {text!r} is not a time: use 'now', a duration ago like "
            "15m, an ISO 8601 time or Unix seconds"
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    try:
        # integer arithmetic: float timestamp() * 1e6 truncates some microseconds to one less
        ns = (dt - _EPOCH) // timedelta(microseconds=1) * 1000
    except OverflowError as exc:  # 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise QueryError(f"{name} {text!r} is out of range: times go from 1970 to 2262") from exc
    return _in_range(ns, name, text)


def format_ns(ts_ns: int) -> str:
    """RFC 3339 UTC with milliseconds."""
    return (
        datetime.fromtimestamp(ts_ns / 1e9, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
