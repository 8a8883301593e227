"""Ingest and store metrics for ``/metrics``, registered on a registry passed in.

``cotenant_request_duration_seconds{model,gpu,phase}`` (and, for generative models,
``cotenant_time_to_first_token_seconds`` / ``cotenant_time_per_output_token_seconds``) are
vectorised histograms: each
normalized batch is bucketed with NumPy in one pass per phase instead of one ``observe`` call
per request and phase.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily, Metric

from cotenant.core.phases import PHASE_COLUMNS, PHASES

DURATION_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    60.0,
    120.0,
)


class RequestObserver(Protocol):
    """What is fed every normalized ``requests`` batch (``RequestDurationHistogram`` in
    serve, ``collectors.fleet_histogram.FleetHistogram`` in the agent)."""

    def observe_requests(self, table: pa.Table) -> None: ...


class RequestDurationHistogram:
    """``cotenant_request_duration_seconds{model,gpu,phase}``; ``phase="total"`` is the
    end-to-end latency, the other phases are the critical-path phases of DESIGN.md."""

    name = "cotenant_request_duration_seconds"

    def __init__(self, buckets: tuple[float, ...] = DURATION_BUCKETS_S) -> None:
        self._bounds = np.asarray(buckets, dtype=np.float64)
        self._nb = len(buckets) + 1  # last slot is +Inf
        self._phases = ("total", *PHASES)
        self._cols = ("latency_ms", *PHASE_COLUMNS)
        # (model, gpu) -> (counts [phase, bucket], sums [phase])
        self._state: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def observe_requests(self, table: pa.Table) -> None:
        """Add every row of a ``requests`` batch (milliseconds) to the histogram."""
        if table.num_rows == 0:
            return
        codes, groups = model_gpu_groups(table)
        ng, nb, npz = len(groups), self._nb, len(self._phases)
        counts = np.zeros((ng, npz, nb), dtype=np.int64)
        sums = np.zeros((ng, npz), dtype=np.float64)
        for p, col in enumerate(self._cols):
            v = np.nan_to_num(table[col].to_numpy(zero_copy_only=False).astype(np.float64)) / 1e3
            idx = np.searchsorted(self._bounds, v, side="left")
            counts[:, p, :] = np.bincount(codes * nb + idx, minlength=ng * nb).reshape(ng, nb)
            sums[:, p] = np.bincount(codes, weights=v, minlength=ng)
        with self._lock:
            _accumulate(self._state, groups, counts, sums)

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(
            self.name, "Request latency by phase (critical path)", labels=["model", "gpu", "phase"]
        )
        les = [*(_fmt(b) for b in self._bounds), "+Inf"]
        with self._lock:
            snapshot = [(k, c.copy(), s.copy()) for k, (c, s) in self._state.items()]
        for (model, gpu), counts, sums in snapshot:
            for p, phase in enumerate(self._phases):
                cum = np.cumsum(counts[p])
                fam.add_metric(
                    [model, gpu, phase], list(zip(les, cum.tolist(), strict=True)), float(sums[p])
                )
        yield fam


TTFT_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
    0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 20.0, 60.0,
)  # fmt: skip
"""Time-to-first-token buckets: dense from 10 ms to 1 s, where TTFT SLOs sit."""
TPOT_BUCKETS_S: tuple[float, ...] = (
    0.0025, 0.0035, 0.005, 0.007, 0.01, 0.014, 0.02, 0.028, 0.04, 0.056,
    0.08, 0.11, 0.16, 0.22, 0.32, 0.45, 0.64, 0.9, 1.28,
)  # fmt: skip
"""Time-per-output-token buckets: two per doubling from 2.5 ms to 1.28 s, so an SLO of a few
ms per token falls within 41 % of a bound (Prometheus' default buckets jump 10 -> 25 ms, and a
minute at 10.1 ms/token read as over a 12 ms SLO)."""

TOKEN_COUNT_BUCKETS: tuple[float, ...] = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
)  # fmt: skip
"""Prompt and output length buckets (tokens), as vLLM's ``request_*_tokens`` histograms."""

TOKEN_SERIES: tuple[tuple[str, str, tuple[float, ...]], ...] = (
    ("cotenant_time_to_first_token_seconds", "Time to first token of generative models",
     TTFT_BUCKETS_S),
    (
        "cotenant_time_per_output_token_seconds",
        "Time per output token of generative models: (latency - TTFT) / (output tokens - 1)",
        TPOT_BUCKETS_S,
    ),
    ("cotenant_request_prompt_tokens", "Prompt length of generative models' requests (tokens)",
     TOKEN_COUNT_BUCKETS),
    ("cotenant_request_output_tokens", "Output length of generative models' requests (tokens)",
     TOKEN_COUNT_BUCKETS),
)  # fmt: skip
"""(name, help, bucket bounds) of the token histograms: TTFT and TPOT (seconds), prompt and
output lengths (tokens), in the order of :func:`token_values`."""


