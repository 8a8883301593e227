"""Per-request timings while requests are in flight, and the columns of completed requests.

Request ids are indices into parallel lists (one entry per admitted request, in admission
order): lists of floats keep the engine's hot path cheap. When a batch completes, its requests
become rows in column buffers (:data:`REQUEST_COLUMNS`, the ``requests`` table's columns that
the simulator fills; :mod:`simulator.output` adds the rest) that :meth:`RequestLog.take` drains.
"""

from __future__ import annotations

from typing import Any

from cotenant.simulator.state import Batch, SimModel

REQUEST_COLUMNS = (
    "ts_start_ns",
    "ts_end_ns",
    "latency_ms",
    "model",
    "tenant",
    "pid",
    "gpu",
    "priority",
    "batch_size",
    "prompt_tokens",
    "output_tokens",
    "queue_ms",
    "lock_wait_ms",
    "preprocess_ms",
    "h2d_ms",
    "compute_ms",
    "d2h_ms",
    "postprocess_ms",
    "lock_name",
    "lock_holder",
    "ttft_ms",
    "rid",
    "replica",
)


class RequestLog:
    """Requests of one run. ``start_ns`` maps virtual time 0 onto wall-clock nanoseconds.

    In flight, per request id (seconds of virtual time): ``model`` (index), ``arrived``,
    ``gate_wait`` (waiting for an admission token), ``preprocess`` (on a core or holding
    locks), ``lock_wait``, ``load_wait`` (queued behind a model load), ``lock_name`` /
    ``lock_holder`` (the lock it waited longest for and
    who held it; None when it never waited), ``ready`` (when it may join the batch queue),
    ``scale`` (kernel work multiplier) and ``tokens`` (prompt, output; -1 when unknown)."""

    def __init__(self, start_ns: int) -> None:
        self._start_ns = start_ns
        self.model: list[int] = []
        self.arrived: list[float] = []
        self.preprocess: list[float] = []
        self.lock_wait: list[float] = []
        self.load_wait: list[float] = []
        self.lock_name: list[str | None] = []
        self.lock_holder: list[str | None] = []
        self.ready: list[float] = []
        self.gate_wait: list[float] = []
        self.scale: list[float] = []
        self.tokens: list[tuple[int, int]] = []
        self._out: dict[str, list[Any]] = {k: [] for k in REQUEST_COLUMNS}

    def admit(
        self,
        model: int,
        t: float,
        arrived: float,
        scale: float,
        ctx: int,
        gen: int,
        ready: float,
    ) -> int:
        """A request of model index ``model`` that arrived at ``arrived`` enters at ``t`` and
        is preprocessed by ``ready``; returns its id."""
        rid = len(self.model)
        self.model.append(model)
        self.arrived.append(arrived)
        self.gate_wait.append(t - arrived)
        self.scale.append(scale)
        self.tokens.append((ctx, gen))
        self.preprocess.append(ready - t)
        self.lock_wait.append(0.0)
        self.load_wait.append(0.0)
        self.lock_name.append(None)
        self.lock_holder.append(None)
        self.ready.append(ready)
        return rid

    def waited_for_loads(
        self, rids: list[int], launch: float, loads: list[tuple[float, float]]
    ) -> None:
        """Requests ``rids`` launch at ``launch``: the part of their wait in the batch queue
        that a load on their replica covered (``loads``: (start, end) seconds, in order) is
        a ``model.load`` wait, booked as ``other`` (docs/instrumenting.md), not queue."""
        for r in rids:
            lo = self.ready[r]
            self.load_wait[r] = sum(
                min(b, launch) - max(a, lo) for a, b in loads if a < launch and b > lo
            )

    def complete(self, t: float, batch: Batch, ms: SimModel, gpu_id: str) -> None:
        """``batch`` of model ``ms`` on GPU ``gpu_id`` finishes postprocessing at ``t``: one
        row per request, its phases in milliseconds."""
        h2d_ms = (batch.h2d_end - batch.launch) * 1000.0
        compute_ms = (batch.kernel_end - batch.h2d_end) * 1000.0
        d2h_ms = (batch.d2h_end - batch.kernel_end) * 1000.0
        post_ms = (t - batch.d2h_end) * 1000.0
        n = len(batch.rids)
        for r in batch.rids:
            self._row(t, r, batch.launch, ms, gpu_id, n, h2d_ms, compute_ms, d2h_ms, post_ms, None)

    def complete_llm(
        self, t: float, rid: int, batch: Batch, ms: SimModel, gpu_id: str, decode_batch: int
    ) -> None:
        """Request ``rid`` of LLM model ``ms`` emits its last token at ``t``; its prefill ran
        in ``batch`` (first token at the batch's ``d2h_end``). ``compute`` holds prefill and
        decode; ``batch_size`` is the decode batch it joined (``decode_batch`` sequences)."""
        ttft_ms = (batch.d2h_end - self.arrived[rid]) * 1000.0
        h2d_ms = (batch.h2d_end - batch.launch) * 1000.0
        compute_ms = (t - batch.h2d_end) * 1000.0
        self._row(t, rid, batch.launch, ms, gpu_id, decode_batch, h2d_ms, compute_ms, 0.0, 0.0,
                  ttft_ms)  # fmt: skip

    def _row(
        self,
        t: float,
        rid: int,
        launch: float,
        ms: SimModel,
        gpu_id: str,
        batch_size: int,
        h2d_ms: float,
        compute_ms: float,
        d2h_ms: float,
        post_ms: float,
        ttft_ms: float | None,
    ) -> None:
        """One completed request's row: ends at ``t``, launched at ``launch`` (seconds)."""
        m = ms.m
        o = self._out
        arr = self.arrived[rid]
        o["ts_start_ns"].append(self._start_ns + int(arr * 1e9))
        o["ts_end_ns"].append(self._start_ns + int(t * 1e9))
        o["latency_ms"].append((t - arr) * 1000.0)
        o["model"].append(m.name)
        o["tenant"].append(m.tenant or None)
        o["pid"].append(ms.pid)
        o["gpu"].append(gpu_id)
        o["priority"].append(ms.priority)
        o["batch_size"].append(batch_size)
        ctx, gen = self.tokens[rid]
        o["prompt_tokens"].append(ctx if ctx >= 0 else None)
        o["output_tokens"].append(gen if gen >= 0 else None)
        queued = launch - self.ready[rid] + self.gate_wait[rid] - self.load_wait[rid]
        o["queue_ms"].append(queued * 1000.0)
        o["lock_wait_ms"].append(self.lock_wait[rid] * 1000.0)
        o["preprocess_ms"].append(self.preprocess[rid] * 1000.0)
        o["h2d_ms"].append(h2d_ms)
        o["compute_ms"].append(compute_ms)
        o["d2h_ms"].append(d2h_ms)
        o["postprocess_ms"].append(post_ms)
        o["lock_name"].append(self.lock_name[rid])
        o["lock_holder"].append(self.lock_holder[rid])
        o["ttft_ms"].append(ttft_ms)
        o["rid"].append(rid)
        o["replica"].append(ms.replica)

    def take(self) -> dict[str, list[Any]]:
        """Completed requests since the last call, as columns (:data:`REQUEST_COLUMNS`)."""
        out = self._out
        self._out = {k: [] for k in REQUEST_COLUMNS}
        return out
