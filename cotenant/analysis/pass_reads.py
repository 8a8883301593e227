"""``PassReads``: one read of the whole fleet per pass, shared by every GPU's windows.

The continuous loop reads each GPU's windows (:class:`analysis.windows.WindowCache`) over the
same range in one pass. Over PromQL each such read is a few HTTP queries, so a fleet of 512
GPUs made ~2,000 queries a pass, whose per-query cost (parsing, planning, encoding, HTTP)
dominated. Wrapping the source in :class:`PassReads` turns the per-GPU requests of a pass into
one fleet-wide request per frame and range, split by GPU in memory (Arrow, vectorised).
Requests it does not batch (a model filter, other frames) go straight through.

A fleet-wide read the engine refuses as too large (Prometheus' ``--query.max-samples``, e.g.
the first pass over a long horizon on a large fleet) is made GPU by GPU instead, for that pass.

Call :meth:`PassReads.new_pass` at the start of each pass: cached frames are for one pass only
(the next one must see new rows). Thread-compatible, not thread-safe: one loop uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from cotenant.core.errors import SourceError
from cotenant.core.readers import DelegatingSource, MetricSource
from cotenant.core.timerange import TimeRange

_Key = tuple[str, int | None, int | None, float]


class PassReads(DelegatingSource):
    """A :class:`cotenant.core.readers.MetricSource` over ``source`` that reads each (frame, range,
    step) of a pass once for every GPU (see the module docstring)."""

    def __init__(self, source: MetricSource) -> None:
        super().__init__(source)
        self._frames: dict[_Key, dict[str, pa.Table]] = {}
        self._empty: dict[str, pa.Table] = {}
        self._too_big: set[_Key] = set()
        self.reads = 0  # fleet-wide reads made (for tests and benchmarks)

    def new_pass(self) -> None:
        self._frames.clear()
        self._too_big.clear()

    def _split(
        self,
        kind: str,
        rng: TimeRange,
        step_s: float,
        gpu: str,
        read: Callable[[], pa.Table],
        one: Callable[[], pa.Table],
    ) -> pa.Table:
        """``gpu``'s part of the fleet-wide ``read()`` of this pass; ``one()`` reads the GPU
        alone when the fleet-wide read is more than the engine takes in one query."""
        key = (kind, rng.since_ns, rng.until_ns, step_s)
        if key in self._too_big:
            return one()
        parts = self._frames.get(key)
        if parts is None:
            try:
                t = read()
            except SourceError as exc:
                if "too many samples" not in str(exc):
                    raise
                # the engine's per-query sample limit (Prometheus --query.max-samples): this
                # frame and range are read GPU by GPU for the rest of the pass
                self._too_big.add(key)
                return one()
            self.reads += 1
            self._empty[kind] = t.schema.empty_table()
            gpus = pc.fill_null(t.column("gpu"), "")
            parts = {str(g): t.filter(pc.equal(gpus, g)) for g in pc.unique(gpus).to_pylist()}
            self._frames[key] = parts
        return parts.get(gpu, self._empty[kind])

    def request_windows(
        self, rng: TimeRange, step_s: float, model: str | None = None, gpu: str | None = None
    ) -> pa.Table:
        if model is not None or gpu is None:
            return self.source.request_windows(rng, step_s, model=model, gpu=gpu)
        return self._split(
            "requests",
            rng,
            step_s,
            gpu,
            lambda: self.source.request_windows(rng, step_s),
            lambda: self.source.request_windows(rng, step_s, gpu=gpu),
        )

    def gpu_windows(self, rng: TimeRange, step_s: float, gpu: str | None = None) -> pa.Table:
        if gpu is None:
            return self.source.gpu_windows(rng, step_s)
        return self._split(
            "gpus",
            rng,
            step_s,
            gpu,
            lambda: self.source.gpu_windows(rng, step_s),
            lambda: self.source.gpu_windows(rng, step_s, gpu=gpu),
        )

    def process_windows(
        self,
        rng: TimeRange,
        step_s: float,
        gpu: str | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pa.Table:
        if gpu is None or hosts is not None:
            return self.source.process_windows(rng, step_s, gpu=gpu, hosts=hosts)
        return self._split(
            "processes",
            rng,
            step_s,
            gpu,
            lambda: self.source.process_windows(rng, step_s),
            lambda: self.source.process_windows(rng, step_s, gpu=gpu),
        )

    def token_windows(
        self, rng: TimeRange, step_s: float, gpu: str | None = None, *, lengths: bool = False
    ) -> pa.Table:
        if gpu is None:
            return self.source.token_windows(rng, step_s, lengths=lengths)
        # vLLM's series name no GPU: each GPU's read was a read of the whole fleet's series
        return self._split(
            "tokens+lengths" if lengths else "tokens",
            rng,
            step_s,
            gpu,
            lambda: self.source.token_windows(rng, step_s, lengths=lengths),
            lambda: self.source.token_windows(rng, step_s, gpu, lengths=lengths),
        )
