"""Bayesian online change point detection (BOCPD) on one series.

Adams & MacKay, "Bayesian Online Changepoint Detection", arXiv:0710.3742 (2007), with a
Normal-Gamma prior on each segment's mean and precision, so that the predictive of the next value
given a segment's observations is a Student-t, and a constant hazard (the prior probability that
any window starts a new segment). BARO (Pham et al., FSE'24) runs it to find where an anomaly
starts; :func:`anomaly_start` does the same on one latency series.

The recursion is online over time (one step per window) and vectorised over run lengths, so a
series of ``n`` windows costs ``O(n^2)`` time and ``O(n)`` memory: fine for the few thousand
windows of an incident, not for a day of one-second windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lgamma

import numpy as np

from cotenant.core.errors import UsageError


@dataclass(frozen=True)
class NormalGamma:
    """Prior of a segment's mean and precision, on the standardised series (see
    :func:`changepoint_probability`): mean ``mu`` with pseudo-count ``kappa``, precision
    Gamma(``alpha``, ``beta``). The defaults say "about unit noise, mean unknown"."""

    mu: float = 0.0
    kappa: float = 0.1
    alpha: float = 1.0
    beta: float = 1.0


def _standardise(x: np.ndarray) -> np.ndarray | None:
    """Centre on the median and divide by the noise level (robust spread of the first
    differences, which one step change barely moves); None for a constant series."""
    if not np.any(x != x[0]):
        return None
    med = float(np.median(x))
    d = np.diff(x)
    sigma = 0.0
    if len(d) >= 2:
        sigma = 1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2.0)
    if sigma <= 0:
        q75, q25 = np.percentile(x, [75, 25])
        sigma = float(q75 - q25) / 1.349
    if sigma <= 0:
        sigma = 0.05 * abs(med)
    if sigma <= 0:
        sigma = float(np.max(np.abs(x - med)))
    return (x - med) / sigma


def _student_t_logpdf(
    x: float,
    mu: np.ndarray,
    kappa: np.ndarray,
    alpha: np.ndarray,
    beta: np.ndarray,
    lg: np.ndarray,
) -> np.ndarray:
    """log p(x) under the Normal-Gamma posterior predictive of every run length at once;
    ``lg`` is ``lgamma(alpha + 1/2) - lgamma(alpha)``."""
    df = 2.0 * alpha
    scale2 = beta * (kappa + 1.0) / (alpha * kappa)
    z = (x - mu) ** 2 / (df * scale2)
    out: np.ndarray = lg - 0.5 * np.log(np.pi * df * scale2) - (alpha + 0.5) * np.log1p(z)
    return out


def changepoint_probability(
    x: np.ndarray, *, lag: int = 3, hazard: float = 1 / 50, prior: NormalGamma | None = None
) -> np.ndarray:
    """For each window ``s`` of ``x`` (shape ``(n,)``, any unit), the posterior probability that
    a new segment starts at ``s``, judged ``lag`` windows later (at ``min(s + lag, n) - 1``, so
    the last windows are judged on fewer observations). Index 0 is the start of the series, not
    a change; it gets 0.

    NaN windows are skipped (the recursion runs on the finite values; their probabilities come
    back at their own index, NaN windows get 0). A constant series has no change point: all 0.
    Raises :class:`UsageError` when ``lag < 1`` or ``hazard`` is not in (0, 1)."""
    if lag < 1:
        raise UsageError(f"lag must be at least 1, got {lag}")
    if not 0 < hazard < 1:
        raise UsageError(f"hazard must be in (0, 1), got {hazard}")
    p = prior or NormalGamma()
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros(len(x))
    finite = np.flatnonzero(np.isfinite(x))
    n = len(finite)
    if n < 2:
        return out
    z = _standardise(x[finite])
    if z is None:
        return out
    cp = np.zeros(n)
    log_h, log_1mh = np.log(hazard), np.log1p(-hazard)
    # state before window t: run lengths m = 0..t (m observations already in the segment)
    logp = np.zeros(1)
    mu = np.array([p.mu])
    kappa = np.array([p.kappa])
    alpha = np.array([p.alpha])
    beta = np.array([p.beta])
    lg0 = lgamma(p.alpha + 0.5) - lgamma(p.alpha)
    lg = np.array([lg0])
    for t in range(n):
        joint = logp + _student_t_logpdf(z[t], mu, kappa, alpha, beta, lg)
        post = joint - np.logaddexp.reduce(joint)  # post[m]: segment began at t - m
        if t >= lag - 1:
            cp[t - lag + 1] = np.exp(post[lag - 1])
        if t == n - 1:
            starts = np.arange(max(0, n - lag + 1), n)
            cp[starts] = np.exp(post[n - 1 - starts])
        beta = beta + kappa * (z[t] - mu) ** 2 / (2.0 * (kappa + 1.0))
        mu = (kappa * mu + z[t]) / (kappa + 1.0)
        kappa = kappa + 1.0
        # lgamma(a + 1) = lgamma(a) + log(a), so the lgamma term steps without lgamma calls
        lg = np.log(alpha) - lg
        alpha = alpha + 0.5
        logp = np.concatenate(([log_h], log_1mh + post))
        mu = np.concatenate(([p.mu], mu))
        kappa = np.concatenate(([p.kappa], kappa))
        alpha = np.concatenate(([p.alpha], alpha))
        beta = np.concatenate(([p.beta], beta))
        lg = np.concatenate(([lg0], lg))
    cp[0] = 0.0
    out[finite] = cp
    return out


def anomaly_start(
    x: np.ndarray,
    *,
    min_before: int = 3,
    min_after: int = 2,
    lag: int = 3,
    hazard: float = 1 / 50,
    threshold: float = 0.5,
    direction: int = 1,
) -> int | None:
    """Index of the first anomalous window of ``x`` (shape ``(n,)``, e.g. a latency p99 in
    seconds per window): the most probable BOCPD change point with at least ``min_before``
    windows before it and ``min_after`` from it on, after which the median of the next ``lag``
    windows moved in ``direction`` (+1 up, -1 down, 0 either) from the median before it.
    None when no such change point reaches ``threshold`` posterior probability."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    if direction not in (-1, 0, 1):
        raise UsageError(f"direction must be -1, 0 or 1, got {direction}")
    lo, hi = max(1, min_before), n - min_after
    if hi < lo:
        return None
    cp = changepoint_probability(x, lag=lag, hazard=hazard)
    best, best_p = None, threshold
    for s in range(lo, hi + 1):
        if cp[s] < best_p:
            continue
        before, after = x[:s], x[s : s + lag]
        before, after = before[np.isfinite(before)], after[np.isfinite(after)]
        if len(before) == 0 or len(after) == 0:
            continue
        shift = float(np.median(after) - np.median(before))
        if direction and shift * direction <= 0:
            continue
        best, best_p = s, cp[s]
    return best
