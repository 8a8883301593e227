"""Slowdowns judged on as many requests as the decision needs (issue 25).

The p99 rules of :mod:`analysis.episodes` judge one window at a time, so they need a p99 per
window: a model serving a request or two a second has none, and a 1.2x slowdown of a busy
model's median hides under its p99's noise. This rule judges the *typical* request instead.
Every window holding requests is one **sample**, its central latency (e2e: the window's
median; TTFT and TPOT: its mean): at low rates one or two requests, at high rates a window's
worth. Over a trailing **span** of windows (:attr:`EvidenceParams.spans`: 30 s to 4 min at 1-s
windows) holding at least ``min_samples`` samples, a slowdown opens when

* the span's median sample is at least ``ratio`` x the **baseline** (the median of the normal
  samples before the span, frozen at opening) and ``abs_ms`` over it;
* a **sign test** says it is no chance: ``k`` of the span's ``n`` samples above the baseline,
  ``P(Binomial(n, 1/2) >= k) < alpha / len(spans)`` (Bonferroni over the spans; it takes the
  samples as independent, which a bursty co-tenant's windows are not — hence the next rule);
* and it exceeds the median of every span of the same length in the recent history
  (``SpikeParams.seen_windows``), slowdowns included but SLO breaches not: a co-tenant's recurring
  bursts, seen before, set how high the model's normal goes (**ordinary contention**), and
  only what exceeds it is news.

So a 200 req/s model is judged over 30 windows and a 0.5 req/s model over one or two minutes:
the shortest span that holds the evidence wins. Once open, the slowdown stays open while the
median of the samples since it began (at most a span of them) stays over the frozen
threshold, and closes after ``SpikeParams.close_windows`` windows under it (or a span without
samples: a model that stops serving is not slow).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

RULE = "median"
"""How an episode this module opened on the typical request was judged
(:attr:`analysis.episodes.Episode.rule`)."""
TAIL = "tail"
"""... and one opened on the slow tail: the samples are the windows' p99s, judged at
:data:`TAIL_Q` (a slowdown of the few slowest requests leaves the median where it was)."""
TAIL_Q = 0.9
"""The quantile of the per-window p99 samples the tail rule judges: at a few requests per
window a window's p99 is its slowest request, so a slower tail shows as many more windows over
the baseline's 90th percentile of them while their median hardly moves (a memory-pressure
fault at 14 requests per window: 10 % of the windows over it before, 33 % during, the 90th
percentile 1.35x; the 80th moved 1.11x)."""
QUANTILE = {RULE: 0.5, TAIL: TAIL_Q}


@dataclass(frozen=True)
class EvidenceParams:
    spans: tuple[int, ...] = (30, 60, 120, 240)  # windows a decision may look back over
    min_samples: int = 12  # samples (windows with requests) a span needs to be judged
    min_baseline: int = 20  # normal samples the baseline needs
    ratio: float = 1.15  # the span's median at least this many times the baseline ...
    abs_ms: float = 0.5  # ... and this much over it
    # the ratio instead when another model on the GPU has an incident at the time whose first
    # cause the slowdown's names too: a fellow victim of a cause already found needs less
    # evidence (analysis.fellows; issue 25: a CPU hog slowed a bystander 1.12x at its median)
    shared_ratio: float = 1.08
    alpha: float = 1e-3  # false-alarm rate of one decision (all spans together)
    warmup: int = 120  # windows after a model's first request before it is judged
    # ... and the recent spans' typical median by this many robust standard deviations of
    # theirs (a bursty neighbour's ordinary excursions make that spread wide)
    spread_z: float = 4.0


@dataclass(frozen=True)
class Opening:
    """Where an evidence slowdown began and was found, and what it was judged against."""

    start: int
    at: int
    baseline: float  # median sample before it
    threshold: float  # it stays open while the median sample is over this
    span: int  # windows it is followed over (at most the span that found it)


def _quantile(x: np.ndarray, w: int, minp: int, q: float = 0.5) -> np.ndarray:
    r = pd.Series(x).rolling(w, min_periods=minp)
    return np.asarray((r.median() if q == 0.5 else r.quantile(q)).to_numpy())


def _count(ok: np.ndarray, w: int) -> np.ndarray:
    return np.convolve(ok.astype(np.int64), np.ones(w, dtype=np.int64))[: len(ok)]


@lru_cache(maxsize=65_536)
def sign_p(k: int, n: int, p0: float = 0.5) -> float:
    """``P(Binomial(n, p0) >= k)``: how often ``k`` or more of ``n`` samples would be above
    the baseline's quantile ``1 - p0`` (its median for ``p0`` = 1/2) by chance."""
    if k <= 0:
        return 1.0
    return float(sum(math.comb(n, j) * p0**j * (1.0 - p0) ** (n - j) for j in range(k, n + 1)))


