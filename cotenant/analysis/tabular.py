"""Tabular mode: rank the entities of a wide metrics table as root causes of a latency anomaly.

A *case* is a CSV file (``data.csv`` in a case folder, or any CSV path): a ``time`` column in
Unix seconds, one row per window, then one numeric column per metric named
``<entity>_<metric>`` (the entity is the text before the first ``_``). A case folder may hold
``inject_time.txt`` (one number, Unix seconds): rows from that time on are the anomaly.

**Roles of the columns.** By metric name (the rules are general, not tied to one data set):

* the *end-to-end* entity is one whose every metric is a latency or success metric (a view of
  the requests at the front door, not a running process: Nezha's ``frontend-svc``). It is the
  symptom, never a candidate;
* ``client-…`` latency (``<e>_client-latency-p90``) is the latency of the calls ``e`` makes:
  evidence that something *behind* ``e`` slowed down, so it is not evidence against ``e``;
  it is used to tell how much of ``e``'s own latency growth its calls explain (below);
* ``node-…`` / ``host-…`` metrics describe the machine, shared by every entity on it: context,
  not evidence;
* an evidence series identical to one of another entity (co-located pods reporting the same
  node counters under another name) cannot single out either: dropped;
* everything else (CPU, memory, own latency, traffic, syscalls) is the entity's own evidence.
  Resource and traffic metrics count when they rise (a root cause adds work or waiting; a fall
  is mostly what a starved neighbour shows), a ``success`` metric when it drops, and the
  entity's own latency either way: a service that fails fast (errors, exceptions, requests
  cut short) answers *faster* while the whole system gets slower.

**Where the anomaly starts.** The inject time when one is given; else the most probable BOCPD
change point upward (:func:`analysis.baselines.bocpd.anomaly_start`) over the latency columns of
the front door: the end-to-end entity, or, when there is none, the entity with the largest
median latency (a request's end-to-end latency includes every hop's).

**Scores** come from the shared core (:func:`analysis.change.rank_changes`): the robust
standardised shift of each evidence series from the rows before the start to the rows from it
on. An own-latency score is reduced by the share of its change that the entity's calls show
too: with ``g = log(during / before)`` of the median latency and ``c`` the same for the paired
``client-`` series, the score is multiplied by ``1 - clip(c / g, 0, 1)`` (a service slow only
because its callee is slow scores 0). An entity's score is its strongest evidence; entities
with none score 0 and rank last, by name. :class:`Rules` switches each rule off, for ablation.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cotenant.analysis.baselines.bocpd import anomaly_start as bocpd_start
from cotenant.analysis.baselines.bocpd import changepoint_probability
from cotenant.analysis.change import SeriesShift, rank_changes, robust_change
from cotenant.core.errors import TabularError
from cotenant.core.timespec import format_ns

MIN_BEFORE = 3  # rows needed before the anomaly start: a median and a spread
MIN_AFTER = 2  # rows needed from the start on
DATA_FILE = "data.csv"
INJECT_FILE = "inject_time.txt"


@dataclass(frozen=True)
class TabularCase:
    """One loaded case. ``time``: shape ``(n_rows,)``, Unix seconds, increasing; ``series``:
    column name -> values of shape ``(n_rows,)`` (NaN where empty), in file order."""

    path: Path
    time: np.ndarray
    series: dict[str, np.ndarray]
    inject_time: float | None = None

    @property
    def entities(self) -> list[str]:
        return list(dict.fromkeys(entity_of(c) for c in self.series))


@dataclass(frozen=True)
class Evidence:
    """An entity's strongest piece of evidence: the column, its medians before and from the
    anomaly start (the column's unit), its score (robust sigmas, after the share explained by
    the entity's calls is taken out) and that share (0-1; 0 for non-latency metrics)."""

    metric: str
    before: float
    during: float
    score: float
    inherited: float = 0.0


@dataclass(frozen=True)
class TabularResult:
    """Entities by decreasing score (``ranks``), their scores, when the anomaly starts (the
    time of its first row, Unix seconds) and how that was decided (``inject-time`` or
    ``change-point`` on ``anomaly_metric``), and each scored entity's top evidence."""

    ranks: list[str]
    scores: dict[str, float]
    anomaly_start: float
    start_from: str
    anomaly_metric: str | None = None
    evidence: dict[str, Evidence] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"ranks": self.ranks, "scores": self.scores}


def entity_of(column: str) -> str:
    return column.split("_", 1)[0]


