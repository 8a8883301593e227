"""The decision: when accumulated evidence says a model is slower than its normal, and when it
says it is back.

Evidence is a bank of one-sided CUSUMs (Page's cumulative sums of log-likelihood ratios) over
the calibrated scores ``g`` of :mod:`.normal` — one per channel and per shift size in
:data:`DELTAS` (in standard deviations of ``g``), so a sudden tripling is seen in one window
and a 1.2x drift over many: ``S = max(0, S + delta * g - delta**2 / 2)``. Each is deflated by
the long-run variance factor of the memory it integrates over, so a neighbour's ordinary
bursts do not add up to an alarm.

**One knob.** The false alarms per model-hour a user accepts set every threshold: split evenly
over the model's CUSUMs and divided into its windows per hour, they give each CUSUM's in-control
average run length, and Siegmund's approximation gives the threshold ``h`` that has it
(:func:`threshold`). A second, lower threshold (``fellow`` times the false alarms) flags *weak*
episodes, which count only as fellow victims of an incident already found (:mod:`.verdicts`).

**Closing.** Once open, a reverse CUSUM (capped) tests "back to normal" against "still
shifted"; the episode ends at the last window where the shift was still favoured once that test
passes :data:`CLOSE_H` (odds of 20 to 1) over a quiet stretch — :data:`CLOSE_SAMPLES` samples
and the caller's quiet time — so an intermittent slowdown (a LoRA swapped in every 15 s,
evictions now and then) is one episode, not a dozen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

DELTAS = (0.5, 1.0, 2.0, 4.0)
"""Shifts, in standard deviations of the calibrated score, the bank's CUSUMs are tuned to."""
CLOSE_H = math.log(20.0)
"""Log odds of "back to normal" over "still shifted" that close an episode ..."""
CLOSE_SAMPLES = 5
"""... over at least this many samples in a row that do not look shifted (and the caller's
quiet windows: a noisy slowdown's dip of a window or two does not end it)."""


def arl0(h: float, delta: float) -> float:
    """Siegmund's in-control average run length (windows) of a CUSUM of ``delta * g -
    delta**2 / 2`` with ``g`` standard normal and threshold ``h``."""
    b = h + 1.166 * delta
    return (math.exp(b) - b - 1.0) / (delta * delta / 2.0)


def threshold(arl: float, delta: float) -> float:
    """The ``h`` whose :func:`arl0` is ``arl`` windows (``arl`` >= 1; to 0.1 % of it)."""
    return _threshold(round(math.log(max(arl, 1.0)), 3), delta)


@lru_cache(maxsize=4096)
def _threshold(log_arl: float, delta: float) -> float:
    """Bisection on :func:`arl0` (cached: the live loop asks the same few values)."""
    arl = math.exp(log_arl)
    lo, hi = 0.0, 200.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if arl0(mid, delta) < arl:
            lo = mid
        else:
            hi = mid
    return hi


def memory(h: float, delta: float) -> float:
    """Windows a CUSUM tuned to ``delta`` integrates over before it reaches ``h`` on that
    shift: what its evidence's long-run variance is taken over."""
    return (h + 1.166 * delta) / (delta * delta / 2.0)


@dataclass(frozen=True)
class Calibration:
    """Thresholds per shift in :data:`DELTAS`: ``h`` opens an incident, ``weak`` a fellow
    victim's episode."""

    h: tuple[float, ...]
    weak: tuple[float, ...]


def calibrate(
    windows_per_hour: float, false_per_hour: float, cusums: int, fellow: float
) -> Calibration:
    """Thresholds that give ``false_per_hour`` false alarms per model-hour over ``cusums``
    CUSUMs judged ``windows_per_hour`` times an hour each (and ``fellow`` times as many for
    weak episodes)."""
    arl = max(1.0, windows_per_hour * cusums / false_per_hour)
    return Calibration(
        tuple(threshold(arl, d) for d in DELTAS),
        tuple(threshold(max(1.0, arl / fellow), d) for d in DELTAS),
    )


def cusum(incr: np.ndarray, s0: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(S, zero)`` of ``S_i = max(0, S_{i-1} + incr_i)`` from ``S_{-1} = s0``, and for each
    ``i`` whether ``S`` was at zero there (vectorised: ``S = C - min(0, running min C)``).
    Along the last axis: ``incr`` of shape ``(K, L)`` with ``s0`` of shape ``(K,)`` runs ``K``
    CUSUMs at once."""
    c = np.asarray(s0, dtype=np.float64)[..., None] + np.cumsum(incr, axis=-1)
    low = np.minimum(np.minimum.accumulate(c, axis=-1), 0.0)
    s = c - low
    return s, s <= 0.0


def first_over(s: np.ndarray, h: float) -> int | None:
    """The first index where ``s`` exceeds ``h``; None when it never does."""
    hit = np.flatnonzero(s > h)
    return int(hit[0]) if len(hit) else None


def close_at(g: np.ndarray, delta: float, quiet: int = 0) -> tuple[int | None, int]:
    """Where an episode judged against a shift of ``delta`` (in the units of ``g``, NaN = no
    sample) closes: ``(index at which "back to normal" wins, or None while it has not; the
    last index where the evidence still favoured the shift)``. The evidence for "back to
    normal" is a CUSUM of log-likelihood ratios capped at twice :data:`CLOSE_H` (one clearly
    slow window among calm ones wipes it: an intermittent slowdown stays one episode); it
    wins when over :data:`CLOSE_H` after at least :data:`CLOSE_SAMPLES` samples and ``quiet``
    windows (with or without a sample) since it was last at zero."""
    cap = 2.0 * CLOSE_H
    t, zero_at, samples = 0.0, -1, 0
    half = delta * delta / 2.0
    for i, x in enumerate(g.tolist()):
        if x != x:  # NaN: a window without a sample
            continue
        t = min(cap, t + half - delta * x)
        if t <= 0.0:
            t, zero_at, samples = 0.0, i, 0
            continue
        samples += 1
        if t > CLOSE_H and samples >= CLOSE_SAMPLES and i - zero_at >= quiet:
            return i, max(zero_at, 0)
    return None, max(zero_at, 0)
