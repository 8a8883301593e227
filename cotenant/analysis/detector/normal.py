"""The model of normal: what one channel of one latency indicator looks like when nothing is wrong.

A channel is a per-window statistic ``x`` (the log of a latency in ms: the window's mean for the
*typical* request, its p99 for the *tail*) and the number of requests ``n`` behind it. Fitted on
the baseline windows (those before the judged window, outside every episode), the model holds

* **where it sits**: the median of ``x``;
* **how much a window varies**: ``a + b / n`` — a part shared by every request of a window
  (``a``: a co-tenant's burst slows them all) and a part that averages out over its requests
  (``b``) — so a window of 200 requests and one of a single request are judged alike; a floor of
  :data:`FLOOR` keeps a simulator's identical windows from making any wobble significant;
* **its shape**: the standardised values' quantiles at :data:`KNOTS` and an exponential upper
  tail beyond the last one, which map a value to a *calibrated score* ``g`` that is standard
  normal on the baseline whatever the latency's distribution (a probability integral transform:
  heavy tails, one slow request in a hundred, are normal where they were normal);
* **how its windows hang together**: the long-run variance factor ``tau`` of the scores' sums
  over :data:`MEMORIES` consecutive windows (1 for independent windows; a neighbour's recurring
  bursts make consecutive windows slow together, and a sum over them varies ``tau`` times more):
  the decision deflates evidence accumulated over that many windows by ``sqrt(tau)``, so the
  spread of the model's ordinary contention is part of its normal;
* **how often it is judged**: windows with requests per second of baseline (the calibration's
  false alarms are per hour, its statistic per window).

Arrays are NumPy of shape ``(n_windows,)``; NaN ``x`` or ``n == 0`` means "no sample".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy.special import ndtri

KNOTS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.975)
"""Probabilities at which the baseline's standardised values are kept (its shape)."""
_G_KNOTS = ndtri(np.asarray(KNOTS))
MEMORIES = (1, 4, 16, 64)
"""Window counts over which the long-run variance factor is estimated."""
FLOOR = 0.01
"""Smallest standard deviation of a window's log latency (1 %): a steadier series is held to
this."""
MIN_TAIL = 0.3
"""Smallest mean excess of the exponential tail (in standard deviations)."""
PRIOR_TAIL = (10, 0.5)
"""The tail's mean excess is shrunk towards half a standard deviation (a little heavier than a
normal distribution's 0.37) as if 10 such excesses had been seen: a baseline of a few dozen
samples, with one or two beyond its last knot, does not make every slow request look
impossible."""
MEDIAN_CHI2 = 0.4549
"""The median of a squared standard normal: a robust variance is the median squared
deviation over it."""


