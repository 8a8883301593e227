"""Continuous batching of an LLM model's decode on its GPU's fluid server.

Every sequence in the decode batch emits one token per step, so all of them advance on one
*token clock* ``v`` (tokens emitted per sequence since the pool began). A sequence that joins at
``v0`` needing ``k`` more tokens is done when the clock reaches ``v0 + k``: a heap of those
targets needs one pending event, however many sequences decode. The pool runs as one job on
the GPU's :class:`~simulator.fluid.Fluid` server (so co-runners, DRAM load and the clock
stretch every step like any kernel); the job's work is the alone-time until the next sequence
finishes, ``tokens x step_s(n)`` with ``step_s(n) = (decode_step_ms + decode_per_seq_ms x n) /
1000``, re-armed whenever a sequence joins or leaves. Times are seconds of virtual time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from cotenant.simulator.fluid import Fluid, Job
from cotenant.simulator.scenario import Llm
from cotenant.simulator.state import SimModel

Finished = Callable[[float, int], None]
"""Called with ``(t, request id)`` when a sequence has emitted its last token."""


def token_counts(llm: Llm, tokens: tuple[int, int]) -> tuple[int, int]:
    """A request's (prompt, output) tokens, the model's means (rounded, >= 1) where unknown."""
    ctx, gen = tokens
    return (
        ctx if ctx > 0 else max(1, round(llm.prompt_tokens)),
        gen if gen > 0 else max(1, round(llm.output_tokens)),
    )


class DecodePool:
    """The decode batch of one LLM model ``ms`` on ``fluid`` (its GPU's kernel server)."""

    __slots__ = (
        "_done",
        "_fluid",
        "_heap",
        "_job",
        "_llm",
        "_ms",
        "_step",
        "_v",
        "_v0",
        "_work",
    )

    def __init__(self, ms: SimModel, llm: Llm, fluid: Fluid, on_finished: Finished) -> None:
        self._ms = ms
        self._llm = llm
        self._fluid = fluid
        self._done = on_finished
        self._heap: list[tuple[float, int]] = []  # (token-clock target, request id)
        self._job: Job | None = None
        self._v = 0.0  # token clock at the last re-arm
        self._v0 = 0.0
        self._work = 0.0  # alone-seconds the current job was armed with
        self._step = 0.0  # alone-seconds per step at the current batch size

    @property
    def active(self) -> int:
        """Sequences decoding now."""
        return len(self._heap)

    @property
    def room(self) -> int:
        """Sequences the decode batch can still take (``max_seqs`` less those decoding)."""
        return self._llm.max_seqs - len(self._heap)

    def join(self, t: float, rids: list[int], tokens_left: list[int]) -> None:
        """Sequences ``rids`` (their first token out at ``t``) start decoding their
        ``tokens_left`` (>= 0) further tokens; a sequence with none finishes at once."""
        self._sync(t)
        for rid, k in zip(rids, tokens_left, strict=True):
            if k <= 0:
                self._done(t, rid)
            else:
                heapq.heappush(self._heap, (self._v + k, rid))
        self._arm(t)

    def step_done(self, t: float) -> None:
        """The fluid server says the armed work is done: the next sequences have finished."""
        self._fluid.advance(t)  # before re-arming: the elapsed time is this work's, not the next
        self._v = self._v0 + (self._work / self._step if self._step > 0 else 0.0)
        heap = self._heap
        while heap and heap[0][0] <= self._v + 1e-9:
            _, rid = heapq.heappop(heap)
            self._done(t, rid)
        self._arm(t)

    def _sync(self, t: float) -> None:
        """Bring the token clock to ``t`` from the job's progress."""
        job = self._job
        if job is None or self._step <= 0:
            return
        self._fluid.advance(t)
        self._v = self._v0 + max(0.0, self._work - job.remaining) / self._step

    def _arm(self, t: float) -> None:
        heap = self._heap
        fluid = self._fluid
        if not heap:
            if self._job is not None:
                fluid.remove(t, self._job)
                self._job = None
            return
        llm = self._llm
        self._step = (llm.decode_step_ms + llm.decode_per_seq_ms * len(heap)) / 1000.0
        self._v0 = self._v
        self._work = max(0.0, heap[0][0] - self._v) * self._step
        job = self._job
        if job is None:
            ms = self._ms
            k = ms.m.kernel
            job = Job(
                self._work, ms.idx, ms.weight, self, k.sm_demand, k.dram_demand, k.memory_bound
            )
            self._job = job
            fluid.add(t, job)
        else:
            job.remaining = self._work
            fluid.changed(t)
