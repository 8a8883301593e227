"""Detect a model's slowdowns in a range, attribute each one, and give each its verdict.

``diagnose(source, model, rng)`` reads through any :class:`core.readers.MetricSource`: it
looks back the detector's baseline history, finds the model's slowdowns per GPU it runs on and
per indicator (:mod:`analysis.detector`), attributes each against the normal windows just
before it (:mod:`analysis.attribution`) and says what it is (:mod:`analysis.detector.verdicts`).
The live loop calls :func:`diagnose_windows` on windows it has already read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from cotenant.analysis.attribution import Cause, attribute
from cotenant.analysis.compute_causes import capacity_lost
from cotenant.analysis.cpu_causes import read_host_cpu
from cotenant.analysis.detector.detect import DetectorParams, Track, detect
from cotenant.analysis.detector.episode import Carry, Episode, lasts_s
from cotenant.analysis.detector.verdicts import Fellow, FirstCause, judge, mark_recurring
from cotenant.analysis.diagnosis import Diagnosis, Judged
from cotenant.analysis.incident_merge import events
from cotenant.analysis.indicators import indicator_series, indicator_view
from cotenant.analysis.mix import mix_excess
from cotenant.analysis.replicas import annotate_replicas
from cotenant.analysis.windows import GpuWindows, gpu_windows, gpus_of
from cotenant.core.errors import QueryError
from cotenant.core.readers import MetricSource
from cotenant.core.slos import DEGRADATION, E2E
from cotenant.core.timerange import TimeRange

BEFORE_WINDOWS = 60
"""Normal windows just before a slowdown that attribution compares it with."""
MIN_COUNT = 3
"""Requests a window needs for its p99 to stand for the window's tail."""
SPARSE_LOOKBACK_S = 3600.0
"""How far back a sparse model's normal windows are looked for (one request a minute: 60)."""


def _before_mask(
    n: int, start: int, abnormal: np.ndarray, count: np.ndarray, step_s: float = 1.0
) -> np.ndarray:
    """The normal windows just before ``start`` attribution compares with: those with a p99
    (:data:`MIN_COUNT` requests), or, for a model too sparse to have enough of them, those
    with any request — looked for over ``3 x BEFORE_WINDOWS`` windows, and as far back as
    :data:`SPARSE_LOOKBACK_S` for a model with too few requests there (a request a minute
    gives three samples in three minutes: no comparison)."""
    mask = np.zeros(n, dtype=bool)
    for back in (BEFORE_WINDOWS * 3, max(BEFORE_WINDOWS * 3, round(SPARSE_LOOKBACK_S / step_s))):
        cand = np.arange(max(0, start - back), start)
        cand = cand[~abnormal[cand]]
        dense = cand[count[cand] >= MIN_COUNT]
        cand = dense if len(dense) >= BEFORE_WINDOWS // 2 else cand[count[cand] > 0]
        if len(cand) >= BEFORE_WINDOWS // 2:
            break
    mask[cand[-BEFORE_WINDOWS:]] = True
    return mask


def _locks(
    source: MetricSource, model: str, w: GpuWindows, lo_i: int, hi_i: int
) -> list[tuple[str, str, float]]:
    lo = w.since_ns + lo_i * w.step_ns
    hi = w.since_ns + (hi_i + 1) * w.step_ns
    t = source.lock_waits(TimeRange(lo, hi), model)
    return [
        (str(n), str(h or ""), float(ms))
        for n, h, ms in zip(
            t.column("lock_name").to_pylist(),
            t.column("lock_holder").to_pylist(),
            t.column("wait_ms_sum").to_pylist(),
            strict=True,
        )
    ]


def diagnose(
    source: MetricSource,
    model: str,
    rng: TimeRange,
    *,
    slo_ms: float | None = None,
    step_s: float = 1.0,
    params: DetectorParams | None = None,
    on_demand: bool = False,
    slos: Mapping[str, float | None] | None = None,
    causes: Sequence[FirstCause] = (),
) -> list[Diagnosis]:
    """Slowdowns of ``model`` that overlap ``rng``, on each of its indicators
    (:mod:`analysis.indicators`; ``slos``: the SLOs of its TTFT and TPOT by indicator name),
    with their verdicts; ``causes``: other models' incidents over the range, which may
    corroborate fellow victims. With ``on_demand`` and no slowdown, one diagnosis of the whole
    range against the windows before it (``incident`` False). The slowdowns of one event on
    its several indicators are told as one, by its lead indicator
    (:func:`analysis.incident_merge.events`), as the live loop's incident book tells them."""
    p = params or DetectorParams()
    full, first = history_range(rng, step_s, p)
    gpus = [g for g, ms in gpus_of(source, full, step_s).items() if model in ms]
    if not gpus:
        raise QueryError(f"model {model!r} served no requests between the given times")
    out: list[Diagnosis] = []
    read = {}
    for gpu in gpus:
        w = read[gpu] = gpu_windows(source, gpu, full, step_s)
        out += diagnose_windows(
            source,
            w,
            model,
            first,
            slo_ms=slo_ms,
            params=p,
            on_demand=on_demand,
            slos=slos,
            causes=causes,
        )
    out = events(out, int(p.quiet_s * 1e9))
    if out:
        annotate_replicas(out, read, source.replicas(full))
    return out


