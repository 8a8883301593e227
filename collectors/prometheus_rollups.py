"""The store's per-minute rollups, read from the fleet's recording rules in Prometheus.

The weekly report (:mod:`reports.compute`) reads ``request_rollup_1m``, ``gpu_rollup_1m`` and
``process_rollup_1m``. In fleet mode nothing is ingested centrally, so central serve fills those
tables for the weeks it reports from the per-minute series that ``rules/fleet.rules.yml`` and
``rules/cotenant.rules.yml`` record (:mod:`alerts.rules_fleet`): one range query per series at
a 60 s step, whatever the number of nodes — a week over a whole cluster is a dozen queries.

Each recorded sample is the value over the clock minute before the minute it was recorded in
(:func:`alerts.rules_fleet.minute_of`); minute ``[m, m + 60 s)`` is read at ``m + 120 s - 1 ms``
(the latest sample of the minute after it, whatever the group's offset within its interval).
Columns with no recording rule are null (``latency_max_ms``,
``batch_size_mean``, token sums, per-minute maxima other than memory); ``clock_event_reasons`` is
``0x40`` (a thermal slowdown bit) in minutes where any thermal or power reason was active, 0
otherwise: which reason is not kept. Utilisations come back in percent, as the store holds them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from collectors import promql
from collectors.prometheus import PrometheusSource
from store.queries import TimeRange
from store.schema import PHASES, arrow_schema

MINUTE_S = 60.0
THROTTLED_BIT = 0x40

REQUEST_SERIES: dict[str, tuple[str, float]] = {
    # column -> (recorded series, scale to the store's unit)
    "count": ("cotenant:requests:increase_minute", 1.0),
    "errors": ("cotenant:request_errors:increase_minute", 1.0),
    "latency_sum_ms": ("cotenant:request_latency_seconds:sum_minute", 1e3),
    "p50_ms": ("cotenant:request_latency_seconds:p50_minute", 1e3),
    "p90_ms": ("cotenant:request_latency_seconds:p90_minute", 1e3),
    "p95_ms": ("cotenant:request_latency_seconds:p95_minute", 1e3),
    "p99_ms": ("cotenant:request_latency_seconds:p99_minute", 1e3),
    "ttft_p99_ms": ("cotenant:time_to_first_token_seconds:p99_minute", 1e3),
    "tpot_p99_ms": ("cotenant:time_per_output_token_seconds:p99_minute", 1e3),
}
PHASE_SERIES = "cotenant:request_phase_seconds:sum_minute"
GPU_SERIES: dict[str, tuple[str, float]] = {
    "sm_util": ("cotenant:gpu_sm_utilization:avg_minute", 100.0),
    "mem_util": ("cotenant:gpu_memory_bandwidth_utilization:avg_minute", 100.0),
    "pcie_tx_bps": ("cotenant:gpu_pcie_bytes_per_second:avg_minute", 1.0),  # TX + RX
    "mem_used_bytes_max": ("cotenant:gpu_memory_used_bytes:max_minute", 1.0),
    "mem_total_bytes": ("cotenant:gpu_memory_total_bytes:max_minute", 1.0),
    "power_w": ("cotenant:gpu_power_watts:avg_minute", 1.0),
    "clock_event_reasons": ("cotenant:gpu_throttled:max_minute", THROTTLED_BIT),
}
PROCESS_SERIES: dict[str, tuple[str, float]] = {
    "sm_util": ("cotenant:process_sm_utilization:avg_minute", 100.0),
    "mem_used_bytes_max": ("cotenant:process_memory_used_bytes:max_minute", 1.0),
    "cpu_cores": ("cotenant:process_cpu_cores:avg_minute", 1.0),
}


def minute_query(series: str, by: tuple[str, ...]) -> str:
    """The recorded ``series`` of each minute, summed ``by`` these labels: only a sample
    recorded within the minute (a plain selector would repeat the last one for the 5 minutes
    of Prometheus' lookback after a series stops)."""
    return f"sum by ({', '.join(by)}) (last_over_time({series}[1m]))"


def _read(
    source: PrometheusSource,
    rng: TimeRange,
    series: dict[str, tuple[str, float]],
    keys: tuple[str, ...],
) -> dict[tuple[Any, ...], dict[str, float]]:
    """(minute_ns, *key labels) -> column -> value, for every series' query."""
    rows: dict[tuple[Any, ...], dict[str, float]] = defaultdict(dict)
    # The rule group is evaluated at an offset within its minute (a hash of the group), and
    # the sample recorded at t holds the clock minute before floor(t / 60 s): minute m is the
    # latest sample in [m + 60 s - 1 ms, m + 120 s - 1 ms] (any offset in [0, 60 s) lands
    # there, and an earlier evaluation at m + 60 s - 1 ms is older than it).
    g = promql.grid(rng, MINUTE_S)
    shifted = promql.Grid(g.w0 + READ_LAG_NS, g.step, g.n)
    for col, (name, scale) in series.items():
        # summed by the key labels: adds up nodes (requests); one series per key otherwise
        for labels, ts, vals in source.on_grid(minute_query(name, keys), shifted):
            key = tuple(labels.get(k, "") for k in keys)
            for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
                if np.isfinite(v):
                    rows[(int(t) - READ_LAG_NS, *key)][col] = v * scale
    return rows


# on_grid evaluates at each window's end: windows start 60 s - 1 ms after the minute's, so
# minute m is read at m + 120 s - 1 ms
READ_LAG_NS = 60_000_000_000 - 1_000_000


def _table(name: str, rows: Iterable[dict[str, Any]]) -> pa.Table:
    schema = arrow_schema(name)
    data = list(rows)
    cols = []
    for f in schema:
        vals = [r.get(f.name) for r in data]
        if pa.types.is_integer(f.type):
            vals = [None if v is None else round(v) for v in vals]
        cols.append(pa.array(vals, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def fleet_rollups(source: PrometheusSource, lo_ns: int, hi_ns: int) -> dict[str, pa.Table]:
    """The rollup rows of the minutes in ``[lo_ns, hi_ns)`` (whole minutes), by table name.
    Raises :class:`store.errors.SourceError` when Prometheus cannot be read."""
    lo = lo_ns - lo_ns % 60_000_000_000
    rng = TimeRange(lo, max(lo + 1, hi_ns))
    req = _read(source, rng, REQUEST_SERIES, ("model", "gpu"))
    for (minute, model, gpu, phase), f in _read(
        source, rng, {"phase_sum": (PHASE_SERIES, 1e3)}, ("model", "gpu", "phase")
    ).items():
        if phase in PHASES:
            req[(minute, model, gpu)][f"{phase}_sum"] = f["phase_sum"]
    requests = []
    for (minute, model, gpu), f in sorted(req.items()):
        n = f.get("count")
        if not n or n <= 0:
            continue
        row: dict[str, Any] = {"minute_ns": minute, "model": model, "gpu": gpu, **f}
        row.setdefault("errors", 0.0)
        for p in PHASES:
            s = f.get(f"{p}_sum")
            row[f"{p}_ms"] = None if s is None else s / n
        requests.append(row)
    gpus = [
        {"minute_ns": m, "host": h, "gpu": g, "samples": 1, **f}
        for (m, h, g), f in sorted(_read(source, rng, GPU_SERIES, ("host", "gpu")).items())
    ]
    procs = []
    for (m, h, g, pid, name, model), f in sorted(
        _read(source, rng, PROCESS_SERIES, ("host", "gpu", "pid", "process", "model")).items()
    ):
        procs.append(
            {
                "minute_ns": m,
                "host": h,
                "gpu": g or None,
                "pid": int(pid) if pid.isdigit() else None,
                "process_name": name,
                "model": model or None,
                "samples": 1,
                **f,
            }
        )
    return {
        "request_rollup_1m": _table("request_rollup_1m", requests),
        "gpu_rollup_1m": _table("gpu_rollup_1m", gpus),
        "process_rollup_1m": _table("process_rollup_1m", procs),
    }
