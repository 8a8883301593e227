"""One indicator's slowdowns: the detector's stages run over its windows.

For each stretch of :attr:`DetectorParams.refit_s` (aligned to the clock, so every reader of the
same windows judges them alike) the **normal** of each channel is fitted on the
:attr:`~DetectorParams.baseline_s` before it, outside every incident and short of the newest
:data:`GUARD_S` (:mod:`.normal`); the
windows are **scored** against it and fed to the **decision** (:mod:`.decision`); an episode
that opens keeps its normal **frozen** until its closing test says it is over
(:mod:`.episode`). The live loop, on-demand diagnosis, the alert receiver, fleet mode, the
report's backfill and the benches all call :func:`detect` through
:func:`analysis.diagnose.diagnose_windows`.

Inputs are one indicator's windows (:class:`analysis.indicators.Series`: p99, request count and
typical value per window, NaN / 0 where a window has none), whatever they summarise: requests of
one second, a scrape interval's histogram, a rollup's minute.
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace

import numpy as np

from cotenant.analysis.detector import decision
from cotenant.analysis.detector.decision import DELTAS, Calibration
from cotenant.analysis.detector.episode import CHANNELS, TAIL, TYPICAL, Carry, Episode
from cotenant.analysis.detector.normal import Normal, fit
from cotenant.analysis.indicators import Series
from cotenant.core.slos import BREACH, DEGRADATION, breach

DELTAS_ARRAY = np.asarray(DELTAS, dtype=np.float64)
MIN_TAIL_COUNT = 3
"""Requests a window needs for its p99 to be a tail sample (below, it is its typical request)."""
TAIL_SHARE = 0.01
"""The share of requests a p99 SLO allows over it."""
SLO_SPAN_S = 60.0
"""The stretch a breach pools requests over: the SLO alert rule's 1-minute p99."""
ODD_SCORE = 3.0
"""A window scored above this is no "before" for an attribution, even outside an episode."""
CLOSE_SHARE = 0.5
"""A slowdown is over when its windows look closer to normal than to this share of the shift
it showed until it was found (a fault that eases off to a third of its worst is still on)."""
MIN_STRETCH = 16
"""Fewest windows judged at a time (one-minute rollups are judged in stretches of 16 minutes)."""
REFIT_SHARE = 0.05
"""The normal is fitted again once this share of its samples has arrived since (and at the
clock's refit boundaries only: every reader of the same windows refits alike)."""
MAX_BASELINE = 12
"""A sparse series' normal looks back at most this many baselines for its samples."""
AS_HIGH = 0.8
"""An earlier slowdown is as high as this one when its excess over normal is this share of it."""
GUARD_S = 120.0
"""The newest history a normal leaves out, once what lies before it holds twice ``min_samples``
samples: a slowdown that has just begun is judged against the normal before it, not learnt
into it a minute at a time while its evidence adds up (on hand-built series slowed 1.08-1.2x
after five minutes of history, 58 of 60 found instead of 47; on the development population
8 more victims at the goal's bar, docs/accuracy.md)."""
WARMUP_SHARE = 0.1
"""Until this share of ``baseline_s`` has passed since a series' first sample (3 minutes at the
default 30), only a breach of its SLO counts as a slowdown: a normal learnt from a minute or two
of a bursty model has not seen its ordinary variation (its long-run factor over 64 windows needs
three times as many), and a cold start that happens to begin in a burst learns the burst as
normal; the SLO needs no history."""


