"""Critical-path decomposition of one request span over its phase children.

Walk back from the root's end: at time ``t`` take the child that finishes last at or before
``t`` (a child running past ``t`` counts only up to ``t``), book its time to its phase, move
``t`` to its start, repeat; every gap no child covers is the root's own ``other`` time. The
phases therefore sum exactly to the root's duration, and overlapping children are never counted
twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from store.schema import PHASES

OTHER = PHASES.index("other")
N_PHASES = len(PHASES)
_END = itemgetter(2)


def critical_path(start_ns: int, end_ns: int, children: Sequence[Sequence[Any]]) -> list[int]:
    """Nanoseconds per phase (indexed like :data:`store.schema.PHASES`).

    ``children`` holds ``(phase_index, start_ns, end_ns, …)`` (extra items are ignored);
    children outside the root are
    clipped to it. The result sums to ``end_ns - start_ns`` (0 when ``end_ns <= start_ns``).
    """
    out = [0] * N_PHASES
    if end_ns <= start_ns:
        return out
    if not children:
        out[OTHER] = end_ns - start_ns
        return out
    cands = sorted(children, key=_END, reverse=True)
    t = end_ns
    while cands and t > start_ns:
        # hot path: a plain loop beats next() over a generator here
        for i, c in enumerate(cands):  # noqa: B007
            if c[1] < t:
                break
        else:
            break
        phase, c_start, c_end = c[0], c[1], c[2]
        stop = c_end if c_end < t else t
        if stop <= start_ns:
            break
        out[OTHER] += t - stop
        begin = c_start if c_start > start_ns else start_ns
        out[phase] += stop - begin
        t = begin
        del cands[i]
    out[OTHER] += t - start_ns
    return out
