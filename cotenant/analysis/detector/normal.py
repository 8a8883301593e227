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

import hashlib
import math
import threading
from collections import OrderedDict
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
SPREAD_Q = 0.1
"""The spread of a group is that of its middle ``1 - 2 * SPREAD_Q`` (as a normal's standard
deviation): robust to the slowest tenth, yet wide enough where the body has shoulders."""
_G_HI = float(ndtri(1.0 - SPREAD_Q))


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
    slope: float = 0.0  # log ms per log request: where a window's value sits grows with n
    ref_n: float = 1.0  # ... from this many requests (``loc`` is there)

    @property
    def baseline_ms(self) -> float:
        """The typical value of the statistic before, in ms."""
        return math.exp(self.loc)

    def sd(self, n: np.ndarray) -> np.ndarray:
        """Standard deviation of a window's ``x`` holding ``n`` requests."""
        nn = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
        return np.asarray(np.sqrt(np.maximum(self.a + self.b / nn, FLOOR**2)), dtype=np.float64)

    def center(self, n: np.ndarray) -> np.ndarray:
        """Where a window of ``n`` requests sits (log ms)."""
        nn = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
        return np.asarray(self.loc + self.slope * (np.log(nn) - math.log(self.ref_n)))

    def z(self, x: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Standardised values: ``(x - center(n)) / sd(n)``."""
        out: np.ndarray = (np.asarray(x, dtype=np.float64) - self.center(n)) / self.sd(n)
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
            float(d.get("slope", 0.0)),
            float(d.get("ref_n", 1.0)),
        )


FITS_KEPT = 4096
"""Normals remembered by :func:`fit`: the live loop re-reads the same clock-aligned stretches
every pass, so nearly every fit it asks for it asked before (about 99 % on a five-model
control; a quarter of a pass's CPU saved)."""

_fits: OrderedDict[tuple[bytes, float, bool], Normal | None] = OrderedDict()
_fits_lock = threading.Lock()


def fit(
    x: np.ndarray, n: np.ndarray, use: np.ndarray, span_s: float, by_count: bool = False
) -> Normal | None:
    """The normal of ``x`` (log ms) with ``n`` requests per window over the windows ``use``
    selects (in time order), which cover ``span_s`` seconds; None when fewer than 8 of them
    hold a sample (the caller asks for more before judging). ``by_count``: where a window
    sits grows with its requests (a tail: the p99 of 50 requests is above that of 5 from the
    same distribution), fitted as a slope over the log of the count. A pure function of its
    arguments, remembered by their content (the last :data:`FITS_KEPT`)."""
    digest = hashlib.blake2b(digest_size=16)
    for a in (x, n, use):
        digest.update(f"{a.dtype.str}{a.shape}".encode())
        digest.update(np.ascontiguousarray(a).tobytes())
    key = (digest.digest(), float(span_s), bool(by_count))
    with _fits_lock:
        if key in _fits:
            _fits.move_to_end(key)
            return _fits[key]
    normal = _fit(x, n, use, span_s, by_count)
    with _fits_lock:
        _fits[key] = normal
        while len(_fits) > FITS_KEPT:
            _fits.popitem(last=False)
    return normal


def _fit(
    x: np.ndarray, n: np.ndarray, use: np.ndarray, span_s: float, by_count: bool
) -> Normal | None:
    sel = use & np.isfinite(x) & (n > 0)
    xs, ns = x[sel], np.maximum(np.asarray(n[sel], dtype=np.float64), 1.0)
    m = len(xs)
    if m < 8:
        return None
    slope, ref = _count_slope(xs, ns) if by_count else (0.0, 1.0)
    xs = xs - slope * (np.log(ns) - math.log(ref))
    loc = float(np.median(xs))
    a, b = _variance(xs - loc, ns)
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
    return Normal(loc, a, b, tuple(knots), tail, _taus(g), m / max(span_s, 1e-9), m, slope, ref)


def _count_slope(x: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """``(slope, reference count)``: how ``x`` grows per log of the requests behind it — the
    median of each group of windows with similar counts (powers of two), then least squares
    over the groups (clipped to [0, 1/2]); 0 where the counts hardly differ."""
    group = np.floor(np.log2(n)).astype(np.int64)
    if group.min() == group.max():
        return 0.0, float(np.median(n))
    med, logn, weight = [], [], []
    for g in np.unique(group):
        sel = group == g
        if sel.sum() >= 5:
            med.append(float(np.median(x[sel])))
            logn.append(float(np.median(np.log(n[sel]))))
            weight.append(float(sel.sum()))
    ref = float(np.median(n))
    if len(med) < 2:
        return 0.0, ref
    slope, _ = _line(np.asarray(logn), np.asarray(med), np.asarray(weight))
    return float(np.clip(slope, 0.0, 0.5)), ref


def _variance(dev: np.ndarray, n: np.ndarray) -> tuple[float, float]:
    """``(a, b)`` >= 0 with a window of ``n`` requests varying by ``a + b / n``, fitted
    robustly: per group of windows with similar counts (powers of two), the spread of the
    middle 80 % of the deviations ``dev`` (as a normal distribution's standard deviation), then
    least squares over the groups; all in ``a`` when the counts hardly differ (then the two
    cannot be told apart, and a variance that does not shrink with more requests is the
    cautious reading). The tails beyond are the calibration's business
    (:meth:`Normal.calibrate`), not the scale's."""
    group = np.floor(np.log2(n)).astype(np.int64)
    if group.min() == group.max():  # one group (a steady rate): the common case, and cheap
        return _spread(dev) ** 2, 0.0
    var, inv, weight = [], [], []
    for g in np.unique(group):
        sel = group == g
        if sel.sum() >= 5:
            var.append(_spread(dev[sel]) ** 2)
            inv.append(float(np.median(1.0 / n[sel])))
            weight.append(float(sel.sum()))
    if not var:
        return _spread(dev) ** 2, 0.0
    v, x, w = np.asarray(var), np.asarray(inv), np.asarray(weight)
    total = float(np.average(v, weights=w))
    if len(v) < 2 or x.max() < 1.5 * x.min():
        return total, 0.0
    slope, icpt = _line(x, v, w)
    if slope <= 0:
        return total, 0.0
    if icpt < 0:
        return 0.0, float(np.average(v / x, weights=w))
    return icpt, slope


def _line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """``(slope, intercept)`` of the weighted least-squares line through ``(x, y)``."""
    mx, my = np.average(x, weights=w), np.average(y, weights=w)
    sxx = float(np.sum(w * (x - mx) ** 2))
    slope = float(np.sum(w * (x - mx) * (y - my))) / sxx if sxx > 0 else 0.0
    return slope, float(my - slope * mx)


def _spread(dev: np.ndarray) -> float:
    lo, hi = np.quantile(dev, (SPREAD_Q, 1.0 - SPREAD_Q))
    return float(hi - lo) / (2.0 * _G_HI)


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