def _key(c: Cause | None) -> tuple[str, str] | None:
    return None if c is None else (str(c.kind), c.culprit)


def history_range(rng: TimeRange, step_s: float, p: DetectorParams) -> tuple[TimeRange, int]:
    """``rng`` extended back by the detector's history, and the index of ``rng``'s first
    window."""
    if rng.since_ns is None or rng.until_ns is None:
        raise QueryError("diagnose needs both start and end")
    step_ns = int(step_s * 1e9)
    start = rng.since_ns - p.history_windows(step_s) * step_ns
    start -= start % step_ns
    return TimeRange(start, rng.until_ns), int((rng.since_ns - start) // step_ns)


def diagnose_windows(
    source: MetricSource,
    w: GpuWindows,
    model: str,
    first: int,
    *,
    slo_ms: float | None = None,
    params: DetectorParams | None = None,
    on_demand: bool = False,
    lag_windows: int = 0,
    carry: Carry | None = None,
    slos: Mapping[str, float | None] | None = None,
    carries: Mapping[str, Carry] | None = None,
    causes: Sequence[FirstCause] = (),
    fellow: Fellow | None = None,
) -> list[Diagnosis]:
    """:func:`diagnose` on windows already read (one read serves every model of a GPU).

    ``lag_windows``: how many of the newest windows may still be waiting for their rows (the
    live loop's ingest lag): windows after the newest one holding data on this GPU (no older
    than ``lag_windows``) are not judged yet — rows that have not landed must not end a
    slowdown. ``carry`` / ``carries``: the episode the live loop has open for this model on
    e2e / on each other indicator (judged on against its frozen normal). ``causes`` and
    ``fellow``: what may make a weak slowdown a fellow victim
    (:func:`analysis.detector.verdicts.verdict`). A slowdown within its SLO younger than
    ``degradation_s``, open or over, is no incident (yet)."""
    p = params or DetectorParams()
    end = w.n
    if lag_windows > 0:
        filled = np.zeros(w.n, dtype=bool)
        for m in w.models.values():
            filled |= np.nan_to_num(m["count"]) > 0
        last = int(np.flatnonzero(filled)[-1]) + 1 if filled.any() else 0
        end = min(w.n, max(last, w.n - lag_windows))
    series = indicator_series(w, model)
    found: list[tuple[str, Episode, float | None, float]] = []  # indicator, episode, SLO, wait
    # a window slow on any indicator is no baseline for another: a workload shift that TTFT
    # shows first must not be in the "before" of the e2e incident it causes later
    abnormal = np.zeros(w.n, dtype=bool)
    near = [c for c in causes if c.gpu == w.gpu and c.victim != model]
    for name, s in series.items():
        slo = slo_ms if name == E2E else (slos or {}).get(name)
        tr: Track = detect(
            s,
            slo,
            p,
            step_s=w.step_ns / 1e9,
            # judged from the first window read: a slowdown in the history is found too, so
            # that no normal learns from it
            origin=w.since_ns // w.step_ns,
            n_eval=end,
            carry=carry if name == E2E else (carries or {}).get(name),
            indicators=len(series),
        )
        step_s = w.step_ns / 1e9
        found += [
            (name, e, slo, lasts_s(e, s.count, p.degradation_s))
            for e in tr.episodes
            if (e.end >= first or e.open)
            # a weak one may be corroborated: by another model's incident, or by the GPU
            # losing a capacity (verdicts.verdict)
            and (e.strong or near or fellow or capacity_lost(w, e.start, e.end))
            # a slowdown over sooner than it needs (episode.needs_s) is a transient
            and (e.until - e.start) * step_s >= lasts_s(e, s.count, p.degradation_s)
        ]
        abnormal |= tr.abnormal
    if not found and not on_demand:
        return []
    cpu = read_host_cpu(
        source, TimeRange(w.since_ns, w.since_ns + w.n * w.step_ns), w.step_ns / 1e9, w.n, w.hosts
    )
    out = judge(
        [
            _diagnose_span(source, w, model, e, abnormal, slo, cpu, name, wait)
            for name, e, slo, wait in found
        ],
        near,
        fellow,
    )
    if not found and on_demand:
        out.append(_quiet(source, w, model, first, abnormal, slo_ms, cpu))
    return out


def _attributed(
    source: MetricSource,
    w: GpuWindows,
    model: str,
    lo: int,
    hi: int,
    abnormal: np.ndarray,
    cpu: dict[str, np.ndarray],
    indicator: str,
) -> tuple[Diagnosis, GpuWindows, np.ndarray]:
    """A diagnosis of windows ``[lo, hi]`` attributed against the normal windows before
    ``lo`` (the fields of the slowdown itself left for the caller), the indicator's view of the
    windows, and the "before" mask."""
    view = indicator_view(w, model, indicator)
    v = view.models[model]
    during = np.zeros(w.n, dtype=bool)
    during[lo : hi + 1] = True
    before = _before_mask(w.n, lo, abnormal, v["count"], w.step_ns / 1e9)
    mix = mix_excess(w.tokens.get(model), indicator, before, during, v["compute_ms"])
    att = attribute(
        view, model, before, during, locks=_locks(source, model, w, lo, hi), host_cpu=cpu, mix=mix
    )
    base = v["p99_ms"][before]
    base = base[np.isfinite(base)]
    sparse = int(np.count_nonzero(before & (v["count"] >= MIN_COUNT))) < len(base) // 2
    # a sparse model's windows hold a request or two: their p99 is the p99 of those requests
    typical = (np.percentile(base, 99) if sparse else np.median(base)) if len(base) else np.nan
    d = Diagnosis(
        model=model,
        gpu=w.gpu,
        start_ns=w.since_ns + lo * w.step_ns,
        end_ns=w.since_ns + (hi + 1) * w.step_ns,
        open=False,
        detected_ns=0,
        peak_p99_ms=float("nan"),
        baseline_p99_ms=float(typical),
        slo_ms=None,
        phases_ms=att.phases_ms,
        causes=att.causes,
        notes=list(att.notes),
        during_windows=int(np.count_nonzero(during & (v["count"] > 0))),
        during_requests=int(np.nansum(v["count"][during])),
        indicator=indicator,
    )
    return d, view, before


def _diagnose_span(
    source: MetricSource,
    w: GpuWindows,
    model: str,
    e: Episode,
    abnormal: np.ndarray,
    slo_ms: float | None,
    cpu: dict[str, np.ndarray],
    indicator: str,
    wait_s: float,
) -> Diagnosis:
    """One episode of ``indicator`` attributed on that indicator's view of the windows.

    A slowdown that went on after it was found and had lasted ``wait_s`` (what it needs before
    it is an incident, :func:`detector.episode.lasts_s`: when the live loop publishes it) is
    attributed on those first windows too; where their top cause differs from the whole's, the
    diagnosis keeps both (``Diagnosis.first_causes``), as the live loop's cause history does."""
    d, view, _ = _attributed(source, w, model, e.start, e.end, abnormal, cpu, indicator)
    v = view.models[model]
    if e.severity == DEGRADATION:
        mark_recurring(d.causes, w, model, e.start, e.end, d.notes)
    early = min(e.end, max(e.opened, e.start + math.ceil(wait_s * 1e9 / w.step_ns)))
    if early < e.end:
        d0, _, _ = _attributed(source, w, model, e.start, early, abnormal, cpu, indicator)
        if _key(d0.top) != _key(d.top):
            d.first_causes = d0.causes
    what = "typical request" if e.channel == "typical" else "slow tail (p99)"
    d.notes.append(
        f"judged on its {what}: {e.ratio:.2f}x its normal of {e.baseline_ms:.1f} ms over the "
        "windows before it"
    )
    after = v["p99_ms"][e.end + 1 : e.end + 6] if not e.open else np.empty(0)
    after = after[np.isfinite(after)]
    d.open = e.open
    # it lasted until the next sample (a sparse series' slow sample stands for its interval)
    d.end_ns = w.since_ns + max(e.until, e.end + 1) * w.step_ns
    d.detected_ns = w.since_ns + (max(e.opened, e.start) + 1) * w.step_ns
    d.peak_p99_ms = float(v["p99_ms"][e.peak])
    d.slo_ms = slo_ms
    d.severity = e.severity
    d.carried = e.carried
    d.after_p99_ms = float(np.median(after)) if len(after) else None
    d.judged = Judged(e.channel, e.delta, e.deflate, e.normal, e.strong, e.ratio, e.like)
    return d


def _quiet(
    source: MetricSource,
    w: GpuWindows,
    model: str,
    first: int,
    abnormal: np.ndarray,
    slo_ms: float | None,
    cpu: dict[str, np.ndarray],
) -> Diagnosis:
    """An on-demand diagnosis of a range without a slowdown: the range as a whole against the
    windows before it."""
    d, view, _ = _attributed(source, w, model, first, w.n - 1, abnormal, cpu, E2E)
    p99 = view.models[model]["p99_ms"][first:]
    d.peak_p99_ms = float(np.nanmax(p99)) if np.isfinite(p99).any() else float("nan")
    d.detected_ns = d.start_ns
    d.slo_ms = slo_ms
    d.severity = DEGRADATION
    d.incident = False
    return d
