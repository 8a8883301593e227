"""The weekly schedule inside ``cotenant serve``: ``[report] schedule = "mon 06:00"`` (UTC).

A thread sleeps until the next scheduled time, then writes the last complete ISO week. The
clock and the wait are injected so tests drive it without waiting a week. A failed run is
logged and the thread carries on to the next week: the report never takes the service down.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from cotenant.core.errors import ConfigError, CotenantError
from cotenant.reports.isoweek import IsoWeek, last_complete_week

log = logging.getLogger(__name__)

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_RE = re.compile(r"^([a-z]{3})[a-z]*\s+(\d{1,2}):(\d{2})$")


@dataclass(frozen=True)
class WeeklyTime:
    weekday: int  # 0 = Monday
    hour: int
    minute: int

    def next_after(self, now_ns: int) -> int:
        """The first scheduled instant strictly after ``now_ns`` (ns UTC)."""
        now = dt.datetime.fromtimestamp(now_ns // 1_000_000_000, tz=dt.UTC)
        day = now.date() + dt.timedelta(days=(self.weekday - now.weekday()) % 7)
        at = dt.datetime(day.year, day.month, day.day, self.hour, self.minute, tzinfo=dt.UTC)
        at_ns = int(at.timestamp()) * 1_000_000_000
        if at_ns <= now_ns:
            at_ns += 7 * 86_400 * 1_000_000_000
        return at_ns


def parse_schedule(text: str, key: str = "report.schedule") -> WeeklyTime | None:
    """``"mon 06:00"`` -> WeeklyTime; ``""`` -> None (not scheduled); ConfigError naming the
    key and the value otherwise."""
    t = text.strip().lower()
    if not t:
        return None
    m = _RE.match(t)
    if m is None or m.group(1) not in DAYS or int(m.group(2)) > 23 or int(m.group(3)) > 59:
        raise ConfigError(
            f"{key} = {text!r}: expected '<day> HH:MM' in UTC, e.g. 'mon 06:00' "
            f"(day one of {', '.join(DAYS)})"
        )
    return WeeklyTime(DAYS.index(m.group(1)), int(m.group(2)), int(m.group(3)))


class ReportScheduler:
    """Runs ``run(week)`` for the last complete week at every ``at``.

    ``clock_ns`` gives the time; ``wait(seconds)`` blocks up to that long and returns True
    when the scheduler is being stopped (default: an Event's wait)."""

    def __init__(
        self,
        at: WeeklyTime,
        run: Callable[[IsoWeek], object],
        *,
        clock_ns: Callable[[], int] = time.time_ns,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self._at = at
        self._run = run
        self._clock_ns = clock_ns
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self._thread: threading.Thread | None = None
        self.runs = 0
        self.failures = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cotenant-report", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = self._clock_ns()
            due = self._at.next_after(now)
            if self._wait(max(0.0, (due - now) / 1e9)) or self._stop.is_set():
                return
            if self._clock_ns() < due:
                continue  # woke early (a test's clock, a spurious wake): wait again
            self.run_once()

    def run_once(self) -> None:
        week = last_complete_week(self._clock_ns())
        try:
            self._run(week)
            self.runs += 1
        except (CotenantError, OSError) as exc:
            self.failures += 1
            log.error("weekly report %s failed: %s", week, exc)
        except Exception:  # a bug must not end the schedule: next week still gets its report
            self.failures += 1
            log.exception("weekly report %s failed unexpectedly", week)
