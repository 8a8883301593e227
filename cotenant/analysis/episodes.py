"""Latency episodes: when a model's p99 left its normal, how bad it got, and when it came back.

One detector serves the live loop and on-demand diagnoses, over one model's windows on one GPU
(arrays of shape ``(n_windows,)``, p99 in ms, request counts):

* **baseline** — rolling median / MAD of the preceding ``history`` windows
  (:func:`analysis.spikes.baseline`), learnt only from windows *outside* episodes: the windows
  of a slowdown never teach the baseline, so a fault that lasts ten minutes is not absorbed
  into "normal" after one;
* an episode **opens as a breach** when ``open_windows`` of the last ``open_windows + 1``
  windows exceed both the SLO and the baseline by the spike margin
  (:func:`analysis.spikes.spike_mask`), or **as a degradation** when two thirds of the last
  ``degrade_windows`` windows are at least ``degrade_ratio`` x the baseline and
  ``degrade_abs_ms`` over it — a sustained slowdown within the SLO, or of a model with none;
* at opening the baseline is **frozen**: the episode stays open while windows are over the SLO
  or over the frozen baseline by the opening margin, and ends after ``close_windows``
  consecutive windows that are neither (windows without enough requests count as clean: a
  model that stops serving is not slow);
* **severity** is ``breach`` when any of its windows crossed the SLO, else ``degradation``;
* a slowdown over within ``min_episode_windows`` is a transient, not an episode (its windows
  still teach the baseline nothing).

A :class:`Carry` continues an episode that began before the first window (the live loop's open
incident, whose start has left the horizon), with the baseline frozen when it opened.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from cotenant.analysis import evidence
from cotenant.analysis.spikes import SpikeParams, baseline, spike_mask

BREACH = "breach"
DEGRADATION = "degradation"
SEVERITIES = (BREACH, DEGRADATION)
LEVEL_Q = 1 / 3
"""A degradation's level: the quantile of the stretch's p99s that 2/3 of them exceed."""


@dataclass(frozen=True)
class Carry:
    """An episode already open before window ``start`` (an index, may be negative)."""

    start: int
    baseline_ms: float
    threshold_ms: float
    severity: str
    rule: str = "p99"  # how it was judged: "p99", evidence.RULE or evidence.TAIL
    span: int = 0  # evidence: windows of the span that found it


@dataclass(frozen=True)
class Episode:
    """Window indices ``[start, end]`` (inclusive) of one slowdown, its peak window, and the
    baseline and stay-open threshold frozen when it opened (ms). ``open``: no run of clean
    windows ended it before the last evaluated window. ``opened``: the window at which the
    opening rule fired (for a carried episode, its ``start``)."""

    start: int
    end: int
    peak: int
    opened: int
    severity: str
    baseline_ms: float
    threshold_ms: float
    open: bool
    carried: bool = False
    rule: str = "p99"  # "p99" (per-window p99 rules), evidence.RULE or .TAIL (its samples)
    span: int = 0  # evidence: windows of the span that found it; baseline and threshold
    # are then of the samples' median, not of the p99


@dataclass
class Track:
    """Every episode of one series, and the windows that must not serve as "before" for an
    attribution (in an episode, or spiking on their own)."""

    episodes: list[Episode] = field(default_factory=list)
    abnormal: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


def track(
    p99: np.ndarray,
    count: np.ndarray,
    slo_ms: float | None,
    p: SpikeParams,
    *,
    carry: Carry | None = None,
    n_eval: int | None = None,
    center: np.ndarray | None = None,
) -> Track:
    """Episodes of one latency series. ``n_eval``: windows from this index on are not judged
    yet (rows may still be arriving); an episode still bad at ``n_eval`` is open.
    ``center``: each window's typical request (median or mean), for the evidence rule
    (:mod:`analysis.evidence`; without it, or with ``p.evidence`` None, p99 rules only)."""
    n = len(p99)
    n_eval = n if n_eval is None else max(0, min(n, n_eval))
    valid = (count >= p.min_count) & np.isfinite(p99)
    v = np.where(valid, p99, np.nan)
    c = None
    samples: dict[str, np.ndarray] = {}  # evidence rule -> its samples
    if center is not None and p.evidence is not None:
        c = np.where((count > 0) & np.isfinite(center), center, np.nan)
        samples[evidence.RULE] = c
        # the tail rule's samples: every window's p99, however few requests it holds
        samples[evidence.TAIL] = np.where((count > 0) & np.isfinite(p99), p99, np.nan)
    taken = np.zeros(n, dtype=bool)  # in an episode or a transient: no baseline
    breached = np.zeros(n, dtype=bool)  # in a breach: no ordinary contention either
    with np.errstate(invalid="ignore"):
        over = valid & (v > slo_ms) if slo_ms is not None else np.zeros(n, dtype=bool)
    out: list[Episode] = []
    pos = 0

    def take(e: Episode) -> None:
        taken[e.start : e.end + 1] = True
        if e.severity == BREACH:
            breached[e.start : e.end + 1] = True
        # ... and its rise: the windows of the span before it already over its threshold,
        # while below the bar that opened it (a bursty model's burst until it beat its last one)
        # teach no baseline and are no "before" either: they made the burst its own normal
        x = samples.get(e.rule, v)
        lo = max(0, e.start - (e.span or p.degrade_windows))
        with np.errstate(invalid="ignore"):
            taken[lo : e.start] |= np.nan_to_num(x[lo : e.start] > e.threshold_ms, nan=0) > 0

    if carry is not None:
        c0 = max(0, min(n, carry.start))
        if carry.rule in samples:
            ep = evidence.extend(
                samples[carry.rule],
                c0,
                carry.threshold_ms,
                slo_ms,
                carry.span,
                p.close_windows,
                n_eval,
                over,
                at_q=evidence.QUANTILE[carry.rule],
            )
        else:
            ep = _extend(v, valid, slo_ms, p, c0, carry.baseline_ms, carry.threshold_ms, n_eval)
        sev = BREACH if carry.severity == BREACH or ep[2] else DEGRADATION
        end, is_open = ep[0], ep[1]
        first = Episode(
            c0,
            end,
            _peak(samples.get(carry.rule, v), c0, end),
            carry.start,
            sev,
            carry.baseline_ms,
            carry.threshold_ms,
            is_open,
            carried=carry.start < 0,
            rule=carry.rule,
            span=carry.span,
        )
        out.append(first)
        take(first)
        pos = end + 1
        if is_open:
            return Track(out, taken.copy())
    memo: list[np.ndarray] = []  # (taken, base, sigma) of the last baseline computed

    def base_of() -> tuple[np.ndarray, np.ndarray]:
        """The baseline of the windows outside ``taken`` (unchanged since: not recomputed)."""
        if not memo or not np.array_equal(memo[0], taken):
            memo[:] = [taken.copy(), *baseline(np.where(taken, np.nan, v), count, p)]
        return memo[1], memo[2]

    while pos < n_eval:
        learn = np.where(taken, np.nan, v)
        base, sigma = base_of()
        opened = _first_opening(
            v,
            learn,
            np.where(breached, np.nan, v),
            count,
            valid,
            base,
            sigma,
            slo_ms,
            p,
            pos,
            n_eval,
        )
        # the p99 rules' episode first: the evidence rule may open before it, not after
        p99_ep: Episode | None = None
        lagged: int | None = None
        if opened is not None:
            start, at, degraded = opened
            b0 = (
                float(base[start])
                if np.isfinite(base[start])
                else float(np.nanmedian(learn[:start]))
            )
            s0 = float(np.nan_to_num(sigma[start]))
            # it stays open while over the frozen baseline by the margin that opened it
            if degraded:
                thr = max(p.degrade_ratio * b0, b0 + p.degrade_abs_ms)
            else:
                thr = b0 + max(p.k_mad_slo * s0, p.rel_margin * b0, p.abs_margin_ms)
            end, is_open, crossed = _extend(v, valid, slo_ms, p, start, b0, thr, n_eval)
            if not crossed and end < at:
                # it fired on a median that lagged a slowdown already over: not sustained
                lagged = at
            else:
                p99_ep = Episode(
                    start,
                    end,
                    _peak(v, start, end),
                    at,
                    BREACH if crossed else DEGRADATION,
                    b0,
                    thr,
                    is_open,
                )
        e: Episode | None = None
        brief: tuple[int, int] | None = None  # an evidence slowdown too short to count
        if samples and p.evidence is not None:
            # the typical request, then the tail: the first to find a slowdown opens it
            for rule, x in samples.items():
                ev = evidence.opening(
                    x,
                    np.where(taken, np.nan, x),
                    np.where(breached, np.nan, x),
                    p.evidence,
                    pos,
                    n_eval if p99_ep is None or _brief(p99_ep, p) else min(n_eval, p99_ep.opened),
                    p.seen_windows,
                    p.ordinary_margin,
                    p.ordinary_q,
                    at_q=evidence.QUANTILE[rule],
                )
                if ev is None or (e is not None and e.opened <= ev.at):
                    continue
                got, short = _evidence_episode(x, v, valid, over, base, ev, slo_ms, p, n_eval, rule)
                if got is not None:
                    e, brief = got, None
                elif e is None:
                    brief = short
        if e is None:
            e = p99_ep
        if e is None and brief is not None:
            taken[brief[0] : brief[1] + 1] = True
            pos = brief[1] + 1
            continue
        if e is None and lagged is not None:
            pos = lagged + 1
            continue
        if e is None:
            break
        if _brief(e, p):
            # a transient (one slow render next door): no baseline, but no incident either
            taken[e.start : e.end + 1] = True
            pos = e.end + 1
            continue
        out.append(e)
        take(e)
        pos = e.end + 1
        if e.open:
            break
    # lone spikes outside episodes are no baseline for an attribution either
    base, sigma = base_of()
    return Track(out, taken | _spikes(v, count, base, sigma, slo_ms, p))


def _brief(e: Episode, p: SpikeParams) -> bool:
    """Over sooner than an episode must last: a transient."""
    return not e.open and e.end - e.start + 1 < p.min_episode_windows


def _evidence_episode(
    c: np.ndarray,
    v: np.ndarray,
    valid: np.ndarray,
    over: np.ndarray,
    base: np.ndarray,
    ev: evidence.Opening,
    slo_ms: float | None,
    p: SpikeParams,
    n_eval: int,
    rule: str = evidence.RULE,
) -> tuple[Episode | None, tuple[int, int] | None]:
    """The episode an evidence opening starts, or (None, its extent) when it was too short
    to be a degradation (then the p99 rules decide)."""
    assert p.evidence is not None
    # the tail stays slow for as long as the p99 degradation rule would say
    b0 = float(base[ev.start]) if np.isfinite(base[ev.start]) else float("nan")
    hold = None
    if np.isfinite(b0):
        # ... as its closing rule judges it: the median of the last 3 x close_windows p99s
        tail = pd.Series(v).rolling(3 * p.close_windows, min_periods=p.close_windows).median()
        with np.errstate(invalid="ignore"):
            hold = np.nan_to_num(
                tail.to_numpy() > max(p.degrade_ratio * b0, b0 + p.degrade_abs_ms), nan=0
            ).astype(bool)
    end, is_open, crossed = evidence.extend(
        c,
        ev.start,
        ev.threshold,
        slo_ms,
        ev.span,
        p.close_windows,
        n_eval,
        over,
        hold,
        at_q=evidence.QUANTILE[rule],
    )
    if not is_open and end - ev.start + 1 < max(p.min_episode_windows, p.degrade_windows):
        # judged slow, but a degradation must last as long as one: the p99 rules decide (a
        # slow tail that outlasts the typical request is theirs)
        return None, (ev.start, end)
    episode = Episode(
        ev.start,
        end,
        _peak(c, ev.start, end),
        ev.at,
        BREACH if crossed else DEGRADATION,
        ev.baseline,
        ev.threshold,
        is_open,
        rule=rule,
        span=ev.span,
    )
    return episode, None


def _spikes(
    v: np.ndarray,
    count: np.ndarray,
    base: np.ndarray,
    sigma: np.ndarray,
    slo_ms: float | None,
    p: SpikeParams,
) -> np.ndarray:
    """Windows over the SLO and the baseline by the spike margin; none before a baseline."""
    flags, _ = spike_mask(v, count, slo_ms, p, base=base, sigma=sigma)
    return np.asarray(flags & np.isfinite(base), dtype=bool)


def _first_opening(
    v: np.ndarray,
    learn: np.ndarray,
    history: np.ndarray,
    count: np.ndarray,
    valid: np.ndarray,
    base: np.ndarray,
    sigma: np.ndarray,
    slo_ms: float | None,
    p: SpikeParams,
    pos: int,
    n_eval: int,
) -> tuple[int, int, bool] | None:
    """(start, opening window, opened as a degradation) of the first episode opening at or
    after ``pos``, or None."""
    n = len(v)
    best: tuple[int, int, bool] | None = None
    if slo_ms is not None:
        spikes = _spikes(v, count, base, sigma, slo_ms, p)
        w = p.open_windows + 1
        recent = np.convolve(spikes.astype(np.int64), np.ones(w, dtype=np.int64))[:n]
        fire = spikes & (recent >= p.open_windows)
        fire[:pos] = False
        fire[n_eval:] = False
        hit = np.flatnonzero(fire)
        if len(hit):
            at = int(hit[0])
            lo = max(pos, at - w + 1)
            start = lo + int(np.argmax(spikes[lo : at + 1]))
            best = (start, at, False)
    d = p.degrade_windows
    if d > 0:
        # the level two thirds of the stretch's windows are above: a noisy series whose
        # median grazes the bar is not degraded, a clear slowdown with dips still is
        level = pd.Series(v).rolling(d, min_periods=max(1, d // 2)).quantile(LEVEL_Q).to_numpy()
        b0 = np.full(n, np.nan)  # the baseline before the stretch: b0[i] = base[i - d + 1]
        if n >= d:
            b0[d - 1 :] = base[: n - d + 1]
        # ... and above any 30-s median of the normal history before the stretch: a
        # bursty model whose ordinary busy minutes run 1.3x its median is not degraded
        # (a seasonal baseline already carries the model's regular busy hours)
        need = np.fmax(p.degrade_ratio * b0, b0 + p.degrade_abs_ms)
        # a degradation is a subtle call: it needs half a full history of normal windows
        # before the stretch (a breach has the SLO to anchor it and needs min_history only)
        known = pd.Series(np.isfinite(learn)).rolling(p.history, min_periods=1).sum()
        enough = (known.shift(d).to_numpy() >= p.history // 2) & np.isfinite(b0)
        if p.evidence is not None:
            # ... and none begins in the evidence rule's warm-up after the model's first
            # request: a tool that has just started has seen none of its ordinary contention
            served = np.flatnonzero(np.nan_to_num(count) > 0)
            if len(served):
                enough[: int(served[0]) + p.evidence.warmup + d - 1] = False
        with np.errstate(invalid="ignore"):
            over = np.nan_to_num(level[pos:n_eval] > need[pos:n_eval]).any()
        if over and not p.seasonal and p.seen_windows > 0:  # (nothing over: no need to look)
            normal = pd.Series(history).rolling(d, min_periods=max(1, d // 2)).quantile(LEVEL_Q)
            bar = evidence.ordinary(normal, b0, p.seen_windows, p.ordinary_q, p.ordinary_margin, d)
            need = np.fmax(need, bar)
        need = np.where(enough, need, np.nan)
        with np.errstate(invalid="ignore"):
            fire = np.nan_to_num(level > need, nan=0).astype(bool) & valid
        fire[: pos + d - 1] = False
        fire[n_eval:] = False
        if best is not None:
            fire[best[1] :] = False
        hit = np.flatnonzero(fire)
        if len(hit):
            at = int(hit[0])
            lo = max(pos, at - d + 1)
            with np.errstate(invalid="ignore"):
                bad = valid[lo : at + 1] & (v[lo : at + 1] > need[at])
            # it began where the run up to the opening is slowest against the two-thirds bar
            # (the largest sum of +1/3 per slow window, -2/3 per other, CUSUM-like): a few
            # noisy windows before the stretch are not its start (a start 12 s early made the
            # stretch look over at once, and the slowdown was found 30 s late, with its first
            # half taken as "before")
            gain = np.where(bad, LEVEL_Q, LEVEL_Q - 1.0)
            suffix = np.cumsum(gain[::-1])[::-1]
            start = lo + (int(np.argmax(suffix)) if bad.any() else 0)
            best = (start, at, True)
    return best


def _extend(
    v: np.ndarray,
    valid: np.ndarray,
    slo_ms: float | None,
    p: SpikeParams,
    start: int,
    baseline_ms: float,
    threshold_ms: float,
    n_eval: int,
) -> tuple[int, bool, bool]:
    """(last bad window, still open, crossed the SLO) of an episode opened at ``start``."""
    n = len(v)
    with np.errstate(invalid="ignore"):
        bad = valid & (v > threshold_ms)
        over = valid & (v > slo_ms) if slo_ms is not None else np.zeros(n, dtype=bool)
    bad |= over
    bad[start] = True  # the window that opened it
    seg = bad[start:n_eval]
    c = p.close_windows
    run = np.convolve((~seg).astype(np.int64), np.ones(c, dtype=np.int64))[: len(seg)]
    # ... and the median of the last 3 x close_windows windows is back under the threshold
    # too, so a noisy slowdown that dips for a few windows is not called over
    level = pd.Series(v[start:n_eval]).rolling(3 * c, min_periods=1).median().to_numpy()
    limit = threshold_ms if slo_ms is None else min(threshold_ms, slo_ms)
    with np.errstate(invalid="ignore"):
        calm = ~(level > limit)
    closed = np.flatnonzero((run >= c) & calm)
    if len(closed):
        last_bad = np.flatnonzero(seg[: int(closed[0]) + 1])
        end = start + (int(last_bad[-1]) if len(last_bad) else 0)
        is_open = False
    else:
        last_bad = np.flatnonzero(seg)
        end = start + int(last_bad[-1]) if len(last_bad) else start
        is_open = True
    end = max(end, start)
    return end, is_open, bool(over[start : end + 1].any())


def _peak(v: np.ndarray, start: int, end: int) -> int:
    seg = np.nan_to_num(v[start : end + 1], nan=-np.inf)
    return start + int(np.argmax(seg)) if len(seg) else start