class TokenHistograms:
    """The histograms of :data:`TOKEN_SERIES`, per ``{model, gpu}``, over the requests that
    carry token information (a TTFT or token counts); each counts the rows where its value is
    known (TPOT: a TTFT and more than one output token)."""

    def __init__(self) -> None:
        self._bounds = [np.asarray(b, dtype=np.float64) for _, _, b in TOKEN_SERIES]
        # every series' buckets (and +Inf) side by side in one row per (model, gpu)
        self._offsets = np.cumsum([0] + [len(b) + 1 for b in self._bounds])
        # (model, gpu) -> (counts [buckets of every series], sums [series])
        self._state: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def observe_requests(self, table: pa.Table) -> None:
        """Add the rows of a ``requests`` batch that carry a TTFT or token counts."""
        n = table.num_rows
        if n == 0 or all(table[c].null_count == n for c in _TOKEN_COLUMNS):
            return  # no generative requests: skip the compute calls (~0.1 ms an export)
        has = pc.or_(
            pc.is_valid(table["ttft_ms"]),
            pc.or_(pc.is_valid(table["prompt_tokens"]), pc.is_valid(table["output_tokens"])),
        )
        t = table.filter(has)
        if t.num_rows == 0:
            return
        codes, groups = model_gpu_groups(t)
        ng, width = len(groups), int(self._offsets[-1])
        counts = np.zeros((ng, width), dtype=np.int64)
        sums = np.zeros((ng, len(TOKEN_SERIES)), dtype=np.float64)
        for k, v in enumerate(token_values(t)):
            ok = np.isfinite(v)
            idx = np.searchsorted(self._bounds[k], v[ok], side="left") + self._offsets[k]
            c = codes[ok]
            counts += np.bincount(c * width + idx, minlength=ng * width).reshape(ng, width)
            sums[:, k] = np.bincount(c, weights=v[ok], minlength=ng)
        with self._lock:
            _accumulate(self._state, groups, counts, sums)

    def collect(self) -> Iterator[Metric]:
        fams = [HistogramMetricFamily(n, h, labels=["model", "gpu"]) for n, h, _ in TOKEN_SERIES]
        les = [[*(_fmt(b) for b in bounds), "+Inf"] for bounds in self._bounds]
        with self._lock:
            snapshot = [(k, c.copy(), s.copy()) for k, (c, s) in self._state.items()]
        for (model, gpu), counts, sums in snapshot:
            for k, fam in enumerate(fams):
                cum = np.cumsum(counts[self._offsets[k] : self._offsets[k + 1]])
                if cum[-1] == 0:
                    continue  # a model with token counts but no TTFT: no TTFT series
                fam.add_metric(
                    [model, gpu], list(zip(les[k], cum.tolist(), strict=True)), float(sums[k])
                )
        yield from fams


_TOKEN_COLUMNS = ("ttft_ms", "prompt_tokens", "output_tokens")


def token_values(t: pa.Table) -> tuple[np.ndarray, ...]:
    """Each ``requests`` row's TTFT and TPOT (seconds), prompt and output tokens: NaN where
    unknown (TPOT = (latency - TTFT) / (output tokens - 1) needs a TTFT and more than one
    output token)."""
    ttft = _floats(t["ttft_ms"]) / 1e3
    out = _floats(t["output_tokens"])
    lat = _floats(t["latency_ms"]) / 1e3
    with np.errstate(invalid="ignore"):
        tpot = np.where(out > 1, (lat - ttft) / np.fmax(out - 1, 1), np.nan)
    return ttft, tpot, _floats(t["prompt_tokens"]), out


def model_gpu_groups(t: pa.Table) -> tuple[np.ndarray, list[list[str]]]:
    """Each row's group code (int64) and the groups' ``[model, gpu]`` (nulls as "")."""
    keys = pc.binary_join_element_wise(
        pc.fill_null(t["model"], ""), pc.fill_null(t["gpu"], ""), "\x00"
    )
    enc = pc.dictionary_encode(keys).combine_chunks()
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, [str(k).split("\x00", 1) for k in enc.dictionary.to_pylist()]


def _floats(col: pa.ChunkedArray) -> np.ndarray:
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)


