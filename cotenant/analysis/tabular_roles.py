"""Roles of a tabular case's columns, and where its anomaly starts (:mod:`analysis.tabular`).

The end-to-end entity (every metric a latency or availability: a view of the front door, not
a process), context series (``node-``/``host-`` machine counters, ``client-`` latency of the
calls an entity makes), the front door whose latency is the symptom, and the first anomalous
row: the inject time, or a BOCPD change point of the front door's latency (upward) or
availability (downward), else the row where that latency rose most (:func:`find_start`). The
module doc of :mod:`analysis.tabular` gives the reasons.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cotenant.analysis.baselines.bocpd import anomaly_start as bocpd_start
from cotenant.analysis.baselines.bocpd import changepoint_probability
from cotenant.analysis.metric_direction import family_of
from cotenant.analysis.tabular_load import TabularCase, entity_of, fail, metric_of
from cotenant.core.timespec import format_ns

MIN_BEFORE = 3  # rows before the anomaly start for a median and a spread (fewer: said so)
MIN_AFTER = 2  # rows from the start on for a median (fewer: said so)


def is_latency(metric: str) -> bool:
    return "latency" in metric and not metric.startswith("client-")


def is_quality(metric: str) -> bool:
    return family_of(metric).name == "availability"


def is_context(metric: str) -> bool:
    return metric.startswith(("node-", "host-")) or metric.startswith("client-")


def end_to_end_entities(case: TabularCase) -> list[str]:
    """Entities whose every metric is a latency or availability metric (views, not
    processes)."""
    metrics: dict[str, list[str]] = {}
    for c in case.series:
        metrics.setdefault(entity_of(c), []).append(metric_of(c))
    return [
        e
        for e, ms in metrics.items()
        if any(is_latency(m) for m in ms) and all(is_latency(m) or is_quality(m) for m in ms)
    ]


def _front_door(case: TabularCase) -> str | None:
    """The entity whose latency is the symptom: the end-to-end entity with the largest median
    latency, or when there is none, the entity with the largest median latency."""
    e2e = end_to_end_entities(case)
    own = {c: x for c, x in case.series.items() if is_latency(metric_of(c))}
    pool = [c for c in own if entity_of(c) in e2e] or list(own)
    level: dict[str, float] = {}
    for c in pool:
        finite = own[c][np.isfinite(own[c])]
        if len(finite):
            e = entity_of(c)
            level[e] = max(level.get(e, -math.inf), float(np.median(finite)))
    return max(level, key=lambda e: (level[e], e)) if level else None


def front_door_latency(case: TabularCase) -> list[str]:
    """The latency columns the anomaly is detected on (see the module doc)."""
    door = _front_door(case)
    return [c for c in case.series if entity_of(c) == door and is_latency(metric_of(c))]


@dataclass(frozen=True)
class Start:
    """Where a case's anomaly starts: ``row`` (index of its first anomalous row), ``how`` it was
    decided (``inject-time``, ``change-point``, or ``largest-rise`` when no change point stands
    out), the column it was found on (``metric``, None for an inject time) and a ``note`` on
    anything the reader should know (an inject time outside the table, a weak start)."""

    row: int
    how: str
    metric: str | None = None
    note: str | None = None


def find_start(case: TabularCase, inject_time: float | None = None) -> Start:
    """Where the anomaly starts. ``inject_time`` overrides the case's ``inject_time.txt``.

    An inject time inside the table gives the first row at or after it; one inside the last
    row's window (before the last time plus the table's step) gives the last row. An inject
    time that leaves no row before or none after it is reported in the note, and the start is
    found as without one: the most probable BOCPD change point upward in the front door's
    latency (or downward in its availability), else the row where that latency rose most over
    the median of the rows before it (``largest-rise``, a weak start, said so).

    Raises :class:`TabularError` only when there is nothing to find a start on: fewer than two
    rows, or no inject time inside the table and no latency column."""
    n = len(case.time)
    if n < 2:
        rows = "a single row" if n == 1 else "no row"
        raise fail(case.path, f"{rows}: need at least one before the anomaly and one from it on")
    t = inject_time if inject_time is not None else case.inject_time
    if t is None:
        return _detected(case, "")
    start = int(np.searchsorted(case.time, t, side="left"))
    if 1 <= start < n:
        return Start(start, "inject-time")
    outside = (
        f"inject time {t:.0f} ({format_ns(int(t * 1e9))}) leaves {start} rows before and "
        f"{n - start} from it on"
    )
    step = float(np.median(np.diff(case.time)))
    if start == n and t < case.time[-1] + step:
        return Start(n - 1, "inject-time", None, f"{outside}: it falls in the last row's window")
    return _detected(case, outside)


def _detected(case: TabularCase, outside: str) -> Start:
    """The start found in the front door's latency (see :func:`find_start`); ``outside``: why
    an inject time was not used ('' when there was none)."""
    cols = front_door_latency(case)
    if not cols:
        why = f"{outside}; " if outside else ""
        raise fail(case.path, f"{why}no latency column to find the anomaly on; give an inject time")
    instead = f"{outside}: the start was found without it, " if outside else ""
    door = entity_of(cols[0])
    quality = [c for c in case.series if entity_of(c) == door and is_quality(metric_of(c))]
    best: tuple[float, int, str] | None = None
    for c in cols + quality:
        x = case.series[c] if c in cols else -case.series[c]
        s = bocpd_start(x, min_before=MIN_BEFORE, min_after=MIN_AFTER)
        if s is None:
            continue
        p = float(changepoint_probability(x)[s])
        if best is None or p > best[0]:
            best = (p, s, c)
    if best is not None:
        note = f"{instead}a change point in {best[2]}" if instead else None
        return Start(best[1], "change-point", best[2], note)
    row, col, ratio = _largest_rise(case, cols)
    return Start(
        row,
        "largest-rise",
        col,
        f"{instead or ''}no change point upward in {', '.join(cols)}: the start is the row where "
        f"{col} rose most over the median before it ({ratio:.2f}x), a weak start; give an "
        "inject time if you know it",
    )


def _largest_rise(case: TabularCase, cols: list[str]) -> tuple[int, str, float]:
    """(row, column, ratio): the row at which a latency column stands highest over the median
    of its rows before it, with :data:`MIN_BEFORE` rows before where the table allows."""
    n = len(case.time)
    lo = min(MIN_BEFORE, n - 1)
    best = (-math.inf, lo, cols[0])
    for c in cols:
        x = case.series[c]
        for s in range(lo, n):
            before = x[:s][np.isfinite(x[:s])]
            if not len(before) or not np.isfinite(x[s]):
                continue
            base = float(np.median(before))
            ratio = float(x[s]) / base if base > 0 else (1.0 if x[s] <= base else math.inf)
            if ratio > best[0]:
                best = (ratio, s, c)
    ratio = best[0] if math.isfinite(best[0]) else 1.0
    return best[1], best[2], ratio


def side_notes(case: TabularCase, start: int) -> list[str]:
    before, after = start, len(case.time) - start
    if before >= MIN_BEFORE and after >= MIN_AFTER:
        return []
    return [
        f"only {before} rows before the anomaly and {after} from it on (a spread needs "
        f"{MIN_BEFORE} before and a median {MIN_AFTER} after): the scores are rough"
    ]
