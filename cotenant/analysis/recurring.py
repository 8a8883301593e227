"""A co-tenant's recurring bursts: ordinary contention, not news.

A victim's slowdown within its SLO while a co-tenant model bursts is that co-tenant's doing,
but when the co-tenant has burst as high at least :data:`MIN_SEEN` times in the recent
history (:data:`MEMORY_S`), it is the trace's usual burstiness: the Azure code
trace bursts every few minutes, and its chat neighbour is slower each time, by more one time
than another. The victim's normal (:mod:`analysis.detector.normal`) takes the spread of such
bursts in, but a burst that lands a little harder than the last two still crosses it; the
culprit-side test here asks instead whether the co-tenant is doing anything it has not done before.

The co-tenant's arrival rate is smoothed over :data:`SMOOTH_S` seconds. Its **current burst**
began where that rate last stood under half the way from its typical level (the median over
the memory) to its peak since the victim's slowdown began. Before that, in the memory, each
separate excursion over the half height whose peak reached :data:`AS_HIGH` x the current
peak is one **earlier burst**. A first burst is news (the warm-up of a tool that has seen
nothing yet); a third of the same height is not.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SMOOTH_S = 30.0
"""Seconds the co-tenant's arrival rate is averaged over (a burst is minutes long; its
per-second arrivals are Poisson noise)."""
RISE = 1.5
"""A peak less than this many times the co-tenant's typical rate is no burst."""
AS_HIGH = 0.8
"""An earlier burst counts when its peak reached this share of the current one."""
MEMORY_S = 1800.0
"""How far back earlier bursts are looked for (as much of it as the windows read hold: the
live loop reads about 20 minutes). Longer than the victim-side memory: a trace's highest
bursts come every ten minutes or more, and a co-tenant's arrivals are cheap to keep."""
MIN_SEEN = 2
"""Earlier bursts the memory must hold for this one to be ordinary (one earlier burst of an
injected campaign is not yet a pattern)."""


def smoothed(arrivals: np.ndarray, windows: int) -> np.ndarray:
    """Trailing mean of ``arrivals`` (requests/s per window, NaN = none) over ``windows``."""
    a = np.nan_to_num(np.asarray(arrivals, dtype=np.float64))
    k = max(1, windows)
    c = np.concatenate(([0.0], np.cumsum(a)))
    idx = np.arange(1, len(a) + 1)
    lo = np.maximum(0, idx - k)
    return np.asarray((c[idx] - c[lo]) / (idx - lo))


def earlier_bursts(
    arrivals: np.ndarray, start: int, end: int, step_s: float
) -> dict[str, Any] | None:
    """The evidence that the co-tenant whose per-window arrival rates are ``arrivals`` was in
    a burst during windows ``[start, end]`` like :data:`MIN_SEEN` or more it had in the
    :data:`MEMORY_S` before that burst began (its peak and typical rate, how many, the memory
    looked over); None when it was not bursting, or not like that before."""
    n = len(arrivals)
    memory = round(MEMORY_S / step_s)
    if n == 0 or start >= n:
        return None
    r = smoothed(arrivals, round(SMOOTH_S / step_s))
    end = min(end, n - 1)
    peak = float(r[start : end + 1].max())
    typical = float(np.median(r[: start + 1][-memory:]))
    if peak <= 0 or peak < RISE * typical:
        return None
    half = typical + 0.5 * (peak - typical)
    under = np.flatnonzero(r[: start + 1] < half)
    if not len(under):
        return None  # busy since the windows began: nothing seen before it
    began = int(under[-1]) + 1
    past = r[max(0, began - memory) : began]
    above = np.concatenate(([False], past >= half, [False]))
    edges = np.flatnonzero(np.diff(above.astype(np.int8)))
    seen = sum(
        1
        for a, b in zip(edges[::2], edges[1::2], strict=True)
        if float(past[a:b].max()) >= AS_HIGH * peak
    )
    if seen < MIN_SEEN:
        return None
    return {
        "peak_rps": round(peak, 3),
        "typical_rps": round(typical, 3),
        "earlier_bursts": seen,
        "memory_s": round(min(memory, began) * step_s),
    }