@dataclass(frozen=True)
class Normal:
    """One channel's normal (see the module docstring). Values in log ms; ``rate`` in samples
    per second; ``samples``: windows it was fitted on."""

    loc: float
    a: float
    b: float
    knots: tuple[float, ...]
    tail: float
    tau: tuple[float, ...]
    rate: float
    samples: int

    @property
    def baseline_ms(self) -> float:
        """The typical value of the statistic before, in ms."""
        return math.exp(self.loc)

    def sd(self, n: np.ndarray) -> np.ndarray:
        """Standard deviation of a window's ``x`` holding ``n`` requests."""
        nn = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
        return np.asarray(np.sqrt(np.maximum(self.a + self.b / nn, FLOOR**2)), dtype=np.float64)

    def z(self, x: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Standardised values: ``(x - loc) / sd(n)``."""
        out: np.ndarray = (np.asarray(x, dtype=np.float64) - self.loc) / self.sd(n)
        return out

    def score(self, x: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Calibrated scores ``g`` (standard normal on the baseline; NaN where no sample)."""
        return self.calibrate(self.z(x, n))

    def calibrate(self, z: np.ndarray) -> np.ndarray:
        """Standardised values to calibrated scores: piecewise linear between the knots in
        normal-score space, an exponential tail above the last knot, slope 1 below the first."""
        k = np.asarray(self.knots)
        g = np.interp(z, k, _G_KNOTS)
        with np.errstate(invalid="ignore"):
            low = z < k[0]
            g = np.where(low, _G_KNOTS[0] + (z - k[0]), g)
            high = z > k[-1]
        if high.any():
            p = (1.0 - KNOTS[-1]) * np.exp(-(z[high] - k[-1]) / self.tail)
            g[high] = -ndtri(np.maximum(p, 1e-300))
        return np.asarray(g, dtype=np.float64)

    def tau_at(self, memory: float) -> float:
        """Long-run variance factor of a sum over ``memory`` windows (interpolated in log)."""
        m = min(max(memory, 1.0), float(MEMORIES[-1]))
        return float(np.interp(math.log(m), np.log(MEMORIES), self.tau))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["knots"] = [round(float(v), 4) for v in self.knots]
        out["tau"] = [round(float(v), 3) for v in self.tau]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Normal:
        """The inverse of :meth:`to_dict` (a frozen model kept with an open incident)."""
        return cls(
            float(d["loc"]),
            float(d["a"]),
            float(d["b"]),
            tuple(float(v) for v in d["knots"]),
            float(d["tail"]),
            tuple(float(v) for v in d["tau"]),
            float(d["rate"]),
            int(d["samples"]),
        )


def fit(x: np.ndarray, n: np.ndarray, use: np.ndarray, span_s: float) -> Normal | None:
    """The normal of ``x`` (log ms) with ``n`` requests per window over the windows ``use``
    selects (in time order), which cover ``span_s`` seconds; None when fewer than 8 of them
    hold a sample (the caller asks for more before judging)."""
    sel = use & np.isfinite(x) & (n > 0)
    xs, ns = x[sel], np.asarray(n[sel], dtype=np.float64)
    m = len(xs)
    if m < 8:
        return None
    loc = float(np.median(xs))
    a, b = _variance((xs - loc) ** 2, np.maximum(ns, 1.0))
    sd = np.sqrt(np.maximum(a + b / np.maximum(ns, 1.0), FLOOR**2))
    z = (xs - loc) / sd
    knots = np.quantile(z, KNOTS)
    # strictly increasing, for the interpolation (a simulator's ties repeat a value)
    knots = np.maximum.accumulate(knots + 1e-9 * np.arange(len(knots)))
    above = z[z > knots[-1]] - knots[-1]
    k, prior = PRIOR_TAIL
    tail = max(MIN_TAIL, (float(above.sum()) + k * prior) / (len(above) + k))
    shape = Normal(loc, a, b, tuple(knots), tail, (1.0,) * len(MEMORIES), 0.0, m)
    g = shape.calibrate(z)
    return Normal(loc, a, b, tuple(knots), tail, _taus(g), m / max(span_s, 1e-9), m)


def _variance(dev2: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """``(a, b)`` >= 0 with a window of ``n`` requests varying by ``a + b / n``, fitted
    robustly: per group of windows with similar counts (powers of two), the median squared
    deviation (over 0.455, a normal's), then least squares over the groups; all in ``a`` when
    the counts hardly differ (then the two cannot be told apart, and a variance that does not
    shrink with more requests is the cautious reading). The tails are the calibration's
    business (:meth:`Normal.calibrate`), not the scale's."""
    group = np.floor(np.log2(n)).astype(np.int64)
    var, inv, weight = [], [], []
    for g in np.unique(group):
        sel = group == g
        if sel.sum() >= 5:
            var.append(float(np.median(dev2[sel])) / MEDIAN_CHI2)
            inv.append(float(np.median(1.0 / n[sel])))
            weight.append(float(sel.sum()))
    if not var:
        return float(np.median(dev2)) / MEDIAN_CHI2, 0.0
    v, x, w = np.asarray(var), np.asarray(inv), np.asarray(weight)
    total = float(np.average(v, weights=w))
    if len(v) < 2 or x.max() < 1.5 * x.min():
        return total, 0.0
    slope, icpt = np.polyfit(x, v, 1, w=np.sqrt(w))
    if slope <= 0:
        return total, 0.0
    if icpt < 0:
        return 0.0, float(np.average(v / x, weights=w))
    return float(icpt), float(slope)


def _taus(g: np.ndarray) -> tuple[float, ...]:
    """Long-run variance factors of ``g``'s sums over :data:`MEMORIES` consecutive samples;
    where too few samples give one, the factor of the longest memory that has one."""
    var = float(g.var())
    out = [1.0]
    c = np.concatenate(([0.0], np.cumsum(g - g.mean())))
    for k in MEMORIES[1:]:
        if var <= 0 or len(g) < 3 * k:
            out.append(out[-1])
            continue
        sums = c[k:] - c[:-k]
        out.append(float(np.clip(sums.var() / (k * var), 1.0, k)))
    return tuple(out)
