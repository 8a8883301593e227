"""Loading a tabular case: a wide CSV of ``time`` and ``<entity>_<metric>`` columns.

A *case* is a CSV file (``data.csv`` in a case folder, or any CSV path): a ``time`` column,
one row per window, then one numeric column per metric named ``<entity>_<metric>`` (the entity
is the text before the first ``_``). A case folder may hold ``inject_time.txt`` (Unix seconds or a
date): rows from that time on are the anomaly.

Tables exported by other tools are rarely that clean, so what has one reading is read that way
and said in the case's ``notes`` (shown by ``cotenant rca-table``) instead of refused:

* a column name that repeats: the first column of that name is kept (pandas' ``time.1`` is a
  repeat of ``time``);
* a time column named ``timestamp``, ``Time`` or ``ts`` when there is no ``time``; times given as
  dates (ISO 8601) are converted, and times in milliseconds, microseconds or nanoseconds (by
  their magnitude) are converted to seconds, the inject time likewise;
* rows without a time are dropped; rows out of order are sorted, and rows that share a time
  are merged (their mean);
* a column not named ``<entity>_<metric>`` (an index written along, ``Unnamed: 0``) is skipped;
* a metric column with some cells that are not numbers: those cells are empty; a column with
  fewer than half its cells numeric is skipped.

:class:`~cotenant.core.errors.TabularError`, naming the file, is raised for what has no reading:
a missing or unreadable file, no time column, times that are neither numbers nor dates, no row
with a time, no metric column left, an ``inject_time.txt`` that holds neither a number nor a
date (a date is read as the time column's are: UTC when it names no zone).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cotenant.core.errors import TabularError

DATA_FILE = "data.csv"
INJECT_FILE = "inject_time.txt"
TIME_NAMES = ("time", "timestamp", "Time", "Timestamp", "ts")
"""Names a time column is looked for under, in this order."""
MIN_NUMERIC = 0.5
"""Share of a metric column's non-empty cells that must be numbers for it to be kept."""


@dataclass(frozen=True)
class TabularCase:
    """One loaded case. ``time``: shape ``(n_rows,)``, Unix seconds, increasing; ``series``:
    column name -> values of shape ``(n_rows,)`` (NaN where empty), in file order; ``notes``:
    what was read leniently (see the module doc)."""

    path: Path
    time: np.ndarray
    series: dict[str, np.ndarray]
    inject_time: float | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def entities(self) -> list[str]:
        return list(dict.fromkeys(entity_of(c) for c in self.series))


def entity_of(column: str) -> str:
    return column.split("_", 1)[0]


def metric_of(column: str) -> str:
    return column.split("_", 1)[1]


def fail(path: Path, what: str) -> TabularError:
    return TabularError(f"{path}: {what}")


def load_case(case: Path | str) -> TabularCase:
    """Read a case folder (``data.csv`` [+ ``inject_time.txt``]) or a bare CSV file (see the
    module doc for what is read leniently and what raises :class:`TabularError`)."""
    root = Path(case)
    if root.is_dir():
        path = root / DATA_FILE
        if not path.is_file():
            raise fail(root, f"no {DATA_FILE} in this case folder")
    elif root.is_file():
        path = root
    else:
        raise fail(root, "no such case folder or CSV file")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        if not header:
            raise fail(path, "is empty")
        frame = pd.read_csv(
            path, low_memory=False, header=None, skiprows=1, names=list(range(len(header)))
        )
    except (OSError, UnicodeDecodeError, csv.Error, pd.errors.ParserError) as exc:
        raise fail(path, f"cannot be read as CSV ({exc})") from exc
    except pd.errors.EmptyDataError as exc:
        raise fail(path, "is empty") from exc
    notes: list[str] = []
    columns = _first_of_each_name(header, notes)
    tcol = next((n for n in TIME_NAMES if n in columns), None)
    if tcol is None:
        raise fail(path, f"no 'time' column (columns: {', '.join(header[:5])}...)")
    if tcol != "time":
        notes.append(f"the time column is {tcol!r}")
    time = _seconds(path, frame[columns[tcol]], notes)
    series: dict[str, np.ndarray] = {}
    skipped: list[str] = []
    for name, idx in columns.items():
        if name in TIME_NAMES:
            continue
        entity, _, metric = name.partition("_")
        if not entity or not metric:
            skipped.append(name)
            continue
        values = _numbers(frame[idx])
        if values is None:
            notes.append(f"column {name!r} is not numeric: skipped")
            continue
        if values[1]:
            notes.append(f"column {name!r}: {values[1]} cells are not numbers (read as empty)")
        series[name] = values[0]
    if skipped:
        notes.append(
            f"columns not named <entity>_<metric> skipped: {', '.join(repr(s) for s in skipped)}"
        )
    if not series:
        raise fail(path, "no <entity>_<metric> column besides 'time'")
    time, series = _ordered(path, time, series, notes)
    inject = _read_inject(root / INJECT_FILE) if root.is_dir() else None
    if inject is not None and _scale(inject) != 1.0:
        notes.append("the inject time is not in seconds: converted")
        inject /= _scale(inject)
    return TabularCase(path, time, series, inject, tuple(notes))