def exceed_p0(q: float, m: int) -> float:
    """How often a normal sample exceeds a ``q`` quantile estimated from ``m`` samples, taken
    high by two standard errors of that estimate (rounded, for the test's cache): above the
    median, 1/2 (the sign test); above a high quantile of a few samples, more than ``1 - q``
    (a 90th percentile of 60 samples may be anyone's 82nd: at 0.1 req/s a fault-free model
    "slowed" by chance under the nominal 10 %)."""
    if q == 0.5:
        return 0.5
    return round(min(0.5, (1.0 - q) + 2.0 * math.sqrt(q * (1.0 - q) / max(m, 1))), 3)


def ordinary(
    levels: pd.Series, b0: np.ndarray, seen_windows: int, q: float, margin: float, lag: int
) -> np.ndarray:
    """The ordinary-contention bar per window: the baseline ``b0`` plus ``margin`` x the
    excursion of the ``q`` quantile (1 = the highest) of ``levels`` over the ``seen_windows``
    before the stretch (``lag`` windows back); NaN where nothing was seen. Both the p99 rule
    and this one open a degradation only above it."""
    seen = levels.rolling(seen_windows, min_periods=1).quantile(q).shift(lag).to_numpy()
    return np.asarray(b0 + margin * (seen - b0))


def threshold(baseline: float, p: EvidenceParams) -> float:
    return max(p.ratio * baseline, baseline + p.abs_ms)


