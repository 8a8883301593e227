"""The engine's event kinds and its time-ordered event queue.

An event is ``(t, seq, kind, a, b)``: virtual time in seconds, a sequence number that breaks
ties in push order (so two runs of a scenario pop events in the same order and produce the same
rows), the :class:`EventKind`, and two payload slots whose meaning each kind documents. Open-loop
arrivals are not events: the engine merges them from a pre-generated, sorted array instead.
"""

from __future__ import annotations

import heapq
from enum import IntEnum
from typing import Any


class EventKind(IntEnum):
    """What happens at an event; the payload ``(a, b)`` of each kind is given here.

    Kinds never decide the order of events (``seq`` does); their values run 0..n-1 so that
    the engine dispatches through a tuple of handlers indexed by kind."""

    CLOSED_ARRIVAL = 0
    """A closed-loop client sends its next request. a: model index."""
    LOCKS = 1
    """A request has finished preprocessing and takes its locks. a: request id."""
    ENQUEUE = 2
    """A request joins its model's batch queue. a: request id."""
    BATCH_TIMER = 3
    """A model's max-wait timer fires (stale unless it matches the model's timer). a: model
    index."""
    KERNEL_DONE = 4
    """A kernel on a GPU's fluid server may have completed. a: (Fluid, Job); b: the job's
    version when scheduled (stale if it has changed since)."""
    SAMPLE = 5
    """Counters are sampled; the next sample is scheduled one period later."""
    FAULT_START = 6
    """A fault starts. a: fault index, or ``-1 - process index`` for an always-active
    process."""
    FAULT_END = 7
    """A fault ends. a: fault index."""
    LOCK_HOG = 8
    """A ``lock_hog`` fault takes its lock again. a: fault index."""
    POSTPROCESS_DONE = 9
    """A batch finishes postprocessing; its requests complete. a: Batch."""
    H2D_DONE = 10
    """A batch's host-to-device copy ends; its kernel starts. a: Batch."""
    D2H_DONE = 11
    """A batch's device-to-host copy ends. a: Batch."""
    ADMITTED = 12
    """A request that waited for an admission token enters. a: model index; b: (arrived,
    work scale, prompt tokens, output tokens)."""


Event = tuple[float, int, EventKind, Any, Any]


class EventQueue:
    """A min-heap of events ordered by ``(t, seq)``. ``heap`` is exposed so the engine's loop
    can peek and pop without a method call per event."""

    __slots__ = ("_seq", "heap")

    def __init__(self) -> None:
        self.heap: list[Event] = []
        self._seq = 0

    def push(self, t: float, kind: EventKind, a: Any = None, b: Any = None) -> None:
        """Schedule ``kind`` at virtual time ``t`` (seconds); ties pop in push order."""
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, a, b))
