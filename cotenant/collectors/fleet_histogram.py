"""The agent's request series for ``/metrics``: latency by phase with exemplars, and lock waits.

``cotenant_request_duration_seconds{node,model,gpu,phase}`` is a classic histogram built with
NumPy per normalized batch (one ``searchsorted`` + ``bincount`` per phase, no per-request
Python). Its bucket edges are chosen for the p99 that central diagnosis reads with
``histogram_quantile``:

* ``phase="total"``: :data:`TOTAL_BUCKETS_S`, three edges per doubling from 1 ms to 65.5 s
  (ratio 2^(1/3) ~ 1.26). ``histogram_quantile`` interpolates linearly inside a bucket, so a
  p99 is off by at most one bucket's width: 26 % of the value in the worst case, about 6 %
  for a typical tail (the quantile falls mid-bucket and latency densities are smooth at that
  scale). The classic default (1-2.5-5 per decade) has buckets up to 2.5x wide: a p99 that
  moves from 110 to 240 ms stays inside the 100-250 ms bucket and is read as a flat line
  whenever the share of requests above 100 ms does not change.
* other phases: :data:`PHASE_BUCKETS_S`, one edge per factor 4 (1 ms .. 16.4 s). Central
  diagnosis reads phase *means* (``_sum`` / ``_count``); the coarse buckets only show where a
  phase's tail sits, and keep a node under 5,000 series (docs/performance.md).

A phase's series appear once a request of that (model, GPU) spent time in it, so a model that
never waits on a lock exports no ``lock_wait`` series.

Exemplars: each ``total`` bucket carries the trace id, latency and end time of the latest
request that fell into it (OpenMetrics exposition only, as the format defines them).

The histogram is rendered by :meth:`FleetHistogram.render`, not through prometheus_client's
collector protocol: at 8 GPUs x 4 models it is about 4,500 lines, and building a ``Sample``
per line costs ~35 us (150 ms a scrape on a busy core). Each line's text up to its value is
built once per (model, GPU, phase) and kept, so a scrape only formats the numbers. The agent's
``/metrics`` appends it to the registry's exposition; :meth:`collect` yields the lock-wait
counters (few series) the usual way.

``cotenant_request_errors_total{node,model,gpu}`` counts requests with an error status.
``cotenant_lock_wait_seconds_total{node,model,gpu,lock,holder}`` and
``cotenant_lock_waits_total{…}`` count the wait time and the requests that waited, per lock and
holder; at most :data:`MAX_LOCK_SERIES` (lock, holder) pairs per model, the rest under
``holder="other"``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import CounterMetricFamily, Metric

from cotenant.collectors.ingest_metrics import model_gpu_groups
from cotenant.core.phases import PHASE_COLUMNS, PHASES

TOTAL_BUCKETS_S: tuple[float, ...] = tuple(
    float(f"{2 ** (k / 3) / 1000:.6g}") for k in range(0, 49)
)
"""1 ms .. 65.536 s, three edges per doubling (see the module docstring)."""
PHASE_BUCKETS_S: tuple[float, ...] = tuple(4**k / 1000 for k in range(0, 8))
"""1 ms .. 16.384 s, one edge per factor 4."""
FOLD_ROWS = 20_000
"""Rows kept unfolded at most (:meth:`FleetHistogram.observe_requests`): bounds their memory
(~6 MB) when nothing scrapes."""
_FOLDED_COLUMNS = (
    "ts_end_ns", "latency_ms", "trace_id", "model", "gpu", "status", *PHASE_COLUMNS,
    "lock_name", "lock_holder",
)  # fmt: skip
"""The ``requests`` columns the series are built from."""
MAX_LOCK_SERIES = 20
NAME = "cotenant_request_duration_seconds"


@dataclass
class _Pair:
    """One (model, gpu): total bucket counts, bucket counts per phase (None until a request
    spent time in it), sums (total, then each phase) and the exemplar of each total bucket."""

    index: int  # its row in FleetHistogram's dense arrays; the arrays below are views of it
    total: np.ndarray
    phases: list[np.ndarray | None]
    sums: np.ndarray
    errors: float = 0.0
    exemplars: dict[int, tuple[str, float, float]] = field(default_factory=dict)


class FleetHistogram:
    """The agent's request series (see the module docstring); a prometheus_client collector
    with :meth:`observe_requests` for :class:`collectors.ingest_metrics.IngestMetrics`.

    ``node``: the value of the ``node`` label on every series (how central serve finds the
    agent that owns a GPU). Thread-safe: batches and scrapes may run at once.
    """

    def __init__(
        self,
        node: str,
        total_buckets: tuple[float, ...] = TOTAL_BUCKETS_S,
        phase_buckets: tuple[float, ...] = PHASE_BUCKETS_S,
    ) -> None:
        self.node = node
        self._tb = np.asarray(total_buckets, dtype=np.float64)
        self._pb = np.asarray(phase_buckets, dtype=np.float64)
        self._tles = [*(repr(float(b)) for b in total_buckets), "+Inf"]
        self._ples = [*(repr(float(b)) for b in phase_buckets), "+Inf"]
        self._pairs: dict[tuple[str, str], _Pair] = {}
        # every pair's counts in one array each (row = _Pair.index), so a batch is added with
        # a few numpy calls whatever the number of (model, GPU) pairs in it
        npz = len(PHASES)
        self._total = np.zeros((0, len(self._tb) + 1), dtype=np.int64)
        self._phase = np.zeros((0, npz, len(self._pb) + 1), dtype=np.int64)
        self._sums = np.zeros((0, 1 + npz))
        # (model, gpu, lock, holder) -> [requests, seconds]
        self._locks: dict[tuple[str, str, str, str], list[float]] = {}
        self._lock_keys: dict[str, int] = {}
        self._mutex = threading.Lock()
        self._waiting: list[pa.Table] = []  # batches not folded yet (observe_requests)
        self._waiting_rows = 0
        # (model, gpu, phase index or -1 for total) -> bucket line prefixes, count, sum prefixes
        self._prefixes: dict[tuple[str, str, int], tuple[list[str], str, str]] = {}

    def observe_requests(self, table: pa.Table) -> None:
        """Add a ``requests`` batch (milliseconds, as the store holds them).

        The batch is kept and folded into the counts, with every batch kept since, when the
        series are next read (a scrape) or :data:`FOLD_ROWS` rows are waiting: numpy's
        per-call cost is most of the work at ~40 rows an export, so folding a scrape
        interval's exports at once costs a fraction of folding each (bench/agent_metrics.py).
        What a read sees is the same either way."""
        n = table.num_rows
        if n == 0:
            return
        kept = table.select(_FOLDED_COLUMNS)
        with self._mutex:
            self._waiting.append(kept)
            self._waiting_rows += n
            if self._waiting_rows >= FOLD_ROWS:
                self._fold()

    def _fold(self) -> None:
        """Fold the waiting batches into the counts; call with ``_mutex`` held. Each batch
        counts a (model, GPU)'s phase only if one of its requests of that pair spent time in
        it, exactly as when the batches are folded one by one."""
        if not self._waiting:
            return
        sizes = [t.num_rows for t in self._waiting]
        table = pa.concat_tables(self._waiting).combine_chunks()
        self._waiting, self._waiting_rows = [], 0
        n = table.num_rows
        codes, found = model_gpu_groups(table)
        groups = [(model, gpu) for model, gpu in found]
        ng = len(groups)
        tnb, pnb = len(self._tb) + 1, len(self._pb) + 1
        lat = _seconds(table, "latency_ms")
        tidx = np.searchsorted(self._tb, lat, side="left")
        flat = codes * tnb + tidx
        total = np.bincount(flat, minlength=ng * tnb).reshape(ng, tnb)
        sums = np.zeros((ng, 1 + len(PHASES)))
        sums[:, 0] = np.bincount(codes, weights=lat, minlength=ng)
        failed = pc.fill_null(pc.equal(table["status"], "error"), False)
        errors = np.bincount(
            codes, weights=failed.to_numpy(zero_copy_only=False).astype(np.float64), minlength=ng
        )
        # every phase at once: one searchsorted and one bincount over (pair, phase, bucket),
        # not one per phase
        npz = len(PHASES)
        v = np.column_stack([_seconds(table, c) for c in PHASE_COLUMNS])  # (n, phases)
        pidx = np.searchsorted(self._pb, v, side="left")
        cell = codes[:, None] * npz + np.arange(npz)  # (n, phases): pair x phase
        # (batch, pair, phase) used by one of the batch's requests; a row counts in a phase's
        # buckets when its batch used that phase for its pair
        per_batch = np.repeat(np.arange(len(sizes)), sizes) * ng + codes  # (n,)
        bcell = (per_batch[:, None] * npz + np.arange(npz)).ravel()
        used = np.bincount(bcell, weights=(v > 0).ravel(), minlength=len(sizes) * ng * npz) > 0
        counted = used[bcell]
        phase_counts = (
            np.bincount((cell * pnb + pidx).ravel(), weights=counted, minlength=ng * npz * pnb)
            .astype(np.int64)
            .reshape(ng, npz, pnb)
        )
        sums[:, 1:] = np.bincount(cell.ravel(), weights=v.ravel(), minlength=ng * npz).reshape(
            ng, npz
        )
        spent = (  # (pairs, phases): used by some batch
            np.bincount(cell.ravel(), weights=counted, minlength=ng * npz).reshape(ng, npz) > 0
        )
        # the newest request of each (pair, bucket): last occurrence in the batch
        rev = flat[::-1]
        uniq, first_rev = np.unique(rev, return_index=True)
        last = n - 1 - first_rev
        trace = table["trace_id"].to_pylist()
        end = table["ts_end_ns"].to_numpy(zero_copy_only=False)
        pairs = [self._pair(g) for g in groups]
        rows = np.fromiter((pair.index for pair in pairs), dtype=np.int64, count=ng)
        self._total[rows] += total  # rows are distinct: fancy-index += is exact
        self._sums[rows] += sums
        self._phase[rows] += phase_counts
        for g, pair in enumerate(pairs):
            pair.errors += float(errors[g])
        for g, p in zip(*np.nonzero(spent), strict=True):
            if pairs[g].phases[p] is None:  # its first use: expose its series from now
                pairs[g].phases[p] = self._phase[pairs[g].index, p]
        for key, i in zip(uniq.tolist(), last.tolist(), strict=True):
            tid = trace[i]
            if tid:
                pairs[key // tnb].exemplars[key % tnb] = (
                    str(tid),
                    float(lat[i]),
                    float(end[i]) / 1e9,
                )
        self._observe_locks(table)

    def _pair(self, key: tuple[str, ...]) -> _Pair:
        pair = self._pairs.get((key[0], key[1]))
        if pair is None:
            i = len(self._pairs)
            if i == len(self._total):
                self._grow(max(8, 2 * i))
            pair = self._pairs[(key[0], key[1])] = _Pair(
                index=i, total=self._total[i], phases=[None] * len(PHASES), sums=self._sums[i]
            )
        return pair

    def _grow(self, rows: int) -> None:
        """Room for ``rows`` pairs; every pair's views move to the new arrays."""
        n = len(self._total)
        total = np.zeros((rows, self._total.shape[1]), dtype=np.int64)
        phase = np.zeros((rows, *self._phase.shape[1:]), dtype=np.int64)
        sums = np.zeros((rows, self._sums.shape[1]))
        total[:n], phase[:n], sums[:n] = self._total, self._phase, self._sums
        self._total, self._phase, self._sums = total, phase, sums
        for pair in self._pairs.values():
            i = pair.index
            pair.total, pair.sums = total[i], sums[i]
            pair.phases = [None if c is None else phase[i, p] for p, c in enumerate(pair.phases)]

    def _observe_locks(self, table: pa.Table) -> None:
        """Lock waits of the batch (few rows wait on a lock: a Python loop over those only)."""
        wait = _seconds(table, "lock_wait_ms")
        rows = np.flatnonzero(wait > 0)
        if rows.size == 0:
            return
        pick = pa.array(rows)
        cols = [
            table[c].take(pick).to_pylist() for c in ("model", "gpu", "lock_name", "lock_holder")
        ]
        for (model, gpu, lock, holder), w in zip(zip(*cols, strict=True), wait[rows], strict=True):
            k = (model or "", gpu or "", lock or "", holder or "")
            if k not in self._locks:
                if self._lock_keys.get(k[0], 0) >= MAX_LOCK_SERIES:
                    k = (k[0], k[1], k[2], "other")
                if k not in self._locks:
                    self._lock_keys[k[0]] = self._lock_keys.get(k[0], 0) + 1
                    self._locks[k] = [0.0, 0.0]
            acc = self._locks[k]
            acc[0] += 1
            acc[1] += float(w)

    @property
    def series(self) -> int:
        """Samples the next scrape will expose (for the size figures of docs/performance.md)."""
        with self._mutex:
            self._fold()
            n = 0
            for pair in self._pairs.values():
                n += len(self._tles) + 2
                n += sum(len(self._ples) + 2 for p in pair.phases if p is not None)
            return n + len(self._pairs) + 2 * len(self._locks)

    def _lines(self, model: str, gpu: str, p: int) -> tuple[list[str], str, str]:
        key = (model, gpu, p)
        got = self._prefixes.get(key)
        if got is None:
            phase = "total" if p < 0 else PHASES[p]
            lb = f'node="{_esc(self.node)}",model="{_esc(model)}",gpu="{_esc(gpu)}",phase="{phase}"'
            les = self._tles if p < 0 else self._ples
            got = (
                [f'{NAME}_bucket{{{lb},le="{le}"}} ' for le in les],
                f"{NAME}_count{{{lb}}} ",
                f"{NAME}_sum{{{lb}}} ",
            )
            self._prefixes[key] = got
        return got

    def render(self, openmetrics: bool = False) -> str:
        """The histogram family as exposition text (OpenMetrics with exemplars, or the classic
        text format), without the final ``# EOF``."""
        with self._mutex:
            self._fold()
            snap = [
                (k, p.total.copy(), [None if c is None else c.copy() for c in p.phases],
                 p.sums.tolist(), dict(p.exemplars) if openmetrics else {})
                for k, p in self._pairs.items()
            ]  # fmt: skip
        out = [
            f"# HELP {NAME} Request latency by phase (critical path of the request's spans)\n",
            f"# TYPE {NAME} histogram\n",
        ]
        for (model, gpu), total, phases, sums, ex in snap:
            blocks = [(-1, total)] + [(i, c) for i, c in enumerate(phases) if c is not None]
            for p, counts in blocks:
                pre, count, sum_ = self._lines(model, gpu, p)
                cum = np.cumsum(counts).tolist()
                if ex and p < 0:  # exemplars are on the total's buckets
                    lines = [f"{a}{c}" for a, c in zip(pre, cum, strict=True)]
                    for i, (tid, v, ts) in ex.items():
                        lines[i] += f' # {{trace_id="{_esc(tid)}"}} {v!r} {ts:.3f}'
                    out.append("\n".join(lines))
                else:
                    out.append("\n".join([f"{a}{c}" for a, c in zip(pre, cum, strict=True)]))
                out.append(f"\n{count}{cum[-1]}\n{sum_}{sums[p + 1]!r}\n")
        return "".join(out)

    def collect(self) -> Iterator[Metric]:
        """The error and lock-wait counters (the histogram is :meth:`render`'s)."""
        with self._mutex:
            self._fold()
            locks = [(k, list(v)) for k, v in self._locks.items()]
            errors = [(k, p.errors) for k, p in self._pairs.items()]
        node = self.node
        failed = CounterMetricFamily(
            "cotenant_request_errors", "Requests whose root span had an error status",
            labels=["node", "model", "gpu"],
        )  # fmt: skip
        for (model, gpu), n in errors:
            failed.add_metric([node, model, gpu], n)
        yield failed
        labels = ["node", "model", "gpu", "lock", "holder"]
        waits = CounterMetricFamily(
            "cotenant_lock_waits", "Requests that waited on a lock, by lock and holder",
            labels=labels,
        )  # fmt: skip
        secs = CounterMetricFamily(
            "cotenant_lock_wait_seconds", "Time requests waited on a lock, by lock and holder",
            labels=labels,
        )  # fmt: skip
        for (model, gpu, lock, holder), (n, s) in locks:
            waits.add_metric([node, model, gpu, lock, holder], n)
            secs.add_metric([node, model, gpu, lock, holder], s)
        yield waits
        yield secs


def _esc(v: str) -> str:
    """A label value escaped for the exposition formats."""
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _seconds(table: pa.Table, col: str) -> np.ndarray:
    """A millisecond column as float64 seconds, null as 0."""
    v = np.array(table[col].to_numpy(zero_copy_only=False), dtype=np.float64)  # a copy
    v[np.isnan(v)] = 0.0  # nulls (NaN here); the normalizer keeps values finite
    out: np.ndarray = v / 1e3
    return out