def _fmt(b: float) -> str:
    return repr(float(b))


class IngestMetrics:
    """All ingest-side series; implements :class:`store.write_batches.WriteObserver`."""

    def __init__(
        self, registry: CollectorRegistry, *, durations: RequestObserver | None = None
    ) -> None:
        """``durations``: what request batches feed (default: serve's
        :class:`RequestDurationHistogram`, registered here; one passed in exposes itself)."""
        self.registry = registry
        self.spans_received = Counter(
            "cotenant_otlp_spans_received",
            "Spans received over OTLP",
            ["protocol", "format"],
            registry=registry,
        )
        self.spans_rejected = Counter(
            "cotenant_otlp_spans_rejected",
            "Spans rejected (reported as OTLP partial success, or whole exports refused)",
            ["reason"],
            registry=registry,
        )
        self.spans_ignored = Counter(
            "cotenant_otlp_spans_ignored",
            "Spans of shapes that are not requests, or child spans whose root never arrived",
            ["reason"],
            registry=registry,
        )
        self.exports = Counter(
            "cotenant_otlp_exports",
            "OTLP export calls by outcome",
            ["protocol", "outcome"],
            registry=registry,
        )
        self.requests_ingested = Counter(
            "cotenant_requests_ingested",
            "Requests normalized and queued for the store",
            ["source"],
            registry=registry,
        )
        self.rows_counter = Counter(
            "cotenant_store_rows_written",
            "Rows appended to the store",
            ["table"],
            registry=registry,
        )
        self.write_failures = Counter(
            "cotenant_store_write_failed_rows",
            "Rows the store failed to append",
            ["table"],
            registry=registry,
        )
        self.write_seconds = Histogram(
            "cotenant_store_write_seconds",
            "Time to append one batch to the store",
            ["table"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
        )
        self.queue_rows = Gauge(
            "cotenant_store_queue_rows", "Rows accepted but not yet written", registry=registry
        )
        self.queue_capacity = Gauge(
            "cotenant_store_queue_capacity_rows",
            "Rows the writer queue holds before ingest answers 503",
            registry=registry,
        )
        self.queue_bytes = Gauge(
            "cotenant_store_queue_bytes",
            "Arrow bytes accepted but not yet written",
            registry=registry,
        )
        self.inflight_bytes = Gauge(
            "cotenant_otlp_inflight_bytes",
            "Bytes of exports the OTLP receivers are working on (otlp.max_inflight_bytes)",
            registry=registry,
        )
        self.pending_spans = Gauge(
            "cotenant_otlp_pending_child_spans",
            "Child spans waiting for their root span",
            registry=registry,
        )
        self.waiting_roots = Gauge(
            "cotenant_otlp_waiting_root_spans",
            "Request root spans held for a child another process exports (otlp.root_wait_s)",
            registry=registry,
        )
        if durations is None:
            durations = RequestDurationHistogram()
            registry.register(durations)
        self.durations: RequestObserver = durations
        self.tokens = TokenHistograms()
        registry.register(self.tokens)

    def bind_queue(
        self,
        depth: Callable[[], float],
        capacity: float,
        pending: Callable[[], float],
        waiting: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.queue_rows.set_function(depth)
        self.queue_capacity.set(capacity)
        self.pending_spans.set_function(pending)
        self.waiting_roots.set_function(waiting)

    def bind_memory(self, queue_bytes: Callable[[], float], inflight: Callable[[], float]) -> None:
        """What bounds ingest's memory: the writer queue's bytes and the receivers'."""
        self.queue_bytes.set_function(queue_bytes)
        self.inflight_bytes.set_function(inflight)

    # WriteObserver
    def rows_written(self, table: str, rows: int, seconds: float) -> None:
        self.rows_counter.labels(table).inc(rows)
        self.write_seconds.labels(table).observe(seconds)

    def write_failed(self, table: str, rows: int) -> None:
        self.write_failures.labels(table).inc(rows)


def _accumulate(
    state: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]],
    groups: list[list[str]],
    counts: np.ndarray,
    sums: np.ndarray,
) -> None:
    """Add one batch's per-(model, gpu) bucket counts and sums (first axis: ``groups``) to a
    histogram's running ``state``; the caller holds the histogram's lock."""
    for g, (model, gpu) in enumerate(groups):
        cur = state.get((model, gpu))
        if cur is None:
            state[(model, gpu)] = (counts[g].copy(), sums[g].copy())
        else:
            cur[0][...] += counts[g]
            cur[1][...] += sums[g]
