"""Number and time formatting shared by the HTML and Markdown renderers."""

from __future__ import annotations

import datetime as dt

from cotenant.reports.summary import OrdinaryCell, WeekOverWeek, WeekSummary

SECTIONS = (
    ("summary", "Summary"),
    ("who-hurt-whom", "Who hurt whom"),
    ("causes", "Causes"),
    ("loads", "Model loads"),
    ("gpus", "GPUs"),
    ("actions", "Actions"),
    ("recommendations", "Recommendations"),
)
"""Section anchors and titles, in order, of every format."""

ORDINARY_NOTE = (
    "Ordinary contention (slower within the SLO, no incident opened: the culprit's bursts "
    "recur, the model was as slow in the last minutes, or its own traffic explains it):"
)


ORDINARY_HEAD = ["victim", "slowed by", "minutes", "slowdowns", "why"]
_WHY = {"own_load": "own traffic", "recurring": "recurring bursts", "seen": "as slow lately"}


def ordinary_cells(o: OrdinaryCell) -> list[str]:
    """One ordinary-contention row's cells (unescaped), under :data:`ORDINARY_HEAD`."""
    culprit = "its own traffic" if o.culprit == o.victim else o.culprit
    why = ", ".join(_WHY.get(r, r) for r in o.reasons)
    return [o.victim, culprit, num(o.minutes, 1), str(o.slowdowns), why]


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


def hours(h: float) -> str:
    """Hours, or minutes / seconds when under one (load time is often seconds a week)."""
    if h >= 1:
        return f"{h:,.1f} h"
    if h * 60 >= 1:
        return f"{h * 60:,.1f} min"
    return f"{h * 3600:,.1f} s"


def loads_note(s: WeekSummary) -> str:
    """What the "Model loads" section says when it has no table, or above its tables."""
    if not s.load_waits and not s.load_kinds:
        return "No request waited for a model, adapter or pipeline load this week."
    total = sum(w.wait_h for w in s.load_waits)
    lead = (
        f"Requests waited {hours(total)} for model loads"
        + (f", most of it {s.load_waits[0].model}'s" if len(s.load_waits) > 1 else "")
        + "."
        if s.load_waits
        else "No request recorded a load wait."
    )
    if not s.load_kinds:
        return lead + " Per-load detail (kind, replica) is not recorded in this mode."
    n = sum(k.loads for k in s.load_kinds)
    busiest = max(s.load_kinds, key=lambda k: k.load_h)
    return (
        f"{lead} {num(n)} loads took {hours(sum(k.load_h for k in s.load_kinds))}; the most "
        f"time went to {busiest.model}'s {busiest.kind} loads ({hours(busiest.load_h)})."
    )