@dataclass(frozen=True)
class DetectorParams:
    """The detector's settings (``[analysis]`` keys, docs/configuration.md)."""

    false_per_hour: float = 0.05  # false incidents per model-hour accepted: every threshold
    min_slowdown: float = 1.1  # a slowdown under half of this (in log) never adds evidence
    min_excess_ms: float = 1.0  # ... nor one under half of this many ms
    baseline_s: float = 1800.0  # history the normal is fitted on
    min_samples: int = 60  # windows with requests the normal needs before anything is judged
    fellow: float = 20.0  # times the false alarms accepted for a fellow victim's episode
    refit_s: float = 60.0  # how often the normal is refitted (aligned to the clock)
    quiet_s: float = 30.0  # a slowdown ends only after this long with no slow-looking window
    degradation_s: float = 30.0  # a slowdown within its SLO shorter than this is a transient

    def baseline_windows(self, step_s: float) -> int:
        """Windows the normal is fitted on: ``baseline_s``, and never fewer than twice the
        samples it needs (a trace of one value a minute learns from two hours)."""
        return max(math.ceil(self.baseline_s / step_s), 2 * self.min_samples)

    def warmup_windows(self, step_s: float) -> int:
        """Windows after a series' first sample in which only a breach is a slowdown
        (:data:`WARMUP_SHARE`)."""
        return math.ceil(WARMUP_SHARE * self.baseline_s / step_s)

    def refit_windows(self, step_s: float) -> int:
        """Windows of one stretch judged against one normal (at least :data:`MIN_STRETCH`)."""
        return max(MIN_STRETCH, round(self.refit_s / step_s))

    def history_windows(self, step_s: float) -> int:
        """Windows read before the first one judged, so that it has its whole baseline (and
        the :data:`GUARD_S` left out before the stretch judged)."""
        guard = math.ceil(GUARD_S / step_s)
        return self.baseline_windows(step_s) + self.refit_windows(step_s) + guard


@dataclass
class Track:
    """Every episode of one series (weak ones included), and the windows that must not serve as
    "before" for an attribution (in an episode, or scored far out on their own)."""

    episodes: list[Episode] = field(default_factory=list)
    abnormal: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


