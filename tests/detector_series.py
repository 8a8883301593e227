"""Synthetic latency series for the detector's tests: Poisson requests with log-normal latency,
summarised per window the way every source summarises them (count, mean, p99)."""

from __future__ import annotations

import numpy as np

from cotenant.analysis.indicators import Series


def requests(
    rate_rps: float,
    duration_s: float,
    *,
    median_ms: float = 50.0,
    sigma: float = 0.2,
    slow: tuple[float, float, float] | None = None,
    tail: tuple[float, float, float, float] | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(t_s, latency_ms)`` of Poisson arrivals. ``slow``: ``(start_s, end_s, factor)``
    multiplies every request in that span; ``tail``: ``(start_s, end_s, fraction, factor)``
    multiplies that fraction of them (a slower tail with the median flat)."""
    rng = np.random.default_rng(seed)
    n = rng.poisson(rate_rps * duration_s)
    t = np.sort(rng.uniform(0.0, duration_s, n))
    lat = median_ms * np.exp(sigma * rng.standard_normal(n))
    if slow is not None:
        lo, hi, f = slow
        lat[(t >= lo) & (t < hi)] *= f
    if tail is not None:
        lo, hi, frac, f = tail
        hit = (t >= lo) & (t < hi) & (rng.uniform(size=n) < frac)
        lat[hit] *= f
    return t, lat


def windows(t: np.ndarray, lat: np.ndarray, duration_s: float, step_s: float = 1.0) -> Series:
    """Per-window count, p99 and mean (NaN where a window has no request)."""
    n = int(np.ceil(duration_s / step_s))
    idx = np.minimum((t // step_s).astype(np.int64), n - 1)
    count = np.bincount(idx, minlength=n).astype(np.float64)
    total = np.bincount(idx, weights=lat, minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, np.nan)
    p99 = np.full(n, np.nan)
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(n + 1))
    for i in np.flatnonzero(count):
        p99[i] = np.quantile(lat[order][bounds[i] : bounds[i + 1]], 0.99)
    return Series(p99, count, mean)


def series(rate_rps: float, duration_s: float, step_s: float = 1.0, **kw: object) -> Series:
    """:func:`windows` of :func:`requests`."""
    t, lat = requests(rate_rps, duration_s, **kw)  # type: ignore[arg-type]
    return windows(t, lat, duration_s, step_s)
