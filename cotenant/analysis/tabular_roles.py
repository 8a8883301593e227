"""Roles of a tabular case's columns, and where its anomaly starts (:mod:`analysis.tabular`).

The end-to-end entity (every metric a latency or availability: a view of the front door, not
a process), context series (``node-``/``host-`` machine counters, ``client-`` latency of the
calls an entity makes), the front door whose latency is the symptom, and the first anomalous
row: the inject time, or a BOCPD change point of the front door's latency (upward) or
availability (downward). The module doc of :mod:`analysis.tabular` gives the reasons.
"""

from __future__ import annotations

import math

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


def find_start(case: TabularCase, inject_time: float | None = None) -> tuple[int, str, str | None]:
    """(index of the first anomalous row, ``inject-time`` | ``change-point``, the column the
    change point was found on). ``inject_time`` overrides the case's ``inject_time.txt``.

    Raises :class:`TabularError` when no row precedes the start or none follows it, or,
    without an inject time, when there is no latency column or no change point in the front
    door's latency (upward) or availability (downward)."""
    n = len(case.time)
    t = inject_time if inject_time is not None else case.inject_time
    if t is not None:
        start = int(np.searchsorted(case.time, t, side="left"))
        if start < 1 or start >= n:
            raise fail(
                case.path,
                f"inject time {t:.0f} ({format_ns(int(t * 1e9))}) leaves {start} rows before "
                f"and {n - start} from it on; need at least one on each side",
            )
        return start, "inject-time", None
    cols = front_door_latency(case)
    if not cols:
        raise fail(case.path, "no latency column to find the anomaly on; give an inject time")
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
    if best is None:
        raise fail(
            case.path,
            f"no change point upward in {', '.join(cols)} with {MIN_BEFORE} rows before and "
            f"{MIN_AFTER} after it ({n} rows); give an inject time",
        )
    return best[1], "change-point", best[2]


def side_notes(case: TabularCase, start: int) -> list[str]:
    before, after = start, len(case.time) - start
    if before >= MIN_BEFORE and after >= MIN_AFTER:
        return []
    return [
        f"only {before} rows before the anomaly and {after} from it on (a spread needs "
        f"{MIN_BEFORE} before and a median {MIN_AFTER} after): the scores are rough"
    ]
