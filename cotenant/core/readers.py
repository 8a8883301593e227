"""What analysis reads through: small reader contracts, and a base for sources that wrap one.

A *source* answers windowed series as the Arrow frames of :mod:`cotenant.core.frames`, one row
per window (``ts_ns`` = window start) and series. Its contract is four small readers:

* :class:`RequestReader` — which (model, GPU) pairs served, their request windows, token
  windows of generative models;
* :class:`SpanReader` — what only spans tell: whether there are any, lock waits, replicas;
* :class:`GpuReader` — per-GPU and per-process NVML / DCGM windows;
* :class:`ServingReader` — the serving stack's own exporter series (vLLM, Triton).

:class:`MetricSource` is all four, what the analysis is handed. Two implementations:
``cotenant.store.source.StoreSource`` (the embedded store) and
``cotenant.collectors.prometheus.source.PrometheusSource`` (PromQL). A wrapper (the fleet's
``WatchedSource``, the loop's ``PassReads``) subclasses :class:`DelegatingSource` and overrides
only what it changes. ``rng`` must be closed (both ends set); an impossible read raises
:class:`cotenant.core.errors.QueryError`, a source that does not answer
:class:`cotenant.core.errors.SourceError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import pyarrow as pa

from cotenant.core.errors import QueryError
from cotenant.core.timerange import TimeRange

T = TypeVar("T")


class RequestReader(Protocol):
    """Request and token windows of the models that served."""

    def model_gpus(self, rng: TimeRange) -> list[tuple[str, str]]:
        """Distinct (model, gpu) pairs that served requests in ``rng`` (cheap)."""
        ...

    def request_windows(
        self, rng: TimeRange, step_s: float, model: str | None = None, gpu: str | None = None
    ) -> pa.Table:
        """REQUEST_WINDOWS rows, filtered to ``model`` / ``gpu`` when given."""
        ...

    def token_windows(
        self, rng: TimeRange, step_s: float, gpu: str | None = None, *, lengths: bool = False
    ) -> pa.Table:
        """TOKEN_WINDOWS rows: TTFT, TPOT and token counts of generative models (none for
        models whose requests carry no token counts). The token counts' p99 columns are
        filled only with ``lengths`` (they cost as much as the latency quantiles; the
        analysis needs their means)."""
        ...

    def request_counts(self, rng: TimeRange, gpu: str) -> tuple[int, int] | None:
        """(requests on ``gpu`` that completed in ``rng``, those that arrived in it): what
        :meth:`request_windows` counts there (its ``count`` and ``arrival_rps`` summed over
        the range), or None when the source cannot count them for less than that read."""
        ...


class SpanReader(Protocol):
    """What only request spans tell."""

    @property
    def has_spans(self) -> bool:
        """True when request rows carry the phase decomposition (spans were ingested)."""
        ...

    def lock_waits(self, rng: TimeRange, model: str) -> pa.Table:
        """LOCK_WAITS rows: which locks ``model``'s requests waited on, and behind whom."""
        ...

    def replicas(self, rng: TimeRange) -> dict[tuple[str, str], str]:
        """(model, gpu) -> the replica name its requests in ``rng`` give (the most frequent);
        pairs whose requests name none are absent."""
        ...


class GpuReader(Protocol):
    """GPU and per-process counters."""

    def gpu_windows(self, rng: TimeRange, step_s: float, gpu: str | None = None) -> pa.Table:
        """GPU_WINDOWS rows, of one GPU when ``gpu`` is given."""
        ...

    def process_windows(
        self,
        rng: TimeRange,
        step_s: float,
        gpu: str | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pa.Table:
        """PROCESS_WINDOWS rows; ``hosts``: only rows of these hosts (a fleet's host CPU of
        one node)."""
        ...


class ServingReader(Protocol):
    """The serving stack's own metrics."""

    def serving_windows(self, rng: TimeRange, step_s: float, model: str | None = None) -> pa.Table:
        """SERVING_WINDOWS rows (exporter series: running / waiting requests, cache use)."""
        ...


class MetricSource(RequestReader, SpanReader, GpuReader, ServingReader, Protocol):
    """Everything the analysis reads: the four readers in one."""


class DelegatingSource:
    """A :class:`MetricSource` that passes every read to ``source`` through :meth:`through`
    (identity here). Subclasses override :meth:`through` to observe every read, or single
    reads to change them."""

    def __init__(self, source: MetricSource) -> None:
        self.source = source

    def through(self, read: Callable[[], T]) -> T:
        """Run one read of the wrapped source (override to observe or translate it)."""
        return read()

    @property
    def has_spans(self) -> bool:
        return self.through(lambda: self.source.has_spans)

    def model_gpus(self, rng: TimeRange) -> list[tuple[str, str]]:
        return self.through(lambda: self.source.model_gpus(rng))

    def request_windows(
        self, rng: TimeRange, step_s: float, model: str | None = None, gpu: str | None = None
    ) -> pa.Table:
        return self.through(lambda: self.source.request_windows(rng, step_s, model, gpu))

    def token_windows(
        self, rng: TimeRange, step_s: float, gpu: str | None = None, *, lengths: bool = False
    ) -> pa.Table:
        return self.through(lambda: self.source.token_windows(rng, step_s, gpu, lengths=lengths))

    def request_counts(self, rng: TimeRange, gpu: str) -> tuple[int, int] | None:
        return self.through(lambda: self.source.request_counts(rng, gpu))

    def lock_waits(self, rng: TimeRange, model: str) -> pa.Table:
        return self.through(lambda: self.source.lock_waits(rng, model))

    def replicas(self, rng: TimeRange) -> dict[tuple[str, str], str]:
        return self.through(lambda: self.source.replicas(rng))

    def gpu_windows(self, rng: TimeRange, step_s: float, gpu: str | None = None) -> pa.Table:
        return self.through(lambda: self.source.gpu_windows(rng, step_s, gpu))

    def process_windows(
        self,
        rng: TimeRange,
        step_s: float,
        gpu: str | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pa.Table:
        return self.through(lambda: self.source.process_windows(rng, step_s, gpu, hosts))

    def serving_windows(self, rng: TimeRange, step_s: float, model: str | None = None) -> pa.Table:
        return self.through(lambda: self.source.serving_windows(rng, step_s, model))


def check_range(rng: TimeRange, step_s: float) -> tuple[int, int, int]:
    """(since_ns, until_ns, step_ns) or QueryError."""
    if rng.since_ns is None or rng.until_ns is None:
        raise QueryError("a window query needs both since and until")
    if not step_s > 0:
        raise QueryError(f"step {step_s} s must be > 0")
    step_ns = int(step_s * 1e9)
    if (rng.until_ns - rng.since_ns) // step_ns > 1_000_000:
        raise QueryError("too many windows (more than 1,000,000): use a larger step")
    return rng.since_ns, rng.until_ns, step_ns
