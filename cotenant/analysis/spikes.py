"""Baselines and the spike test on one latency series.

Baseline: rolling median of the preceding ``history`` windows (windows with too few requests
ignored), spread: rolling MAD scaled to a standard deviation. A window is a *spike* when its
p99 exceeds the model's SLO (when one is set) **and** the baseline by a margin —
``baseline + max(k x MAD, rel_margin x baseline, abs_margin_ms)`` with ``k = k_mad`` (5), or
``k_mad_slo`` (3) when an SLO is set and must be breached as well. How spikes and sustained
slowdowns become episodes (opening, frozen baseline, closing) is :mod:`analysis.episodes`.

Seasonal baseline, where history allows: with ``season`` set (windows per season, e.g. 1440
one-minute windows for a daily cycle) and at least two seasons of usable windows, a robust STL
decomposition (statsmodels) takes the seasonal component out first; the rolling median/MAD run
on the deseasonalised series and the seasonal component is added back to the baseline. A
model that is always slower at its daily peak is then not an incident at every peak, while a
spike on top of the peak still is. Only the on-demand :class:`analysis.analyzer.Analyzer` sets
``season`` (from ``analysis.season_s`` and its step); the live loop reads a 10-minute horizon
and keeps ``SpikeParams()``, as two days of history per pass would cost too much.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from cotenant.analysis.evidence import EvidenceParams


@dataclass(frozen=True)
class SpikeParams:
    history: int = 120  # windows in the rolling baseline
    min_history: int = 30  # windows of history before anything is called slow (warm-up)
    min_count: float = 3  # requests a window needs for its p99 to count
    k_mad: float = 5.0  # without an SLO the baseline margin alone decides: be strict
    k_mad_slo: float = 3.0  # with an SLO, breaching it is the main gate
    rel_margin: float = 0.3
    abs_margin_ms: float = 2.0
    open_windows: int = 2
    close_windows: int = 5
    degrade_ratio: float = 1.3  # a degradation: median p99 >= ratio x baseline ...
    degrade_abs_ms: float = 2.0  # ... and this much over it ...
    degrade_windows: int = 30  # ... over this many windows (0: no degradations)
    min_episode_windows: int = 5  # a slowdown over sooner than this is a transient, not news
    season: int = 0  # windows per season (0: no seasonal baseline)
    season_max: int = 10_080  # longest season decomposed (a week of one-minute windows)
    # how far back the levels of a model's slowdowns count as its ordinary contention
    # (degradations only open above every such level seen since; analysis.evidence); 0: none
    seen_windows: int = 600
    # ... by this many times the largest excursion over the baseline seen in that history
    ordinary_margin: float = 1.25
    # which level of that history counts: 1 = the highest; 0.75 = one the model spent a
    # quarter of it above (a slowdown seen once is not yet the model's normal)
    ordinary_q: float = 1.0
    evidence: EvidenceParams | None = field(default_factory=EvidenceParams)  # None: p99 only

    @property
    def seasonal(self) -> bool:
        return 2 <= self.season <= self.season_max

    @property
    def history_windows(self) -> int:
        """Windows of history read before a range: two seasons when seasonal, and the
        ordinary contention's whole memory before the range's first window (plus the
        stretches its levels are judged over), so a window is judged against the same past
        whichever pass reads it: with less, a live pass whose read had scrolled past a burst
        found an old stretch "new" and joined it to the next incident."""
        n = max(self.history, 2 * self.season) if self.seasonal else self.history
        if self.seen_windows > 0:
            n = max(n, self.seen_windows + 2 * self.degrade_windows)
        return n


def baseline(p99: np.ndarray, count: np.ndarray, p: SpikeParams) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, robust sigma) per window from the *preceding* windows only (plus, when
    seasonal, the seasonal component of the whole series)."""
    v = np.where(count >= p.min_count, p99, np.nan)
    seasonal = seasonal_component(v, p.season) if p.seasonal else None
    s = pd.Series(v if seasonal is None else v - seasonal)
    med = s.rolling(p.history, min_periods=p.min_history).median().shift(1)
    mad = (s - med).abs().rolling(p.history, min_periods=p.min_history).median().shift(1)
    base = med.to_numpy()
    if seasonal is not None:
        base = base + seasonal
    return base, 1.4826 * mad.to_numpy()


def seasonal_component(v: np.ndarray, season: int) -> np.ndarray | None:
    """The seasonal component of ``v`` (NaN = no usable value) by robust STL, or None when
    fewer than two seasons of values are usable (then there is nothing to learn a cycle from)."""
    ok = np.isfinite(v)
    if season < 2 or ok.sum() < 2 * season or len(v) < 2 * season:
        return None
    from statsmodels.tsa.seasonal import STL  # imported here: only long ranges need it

    filled = pd.Series(v).interpolate(limit_direction="both").to_numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter on flat series
        # a local-constant seasonal smoother over 3 (or, with a week of cycles, 7) cycles:
        # with few cycles a sloped one would fit a one-off spike in the last cycle as season
        cycles = len(v) // season
        fit = STL(
            filled, period=season, seasonal=7 if cycles >= 7 else 3, seasonal_deg=0, robust=True
        ).fit()
    return np.asarray(fit.seasonal, dtype=float)


def spike_mask(
    p99: np.ndarray,
    count: np.ndarray,
    slo_ms: float | None,
    p: SpikeParams,
    *,
    base: np.ndarray | None = None,
    sigma: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(spike flags, threshold) per window: over the SLO (when set) and over the baseline by
    the spike margin. ``base`` / ``sigma``: a baseline already computed (e.g. one learnt
    only from windows outside incidents); by default :func:`baseline` of ``p99``."""
    if base is None or sigma is None:
        base, sigma = baseline(p99, count, p)
    k = p.k_mad if slo_ms is None else p.k_mad_slo
    margin = np.fmax(np.fmax(k * np.nan_to_num(sigma), p.rel_margin * base), p.abs_margin_ms)
    thr = base + margin
    if slo_ms is not None:
        thr = np.fmax(thr, slo_ms)
    with np.errstate(invalid="ignore"):
        spikes = (count >= p.min_count) & (p99 > thr)
    return np.nan_to_num(spikes, nan=0).astype(bool), thr
