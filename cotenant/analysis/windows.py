"""Aligned windows for analysis: every series of one GPU on one time grid.

A :class:`GpuWindows` holds, for ``[since, until)`` cut into ``step_s`` windows, NumPy arrays of
shape ``(n_windows,)``: per model on the GPU its request windows (count, rate, quantiles, mean
phases, batch size), the GPU's counters, and per process (keyed by process name) its SM and
memory utilisation and memory used; per generative model (requests with token counts) its
TTFT, TPOT and token-count series (:data:`store.frames.TOKEN_WINDOWS`). Missing windows are NaN
(counts 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cotenant.core.frames import GPU_WINDOWS, REQUEST_WINDOWS, TOKEN_WINDOWS
from cotenant.core.readers import MetricSource, check_range
from cotenant.core.timerange import TimeRange

REQ_FIELDS = tuple(n for n in REQUEST_WINDOWS.names if n not in ("ts_ns", "model", "gpu"))
GPU_FIELDS = tuple(n for n in GPU_WINDOWS.names if n not in ("ts_ns", "host", "gpu"))
PROC_FIELDS = ("sm_util", "mem_util", "mem_used_bytes")
TOKEN_FIELDS = tuple(n for n in TOKEN_WINDOWS.names if n not in ("ts_ns", "model", "gpu"))


@dataclass
class GpuWindows:
    gpu: str
    since_ns: int
    step_ns: int
    n: int
    models: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    counters: dict[str, np.ndarray] = field(default_factory=dict)
    processes: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    process_model: dict[str, str | None] = field(default_factory=dict)
    tokens: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    hosts: set[str] = field(default_factory=set)
    """Hosts the GPU's counter and process rows name (empty when there are none): in fleet
    mode, host CPU is read from these hosts only."""

    @property
    def ts_ns(self) -> np.ndarray:
        return self.since_ns + np.arange(self.n, dtype=np.int64) * self.step_ns

    def index(self, ts_ns: int) -> int:
        return int((ts_ns - self.since_ns) // self.step_ns)


def _grid(table: pa.Table, since: int, step: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    idx = (table.column("ts_ns").to_numpy() - since) // step
    ok = (idx >= 0) & (idx < n)
    return idx.astype(np.int64), ok


def _col(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def pivot_requests(
    table: pa.Table, since: int, step: int, n: int, fields: tuple[str, ...] = REQ_FIELDS
) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """REQUEST_WINDOWS (or TOKEN_WINDOWS, with its ``fields``) rows -> {(model, gpu): {field:
    array[n]}} on the grid."""
    out: dict[tuple[str, str], dict[str, np.ndarray]] = {}
    if table.num_rows == 0:
        return out
    idx, ok = _grid(table, since, step, n)
    models = np.asarray(table.column("model").to_pylist(), dtype=object)
    gpus = np.asarray([g or "" for g in table.column("gpu").to_pylist()], dtype=object)
    cols = {f: _col(table, f) for f in fields}
    keys = np.char.add(models.astype(str), np.char.add("\x1f", gpus.astype(str)))
    for key in np.unique(keys[ok]):
        sel = ok & (keys == key)
        model, gpu = str(key).split("\x1f", 1)
        series: dict[str, np.ndarray] = {}
        for f, v in cols.items():
            arr = (
                np.zeros(n)
                if f in ("count", "rate_rps", "arrival_rps", "errors")
                else np.full(n, np.nan)
            )
            arr[idx[sel]] = v[sel]
            series[f] = arr
        out[(model, gpu)] = series
    return out


def gpu_windows(source: MetricSource, gpu: str, rng: TimeRange, step_s: float) -> GpuWindows:
    """Every series of ``gpu`` over ``rng`` on one grid."""
    check_range(rng, step_s)
    return windows_from_tables(gpu, rng, step_s, *_read(source, gpu, rng, step_s))


def _read(source: MetricSource, gpu: str, rng: TimeRange, step_s: float) -> Tables:
    return (
        source.request_windows(rng, step_s, gpu=gpu),
        source.gpu_windows(rng, step_s, gpu=gpu),
        source.process_windows(rng, step_s, gpu=gpu),
        source.token_windows(rng, step_s, gpu=gpu),
    )


Tables = tuple[pa.Table, pa.Table, pa.Table, pa.Table]
"""One GPU's request, counter, process and token frames."""


