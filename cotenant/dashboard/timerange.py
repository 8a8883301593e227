"""The time range a page shows, as typed in its URL (``range=1h`` or ``range=<iso>..<iso>``)."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.core.errors import QueryError
from cotenant.core.timespec import format_ns, parse_duration_ns, parse_time_ns

PRESETS: tuple[str, ...] = ("5m", "15m", "1h", "6h", "24h", "7d")
"""Ranges offered by the picker (any duration or ``<from>..<to>`` is accepted in the URL)."""

_STEPS_S: tuple[int, ...] = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)
MAX_POINTS = 360
"""Most windows a timeline chart gets: the step grows with the range to stay under it."""


@dataclass(frozen=True)
class Range:
    """``[since_ns, until_ns)``; ``live`` when it ends at "now" (the page refreshes)."""

    text: str
    since_ns: int
    until_ns: int
    live: bool

    @property
    def step_s(self) -> int:
        """Window width for charts: the smallest step giving at most :data:`MAX_POINTS`
        windows; steps of a minute or more are whole minutes, so they read the rollups."""
        span_s = (self.until_ns - self.since_ns) / 1e9
        return next((s for s in _STEPS_S if span_s / s <= MAX_POINTS), _STEPS_S[-1])

    def label(self) -> str:
        return f"{format_ns(self.since_ns)} – {format_ns(self.until_ns)}"


def parse_range(text: str | None, now_ns: int, default: str = "1h") -> Range:
    """A duration back from ``now_ns`` (``15m``) or two times joined by ``..``.

    Raises QueryError naming what is wrong (a bad duration or time, an empty or reversed
    range)."""
    t = (text or default).strip()
    if ".." in t:
        a, b = t.split("..", 1)
        lo = parse_time_ns(a, "range start", now_ns)
        hi = parse_time_ns(b, "range end", now_ns)
        if hi <= lo:
            raise QueryError(f"range {t!r}: the end must be after the start")
        return Range(t, lo, hi, live=b.strip() == "now")
    span = parse_duration_ns(t.lstrip("-"), "range")
    if span <= 0:
        raise QueryError(f"range {t!r} must be longer than zero")
    return Range(t, now_ns - span, now_ns, live=True)


FIT_MIN_NS = 300_000_000_000
"""The shortest range a default range is fitted down to (5 min)."""


def fit_to_data(rng: Range, first_ns: int | None) -> Range:
    """``rng`` (a live default range such as "last 1 h") cut down to the data when everything
    stored is younger than it: from a little before the oldest record (a twentieth of the
    span, at least 10 s; the whole range at least :data:`FIT_MIN_NS`) to now, still live.
    ``rng`` unchanged when it is not live, when ``first_ns`` is None (nothing stored) or
    when the data is as old as the range or older."""
    if not rng.live or first_ns is None or first_ns <= rng.since_ns:
        return rng
    until = rng.until_ns
    lo = first_ns - max((until - first_ns) // 20, 10_000_000_000)
    lo = min(lo, until - FIT_MIN_NS)
    lo -= lo % 1_000_000_000
    if lo <= rng.since_ns:
        return rng
    return Range(f"{format_ns(lo)[:19]}Z..now", lo, until, live=True)


def incident_range(start_ns: int, end_ns: int) -> Range:
    """The default view of an incident: a few times its length before it (at least 5 min, for
    the baseline), some after (at least 2 min, for the recovery)."""
    length = max(end_ns - start_ns, 1_000_000_000)
    lo = start_ns - max(3 * length, 300_000_000_000)
    hi = end_ns + max(length, 120_000_000_000)
    lo -= lo % 1_000_000_000
    hi += -hi % 1_000_000_000
    return Range(f"{format_ns(lo)[:19]}Z..{format_ns(hi)[:19]}Z", lo, hi, live=False)
