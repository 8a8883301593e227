"""ISO weeks (``2026-W48``): parsing, bounds in UTC nanoseconds, the last complete week."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from cotenant.core.errors import ReportError

WEEK_NS = 7 * 86_400 * 1_000_000_000
_WEEK_RE = re.compile(r"^(\d{4})-W(\d{2})$")


@dataclass(frozen=True, order=True)
class IsoWeek:
    """An ISO 8601 week: Monday 00:00 UTC to the next Monday 00:00 UTC."""

    year: int
    week: int

    def __str__(self) -> str:
        return f"{self.year:04d}-W{self.week:02d}"

    @property
    def start_ns(self) -> int:
        monday = dt.datetime.fromisocalendar(self.year, self.week, 1).replace(tzinfo=dt.UTC)
        return int(monday.timestamp()) * 1_000_000_000

    @property
    def end_ns(self) -> int:
        return self.start_ns + WEEK_NS

    def previous(self) -> IsoWeek:
        return week_of(self.start_ns - 1)


def week_of(ts_ns: int) -> IsoWeek:
    """The ISO week containing ``ts_ns`` (UTC)."""
    d = dt.datetime.fromtimestamp(ts_ns // 1_000_000_000, tz=dt.UTC)  # floor: no float rounding
    y, w, _ = d.isocalendar()
    return IsoWeek(y, w)


def last_complete_week(now_ns: int) -> IsoWeek:
    """The newest week that ended at or before ``now_ns``."""
    return week_of(now_ns).previous()


def parse_week(text: str) -> IsoWeek:
    """``YYYY-Www`` -> IsoWeek; ReportError naming the value otherwise (e.g. week 53 of a
    year that has 52)."""
    m = _WEEK_RE.match(text.strip())
    if m is None:
        raise ReportError(f"week {text!r} is not an ISO week like 2026-W48 (YYYY-Www)")
    year, week = int(m.group(1)), int(m.group(2))
    if not 1970 <= year <= 2261:  # year 0 is no date; past 2261 is past int64 nanoseconds
        raise ReportError(f"week {text!r} is out of range: years 1970 to 2261")
    weeks = dt.date(year, 12, 28).isocalendar()[1]  # 28 December is always in the last week
    if not 1 <= week <= weeks:
        raise ReportError(f"week {text!r} does not exist: {year} has weeks W01 to W{weeks:02d}")
    return IsoWeek(year, week)
