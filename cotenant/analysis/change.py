"""How much a series changed between a *before* and a *during* set of windows.

The shared scoring core of attribution: the GPU attribution uses it for the confidence and
evidence of each cause, and the tabular mode ranks entities with it directly.

The score of a series is its robust standardised shift: ``(x_during - median_before) /
scale_before`` where ``x_during`` is the median over the during windows (robust to a single
outlier), or their mean with ``during_stat="mean"`` (a culprit active in bursts shows in the
mean even when it is idle in half the windows), and ``scale_before`` the before windows'
interquartile range / 1.349 (a standard deviation for Gaussian data), floored so that a flat
baseline does not turn a tiny absolute change into an infinite score.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SeriesShift:
    """How one series moved from the before windows to the during windows (not to be confused
    with :class:`actuators.backend.Change`, a change an actuator applies)."""

    before: float  # median over the before windows
    during: float  # median over the during windows
    peak: float  # the most extreme during value in the direction of the change
    scale: float  # robust spread of the before windows
    score: float  # signed standardised shift (during - before) / scale

    @property
    def delta(self) -> float:
        return self.during - self.before


def robust_change(
    x: np.ndarray,
    before: np.ndarray,
    during: np.ndarray,
    rel_floor: float = 0.05,
    abs_floor: float = 1e-9,
    during_stat: str = "median",
) -> SeriesShift | None:
    """The shift of ``x`` from the ``before`` windows to the ``during`` windows (boolean masks).

    Returns None when either side has no finite value. ``scale`` is at least
    ``rel_floor x |median_before|`` and ``abs_floor``."""
    b = x[before]
    d = x[during]
    b = b[np.isfinite(b)]
    d = d[np.isfinite(d)]
    if len(b) == 0 or len(d) == 0:
        return None
    med = float(np.median(b))
    q75, q25 = np.percentile(b, [75, 25])
    scale = max(float(q75 - q25) / 1.349, rel_floor * abs(med), abs_floor)
    dur = float(np.mean(d) if during_stat == "mean" else np.median(d))
    peak = float(d.max() if dur >= med else d.min())
    return SeriesShift(med, dur, peak, scale, (dur - med) / scale)


def mean_over(x: np.ndarray, mask: np.ndarray) -> float:
    """Mean of the finite values of ``x`` in ``mask``; NaN when there are none."""
    v = x[mask]
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else float("nan")


def median_over(x: np.ndarray, mask: np.ndarray) -> float:
    """Median of the finite values of ``x`` in ``mask``; NaN when there are none."""
    v = x[mask]
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else float("nan")


def wmean_over(x: np.ndarray, w: np.ndarray, mask: np.ndarray) -> float:
    """Mean of ``x`` in ``mask`` weighted by ``w`` (e.g. request counts), over the finite
    values with positive weight; NaN when there are none."""
    sel = mask & np.isfinite(x) & (w > 0)
    if not sel.any():
        return float("nan")
    return float(np.average(x[sel], weights=w[sel]))


ABSENT = 0.25
"""A process sampled in fewer than this fraction of the before windows was not running then."""


def absent_as_zero(x: np.ndarray, before: np.ndarray) -> np.ndarray:
    """A series almost never sampled before the incident belongs to a process that appeared:
    its missing before windows count as 0. Otherwise missing windows stay unknown (no new
    sample), and averages skip them."""
    b = x[before]
    if len(b) == 0 or np.isfinite(b).mean() >= ABSENT:
        return x
    y = x.copy()
    y[before & ~np.isfinite(x)] = 0.0
    return y


def strength(score: float, half: float = 3.0) -> float:
    """Map a standardised shift to a confidence-like strength in [0, 1):
    0 for no change, 0.5 at ``half`` robust sigmas, approaching 1 for large shifts."""
    s = max(0.0, score)
    return s / (s + half)


def rank_changes(
    series: Mapping[str, np.ndarray],
    before: np.ndarray,
    during: np.ndarray,
    *,
    increase_only: bool = False,
) -> list[tuple[str, SeriesShift]]:
    """Series by decreasing absolute score (only increases when ``increase_only``)."""
    out = []
    for name, x in series.items():
        c = robust_change(np.asarray(x, dtype=np.float64), before, during)
        if c is None:
            continue
        if increase_only and c.score <= 0:
            continue
        out.append((name, c))
    out.sort(key=lambda nc: -abs(nc[1].score))
    return out


def rise(x: np.ndarray, before: np.ndarray, during: np.ndarray) -> float:
    """How much the mean of ``x`` rose from before to during (0 if it fell or is unknown);
    a process absent before counts as 0 then (:func:`absent_as_zero`)."""
    x = absent_as_zero(x, before)
    b, d = mean_over(x, before), mean_over(x, during)
    return 0.0 if not (np.isfinite(b) and np.isfinite(d)) else max(0.0, d - b)


def confidence(x: np.ndarray | None, before: np.ndarray, during: np.ndarray) -> float:
    """:func:`strength` of the rise of ``x`` (during mean); 0.3 when there is no series."""
    if x is None:
        return 0.3
    x = absent_as_zero(np.asarray(x, dtype=np.float64), before)
    c = robust_change(x, before, during, during_stat="mean")
    return 0.0 if c is None else strength(c.score)


def evidence(
    x: np.ndarray | None, before: np.ndarray, during: np.ndarray, series: str, unit: str
) -> dict[str, Any]:
    """What a cause shows for the series ``x``: its name, unit and before / during means."""
    if x is None:
        return {"series": series}
    x = absent_as_zero(x, before)
    return {
        "series": series,
        "unit": unit,
        "before": round(mean_over(x, before), 4),
        "during": round(mean_over(x, during), 4),
    }