def metric_of(column: str) -> str:
    return column.split("_", 1)[1]


def _is_latency(metric: str) -> bool:
    return "latency" in metric and not metric.startswith("client-")


def _is_quality(metric: str) -> bool:
    return "success" in metric


def _is_context(metric: str) -> bool:
    return metric.startswith(("node-", "host-")) or metric.startswith("client-")


# ---------------------------------------------------------------- loading and validation


def _fail(path: Path, what: str) -> TabularError:
    return TabularError(f"{path}: {what}")


def load_case(case: Path | str) -> TabularCase:
    """Read a case folder (``data.csv`` [+ ``inject_time.txt``]) or a bare CSV file.

    Raises :class:`TabularError`, naming the file, when it is missing or not CSV, when the
    ``time`` column is missing, not numeric, has empty cells or does not increase, when a
    column name repeats or is not ``<entity>_<metric>``, when a metric column is not numeric,
    when there is no metric column, or when ``inject_time.txt`` does not hold a number."""
    root = Path(case)
    if root.is_dir():
        path = root / DATA_FILE
        if not path.is_file():
            raise _fail(root, f"no {DATA_FILE} in this case folder")
    elif root.is_file():
        path = root
    else:
        raise _fail(root, "no such case folder or CSV file")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        frame = pd.read_csv(path, low_memory=False)
    except (OSError, UnicodeDecodeError, csv.Error, pd.errors.ParserError) as exc:
        raise _fail(path, f"cannot be read as CSV ({exc})") from exc
    except pd.errors.EmptyDataError as exc:
        raise _fail(path, "is empty") from exc
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise _fail(path, f"column names repeat: {', '.join(repeated)}")
    if "time" not in frame.columns:
        raise _fail(path, f"no 'time' column (columns: {', '.join(header[:5])}...)")
    if not pd.api.types.is_numeric_dtype(frame["time"]):
        raise _fail(path, "the 'time' column is not numeric Unix seconds")
    time = frame["time"].to_numpy(dtype=np.float64)
    if not np.all(np.isfinite(time)):
        raise _fail(path, "the 'time' column has empty or non-finite cells")
    if np.any(np.diff(time) <= 0):
        raise _fail(path, "the 'time' column does not strictly increase")
    series: dict[str, np.ndarray] = {}
    for col in frame.columns:
        if col == "time":
            continue
        entity, _, metric = str(col).partition("_")
        if not entity or not metric:
            raise _fail(path, f"column {col!r} is not named <entity>_<metric>")
        if not pd.api.types.is_numeric_dtype(frame[col]):
            bad = next((v for v in frame[col] if not _numeric(v)), frame[col].dtype)
            raise _fail(path, f"column {col!r} is not numeric (value {bad!r})")
        series[str(col)] = frame[col].to_numpy(dtype=np.float64)
    if not series:
        raise _fail(path, "no <entity>_<metric> column besides 'time'")
    inject = _read_inject(root / INJECT_FILE) if root.is_dir() else None
    return TabularCase(path, time, series, inject)


def _numeric(v: object) -> bool:
    try:
        float(str(v))
    except ValueError:
        return False
    return True


def _read_inject(path: Path) -> float | None:
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise _fail(path, f"{text[:40]!r} is not a Unix time in seconds")
    return value


# ------------------------------------------------------------------------ roles and start


def end_to_end_entities(case: TabularCase) -> list[str]:
    """Entities whose every metric is a latency or success metric (views, not processes)."""
    metrics: dict[str, list[str]] = {}
    for c in case.series:
        metrics.setdefault(entity_of(c), []).append(metric_of(c))
    return [
        e
        for e, ms in metrics.items()
        if any(_is_latency(m) for m in ms) and all(_is_latency(m) or _is_quality(m) for m in ms)
    ]


def front_door_latency(case: TabularCase) -> list[str]:
    """The latency columns the anomaly is detected on (see the module doc)."""
    e2e = end_to_end_entities(case)
    own = {c: x for c, x in case.series.items() if _is_latency(metric_of(c))}
    pool = [c for c in own if entity_of(c) in e2e] or list(own)
    if not pool:
        return []
    level: dict[str, float] = {}
    for c in pool:
        finite = own[c][np.isfinite(own[c])]
        if len(finite):
            e = entity_of(c)
            level[e] = max(level.get(e, -math.inf), float(np.median(finite)))
    if not level:
        return []
    door = max(level, key=lambda e: (level[e], e))
    return [c for c in pool if entity_of(c) == door]