def windows_from_tables(
    gpu: str,
    rng: TimeRange,
    step_s: float,
    req: pa.Table,
    counters: pa.Table,
    procs: pa.Table,
    tokens: pa.Table | None = None,
) -> GpuWindows:
    """Pivot the frames of one GPU onto the grid of ``rng``."""
    since, until, step = check_range(rng, step_s)
    n = int(-(-(until - since) // step))
    w = GpuWindows(gpu, since, step, n)
    for (model, g), series in pivot_requests(req, since, step, n).items():
        if g == gpu:
            w.models[model] = series
    if tokens is not None and tokens.num_rows:
        for (model, g), series in pivot_requests(tokens, since, step, n, TOKEN_FIELDS).items():
            if g == gpu and model in w.models:
                w.tokens[model] = series
    if counters.num_rows:
        idx, ok = _grid(counters, since, step, n)
        for f in GPU_FIELDS:
            arr = np.full(n, np.nan)
            arr[idx[ok]] = _col(counters, f)[ok]
            w.counters[f] = arr
    if procs.num_rows:
        _pivot_processes(w, procs, since, step, n)
    for t in (counters, procs):
        if t.num_rows:
            w.hosts.update(h for h in pc.unique(t.column("host")).to_pylist() if h)
    return w


class WindowCache:
    """The continuous loop's windows of one GPU, read incrementally.

    Each call re-reads only from ``overlap_s`` before the end of the previous read (late rows
    of the last seconds are picked up), keeps the frames' rows still inside the new range, and
    pivots them. A range that does not continue the previous one is read in full. Every
    ``refresh_s`` (of the caller's clock) after the last full read, rows that landed later
    than ``overlap_s`` (a backfill through OTLP, a request longer than ``overlap_s`` counted
    where it arrived, GPU samples held up on a busy host) are looked for: the GPU and process
    frames are read in full (cheap), and the request and token frames too when the source
    counts requests in the kept range other than the kept windows do
    (:meth:`MetricSource.request_counts`; a source that cannot count reads them in full)."""

    def __init__(
        self,
        source: MetricSource,
        gpu: str,
        step_s: float,
        overlap_s: float = 30.0,
        refresh_s: float = 60.0,
    ) -> None:
        self._source = source
        self._gpu = gpu
        self._step_s = step_s
        self._overlap_ns = int(overlap_s * 1e9)
        self._refresh_ns = int(refresh_s * 1e9)
        self._tables: Tables | None = None
        self._until: int | None = None
        self._full_at = 0
        self.full_reads = 0  # request frames read in full (a late row, or a new range)

    def get(self, rng: TimeRange) -> GpuWindows:
        since, until, step = check_range(rng, self._step_s)
        src, gpu, s = self._source, self._gpu, self._step_s
        old = self._tables
        if old is None or self._until is None or not (since <= self._until <= until):
            self._full_at = until
            self._tables = _read(src, gpu, TimeRange(since, until), s)
            self.full_reads += 1
        else:
            start = max(since, self._until - self._overlap_ns)
            start -= (start - since) % step  # stay on the grid
            refresh = until - self._full_at >= self._refresh_ns
            if refresh:
                self._full_at = until
            if refresh and not self._kept_complete(old[0], since, start, step):
                self._tables = _read(src, gpu, TimeRange(since, until), s)
                self.full_reads += 1
            else:
                # the requests from start; on a refresh, the counters over the whole range
                late = TimeRange(start, until)
                over = TimeRange(since, until) if refresh else late
                counters = src.gpu_windows(over, s, gpu=gpu)
                procs = src.process_windows(over, s, gpu=gpu)
                self._tables = (
                    _joined(old[0], src.request_windows(late, s, gpu=gpu), since, start),
                    counters if refresh else _joined(old[1], counters, since, start),
                    procs if refresh else _joined(old[2], procs, since, start),
                    _joined(old[3], src.token_windows(late, s, gpu=gpu), since, start),
                )
        self._until = until
        return windows_from_tables(gpu, rng, s, *self._tables)

    def _kept_complete(self, req: pa.Table, since: int, start: int, step: int) -> bool:
        """Whether the source counts as many requests completed and arrived in the kept
        windows ``[since, start)`` as they hold (no row landed there since they were read)."""
        if start <= since:
            return True
        counted = self._source.request_counts(TimeRange(since, start), self._gpu)
        if counted is None:
            return False
        kept = _between(req, since, start)
        done = float(pc.sum(kept.column("count")).as_py() or 0.0)
        came = float(pc.sum(kept.column("arrival_rps")).as_py() or 0.0) * step / 1e9
        return counted == (round(done), round(came))


def _joined(old: pa.Table, new: pa.Table, since: int, start: int) -> pa.Table:
    return pa.concat_tables([_between(old, since, start), new])


def _between(t: pa.Table, lo: int, hi: int) -> pa.Table:
    ts = t.column("ts_ns")
    return t.filter(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)))


def _pivot_processes(w: GpuWindows, pt: pa.Table, since: int, step: int, n: int) -> None:
    idx, ok = _grid(pt, since, step, n)
    names = [
        p or f"pid {pid}"
        for p, pid in zip(
            pt.column("process_name").to_pylist(), pt.column("pid").to_pylist(), strict=True
        )
    ]
    models = pt.column("model").to_pylist()
    cols = {f: _col(pt, f) for f in PROC_FIELDS}
    name_arr = np.asarray(names, dtype=object)
    for name in sorted(set(names)):
        sel = ok & (name_arr == name)
        series = {}
        for f, v in cols.items():
            arr = np.full(n, np.nan)
            arr[idx[sel]] = v[sel]
            series[f] = arr
        w.processes[name] = series
        w.process_model[name] = next((m for m, s in zip(models, sel, strict=True) if s and m), None)


def gpus_of(source: MetricSource, rng: TimeRange, step_s: float) -> dict[str, list[str]]:
    """GPU -> models served on it in ``rng``."""
    out: dict[str, list[str]] = {}
    for m, g in source.model_gpus(rng):
        out.setdefault(g, []).append(m)
    return out
