"""Where the week's model-load latency went: the report's "Model loads" section.

Two reads of :class:`cotenant.core.week_reads.WeekRollups`: the requests' waits for loads per
model (their ``other`` phase, where a ``model.load`` span is booked: embedded and fleet mode)
and the loads themselves per model, replica and kind (``model_loads`` rows: the embedded store
only, e.g. a GenTD26 import). This module reduces them to what a reader scans: per model the
wait, per model and kind the loads, and the replicas that spent the most time loading.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from cotenant.analysis.load_causes import LOAD_WINDOW_MS
from cotenant.core.week_reads import WeekRollups
from cotenant.reports.summary import LoadKindWeek, LoadReplicaWeek, LoadWait

HOUR_MS = 3_600_000.0
TOP_REPLICAS = 10
"""Replicas listed in the section, most time spent loading first."""


def load_waits(rows: Iterable[Mapping[str, Any]]) -> list[LoadWait]:
    """:class:`LoadWait` per ``load_wait_weeks`` row, in its order (largest wait first),
    leaving out models whose requests' ``other`` time averages under
    :data:`~cotenant.analysis.load_causes.LOAD_WINDOW_MS` (the gaps between uninstrumented
    spans, not loads: the analysis' own threshold)."""
    out = []
    for r in rows:
        n, wait, lat = int(r["requests"]), float(r["wait_ms"]), float(r["latency_ms"] or 0.0)
        if not n or wait / n < LOAD_WINDOW_MS:
            continue
        out.append(
            LoadWait(
                model=str(r["model"]),
                requests=n,
                wait_h=wait / HOUR_MS,
                latency_share=wait / lat if lat > 0 else None,
                mean_wait_ms=wait / n if n else 0.0,
            )
        )
    return out


def load_kinds(rows: Iterable[Mapping[str, Any]]) -> list[LoadKindWeek]:
    """Per (model, kind) over the ``load_weeks`` rows (one per model, replica and kind):
    sorted by model, then load time, largest first."""
    acc: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        key = (str(r["model"]), str(r["kind"]))
        a = acc.setdefault(key, [0, 0.0, 0.0, 0, "", -1.0])  # loads, ms, max, replicas, top
        ms = float(r["load_ms"])
        a[0] += int(r["loads"])
        a[1] += ms
        a[2] = max(a[2], float(r["max_ms"]))
        a[3] += 1
        if ms > a[5]:
            a[4], a[5] = str(r["replica"]), ms
    out = [
        LoadKindWeek(
            model=m,
            kind=k,
            loads=a[0],
            load_h=a[1] / HOUR_MS,
            mean_ms=a[1] / a[0] if a[0] else 0.0,
            max_ms=a[2],
            replicas=a[3],
            top_replica=a[4],
        )
        for (m, k), a in acc.items()
    ]
    return sorted(out, key=lambda x: (x.model, -x.load_h, x.kind))


def load_replicas(
    rows: Iterable[Mapping[str, Any]], top: int = TOP_REPLICAS
) -> list[LoadReplicaWeek]:
    """The ``top`` replicas by load time over the ``load_weeks`` rows, with their time per
    kind (ms)."""
    loads: dict[tuple[str, str], int] = defaultdict(int)
    kinds: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for r in rows:
        key = (str(r["model"]), str(r["replica"]))
        loads[key] += int(r["loads"])
        kinds[key][str(r["kind"])] = float(r["load_ms"])
    ranked = sorted(kinds, key=lambda k: (-sum(kinds[k].values()), k))[:top]
    return [
        LoadReplicaWeek(
            model=m,
            replica=rep,
            loads=loads[(m, rep)],
            load_h=sum(kinds[(m, rep)].values()) / HOUR_MS,
            by_kind_ms=dict(sorted(kinds[(m, rep)].items(), key=lambda kv: -kv[1])),
        )
        for m, rep in ranked
    ]


def load_section(
    rollups: WeekRollups, lo: int, hi: int
) -> tuple[list[LoadWait], list[LoadKindWeek], list[LoadReplicaWeek]]:
    """The section's three tables for the minutes ``[lo, hi)``."""
    rows = rollups.load_weeks(lo, hi)
    return load_waits(rollups.load_wait_weeks(lo, hi)), load_kinds(rows), load_replicas(rows)
