"""The oracle limit of detection: a CUSUM that knows a model's latency before and after a change.

Among detectors held to the same false-alarm rate, none finds a change in a stream's
distribution faster (in the worst case over when it starts: Lorden 1971, Moustakides 1986)
than Page's CUSUM of the log-likelihood ratio of each observation under *after* vs *before*::

    S_0 = 0,  S_k = max(0, S_{k-1} + x_k),  alarm at the first k with S_k >= h  (then S = 0)

where ``x_k`` is the evidence of step ``k`` and ``h`` the threshold. Its delay at a stated
false-alarm rate is therefore the physical limit a real detector, which does not know the
distributions, can approach. This module holds the four stages, each usable alone:

* :class:`LatencyRatio` — the log-likelihood ratio of one request's latency: histogram
  densities of log latency before and after (shared bins at quantiles of the pooled sample,
  half a count added to every bin so no ratio is infinite). Fit it on requests the run it
  scores does not hold.
* :func:`window_increments` — a step's evidence ``x_k``: the summed ratios of the requests
  that ended in each window of ``width_s`` seconds (0 for a window without one).
* :func:`cusum_alarms` — the recursion above over a series of increments, for one or many
  thresholds at once.
* :func:`calibrate` — the threshold for a false-alarm rate per hour: a circular block
  bootstrap of fault-free increment series (blocks keep the short-range dependence of real
  latencies: batches, queues) to ``hours`` of null data, the alarm rate counted on a grid of
  thresholds; :meth:`FalseAlarmCurve.threshold` picks the smallest threshold of the grid
  at or under the rate asked.

Shapes: latencies and end times are 1-D float arrays in ms and s; increments 1-D float
(windows). Bad input (empty or mismatched arrays, a non-positive width or rate) raises
:class:`~cotenant.core.errors.UsageError` naming what is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cotenant.core.errors import UsageError

PSEUDO_COUNT = 0.5
"""Added to every bin of both histograms (Jeffreys' prior): an empty bin gives a finite ratio."""


@dataclass(frozen=True)
class LatencyRatio:
    """Per-request log-likelihood ratio, after vs before, of a latency (ms).

    ``edges``: the interior bin edges on log(ms) (``bins - 1`` values, increasing);
    ``p_before`` / ``p_after``: each of the ``bins`` bins' probability (values below the first
    edge fall in the first bin, above the last in the last)."""

    edges: np.ndarray
    p_before: np.ndarray
    p_after: np.ndarray

    @classmethod
    def fit(
        cls, before_ms: Sequence[float] | np.ndarray, after_ms: Sequence[float] | np.ndarray
    ) -> LatencyRatio:
        """Fit from latencies (ms, > 0) seen before and after the change. Bins: about the
        square root of the smaller sample (4 to 50), at quantiles of both samples pooled."""
        lb = np.log(_positive(before_ms, "before_ms"))
        la = np.log(_positive(after_ms, "after_ms"))
        bins = int(np.clip(np.sqrt(min(len(lb), len(la))), 4, 50))
        pooled = np.concatenate([lb, la])
        edges = np.unique(np.quantile(pooled, np.linspace(0, 1, bins + 1)[1:-1]))
        n = len(edges) + 1
        cb = np.bincount(np.searchsorted(edges, lb, side="right"), minlength=n)
        ca = np.bincount(np.searchsorted(edges, la, side="right"), minlength=n)
        return cls(
            edges=edges,
            p_before=(cb + PSEUDO_COUNT) / (len(lb) + PSEUDO_COUNT * n),
            p_after=(ca + PSEUDO_COUNT) / (len(la) + PSEUDO_COUNT * n),
        )

    @property
    def llr(self) -> np.ndarray:
        """The ratio of each bin, nats."""
        out: np.ndarray = np.log(self.p_after) - np.log(self.p_before)
        return out

    def __call__(self, latency_ms: np.ndarray) -> np.ndarray:
        """The ratio of each latency (ms); same shape."""
        x = np.log(np.maximum(np.asarray(latency_ms, dtype=np.float64), 1e-9))
        out: np.ndarray = self.llr[np.searchsorted(self.edges, x, side="right")]
        return out

    def divergence(self) -> float:
        """Kullback-Leibler divergence of after from before, nats per request (the mean
        increment once the change has happened): the textbook delay is about
        ``threshold / divergence`` requests."""
        return float(np.sum(self.p_after * self.llr))


def _positive(x: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or not len(a):
        raise UsageError(f"{name}: needs a non-empty 1-D sample of latencies (got shape {a.shape})")
    bad = ~np.isfinite(a) | (a <= 0)
    if bad.any():
        raise UsageError(f"{name}: {int(bad.sum())} latency value(s) not finite and > 0")
    return a


def window_increments(
    end_s: np.ndarray, llr: np.ndarray, duration_s: float, width_s: float
) -> np.ndarray:
    """Sum of ``llr`` over the requests whose end (s from the run's start) falls in each
    window ``[k w, (k+1) w)`` of ``[0, duration_s)``; ``ceil(duration_s / width_s)`` windows.
    Requests outside the range are dropped."""
    if width_s <= 0 or duration_s <= 0:
        raise UsageError(f"width_s and duration_s must be > 0 (got {width_s}, {duration_s})")
    t = np.asarray(end_s, dtype=np.float64)
    v = np.asarray(llr, dtype=np.float64)
    if t.shape != v.shape:
        raise UsageError(f"end_s and llr differ in shape ({t.shape} vs {v.shape})")
    n = int(np.ceil(duration_s / width_s))
    k = np.floor(t / width_s).astype(np.int64)
    ok = (k >= 0) & (k < n)
    return np.bincount(k[ok], weights=v[ok], minlength=n)[:n]


def cusum_alarms(increments: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of the windows at which the CUSUM of ``increments`` alarms at ``threshold``
    (> 0), restarting from 0 after each alarm."""
    if threshold <= 0:
        raise UsageError(f"threshold must be > 0 (got {threshold})")
    s = 0.0
    out = []
    for k, x in enumerate(np.asarray(increments, dtype=np.float64).tolist()):
        s = max(0.0, s + x)
        if s >= threshold:
            out.append(k)
            s = 0.0
    return np.asarray(out, dtype=np.int64)


def first_alarm(increments: np.ndarray, threshold: float, lo: int, hi: int) -> int | None:
    """The first window in ``[lo, hi)`` at which the CUSUM (run from window 0, restarting
    after every alarm, those before ``lo`` included) alarms; None if it does not."""
    alarms = cusum_alarms(increments, threshold)
    inside = alarms[(alarms >= lo) & (alarms < hi)]
    return int(inside[0]) if len(inside) else None


@dataclass(frozen=True)
class FalseAlarmCurve:
    """False alarms per hour of the CUSUM at each threshold of ``thresholds`` (increasing),
    counted over ``hours`` of bootstrapped fault-free data (``alarms`` per threshold)."""

    thresholds: np.ndarray
    alarms: np.ndarray
    hours: float

    @property
    def per_hour(self) -> np.ndarray:
        out: np.ndarray = self.alarms / self.hours
        return out

    def rate_at(self, threshold: float) -> float:
        """False alarms per hour at ``threshold``: the rate of the largest grid point at or
        below it (the first point's below the grid). The rate is a step function where the
        ratios take few values (a handful of histogram bins at low request rates), so it is
        not interpolated."""
        j = int(np.searchsorted(self.thresholds, threshold, side="right")) - 1
        return float(self.per_hour[max(j, 0)])

    def threshold(self, rate_per_hour: float) -> float:
        """The smallest grid threshold whose false-alarm rate is at most ``rate_per_hour``
        (so the rate it raises is at most the one asked, by up to one grid step). Raises
        UsageError when the rate is beyond what the grid or the bootstrap resolves (every
        threshold alarms more often, or asks for a rate under one alarm in ``hours``)."""
        if rate_per_hour <= 0:
            raise UsageError(f"rate_per_hour must be > 0 (got {rate_per_hour})")
        if rate_per_hour * self.hours < 1:
            raise UsageError(
                f"{rate_per_hour}/h needs more than the {self.hours:g} bootstrapped hours"
            )
        below = np.flatnonzero(self.per_hour <= rate_per_hour)
        if not len(below):
            raise UsageError(
                f"{rate_per_hour}/h is below every rate the bootstrap counted (lowest "
                f"{self.per_hour[-1]:.3g}/h at threshold {self.thresholds[-1]:.3g}): extend "
                "the grid"
            )
        return float(self.thresholds[below[0]])


def calibrate(
    null_runs: Sequence[np.ndarray],
    width_s: float,
    *,
    thresholds: np.ndarray | None = None,
    hours: float = 1000.0,
    block: int = 60,
    chains: int = 500,
    seed: int = 0,
) -> FalseAlarmCurve:
    """False alarms per hour of the CUSUM over fault-free increments, at every threshold.

    ``null_runs``: increment series (one per fault-free run and model, windows of
    ``width_s`` s), each at least ``block`` windows long. They are cut into overlapping
    blocks of ``block`` windows (wrapping around within each run, so every window is drawn
    as often), drawn with replacement into ``chains`` parallel series of ``hours`` in all,
    and the CUSUM (restarting after each alarm) runs over every series at every threshold at
    once. ``thresholds``: increasing, > 0 (default 0.25 .. 40 by 0.25)."""
    runs = [np.asarray(r, dtype=np.float64) for r in null_runs]
    if not runs or any(len(r) < block for r in runs):
        raise UsageError(
            f"calibrate needs fault-free runs of at least {block} windows each "
            f"(got lengths {[len(r) for r in runs]})"
        )
    if width_s <= 0 or hours <= 0 or block < 1 or chains < 1:
        raise UsageError(
            f"width_s, hours, block and chains must be > 0 ({width_s}, {hours}, {block}, {chains})"
        )
    grid = np.arange(0.25, 40.0 + 1e-9, 0.25) if thresholds is None else np.asarray(thresholds)
    if grid.ndim != 1 or not len(grid) or (grid <= 0).any() or (np.diff(grid) <= 0).any():
        raise UsageError("thresholds must be a non-empty increasing 1-D array of values > 0")
    data = np.concatenate(runs)
    # circular blocks within each run: every window is drawn equally often, the first and
    # last ones of a run (its start-up, its end) included
    offsets = np.repeat(np.cumsum([0] + [len(r) for r in runs[:-1]]), [len(r) for r in runs])
    lengths = np.repeat([len(r) for r in runs], [len(r) for r in runs])
    local = np.concatenate([np.arange(len(r)) for r in runs])
    steps = int(np.ceil(hours * 3600 / width_s / chains / block))
    rng = np.random.default_rng(seed)
    s = np.zeros((chains, len(grid)))
    alarms = np.zeros(len(grid), dtype=np.int64)
    for _ in range(steps):
        pick = rng.integers(0, len(data), size=chains)[:, None]
        blocks = data[offsets[pick] + (local[pick] + np.arange(block)) % lengths[pick]]
        for x in blocks.T:
            s += x[:, None]
            np.maximum(s, 0.0, out=s)
            hit = s >= grid
            alarms += hit.sum(axis=0)
            s[hit] = 0.0
    done = steps * block * chains * width_s / 3600
    return FalseAlarmCurve(thresholds=grid, alarms=alarms, hours=done)