def _first_of_each_name(header: list[str], notes: list[str]) -> dict[str, int]:
    """Column name -> index of its first column; repeats are noted."""
    out: dict[str, int] = {}
    repeated: list[str] = []
    for i, name in enumerate(header):
        if name in out:
            repeated.append(name)
        else:
            out[name] = i
    if repeated:
        names = ", ".join(sorted(set(repeated)))
        notes.append(f"column names repeat ({names}): the first of each kept")
    return out


def _numbers(col: pd.Series) -> tuple[np.ndarray, int] | None:
    """The column as floats and how many non-empty cells were not numbers; None when fewer
    than :data:`MIN_NUMERIC` of its non-empty cells are numbers."""
    if pd.api.types.is_numeric_dtype(col):
        return col.to_numpy(dtype=np.float64), 0
    values = pd.to_numeric(col, errors="coerce")
    given = int(col.notna().sum())
    bad = int((col.notna() & values.isna()).sum())
    if given and (given - bad) / given < MIN_NUMERIC:
        return None
    return values.to_numpy(dtype=np.float64), bad


def _seconds(path: Path, col: pd.Series, notes: list[str]) -> np.ndarray:
    """The time column in Unix seconds (NaN where empty)."""
    if not pd.api.types.is_numeric_dtype(col):
        parsed = pd.to_datetime(col, errors="coerce", utc=True, format="mixed")
        if parsed.notna().sum() < max(1, MIN_NUMERIC * col.notna().sum()):
            raise fail(path, "the 'time' column is neither numeric Unix seconds nor dates")
        notes.append("times are dates: converted to Unix seconds")
        since = parsed - pd.Timestamp(0, tz="UTC")
        return np.asarray(since.dt.total_seconds(), dtype=np.float64)
    t = col.to_numpy(dtype=np.float64)
    finite = t[np.isfinite(t)]
    scale = _scale(float(np.median(finite))) if len(finite) else 1.0
    if scale != 1.0:
        unit = {1e3: "milliseconds", 1e6: "microseconds", 1e9: "nanoseconds"}[scale]
        notes.append(f"times are in {unit}: converted to seconds")
    out: np.ndarray = t / scale
    return out


def _scale(t: float) -> float:
    """The factor that brings a Unix time of this magnitude to seconds (1e11 s is the year
    5138: anything larger is in a finer unit)."""
    a = abs(t)
    return 1e9 if a >= 1e17 else 1e6 if a >= 1e14 else 1e3 if a >= 1e11 else 1.0


def _ordered(
    path: Path, time: np.ndarray, series: dict[str, np.ndarray], notes: list[str]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Rows with a time, in time order, rows of one time merged (their mean)."""
    ok = np.isfinite(time)
    if not ok.any():
        raise fail(path, "the 'time' column has no finite value")
    if not ok.all():
        notes.append(f"{int((~ok).sum())} rows without a time dropped")
    frame = pd.DataFrame({c: x[ok] for c, x in series.items()})
    frame.insert(0, "\x00time", time[ok])
    steps = np.diff(frame["\x00time"].to_numpy())
    if np.any(steps <= 0):
        n = len(frame)
        frame = frame.groupby("\x00time", sort=True).mean()
        frame = frame.reset_index()
        merged = n - len(frame)
        notes.append(
            "rows were not in time order: sorted"
            + (f", {merged} rows sharing a time merged" if merged else "")
        )
    t = frame["\x00time"].to_numpy(dtype=np.float64)
    return t, {c: frame[c].to_numpy(dtype=np.float64) for c in series}


def _read_inject(path: Path) -> float | None:
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace").strip()
    try:
        value = float(text)
    except ValueError:
        value = _date_seconds(text)
    if not math.isfinite(value):
        raise fail(path, f"{text[:40]!r} is neither a Unix time in seconds nor a date")
    return value


def _date_seconds(text: str) -> float:
    """Unix seconds of an ISO 8601 date (UTC when it names no zone, as the time column's
    dates are read); NaN when ``text`` is not one."""
    when = pd.to_datetime(text, errors="coerce", utc=True)
    if pd.isna(when):
        return math.nan
    return float((when - pd.Timestamp(0, tz="UTC")).total_seconds())
