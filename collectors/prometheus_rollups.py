"""The store's per-minute rollups, read from the fleet's recording rules in Prometheus.

The weekly report (:mod:`reports.compute`) reads ``request_rollup_1m``, ``gpu_rollup_1m`` and
``process_rollup_1m``. In fleet mode nothing is ingested centrally, so central serve fills those
tables for the weeks it reports from the per-minute series that ``rules/fleet.rules.yml``
records (:mod:`alerts.rules_fleet`): one range query per column at a 60 s step, whatever the
number of nodes.

Only what the report reads is imported (``store.report_queries``): per (model, GPU) minute the
requests, errors and p99 of the latency, TTFT and TPOT; per GPU minute its utilisations, PCIe,
memory and throttling; per process minute only the SM share of processes that serve no model,
over 1 % (filtered in PromQL: they are most of a fleet's series). Other columns stay null;
the recording rules keep them for dashboards and ad-hoc PromQL. ``clock_event_reasons`` is
``0x40`` (a thermal slowdown bit) in minutes where any thermal or power reason was active, 0
otherwise: which reason is not kept. Utilisations come back in percent, as the store holds them.

Each recorded sample is the value over the clock minute before the minute it was recorded in
(:func:`alerts.rules_fleet.minute_of`); minute ``[m, m + 60 s)`` is read at ``m + 120 s - 1 ms``
(the latest sample of the minute after it, whatever the group's offset within its interval).
Rows are built column-wise from the answers' arrays (a week of a node is ~10^5 rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from collectors import promql
from collectors.prometheus import PrometheusSource
from store.queries import TimeRange
from store.schema import arrow_schema

MINUTE_S = 60.0
THROTTLED_BIT = 0x40

REQUEST_SERIES: dict[str, tuple[str, float]] = {
    # column -> (recorded series, scale to the store's unit)
    "count": ("cotenant:requests:increase_minute", 1.0),
    "errors": ("cotenant:request_errors:increase_minute", 1.0),
    "p99_ms": ("cotenant:request_latency_seconds:p99_minute", 1e3),
    "ttft_p99_ms": ("cotenant:time_to_first_token_seconds:p99_minute", 1e3),
    "tpot_p99_ms": ("cotenant:time_per_output_token_seconds:p99_minute", 1e3),
}
GPU_SERIES: dict[str, tuple[str, float]] = {
    "sm_util": ("cotenant:gpu_sm_utilization:avg_minute", 100.0),
    "mem_util": ("cotenant:gpu_memory_bandwidth_utilization:avg_minute", 100.0),
    "pcie_tx_bps": ("cotenant:gpu_pcie_bytes_per_second:avg_minute", 1.0),  # TX + RX
    "mem_used_bytes_max": ("cotenant:gpu_memory_used_bytes:max_minute", 1.0),
    "mem_total_bytes": ("cotenant:gpu_memory_total_bytes:max_minute", 1.0),
    "clock_event_reasons": ("cotenant:gpu_throttled:max_minute", THROTTLED_BIT),
}
PROCESS_SM = 'cotenant:process_sm_utilization:avg_minute{model=""}'
"""Processes that serve no model (the report's co-tenants besides models)."""
PROCESS_SM_MIN = 0.01
"""The report counts a process as a tenant from 1 % SM in a minute."""


def minute_query(series: str, by: tuple[str, ...], above: float | None = None) -> str:
    """The recorded ``series`` of each minute, summed ``by`` these labels (only those
    ``above`` a value, when given): only a sample recorded within the minute (a plain selector
    would repeat the last one for the 5 minutes of Prometheus' lookback after a series stops)."""
    q = f"sum by ({', '.join(by)}) (last_over_time({series}[1m]))"
    return q if above is None else f"{q} > {above!r}"


# on_grid evaluates at each window's end: windows start 60 s - 1 ms after the minute's, so
# minute m is read at m + 120 s - 1 ms
READ_LAG_NS = 60_000_000_000 - 1_000_000
DAY_POINTS = 1440


def _column(
    source: PrometheusSource,
    g: promql.Grid,
    query: str,
    keys: tuple[str, ...],
    col: str,
    scale: float,
) -> pd.DataFrame | None:
    """One query's answer as rows ``(minute_ns, *keys, col)``; None when it has none. Read a
    day at a time: Prometheus holds about 2 x series x points samples for one of these queries
    and refuses more than ``--query.max-samples`` (50 M), which a week of a fleet's process
    series in one range query passes from about 20 nodes; a day's passes it from about 135."""
    parts = []
    for c in range(0, g.n, DAY_POINTS):
        day = promql.Grid(g.w0 + c * g.step + READ_LAG_NS, g.step, min(DAY_POINTS, g.n - c))
        parts += _frames(source.on_grid(query, day), keys, col, scale)
    if not parts:
        return None
    return pd.concat(parts, ignore_index=True).set_index(["minute_ns", *keys])


def _frames(
    answer: list[tuple[dict[str, str], np.ndarray, np.ndarray]],
    keys: tuple[str, ...],
    col: str,
    scale: float,
) -> list[pd.DataFrame]:
    parts = []
    for labels, ts, vals in answer:
        ok = np.isfinite(vals)
        n = int(ok.sum())
        if n == 0:
            continue
        frame: dict[str, Any] = {"minute_ns": ts[ok] - READ_LAG_NS}
        for k in keys:
            frame[k] = np.full(n, labels.get(k, ""), dtype=object)
        frame[col] = vals[ok] * scale
        parts.append(pd.DataFrame(frame))
    return parts


def _read(
    source: PrometheusSource,
    rng: TimeRange,
    series: dict[str, tuple[str, float]],
    keys: tuple[str, ...],
    above: float | None = None,
) -> pd.DataFrame:
    """Rows ``(minute_ns, *keys, *columns)`` of every minute any of ``series`` holds."""
    g = promql.grid(rng, MINUTE_S)
    cols = [
        c
        for col, (name, scale) in series.items()
        if (c := _column(source, g, minute_query(name, keys, above), keys, col, scale)) is not None
    ]
    if not cols:
        return pd.DataFrame(columns=["minute_ns", *keys, *series])
    return (
        cols[0].join(cols[1:], how="outer").reset_index()
        if len(cols) > 1
        else (cols[0].reset_index())
    )


def _table(name: str, frame: pd.DataFrame) -> pa.Table:
    """``frame`` as ``name``'s Arrow schema: missing columns null, integers rounded."""
    schema = arrow_schema(name)
    n = len(frame)
    cols = []
    for f in schema:
        if f.name not in frame.columns:
            cols.append(pa.nulls(n, f.type))
            continue
        v = frame[f.name]
        if pa.types.is_integer(f.type):
            num = pd.to_numeric(v, errors="coerce")
            cols.append(pa.array(num.round().astype("Int64"), f.type))
        else:
            cols.append(pa.array(v.to_numpy(), f.type, from_pandas=True))
    return pa.Table.from_arrays(cols, schema=schema)


def fleet_rollups(source: PrometheusSource, lo_ns: int, hi_ns: int) -> dict[str, pa.Table]:
    """The rollup rows of the minutes in ``[lo_ns, hi_ns)`` (whole minutes), by table name.
    Raises :class:`store.errors.SourceError` when Prometheus cannot be read."""
    lo = lo_ns - lo_ns % 60_000_000_000
    rng = TimeRange(lo, max(lo + 1, hi_ns))
    req = _read(source, rng, REQUEST_SERIES, ("model", "gpu"))
    req = req[pd.to_numeric(req["count"], errors="coerce").fillna(0) > 0].copy()
    req["errors"] = pd.to_numeric(req["errors"], errors="coerce").fillna(0.0)
    gpus = _read(source, rng, GPU_SERIES, ("host", "gpu"))
    gpus["samples"] = 1
    keys = ("host", "gpu", "pid", "process", "model")
    procs = _read(source, rng, {"sm_util": (PROCESS_SM, 100.0)}, keys, above=PROCESS_SM_MIN)
    procs = procs.rename(columns={"process": "process_name"})
    procs["gpu"] = procs["gpu"].where(procs["gpu"] != "", None)  # a host-only process
    procs["model"] = None
    procs["pid"] = pd.to_numeric(procs["pid"], errors="coerce")
    procs["samples"] = 1
    return {
        "request_rollup_1m": _table(
            "request_rollup_1m", req.sort_values(["minute_ns", "model", "gpu"])
        ),
        "gpu_rollup_1m": _table("gpu_rollup_1m", gpus.sort_values(["minute_ns", "host", "gpu"])),
        "process_rollup_1m": _table("process_rollup_1m", procs),
    }