def find_start(case: TabularCase, inject_time: float | None = None) -> tuple[int, str, str | None]:
    """(index of the first anomalous row, ``inject-time`` | ``change-point``, the column the
    change point was found on). ``inject_time`` overrides the case's ``inject_time.txt``.

    Raises :class:`TabularError` when fewer than :data:`MIN_BEFORE` rows precede the start or
    fewer than :data:`MIN_AFTER` follow it, or, without an inject time, when there is no
    latency column or no change point upward in it."""
    n = len(case.time)
    t = inject_time if inject_time is not None else case.inject_time
    if t is not None:
        start = int(np.searchsorted(case.time, t, side="left"))
        _check_sides(case, start, f"inject time {t:.0f} ({format_ns(int(t * 1e9))})")
        return start, "inject-time", None
    cols = front_door_latency(case)
    if not cols:
        raise _fail(case.path, "no latency column to find the anomaly on; give an inject time")
    best: tuple[float, int, str] | None = None
    for c in cols:
        s = bocpd_start(case.series[c], min_before=MIN_BEFORE, min_after=MIN_AFTER)
        if s is None:
            continue
        p = float(changepoint_probability(case.series[c])[s])
        if best is None or p > best[0]:
            best = (p, s, c)
    if best is None:
        raise _fail(
            case.path,
            f"no change point upward in {', '.join(cols)} with {MIN_BEFORE} rows before and "
            f"{MIN_AFTER} after it ({n} rows); give an inject time",
        )
    return best[1], "change-point", best[2]


def _check_sides(case: TabularCase, start: int, what: str) -> None:
    before, after = start, len(case.time) - start
    if before < MIN_BEFORE or after < MIN_AFTER:
        raise _fail(
            case.path,
            f"{what} leaves {before} rows before and {after} from it on; "
            f"need at least {MIN_BEFORE} before and {MIN_AFTER} after",
        )


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


def rank_entities(
    case: TabularCase, start: int, rules: Rules | None = None
) -> tuple[list[str], dict[str, float], dict[str, Evidence]]:
    """Entities by decreasing score for an anomaly starting at row ``start``, their scores and
    top evidence (see the module doc)."""
    r = rules or Rules()
    cands = candidate_series(case)
    evidence_cols = {
        c: x for c, x in cands.items() if not (r.drop_context and _is_context(metric_of(c)))
    }
    if r.drop_shared:
        shared = _shared(evidence_cols)
        evidence_cols = {c: x for c, x in evidence_cols.items() if c not in shared}
    evidence_cols = {c: (-x if _is_quality(metric_of(c)) else x) for c, x in evidence_cols.items()}
    before = np.arange(len(case.time)) < start
    during = ~before
    best: dict[str, Evidence] = {}
    for col, ch in rank_changes(evidence_cols, before, during):
        entity, metric = entity_of(col), metric_of(col)
        latency = _is_latency(metric)
        if ch.score <= 0 and not (latency and r.latency_both_ways):
            continue
        score, share = abs(ch.score), 0.0
        calls_col = f"{entity}_client-{metric}"
        if r.inherit and latency and calls_col in case.series:
            share = inherited_share(ch, robust_change(case.series[calls_col], before, during))
            score *= 1.0 - share
        sign = -1.0 if _is_quality(metric) else 1.0
        ev = Evidence(col, sign * ch.before, sign * ch.during, score, share)
        if entity not in best or score > best[entity].score:
            best[entity] = ev
    scores = {e: 0.0 for e in dict.fromkeys(entity_of(c) for c in cands)}
    scores.update({e: ev.score for e, ev in best.items()})
    ranks = sorted(scores, key=lambda e: (-scores[e], e))
    return ranks, scores, best


def rca_table(case: Path | str | TabularCase, inject_time: float | None = None) -> TabularResult:
    """Load ``case`` (unless already loaded), find the anomaly start and rank its entities.
    Raises :class:`TabularError` as :func:`load_case` and :func:`find_start` do, and when the
    table has no candidate entity (only end-to-end views)."""
    c = case if isinstance(case, TabularCase) else load_case(case)
    if not candidate_series(c):
        raise _fail(c.path, "every entity is an end-to-end view (latency/success only)")
    start, how, metric = find_start(c, inject_time)
    ranks, scores, evidence = rank_entities(c, start)
    return TabularResult(ranks, scores, float(c.time[start]), how, metric, evidence)
