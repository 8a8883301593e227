"""Is a cause's evidence enriched in the slow windows over its rate in the model's normal ones?

A cause is named only when what shows it is more common (or larger) in the windows of the
incident than in the model's normal windows before it: evidence as common in normal windows as
in slow ones (ordinary model loads that come with most requests, a co-tenant that is always
busy) explains nothing about the slowdown. Two one-sided tests, both at :data:`Z_NAMED`
standard errors (about 1.3 in 1,000 for a normal statistic):

* :func:`rate_enrichment` — evidence present or not per window (a load, a clock under its
  maximum while busy): the binomial z of the windows of the incident that show it, against the
  rate of the normal windows (clipped to ``[1 / (n + 1), 1 - 1 / (n + 1)]`` for ``n`` normal
  windows: a rate from ``n`` windows is never known to be exactly 0 or 1);
* :func:`shift_enrichment` — evidence measured per window (cores, SM activity, a frequency):
  Welch's z of the difference of the two means, in the direction that hurts
  (:mod:`analysis.metric_direction`), the standard error floored so a flat series does not turn
  a tiny change into a certain one.

The same comparison gives the part of the evidence that is excess over the base rate: for a
rate ``1 - rate_normal / rate_slow`` (the attributable fraction, :attr:`Enrichment.
excess_fraction`), for a level the ``during - before`` shift itself. Explainers predict their
share from that excess (a co-tenant's rise in activity, a clock's before / during ratio, the rise
of the load time per request), never from the level itself: what a cause does at its normal
rate is in the baseline already, not the incident's doing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.analysis.metric_direction import Direction, harmful

Z_NAMED = 3.0
"""One-sided z a cause's evidence must reach to be named."""
MIN_OWN_SPREAD = 5
"""Values a side needs for its own variance to enter a shift's standard error."""


@dataclass(frozen=True)
class Enrichment:
    """The evidence in the normal (``before``) and slow (``during``) windows: a rate (0-1)
    or a mean in the series' unit, the windows each had, and the one-sided z in the direction
    that hurts."""

    before: float
    during: float
    n_before: int
    n_during: int
    z: float
    rate: bool  # a share of windows (True) or a mean level (False)

    @property
    def named(self) -> bool:
        return bool(np.isfinite(self.z) and self.z >= Z_NAMED)

    @property
    def excess_fraction(self) -> float:
        """For a rate, the part of the slow windows' rate beyond the normal one (0-1):
        ``1 - before / during``; 1 for a level (its caller uses the shift itself)."""
        if not self.rate:
            return 1.0
        if not self.during > 0:
            return 0.0
        return float(min(1.0, max(0.0, 1.0 - self.before / self.during)))

    def to_evidence(self) -> dict[str, Any]:
        return {
            "normal": _r(self.before),
            "slow": _r(self.during),
            "normal_windows": self.n_before,
            "slow_windows": self.n_during,
            "z": _r(self.z, 2),
            "test": "binomial" if self.rate else "welch",
        }


def binomial_z(k: int, n: int, p: float, n_before: int) -> float:
    """One-sided binomial z of ``k`` windows out of ``n`` at the normal rate ``p`` (estimated
    from ``n_before`` windows, clipped as the module doc says); 0 when ``n`` is 0."""
    if n <= 0:
        return 0.0
    eps = 1.0 / (n_before + 1)
    q = min(max(p, eps), 1.0 - eps)
    return float((k - n * q) / np.sqrt(n * q * (1.0 - q)))


def rate_enrichment(on: np.ndarray, before: np.ndarray, during: np.ndarray) -> Enrichment:
    """``on``: per window 1 where the evidence is present, 0 where absent, NaN where unknown;
    ``before`` / ``during``: boolean masks of the normal and the slow windows."""
    x = np.asarray(on, dtype=np.float64)
    seen = np.isfinite(x)
    nb, nd = int((seen & before).sum()), int((seen & during).sum())
    kb = int(np.count_nonzero(x[seen & before] > 0))
    kd = int(np.count_nonzero(x[seen & during] > 0))
    pb = kb / nb if nb else 0.0
    pd = kd / nd if nd else 0.0
    return Enrichment(pb, pd, nb, nd, binomial_z(kd, nd, pb, nb), rate=True)


def shift_enrichment(
    x: np.ndarray,
    before: np.ndarray,
    during: np.ndarray,
    direction: Direction = Direction.RISE,
    se_floor: float = 0.0,
) -> Enrichment:
    """Welch's one-sided z of the mean of ``x`` over ``during`` against ``before``, in
    ``direction`` (``FALL``: a drop is positive; ``EITHER``: either way); with fewer than
    :data:`MIN_OWN_SPREAD` values during, their spread counts at most as much as the normal's
    (two or three windows of a coarse series cannot estimate their own). ``before`` and
    ``during`` in the result are the plain means (the series' unit). ``se_floor`` (the series'
    unit): the least standard error of the difference. NaN z when a side has no value."""
    y = np.asarray(x, dtype=np.float64)
    b = y[before & np.isfinite(y)]
    d = y[during & np.isfinite(y)]
    if len(b) == 0 or len(d) == 0:
        return Enrichment(np.nan, np.nan, len(b), len(d), np.nan, rate=False)
    mb, md = float(b.mean()), float(d.mean())
    # a handful of slow windows cannot show a spread wider than the normal's (two or three
    # steps of a coarse series that differ by 2x are no sign of a noisier mean)
    vd = d.var() if len(d) >= MIN_OWN_SPREAD else min(d.var(), b.var())
    se = float(np.sqrt(b.var() / len(b) + vd / len(d)))
    diff = float(np.mean(harmful(d, direction)) - np.mean(harmful(b, direction)))
    if direction == Direction.EITHER:
        diff = abs(diff)
    z = diff / max(se, se_floor, 1e-12)
    return Enrichment(mb, md, len(b), len(d), z, rate=False)


def _r(x: float, digits: int = 4) -> float | None:
    return round(float(x), digits) if np.isfinite(x) else None
