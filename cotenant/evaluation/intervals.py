"""Exact confidence intervals for the benchmarks' counts and proportions.

* :func:`poisson_rate` — Garwood's exact interval for a Poisson count ``k`` over an exposure
  (e.g. false incidents over model-hours): the rates ``L, U`` with ``P(X >= k; L) = a/2`` and
  ``P(X <= k; U) = a/2``; ``L = 0`` when ``k = 0``.
* :func:`proportion` — Clopper-Pearson's exact interval for ``k`` successes in ``n`` trials.

Both solve their defining equations by bisection on exact tail sums (log-space terms), so
they need nothing beyond the standard library; ``level`` is the two-sided confidence (0.9 by
default: the figures in docs/accuracy.md are 90 % intervals).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from cotenant.core.errors import UsageError

LEVEL = 0.9


@dataclass(frozen=True)
class Interval:
    """An estimate and its two-sided interval at ``level``."""

    estimate: float
    low: float
    high: float
    level: float = LEVEL

    def __str__(self) -> str:
        return f"{self.estimate:.3g} [{self.low:.3g}, {self.high:.3g}]"


def _poisson_cdf(k: int, mu: float) -> float:
    """P(X <= k) for X ~ Poisson(mu)."""
    if mu <= 0:
        return 1.0
    log_term = -mu  # log P(X = 0)
    total = math.exp(log_term)
    for i in range(1, k + 1):
        log_term += math.log(mu) - math.log(i)
        total += math.exp(log_term)
    return min(1.0, total)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        log_c = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        total += math.exp(log_c + i * lp + (n - i) * lq)
    return min(1.0, total)


def _solve(f: Callable[[float], float], lo: float, hi: float) -> float:
    """The root of ``f``, decreasing on ``[lo, hi]``, by bisection to 1e-12 relative."""
    for _ in range(200):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def _check_level(level: float) -> float:
    if not 0 < level < 1:
        raise UsageError(f"confidence level {level}: must be between 0 and 1")
    return (1 - level) / 2


def poisson_rate(k: int, exposure: float, level: float = LEVEL) -> Interval:
    """Garwood interval of the rate of ``k`` events over ``exposure`` (hours, model-hours...).
    Raises UsageError for a negative count or a non-positive exposure."""
    if k < 0 or exposure <= 0:
        raise UsageError(f"a Poisson rate needs k >= 0 and exposure > 0 (got {k}, {exposure})")
    a = _check_level(level)
    high_mu = _solve(lambda mu: _poisson_cdf(k, mu) - a, 0.0, 10.0 * k + 50.0)
    low_mu = (
        0.0
        if k == 0
        else _solve(lambda mu: _poisson_cdf(k - 1, mu) - (1 - a), 0.0, 10.0 * k + 50.0)
    )
    return Interval(k / exposure, low_mu / exposure, high_mu / exposure, level)


def proportion(k: int, n: int, level: float = LEVEL) -> Interval:
    """Clopper-Pearson interval of ``k`` successes in ``n`` trials (``n = 0``: the estimate
    is NaN and the interval [0, 1]). Raises UsageError unless ``0 <= k <= n``."""
    if not 0 <= k <= n:
        raise UsageError(f"a proportion needs 0 <= k <= n (got {k} of {n})")
    a = _check_level(level)
    if n == 0:
        return Interval(float("nan"), 0.0, 1.0, level)
    high = 1.0 if k == n else _solve(lambda p: _binom_cdf(k, n, p) - a, 0.0, 1.0)
    low = 0.0 if k == 0 else _solve(lambda p: _binom_cdf(k - 1, n, p) - (1 - a), 0.0, 1.0)
    return Interval(k / n, low, high, level)
