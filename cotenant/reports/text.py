"""Number and time formatting shared by the HTML and Markdown renderers."""

from __future__ import annotations

import datetime as dt

from cotenant.reports.summary import WeekOverWeek, WeekSummary

SECTIONS = (
    ("summary", "Summary"),
    ("who-hurt-whom", "Who hurt whom"),
    ("causes", "Causes"),
    ("gpus", "GPUs"),
    ("actions", "Actions"),
    ("recommendations", "Recommendations"),
)
"""Section anchors and titles, in order, of every format."""


def when(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def pct(x: float | None) -> str:
    return "no SLO" if x is None else f"{x * 100:.1f}%"


def num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def ms(x: float | None) -> str:
    return "–" if x is None else f"{x:,.1f} ms"


def delta(c: WeekOverWeek) -> str:
    """``+12.0%`` style change for a WeekOverWeek (points for attainment)."""
    d = c.delta
    if d is None:
        return "new" if c.last_week is None and c.this_week is not None else "–"
    if c.metric == "slo_attainment":
        return f"{d * 100:+.1f} pt"
    if c.last_week:
        return f"{d / c.last_week * 100:+.1f}%"
    return f"{d:+,.0f}"


def headline(s: WeekSummary) -> str:
    """One sentence that says how the week went."""
    t = s.totals
    if s.empty:
        return (
            f"No requests and no incidents were recorded in {s.week}: there is nothing to report."
        )
    if t.incidents == 0:
        return f"{num(t.requests)} requests served in {s.week} with no latency incidents."
    return (
        f"{num(t.requests)} requests served in {s.week}; {t.incidents} latency incident(s) "
        f"cost {num(t.impacted_minutes)} impacted minutes; SLO attainment {pct(t.slo_attainment)}."
    )
