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

from cotenant.core.phases import PHASES

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
    # one pass over the children, latest end first: the next child booked is the first one
    # left that starts before ``t``; one passed over (it starts at or after ``t``) can never
    # be booked later, as ``t`` only moves back
    other = 0
    t = end_ns
    for c in sorted(children, key=_END, reverse=True):
        if t <= start_ns:
            break
        c_start = c[1]
        if c_start >= t:
            continue
        c_end = c[2]
        stop = c_end if c_end < t else t
        if stop <= start_ns:
            break
        other += t - stop
        begin = c_start if c_start > start_ns else start_ns
        out[c[0]] += stop - begin
        t = begin
    out[OTHER] += other + t - start_ns
    return out