def channels(s: Series) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each channel's ``(x, n)``: log ms per window (NaN without a sample) and its requests."""
    n = np.nan_to_num(np.asarray(s.count, dtype=np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        typ = np.where((n > 0) & (s.center > 0), np.log(s.center), np.nan)
        tail = np.where((n >= MIN_TAIL_COUNT) & (s.p99_ms > 0), np.log(s.p99_ms), np.nan)
    return {TYPICAL: (typ, n), TAIL: (tail, n)}


def dead_zone(normal: Normal, p: DetectorParams) -> float:
    """How far (log) above its normal a window must be before it adds any evidence."""
    rel = math.log(p.min_slowdown) / 2
    return max(rel, math.log1p(p.min_excess_ms / 2 / max(normal.baseline_ms, 1e-9)))


@dataclass
class _Member:
    """One CUSUM of the bank: its channel, shift, deflation and state."""

    channel: str
    k: int  # index into DELTAS
    s: float = 0.0
    since: int = 0  # where its current run above zero began


def detect(
    series: Series,
    slo_ms: float | None,
    p: DetectorParams,
    *,
    step_s: float,
    origin: int = 0,
    begin: int = 0,
    n_eval: int | None = None,
    carry: Carry | None = None,
    indicators: int = 1,
) -> Track:
    """Episodes of one indicator's windows. ``origin``: the first window's index on the clock's
    grid of windows (refits fall where ``(origin + i) * step_s`` is a multiple of ``refit_s``);
    ``begin``: the first window judged (those before are history); ``n_eval``: windows from
    this one on are not judged yet (rows may still land); ``carry``: an episode open before
    the first window; ``indicators``: how many indicators of the model share its false-alarm
    budget."""
    n = len(series.count)
    n_eval = n if n_eval is None else max(0, min(n, n_eval))
    ch = channels(series)
    run = _Run(series, ch, slo_ms, p, step_s, n_eval, indicators)
    pos = max(0, begin)
    # a cold start: until the warm-up is over only a breach of the SLO is a slowdown
    has = np.flatnonzero(np.isfinite(ch[TYPICAL][0]))
    warm = int(has[0]) + p.warmup_windows(step_s) if len(has) and carry is None else 0
    if carry is not None:
        ep = run.follow_carry(carry)
        run.keep(ep)
        if ep.open:
            return run.track()
        pos = max(pos, run.resume)
    every = p.refit_windows(step_s)
    base = p.baseline_windows(step_s)
    # samples (windows with a typical value) before each window: the normal needs twice
    # min_samples of them, so a sparse series learns from further back than baseline_s
    seen = np.concatenate(([0], np.cumsum(np.isfinite(ch[TYPICAL][0]))))
    need = 2 * p.min_samples
    guard = math.ceil(GUARD_S / step_s)
    members = [_Member(c, k, since=pos) for c in CHANNELS for k in range(len(DELTAS))]
    fitted: _Fitted | None = None
    while pos < n_eval:
        end = min(n_eval, ((origin + pos) // every + 1) * every - origin)
        if seen[end] == seen[pos]:
            pos = end  # no sample to judge: nothing moves
            continue
        if fitted is None or fitted.stale(pos, int(seen[pos]), base):
            # the newest GUARD_S are left out while what is before holds enough samples: a
            # slowdown that has just begun is judged, not learnt
            top = max(0, pos - guard)
            if seen[top] - seen[max(0, top - base)] < need:
                top = pos
            lo = max(0, top - base)
            if seen[top] - seen[lo] < need:
                back = int(np.searchsorted(seen, seen[top] - need, side="right")) - 1
                lo = max(0, min(lo, back), top - MAX_BASELINE * base)
            # the rate is over the time the samples cover (not windows read before them)
            lo = max(lo, int(np.searchsorted(seen, seen[lo], side="right")) - 1)
            normals = {
                c: fit(x[lo:top], m[lo:top], ~run.taken[lo:top], (top - lo) * step_s, c == TAIL)
                for c, (x, m) in ch.items()
            }
            fitted = _Fitted.of(normals, p, indicators, pos, int(seen[pos]))
        if fitted.cal is None:
            for mb in members:
                mb.s, mb.since = 0.0, end
            # judged from the window its warm-up completes, not from the next boundary (a
            # stretch that began before would be learnt as normal, slow or not)
            ready = int(np.searchsorted(seen, seen[max(0, pos - base)] + p.min_samples))
            pos, fitted = (ready, None) if pos < ready < end else (end, fitted)
            continue
        hit = run.scan(members, fitted, pos, end)
        if hit is None:
            pos = end
            continue
        ep = run.follow(hit, members, fitted)
        if hit.at < warm and not ep.breach:
            # judged against a normal still being learnt, and within its SLO: no evidence (the
            # normal learns from these windows); judging goes on for a breach
            fitted, pos = None, hit.at + 1
            for mb in members:
                mb.s, mb.since = 0.0, pos
            continue
        run.keep(ep)
        fitted = None  # its windows teach the next normal nothing
        for mb in members:
            mb.s, mb.since = 0.0, run.resume
        if ep.open:
            break
        pos = run.resume
    return run.track()


def breached(
    p99_ms: np.ndarray, count: np.ndarray, slo_ms: float | None, span: int | None = None
) -> bool:
    """Whether a stretch of windows breached a p99 SLO: in some ``span`` consecutive windows
    (all of them by default; the detector passes a minute's, what the SLO alert rule's p99
    pools) more of the requests over the SLO than the p99 allows (:data:`TAIL_SHARE`). A
    window whose p99 is over the SLO (the one :func:`core.slos.breach`) holds at least
    ``max(1, TAIL_SHARE x n)`` of its ``n`` requests over it, so a window of
    ``1 / TAIL_SHARE`` requests or more is a breach by itself; under that a window's p99 is its
    slowest request or two, and one slow request among the hundreds of a minute is a p99
    within its SLO. A window under :data:`MIN_TAIL_COUNT` requests (when the stretch has
    windows that size) is no tail sample and crosses nothing."""
    cnt = np.nan_to_num(count)
    tail = cnt >= min(MIN_TAIL_COUNT, max(1.0, float(cnt.max()) if len(cnt) else 1.0))
    over = breach(p99_ms, slo_ms) & (cnt > 0) & tail
    if not over.any():
        return False
    if (cnt[over] >= 1 / TAIL_SHARE).any():
        return True
    k = len(cnt) if span is None else max(1, min(span, len(cnt)))
    least = np.concatenate([[0.0], np.cumsum(np.where(over, np.maximum(1.0, TAIL_SHARE * cnt), 0))])
    total = np.concatenate([[0.0], np.cumsum(cnt)])
    return bool((least[k:] - least[:-k] >= TAIL_SHARE * (total[k:] - total[:-k])).any())


@dataclass(frozen=True)
class _Fitted:
    """The normals of a stretch, their thresholds (None: not enough samples to judge), and
    where they were fitted (window, samples before it)."""

    normals: dict[str, Normal]
    cal: Calibration | None
    pos: int
    seen: int
    deflate: dict[tuple[str, int], float] = field(default_factory=dict)  # per (channel, shift)
    key: bytes = b""  # what the normals and thresholds are, exactly (for :data:`SCANS_KEPT`)

    @classmethod
    def of(
        cls,
        normals: dict[str, Normal | None],
        p: DetectorParams,
        indicators: int,
        pos: int,
        seen: int,
    ) -> _Fitted:
        usable = {c: v for c, v in normals.items() if v is not None and v.samples >= p.min_samples}
        typical = usable.get(TYPICAL)
        if typical is None:
            return cls({}, None, pos, seen)
        cal = decision.calibrate(
            typical.rate * 3600.0,
            p.false_per_hour,
            len(usable) * len(DELTAS) * indicators,
            p.fellow,
        )
        deflate = {(c, k): f for c, v in usable.items() for k, f in enumerate(_deflate(v, cal.h))}
        return cls(usable, cal, pos, seen, deflate, repr((sorted(usable.items()), cal)).encode())

    def stale(self, pos: int, seen: int, base: int) -> bool:
        """Whether the normal should be fitted again at ``pos``: enough new samples since
        (:data:`REFIT_SHARE` of those it was fitted on), or half a baseline of windows."""
        typical = self.normals.get(TYPICAL)
        fresh = max(1, round(REFIT_SHARE * (typical.samples if typical else 0)))
        return seen - self.seen >= fresh or 2 * (pos - self.pos) >= base


SCANS_KEPT = 16384
"""Stretches scanned without a crossing remembered by what they depend on: the live loop
re-judges the same clock-aligned stretches every pass (the recent ones change as rows land)."""
_scans: OrderedDict[bytes, tuple[np.ndarray, tuple[tuple[float, int | None], ...]]] = OrderedDict()
_scans_lock = threading.Lock()


@functools.lru_cache(maxsize=4096)
def _deflate(normal: Normal, h: tuple[float, ...]) -> tuple[float, ...]:
    """Per shift, the long-run deflation of its evidence under ``normal`` at thresholds ``h``
    (remembered: the live loop asks for the same normals pass after pass)."""
    return tuple(
        math.sqrt(normal.tau_at(decision.memory(hk, d))) for hk, d in zip(h, DELTAS, strict=True)
    )


@dataclass(frozen=True)
class _Hit:
    at: int
    start: int
    member: _Member
    states: dict[tuple[str, int], float]  # every member's S at ``at``


class _Run:
    """The state of one :func:`detect` call."""

    def __init__(
        self,
        series: Series,
        ch: dict[str, tuple[np.ndarray, np.ndarray]],
        slo_ms: float | None,
        p: DetectorParams,
        step_s: float,
        n_eval: int,
        indicators: int,
    ) -> None:
        self.series, self.ch, self.slo, self.p = series, ch, slo_ms, p
        self.n_eval = n_eval
        n = len(series.count)
        self.taken = np.zeros(n, dtype=bool)  # in an incident: no baseline
        self.odd = np.zeros(n, dtype=bool)  # weak episodes and far-out windows
        self.episodes: list[Episode] = []
        self.resume = 0
        self.memory = p.baseline_windows(step_s)  # earlier slowdowns are counted this far back
        self.quiet = math.ceil(p.quiet_s / step_s)  # windows a slowdown must be over to end
        self.slo_span = max(1, round(SLO_SPAN_S / step_s))  # windows a breach pools

    def scores(self, c: str, normal: Normal, lo: int, hi: int, deadzone: bool = True) -> np.ndarray:
        x, m = self.ch[c]
        shift = dead_zone(normal, self.p) if deadzone else 0.0
        return normal.score(x[lo:hi] - shift, m[lo:hi])

    def evidence(self, c: str, normal: Normal, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Channel ``c``'s scores over ``[lo, hi)`` (dead zone applied) as ``(value, 0 where
        none; whether there is one)``: what every shift's increments are made of."""
        g = self.scores(c, normal, lo, hi)
        return np.nan_to_num(g), np.isfinite(g)

    @staticmethod
    def increments(ev: tuple[np.ndarray, np.ndarray], k: int, dfl: float) -> np.ndarray:
        """The CUSUM increments of shift ``DELTAS[k]`` from :meth:`evidence`, deflated."""
        d = DELTAS[k]
        g, has = ev
        return np.where(has, d * (g / dfl) - d * d / 2, 0.0)

    def scan_key(self, members: list[_Member], fitted: _Fitted, lo: int, hi: int) -> bytes:
        """What a stretch's scan depends on: its windows, the normals and thresholds, the
        dead zone, the members' states (the since-when relative to ``lo``)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(fitted.key)
        h.update(repr((self.p.min_slowdown, self.p.min_excess_ms, hi - lo)).encode())
        for c in CHANNELS:
            x, m = self.ch[c]
            h.update(x[lo:hi].tobytes())
            h.update(m[lo:hi].tobytes())
        h.update(np.array([mb.s for mb in members]).tobytes())
        h.update(np.array([(mb.k, mb.since - lo) for mb in members], dtype=np.int64).tobytes())
        h.update(" ".join(mb.channel for mb in members).encode())
        return h.digest()

    def scan(self, members: list[_Member], fitted: _Fitted, lo: int, hi: int) -> _Hit | None:
        """The first window of ``[lo, hi)`` where a member crosses its weak threshold;
        members' states move to ``hi`` when none does."""
        normals, cal = fitted.normals, fitted.cal
        assert cal is not None
        key = self.scan_key(members, fitted, lo, hi)
        with _scans_lock:
            seen = _scans.get(key)
            if seen is not None:
                _scans.move_to_end(key)
        if seen is not None:
            self.odd[lo:hi] |= seen[0]
            for mb, (s_end, since) in zip(members, seen[1], strict=True):
                mb.s, mb.since = s_end, mb.since if since is None else lo + since
            return None
        odd = np.zeros(hi - lo, dtype=bool)
        if TYPICAL in normals:
            with np.errstate(invalid="ignore"):
                odd = self.scores(TYPICAL, normals[TYPICAL], lo, hi, False) > ODD_SCORE
            self.odd[lo:hi] |= odd
        # each channel's CUSUMs at once, a row per shift (the bank's members in its order)
        runs: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        first: dict[tuple[str, int], int] = {}  # where each crossed its weak threshold (-1: not)
        for c in {mb.channel for mb in members} & normals.keys():
            bank = [mb for mb in members if mb.channel == c]
            ks = np.array([mb.k for mb in bank])
            dfl = np.array([fitted.deflate[(c, int(k))] for k in ks])
            g, has = self.evidence(c, normals[c], lo, hi)
            d = DELTAS_ARRAY[ks][:, None]
            incr = np.where(has, d * (g / dfl[:, None]) - d * d / 2, 0.0)
            s, zero = decision.cusum(incr, np.array([mb.s for mb in bank]))
            over = s > np.asarray(cal.weak)[ks][:, None]
            crossed = np.where(over.any(axis=1), over.argmax(axis=1), -1)
            for row, mb in enumerate(bank):
                runs[(c, mb.k)] = (s[row], zero[row])
                first[(c, mb.k)] = int(crossed[row])
        best: tuple[int, _Member] | None = None
        for mb in members:
            if (mb.channel, mb.k) not in runs:
                mb.s, mb.since = 0.0, hi
                continue
            at = first[(mb.channel, mb.k)]
            # (at the same window, the largest shift: the one that fits a sudden jump)
            if at >= 0 and (best is None or at <= best[0]):
                best = (at, mb)
        if best is None:
            moved = []
            for mb in members:
                if (mb.channel, mb.k) in runs:
                    s, zero = runs[(mb.channel, mb.k)]
                    z = np.flatnonzero(zero)
                    mb.s = float(s[-1])
                    mb.since = lo + int(z[-1]) + 1 if len(z) else mb.since
                    moved.append((mb.s, int(z[-1]) + 1 if len(z) else None))
                else:
                    moved.append((0.0, int(hi - lo)))
            with _scans_lock:
                _scans[key] = (odd, tuple(moved))
                while len(_scans) > SCANS_KEPT:
                    _scans.popitem(last=False)
            return None
        at, mb = best
        s, zero = runs[(mb.channel, mb.k)]
        z = np.flatnonzero(zero[:at])
        start = lo + int(z[-1]) + 1 if len(z) else mb.since
        states = {key: float(v[0][at]) for key, v in runs.items()}
        # it began at the first sample of the run that crossed
        x = self.ch[mb.channel][0]
        has = np.flatnonzero(np.isfinite(x[start : lo + at + 1]))
        start = start + int(has[0]) if len(has) else lo + at
        return _Hit(lo + at, start, mb, states)

    def follow(self, hit: _Hit, members: list[_Member], fitted: _Fitted) -> Episode:
        """The episode a weak crossing opened: where it closes (its own channel's test) and
        whether it crosses the incident threshold before then."""
        normals, cal = fitted.normals, fitted.cal
        assert cal is not None
        c, k = hit.member.channel, hit.member.k
        normal = normals[c]
        dfl = fitted.deflate[(c, k)]
        g = self.scores(c, normal, hit.start, self.n_eval, deadzone=False) / dfl
        # it stays open while closer to half its shift so far than to normal
        seen = g[: hit.at - hit.start + 1]
        size = float(np.nanmedian(seen)) if np.isfinite(seen).any() else DELTAS[k]
        delta = float(np.clip(CLOSE_SHARE * size, DELTAS[0], DELTAS[k]))
        done, last = decision.close_at(g[hit.at - hit.start :], delta, self.quiet)
        stop = self.n_eval if done is None else hit.at + done
        opened: int | None = None
        ev = {ch: self.evidence(ch, v, hit.at + 1, stop) for ch, v in normals.items()}
        for mb in members:
            key = (mb.channel, mb.k)
            if key not in hit.states:
                continue
            s0 = hit.states[key]
            if s0 > cal.h[mb.k]:
                opened = hit.at
                break
            incr = self.increments(ev[mb.channel], mb.k, fitted.deflate[key])
            s, _ = decision.cusum(incr, s0)
            at = decision.first_over(s, cal.h[mb.k])
            if at is not None and (opened is None or hit.at + 1 + at < opened):
                opened = hit.at + 1 + at
        self.resume = stop + 1 if done is not None else self.n_eval
        return self.episode(
            hit.start,
            hit.at + last,
            opened if opened is not None else hit.at,
            done is None,
            c,
            opened is not None,
            normal,
            delta,
            dfl,
        )

    def follow_carry(self, carry: Carry) -> Episode:
        """A carried episode continued over these windows with its frozen normal."""
        lo = max(0, carry.start)
        g = self.scores(carry.channel, carry.normal, lo, self.n_eval, deadzone=False)
        done, last = decision.close_at(g / carry.deflate, carry.delta, self.quiet)
        self.resume = lo + done + 1 if done is not None else self.n_eval
        ep = self.episode(
            lo,
            lo + last,
            lo,
            done is None,
            carry.channel,
            carry.strong,
            carry.normal,
            carry.delta,
            carry.deflate,
            carried=carry.start < 0,
        )
        if carry.severity == BREACH:
            ep = replace(ep, severity=BREACH)
        return ep

    def episode(
        self,
        start: int,
        end: int,
        opened: int,
        is_open: bool,
        c: str,
        strong: bool,
        normal: Normal,
        delta: float,
        dfl: float,
        carried: bool = False,
    ) -> Episode:
        end = max(end, start)
        p99 = self.series.p99_ms[start : end + 1]
        cnt = np.nan_to_num(self.series.count[start : end + 1])
        seg = np.nan_to_num(p99, nan=-np.inf)
        peak = start + int(np.argmax(seg)) if len(seg) else start
        crossed = breached(p99, cnt, self.slo, self.slo_span)
        x = self.ch[c][0][start : end + 1]
        rel = x - normal.center(self.ch[c][1][start : end + 1])
        ratio = math.exp(float(np.nanmedian(rel))) if np.isfinite(rel).any() else math.nan
        after = np.flatnonzero(np.isfinite(self.ch[TYPICAL][0][end + 1 : self.n_eval]))
        until = end + 1 + int(after[0]) if len(after) else max(end + 1, self.n_eval)
        return Episode(
            start,
            end,
            opened,
            peak,
            is_open,
            c,
            strong,
            normal,
            delta,
            BREACH if crossed else DEGRADATION,
            carried,
            ratio,
            dfl,
            until=until,
        )

    def keep(self, ep: Episode) -> None:
        if ep.strong and math.isfinite(ep.ratio):
            bar = 1.0 + AS_HIGH * (ep.ratio - 1.0)
            like = sum(
                1
                for e in self.episodes
                if e.strong and e.start >= ep.start - self.memory and e.ratio >= bar
            )
            ep = replace(ep, like=like)
        self.episodes.append(ep)
        if ep.strong:
            self.taken[ep.start : ep.end + 1] = True
        else:
            self.odd[ep.start : ep.end + 1] = True

    def track(self) -> Track:
        return Track(self.episodes, self.taken | self.odd)
