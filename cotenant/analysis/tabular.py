"""Tabular mode: rank the entities of a wide metrics table as root causes of an anomaly.

A *case* is a wide CSV (:mod:`analysis.tabular_load`): a ``time`` column, one row per window,
then ``<entity>_<metric>`` columns; an optional inject time marks where the anomaly starts.

**Roles of the columns.** By metric name (the rules are general, not tied to one data set):

* the *end-to-end* entity is one whose every metric is a latency or availability metric (a
  view of the requests at the front door, not a running process: Nezha's ``frontend-svc``). It
  is the symptom, never a candidate;
* ``client-…`` latency (``<e>_client-latency-p90``) is the latency of the calls ``e`` makes:
  evidence that something *behind* ``e`` slowed down, so it is not evidence against ``e``;
  it is used to tell how much of ``e``'s own latency growth its calls explain (below);
* ``node-…`` / ``host-…`` metrics describe the machine, shared by every entity on it: context,
  not evidence (a table that names the host as an entity of its own, ``node_cpu-freq``, makes
  them that entity's evidence);
* an evidence series identical to one of another entity (co-located pods reporting the same
  node counters under another name) cannot single out either: dropped;
* everything else (CPU, memory, clocks, own latency, traffic, errors, availability) is the
  entity's own evidence, **in the direction that hurts** (:mod:`analysis.metric_direction`): a
  cost (utilisation, queue, wait, errors, traffic) when it rises, a capacity (a clock or
  frequency, availability or success, free memory, headroom) when it falls, and the entity's
  own latency either way: a service that fails fast (errors, exceptions, requests cut short)
  answers *faster* while the whole system gets slower.

**Where the anomaly starts.** The inject time when one is given (one in the last row's window
is the last row); else, or when it leaves no row before or after it (said in the notes), the
most probable BOCPD change point (:func:`analysis.baselines.bocpd.anomaly_start`) upward in
the front door's latency columns or downward in its availability columns: the end-to-end
entity's, or, when there is none, those of the entity with the largest median latency (a
request's end-to-end latency includes every hop's). Without a change point, the row where that
latency rose most over the median before it, said to be a weak start: every case with a
latency column or a usable inject time is answered.

**Scores** come from the shared core (:func:`analysis.change.robust_change`): the robust
standardised shift of each evidence series, oriented so that harm is positive, from the rows
before the start to the rows from it on. A rate of the availability family (availability,
success, hit rate) is scored on its *shortfall* from its bound (100 or 1,
:func:`analysis.metric_direction.shortfall`), spread floored at one request in a thousand:
99.9 % to 98 % is twenty times the failures, which a spread taken on the rate itself (the shared
core's floor, 5 % of its level) would call a third of a sigma. An own-latency score is reduced
by the share of its change that the entity's calls show too: with ``g = log(during / before)``
of the median latency and ``c`` the same for the paired ``client-`` series, the score is
multiplied by ``1 - clip(c / g, 0, 1)`` (a service slow only because its callee is slow scores
0). An entity's score is its strongest evidence, which also names the kind of cause it points
at (:class:`~cotenant.core.cause_kinds.CauseKind`: a clock is ``throttle``, a CPU frequency or
CPU use ``cpu``, memory ``memory``, link traffic ``bandwidth``, requests ``load``; latency,
errors and availability point at the entity itself, ``unknown``). Entities with no evidence
score 0 and rank last, by name.

**Capacity first.** A clock or CPU frequency that fell (by :data:`CAPACITY_Z` robust sigmas
and :data:`CAPACITY_DROP` of its level) while its entity's utilisation did not fall is a
capacity lost while busy: the physics says a slowdown elsewhere cannot cause it (a busy
processor does not lower its own clock because its callers wait; an idle one does, hence the
utilisation check), while it causes the queues, latencies and CPU use that grow everywhere
downstream of it. Such entities rank before all others, by score. :class:`Rules` switches each
rule off, for ablation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cotenant.analysis.change import SeriesShift, robust_change
from cotenant.analysis.metric_direction import (
    SHORTFALL_FLOOR,
    Direction,
    Family,
    family_of,
    harmful,
    shortfall,
    words_of,
)
from cotenant.analysis.tabular_load import (
    DATA_FILE,
    INJECT_FILE,
    TabularCase,
    entity_of,
    fail,
    load_case,
    metric_of,
)
from cotenant.analysis.tabular_roles import (
    end_to_end_entities,
    find_start,
    front_door_latency,
    is_context,
    is_latency,
    side_notes,
)
from cotenant.core.cause_kinds import CauseKind

__all__ = [
    "DATA_FILE",
    "INJECT_FILE",
    "Evidence",
    "Rules",
    "TabularCase",
    "TabularResult",
    "candidate_series",
    "cause_kind_of",
    "end_to_end_entities",
    "entity_of",
    "find_start",
    "front_door_latency",
    "inherited_share",
    "load_case",
    "metric_of",
    "rank_entities",
    "rca_table",
]


@dataclass(frozen=True)
class Evidence:
    """An entity's strongest piece of evidence: the column, its medians before and from the
    anomaly start (the column's unit), its score (robust sigmas in the direction that hurts,
    after the share explained by the entity's calls is taken out), that share (0-1; 0 for
    non-latency metrics), which way it moved and the kind of cause it points at."""

    metric: str
    before: float
    during: float
    score: float
    inherited: float = 0.0
    direction: str = Direction.RISE
    kind: str = CauseKind.UNKNOWN
    capacity: bool = False  # a capacity lost while busy (ranks before every cost)


@dataclass(frozen=True)
class TabularResult:
    """Entities by decreasing score (``ranks``), their scores, when the anomaly starts (the
    time of its first row, Unix seconds) and how that was decided (``inject-time``, or
    ``change-point`` or ``largest-rise`` on ``anomaly_metric``), each scored entity's top
    evidence, and notes on what was read leniently, judged on few rows or found weakly."""

    ranks: list[str]
    scores: dict[str, float]
    anomaly_start: float
    start_from: str
    anomaly_metric: str | None = None
    evidence: dict[str, Evidence] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"ranks": self.ranks, "scores": self.scores}


def cause_kind_of(metric: str) -> CauseKind:
    """The kind of cause a harmful move of ``metric`` points at (see the module doc)."""
    fam, words = family_of(metric), set(words_of(metric))
    if fam.name == "clock" or (fam.name == "throttling" and words & {"clock", "clocks"}):
        return CauseKind.CPU if words & CPU_CLOCK_WORDS else CauseKind.THROTTLE
    if (words & {"mem", "memory", "dram"} and words & BUSY_WORDS) or "dram" in words:
        return CauseKind.BANDWIDTH  # a memory controller's busy time: DRAM bandwidth
    if words & {"mem", "memory", "fb", "kv", "cache", "oom", "swap"}:
        return CauseKind.MEMORY
    if fam.name in ("utilisation", "throttling", "headroom"):
        if words & GPU_WORDS:
            return CauseKind.COTENANT
        return CauseKind.CPU
    if words & {"pcie", "nvlink", "bandwidth", "bps", "bytes", "net", "rx", "tx", "io", "disk"}:
        return CauseKind.BANDWIDTH
    if fam.name in ("traffic", "queue"):
        return CauseKind.LOAD
    return CauseKind.UNKNOWN


# -------------------------------------------------------------------------------- ranking


def candidate_series(case: TabularCase) -> dict[str, np.ndarray]:
    """Every column of every candidate entity (all but the end-to-end ones): what the
    baselines rank, side by side with :func:`rank_entities`."""
    e2e = set(end_to_end_entities(case))
    return {c: x for c, x in case.series.items() if entity_of(c) not in e2e}


def _shared(series: Mapping[str, np.ndarray]) -> set[str]:
    """Columns whose values equal a column of another entity."""
    groups: dict[bytes, list[str]] = {}
    for c, x in series.items():
        key = np.where(np.isnan(x), np.inf, x).tobytes()
        groups.setdefault(key, []).append(c)
    out: set[str] = set()
    for cols in groups.values():
        if len({entity_of(c) for c in cols}) > 1:
            out.update(cols)
    return out


def inherited_share(own: SeriesShift, calls: SeriesShift | None) -> float:
    """Share (0-1) of the change of an entity's latency that the latency of its calls shows
    too: ``clip(log(calls.during / calls.before) / log(own.during / own.before), 0, 1)`` (0
    when a median is not positive or the entity's latency did not move)."""
    if calls is None or min(own.before, own.during, calls.before, calls.during) <= 0:
        return 0.0
    g = math.log(own.during / own.before)
    if g == 0:
        return 0.0
    return min(1.0, max(0.0, math.log(calls.during / calls.before) / g))


@dataclass(frozen=True)
class Rules:
    """The rules of the module doc, each of which can be switched off to measure what it
    contributes (``cotenant bench --tabular`` uses the defaults)."""

    drop_shared: bool = True  # drop series identical across entities
    drop_context: bool = True  # host-level and client-latency series are not evidence
    inherit: bool = True  # take out the share of a latency change the entity's calls show
    latency_both_ways: bool = True  # own latency counts when it falls as well as rises
    directions: bool = True  # capacities (clocks, availability, ...) count when they fall
    capacity_first: bool = True  # a clock or frequency lost while busy ranks first
    shortfall: bool = True  # a falling availability is judged on what it misses of 100 %


CAPACITY_Z = 3.0
"""Robust sigmas a clock's or frequency's fall must reach to count as a capacity lost."""
CAPACITY_DROP = 0.05
"""...and the share of its level it must lose."""
CPU_CLOCK_WORDS = frozenset({"cpu", "host", "node", "core", "cpufreq", "scaling"})
"""Words of a clock that is a CPU's (``scaling_cur_freq`` is Linux cpufreq's), not a GPU's."""
GPU_WORDS = frozenset({"gpu", "sm", "dram", "tensor", "dcgm", "nvml"})
"""Words of a metric of a GPU (DCGM's and NVML's names say so by their prefix): its use points
at whoever shares the GPU."""
BUSY_WORDS = frozenset({"util", "utilization", "utilisation", "busy", "active"})
"""Words of a metric that measures how busy its entity is (power or temperature do not: they
fall with a clock)."""
TRAFFIC_WORDS = frozenset({"mem", "memory", "dram", "fb", "copy", "pcie", "nvlink", "bandwidth"})
"""... unless it is the utilisation of a memory or a link: a share of its peak bandwidth,
which falls with the work done per second, so with a clock locked low while the SMs stay busy
(only a share of the time busy says the processor went idle)."""


def _direction(fam: Family, r: Rules, words: frozenset[str] = frozenset()) -> Direction:
    if fam.direction == Direction.EITHER:
        return Direction.EITHER if r.latency_both_ways else Direction.RISE
    if not r.directions:  # every metric a cost but a success rate (no metric families)
        return Direction.FALL if "success" in words else Direction.RISE
    return fam.direction


def rank_entities(
    case: TabularCase, start: int, rules: Rules | None = None
) -> tuple[list[str], dict[str, float], dict[str, Evidence]]:
    """Entities by decreasing score for an anomaly starting at row ``start``, their scores and
    top evidence (see the module doc)."""
    r = rules or Rules()
    cands = candidate_series(case)
    evidence_cols = {
        c: x for c, x in cands.items() if not (r.drop_context and is_context(metric_of(c)))
    }
    if r.drop_shared:
        shared = _shared(evidence_cols)
        evidence_cols = {c: x for c, x in evidence_cols.items() if c not in shared}
    before = np.arange(len(case.time)) < start
    during = ~before
    best: dict[str, Evidence] = {}
    for col, x in evidence_cols.items():
        entity, metric = entity_of(col), metric_of(col)
        fam = family_of(metric)
        way = _direction(fam, r, frozenset(words_of(metric)))
        ch, bound = _harm_change(np.asarray(x, dtype=np.float64), fam, way, before, during, r)
        if ch is None or (ch.score <= 0 and way != Direction.EITHER):
            continue
        score, share = abs(ch.score), 0.0
        calls_col = f"{entity}_client-{metric}"
        if r.inherit and is_latency(metric) and calls_col in case.series:
            share = inherited_share(ch, robust_change(case.series[calls_col], before, during))
            score *= 1.0 - share
        sign = -1.0 if way == Direction.FALL else 1.0
        moved = _moved(ch) if way == Direction.EITHER else way
        kind = cause_kind_of(metric)
        ev = Evidence(
            col, bound + sign * ch.before, bound + sign * ch.during, score, share, moved, kind
        )
        if entity not in best or score > best[entity].score:
            best[entity] = ev
    if r.capacity_first:
        best = _capacity(best, evidence_cols, before, during, r)
    scores = {e: 0.0 for e in dict.fromkeys(entity_of(c) for c in cands)}
    scores.update({e: ev.score for e, ev in best.items()})
    first = {e for e, ev in best.items() if ev.capacity}
    ranks = sorted(scores, key=lambda e: (e not in first, -scores[e], e))
    return ranks, scores, best


def _harm_change(
    x: np.ndarray, fam: Family, way: Direction, before: np.ndarray, during: np.ndarray, r: Rules
) -> tuple[SeriesShift | None, float]:
    """The shift of ``x`` oriented so that harm is positive, and the offset that turns its
    medians back into the column's unit (``offset + sign * median``): a rate of the
    availability family falling is judged on its shortfall from its bound
    (:func:`analysis.metric_direction.shortfall`), any other metric on itself."""
    if r.shortfall and fam.name == "availability" and way == Direction.FALL:
        short, bound = shortfall(x)
        ch = robust_change(short, before, during, abs_floor=SHORTFALL_FLOOR * bound)
        return ch, bound
    return robust_change(harmful(x, way), before, during), 0.0


def _capacity(
    best: dict[str, Evidence],
    cols: Mapping[str, np.ndarray],
    before: np.ndarray,
    during: np.ndarray,
    r: Rules,
) -> dict[str, Evidence]:
    """Each entity's clock or frequency that fell by :data:`CAPACITY_Z` robust sigmas and
    :data:`CAPACITY_DROP` of its level while its utilisation did not fall (it stayed busy): a
    capacity lost, which a slowdown elsewhere cannot cause, made the entity's top evidence."""
    out = dict(best)
    fell: dict[str, Evidence] = {}
    idle: set[str] = set()
    for col, x in cols.items():
        entity, metric = entity_of(col), metric_of(col)
        fam = family_of(metric)
        words = set(words_of(metric))
        busy = bool(words & BUSY_WORDS) and not words & TRAFFIC_WORDS
        if fam.name != "clock" and not busy:
            continue
        ch = robust_change(-np.asarray(x, dtype=np.float64), before, during)
        if ch is None:
            continue
        if busy:
            if ch.score >= CAPACITY_Z:  # its utilisation fell: idle, not throttled
                idle.add(entity)
            continue
        lost = (ch.during - ch.before) / abs(ch.before) if ch.before else 0.0
        if ch.score < CAPACITY_Z or lost < CAPACITY_DROP:
            continue
        ev = Evidence(
            col, -ch.before, -ch.during, ch.score, 0.0, Direction.FALL, cause_kind_of(metric), True
        )
        if entity not in fell or ev.score > fell[entity].score:
            fell[entity] = ev
    for entity, ev in fell.items():
        if entity not in idle and _direction(family_of(metric_of(ev.metric)), r) == Direction.FALL:
            out[entity] = ev
    return out


def _moved(ch: SeriesShift) -> Direction:
    return Direction.RISE if ch.score >= 0 else Direction.FALL


def rca_table(case: Path | str | TabularCase, inject_time: float | None = None) -> TabularResult:
    """Load ``case`` (unless already loaded), find the anomaly start and rank its entities.
    Raises :class:`TabularError` as :func:`load_case` and :func:`find_start` do, and when the
    table has no candidate entity (only end-to-end views)."""
    c = case if isinstance(case, TabularCase) else load_case(case)
    if not candidate_series(c):
        raise fail(c.path, "every entity is an end-to-end view (latency/availability only)")
    start = find_start(c, inject_time)
    ranks, scores, evidence = rank_entities(c, start.row)
    said = [start.note] if start.note else []
    notes = [*c.notes, *said, *side_notes(c, start.row)]
    return TabularResult(
        ranks, scores, float(c.time[start.row]), start.how, start.metric, evidence, notes
    )