def opening(
    center: np.ndarray,
    normal: np.ndarray,
    history: np.ndarray,
    p: EvidenceParams,
    pos: int,
    n_eval: int,
    seen_windows: int,
    margin: float = 1.0,
    q: float = 1.0,
    at_q: float = 0.5,
) -> Opening | None:
    """The first evidence opening whose span starts at or after ``pos`` and is judged before
    ``n_eval``. ``center``: the samples (NaN = a window without requests); ``normal``: the
    samples that may serve as baseline (outside every slowdown); ``history``: the samples
    whose spans set the ordinary contention (outside SLO breaches), over the last
    ``seen_windows`` (the baseline: at least ten times ``min_baseline``). Nothing is judged
    in the first ``p.warmup`` windows after the first sample (a service filling up is not
    slowing down). ``at_q``: the quantile of the samples judged (:data:`QUANTILE`; the
    median by default)."""
    n = len(center)
    has = np.flatnonzero(np.isfinite(center))
    if len(has) == 0:
        return None
    pos = max(pos, int(has[0]) + p.warmup)
    window = max(seen_windows, 10 * p.min_baseline)
    base = np.roll(_quantile(normal, window, p.min_baseline, at_q), 1)
    base[:1] = np.nan
    # the normal samples each baseline was estimated from (for the exceedance test's p0)
    known = np.roll(_count(np.isfinite(normal), window), 1)
    # the spans this model's rate needs: up to the first that holds twice the samples a
    # decision needs (a longer one would only blur a slowdown the short ones can see)
    rate = float(np.isfinite(normal).mean()) if len(normal) else 0.0
    spans = [w for w in p.spans if w <= n]
    enough = [w for w in spans if w * rate >= 2 * p.min_samples]
    if enough:
        spans = [w for w in spans if w <= enough[0]]
    # ... and it is followed over the shortest that holds what one decision needs
    follow = next((w for w in spans if w * rate >= p.min_samples), spans[-1] if spans else 0)
    best: Opening | None = None
    for span in spans:
        level = _quantile(center, span, p.min_samples, at_q)
        b0 = np.full(n, np.nan)  # the baseline before the span
        b0[span - 1 :] = base[: n - span + 1]
        need = np.fmax(p.ratio * b0, b0 + p.abs_ms)
        with np.errstate(invalid="ignore"):
            if not np.nan_to_num(
                level[pos + span - 1 : n_eval] > need[pos + span - 1 : n_eval]
            ).any():
                continue  # nothing over the bar at all (most passes): the rest is not needed
        if seen_windows > 0:  # 0: no ordinary contention, every slowdown is news
            past = pd.Series(_quantile(history, span, p.min_samples, at_q))
            bar = ordinary(past, b0, seen_windows, q, margin, span)
            few = min(seen_windows, p.min_baseline)
            mid = past.rolling(seen_windows, min_periods=few).median()
            mad = (past - mid).abs().rolling(seen_windows, min_periods=few).median()
            spread = (mid + p.spread_z * 1.4826 * mad).shift(span).to_numpy()
            need = np.where(np.isfinite(bar), np.fmax(need, bar), need)
            need = np.where(np.isfinite(spread), np.fmax(need, spread), need)
        with np.errstate(invalid="ignore"):
            fire = np.nan_to_num(level > need, nan=0).astype(bool)
        fire[: pos + span - 1] = False
        fire[n_eval:] = False
        if best is not None:
            fire[best.at :] = False
        for i in np.flatnonzero(fire):
            lo = i - span + 1
            seg = center[lo : i + 1]
            ok = np.isfinite(seg)
            k = int(np.count_nonzero(seg[ok] > b0[i]))
            p0 = exceed_p0(at_q, int(known[lo]))
            if sign_p(k, int(ok.sum()), p0) >= p.alpha / len(spans):
                continue
            # it began where the run of samples above the threshold is longest against the
            # others (+1/3 per sample over, -2/3 per sample under: CUSUM-like)
            with np.errstate(invalid="ignore"):
                gain = np.where(ok, np.where(seg > need[i], 1 / 3, -2 / 3), 0.0)
            suffix = np.cumsum(gain[::-1])[::-1]
            first = int(np.argmax(suffix))
            later = np.flatnonzero(ok[first:])
            start = int(lo + first + (int(later[0]) if len(later) else 0))
            best = Opening(
                start, int(i), float(b0[i]), threshold(float(b0[i]), p), min(span, follow)
            )
            break
    return best


def extend(
    center: np.ndarray,
    start: int,
    threshold_ms: float,
    slo_ms: float | None,
    span: int,
    close: int,
    n_eval: int,
    over: np.ndarray | None = None,
    hold: np.ndarray | None = None,
    at_q: float = 0.5,
) -> tuple[int, bool, bool]:
    """(last slow window, still open, crossed the SLO) of a slowdown opened at ``start``:
    judged on the median of its own samples, at most ``span`` windows of them. ``over``:
    windows whose p99 is over the SLO (they keep it open and make it a breach); ``hold``:
    windows slow by the p99 rules (they keep it open: the tail can stay slow after the
    typical request has recovered)."""
    seg = center[start:n_eval]
    if len(seg) == 0:
        return start, True, False
    ok = np.isfinite(seg)
    level = _quantile(seg, max(1, span), 1, at_q)
    count = _count(ok, max(1, span))
    breach = np.zeros(len(seg), dtype=bool) if over is None else over[start:n_eval]
    with np.errstate(invalid="ignore"):
        if slo_ms is not None:
            breach = breach | np.nan_to_num(level > slo_ms, nan=0).astype(bool)
        held = breach if hold is None else breach | hold[start:n_eval]
        calm = ((count == 0) | ~(level > threshold_ms)) & ~held
        slow = (ok & (seg > threshold_ms)) | held
    crossed = bool(breach.any())
    c = close
    run = _count(calm, c)
    closed = np.flatnonzero(run >= c)
    if len(closed):
        upto = int(closed[0]) + 1
        last = np.flatnonzero(slow[:upto])
        end = start + (int(last[-1]) if len(last) else 0)
        return end, False, bool(breach[:upto].any())
    last = np.flatnonzero(slow)
    return start + (int(last[-1]) if len(last) else 0), True, crossed
