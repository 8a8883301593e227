"""Detect a model's latency incidents in a range and attribute each one.

``diagnose(source, model, rng)`` reads through any :class:`store.source.MetricSource`: it looks
``history`` windows back for the baseline, finds spikes per GPU the model runs on, merges them
into incidents and attributes each against the non-spiking windows just before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from cotenant.analysis import evidence
from cotenant.analysis.attribution import Attribution, Cause, attribute
from cotenant.analysis.episodes import BREACH, DEGRADATION, Carry, Episode, track
from cotenant.analysis.indicators import indicator_series, indicator_view
from cotenant.analysis.mix import mix_excess
from cotenant.analysis.recurring_causes import beyond_recurring, mark_recurring
from cotenant.analysis.replicas import annotate_replicas
from cotenant.analysis.spikes import SpikeParams
from cotenant.analysis.windows import GpuWindows, gpu_windows, gpus_of
from cotenant.core.errors import QueryError
from cotenant.core.readers import MetricSource
from cotenant.core.slos import E2E
from cotenant.core.timerange import TimeRange

BEFORE_WINDOWS = 60
"""Baseline windows (non-spiking, just before an incident) the attribution compares with."""


@dataclass
class Diagnosis:
    model: str
    gpu: str
    start_ns: int
    end_ns: int
    open: bool  # still spiking at the end of the range
    detected_ns: int  # when the hysteresis opened it
    peak_p99_ms: float
    baseline_p99_ms: float
    slo_ms: float | None
    phases_ms: dict[str, float]
    causes: list[Cause]
    notes: list[str] = field(default_factory=list)
    incident: bool = True  # False: an on-demand diagnosis of a quiet range
    severity: str = BREACH  # breach (SLO crossed) | degradation (slower than its baseline)
    threshold_ms: float = float("nan")  # stay-open threshold frozen at opening
    carried: bool = False  # began before the windows read: its "before" is not in them
    during_windows: int = 0  # windows with requests inside it (what attribution had)
    after_p99_ms: float | None = None  # median p99 of the clean windows that ended it
    replica: str | None = None  # the replica of the model on this GPU, when requests name one
    siblings: dict[str, Any] = field(default_factory=dict)  # analysis.replicas.summarise
    indicator: str = E2E  # the series that breached: e2e | ttft | tpot (analysis.indicators)
    # analysis.evidence: how an episode judged on its typical request was (rule, span,
    # the median baseline; threshold_ms is then the median's); None for the p99 rules
    judged_on: dict[str, Any] | None = None
    # found only with the ordinary-contention bar off (the live loop's sweep): no higher than
    # the model's slowdowns of the recent history, its ordinary contention
    seen: bool = False

    @property
    def id(self) -> str:
        raw = f"{self.model}\x00{self.gpu}\x00{self.start_ns}"
        if self.indicator != E2E:
            raw += f"\x00{self.indicator}"
        return "inc-" + hashlib.blake2b(raw.encode(), digest_size=6).hexdigest()

    @property
    def top(self) -> Cause | None:
        return next((c for c in self.causes if c.kind != "unknown"), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "gpu": self.gpu,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "open": self.open,
            "detected_ns": self.detected_ns,
            "incident": self.incident,
            "peak_p99_ms": _r(self.peak_p99_ms),
            "baseline_p99_ms": _r(self.baseline_p99_ms),
            "slo_ms": self.slo_ms,
            "severity": self.severity,
            "indicator": self.indicator,
            "threshold_ms": _r(self.threshold_ms),
            "resolved_p99_ms": None if self.after_p99_ms is None else _r(self.after_p99_ms),
            "phases_ms": {k: round(v, 3) for k, v in self.phases_ms.items()},
            "causes": [c.to_dict() for c in self.causes],
            "notes": self.notes,
            "replica": self.replica,
            "siblings": self.siblings,
            "judged_on": self.judged_on,
        }


def _r(x: float) -> float | None:
    return None if not np.isfinite(x) else round(float(x), 3)


def _before_mask(
    n: int, start: int, abnormal: np.ndarray, count: np.ndarray, min_count: float
) -> np.ndarray:
    """The normal windows just before ``start`` attribution compares with: those with a p99
    (``min_count`` requests), or, for a model too sparse to have enough of them, those with
    any request."""
    mask = np.zeros(n, dtype=bool)
    lo = max(0, start - BEFORE_WINDOWS * 3)
    cand = np.arange(lo, start)
    cand = cand[~abnormal[cand]]
    dense = cand[count[cand] >= min_count]
    cand = dense if len(dense) >= BEFORE_WINDOWS // 2 else cand[count[cand] > 0]
    mask[cand[-BEFORE_WINDOWS:]] = True
    return mask


def _locks(
    source: MetricSource, model: str, w: GpuWindows, span: Episode
) -> list[tuple[str, str, float]]:
    lo = w.since_ns + span.start * w.step_ns
    hi = w.since_ns + (span.end + 1) * w.step_ns
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


def host_cpu(
    source: MetricSource,
    rng: TimeRange,
    step_s: float,
    n: int,
    hosts: set[str] | frozenset[str] = frozenset(),
) -> dict[str, np.ndarray]:
    """Host CPU use (cores) per process name, on the window grid of ``rng``: the processes
    sharing a name (eight ``python`` burners) are summed, each (host, pid) counted once however
    many GPUs it has rows on. Only rows of ``hosts`` when given (a fleet's source holds every
    node's processes: a CPU hog on another node cannot slow this GPU's models)."""
    t = source.process_windows(rng, step_s, hosts=sorted(hosts) if hosts else None)
    if t.num_rows == 0:
        return {}
    since = rng.since_ns or 0
    step = int(step_s * 1e9)
    idx = (t.column("ts_ns").to_numpy() - since) // step
    cpu = np.asarray(t.column("cpu_cores").to_numpy(zero_copy_only=False), dtype=np.float64)
    ok = np.isfinite(cpu) & (idx >= 0) & (idx < n)
    if not ok.any():
        return {}
    rows = pd.DataFrame(
        {
            "w": idx[ok],
            "host": [h or "" for h in np.asarray(t.column("host").to_pylist(), dtype=object)[ok]],
            "pid": np.asarray(t.column("pid").to_pylist(), dtype=object)[ok],
            "name": [
                name or f"pid {pid}"
                for name, pid, keep in zip(
                    t.column("process_name").to_pylist(),
                    t.column("pid").to_pylist(),
                    ok,
                    strict=True,
                )
                if keep
            ],
            "cpu": cpu[ok],
        }
    )
    # one process on two GPUs has a row per GPU with the same host CPU: count it once
    per_pid = rows.groupby(["w", "host", "pid"], sort=False, dropna=False).agg(
        name=("name", "first"), cpu=("cpu", "max")
    )
    per_name = per_pid.groupby(["name", "w"], sort=False)["cpu"].sum()
    out: dict[str, np.ndarray] = {}
    for name, series in per_name.groupby(level=0, sort=True):
        arr = np.full(n, np.nan)
        arr[series.index.get_level_values(1).to_numpy()] = series.to_numpy()
        out[str(name)] = arr
    return out


def diagnose(
    source: MetricSource,
    model: str,
    rng: TimeRange,
    *,
    slo_ms: float | None = None,
    step_s: float = 1.0,
    params: SpikeParams | None = None,
    on_demand: bool = False,
    slos: Mapping[str, float | None] | None = None,
) -> list[Diagnosis]:
    """Incidents of ``model`` that overlap ``rng``, on each of its indicators
    (:mod:`analysis.indicators`; ``slos``: the SLOs of its TTFT and TPOT by indicator name);
    with ``on_demand`` and no incident, one diagnosis of the whole range against the windows
    before it."""
    p = params or SpikeParams()
    full, first = history_range(rng, step_s, p)
    gpus = [g for g, ms in gpus_of(source, full, step_s).items() if model in ms]
    if not gpus:
        raise QueryError(f"model {model!r} served no requests between the given times")
    out: list[Diagnosis] = []
    read = {}
    for gpu in gpus:
        w = read[gpu] = gpu_windows(source, gpu, full, step_s)
        out += diagnose_windows(
            source, w, model, first, slo_ms=slo_ms, params=p, on_demand=on_demand, slos=slos
        )
    if out:
        annotate_replicas(out, read, source.replicas(full))
    return out


def history_range(rng: TimeRange, step_s: float, p: SpikeParams) -> tuple[TimeRange, int]:
    """``rng`` extended back by the baseline history, and the index of ``rng``'s first window."""
    if rng.since_ns is None or rng.until_ns is None:
        raise QueryError("diagnose needs both start and end")
    step_ns = int(step_s * 1e9)
    start = rng.since_ns - p.history_windows * step_ns
    return TimeRange(start, rng.until_ns), int((rng.since_ns - start) // step_ns)


def diagnose_windows(
    source: MetricSource,
    w: GpuWindows,
    model: str,
    first: int,
    *,
    slo_ms: float | None = None,
    params: SpikeParams | None = None,
    on_demand: bool = False,
    lag_windows: int = 0,
    carry: Carry | None = None,
    slos: Mapping[str, float | None] | None = None,
    carries: Mapping[str, Carry] | None = None,
) -> list[Diagnosis]:
    """:func:`diagnose` on windows already read (one read serves every model of a GPU).

    ``lag_windows``: how many of the newest windows may still be waiting for their rows (the
    live loop's ingest lag). Windows after the newest one holding data on this GPU (no older
    than ``lag_windows``) are not judged yet: rows that have not landed must not resolve an
    incident. ``carry``: the episode the live loop has open for this model (its baseline
    stays frozen; see :mod:`analysis.episodes`). ``slos`` and ``carries``: the SLO and the
    open episode of each other indicator (``ttft``, ``tpot``) by name; ``slo_ms`` and
    ``carry`` are the e2e ones."""
    p = params or SpikeParams()
    v = w.models[model]
    end = w.n
    if lag_windows > 0:
        filled = np.zeros(w.n, dtype=bool)
        for m in w.models.values():
            filled |= np.nan_to_num(m["count"]) > 0
        last = int(np.flatnonzero(filled)[-1]) + 1 if filled.any() else 0
        end = min(w.n, max(last, w.n - lag_windows))
    found: list[tuple[str, Episode, float | None]] = []
    # a window slow on any indicator is no baseline for another: a workload shift that TTFT
    # shows first must not be in the "before" of the e2e incident it causes later
    abnormal = np.zeros(w.n, dtype=bool)
    for name, series in indicator_series(w, model).items():
        slo = slo_ms if name == E2E else (slos or {}).get(name)
        c = carry if name == E2E else (carries or {}).get(name)
        tr = track(series.p99_ms, series.count, slo, p, carry=c, n_eval=end, center=series.center)
        found += [(name, e, slo) for e in tr.episodes if e.end >= first or e.open]
        abnormal |= tr.abnormal
    if not found and not on_demand:
        return []
    # host CPU series are read once for every incident of this call (they are not per GPU)
    cpu = host_cpu(
        source,
        TimeRange(w.since_ns, w.since_ns + w.n * w.step_ns),
        w.step_ns / 1e9,
        w.n,
        w.hosts,
    )
    out = [
        _diagnose_span(source, w, model, e, abnormal, slo, p, cpu, name) for name, e, slo in found
    ]
    if not found and on_demand:
        peak = first + int(np.nanargmax(np.nan_to_num(v["p99_ms"][first:], nan=-1)))
        whole = Episode(first, w.n - 1, peak, first, DEGRADATION, float("nan"), float("nan"), False)
        d = _diagnose_span(source, w, model, whole, abnormal, slo_ms, p, cpu, E2E)
        d.incident = False
        out.append(d)
    return out


def _diagnose_span(
    source: MetricSource,
    w: GpuWindows,
    model: str,
    e: Episode,
    abnormal: np.ndarray,
    slo_ms: float | None,
    p: SpikeParams,
    cpu: dict[str, np.ndarray],
    indicator: str,
) -> Diagnosis:
    """One episode of ``indicator`` attributed on that indicator's view of the windows."""
    view = indicator_view(w, model, indicator)
    v = view.models[model]
    during = np.zeros(w.n, dtype=bool)
    during[e.start : e.end + 1] = True
    before = _before_mask(w.n, e.start, abnormal, v["count"], p.min_count)
    locks = _locks(source, model, w, e)

    def against(past: np.ndarray) -> Attribution:
        mix = mix_excess(w.tokens.get(model), indicator, past, during)
        return attribute(view, model, past, during, locks=locks, host_cpu=cpu, mix=mix)

    att = against(before)
    notes = list(att.notes)
    causes = att.causes
    if p.seen_windows > 0:  # 0: no ordinary contention, every degradation is news
        bursts = mark_recurring(causes, w, model, e.start, e.end, notes)
        if e.severity == DEGRADATION:
            causes = beyond_recurring(
                causes, bursts, model, v["p99_ms"], v["count"], before, during, against, notes
            )
    base = v["p99_ms"][before]
    base = base[np.isfinite(base)]
    sparse = int(np.count_nonzero(before & (v["count"] >= p.min_count))) < len(base) // 2
    judged = e.rule in evidence.QUANTILE
    if np.isfinite(e.baseline_ms) and not judged:
        frozen = e.baseline_ms
    elif sparse and len(base):  # the p99 of the requests, one or two per window
        frozen = float(np.percentile(base, 99))
    else:  # an on-demand diagnosis of a quiet range, or a median judged: the windows before
        frozen = float(np.median(base)) if len(base) else float("nan")
    if judged:
        sec = e.span * w.step_ns / 1e9
        if e.rule == evidence.TAIL:
            notes.append(
                f"judged on the slow tail over {sec:.0f} s spans (the typical request did not "
                f"move): {evidence.TAIL_Q:.0%} of the windows' p99s were under "
                f"{e.baseline_ms:.1f} ms before, threshold {e.threshold_ms:.1f} ms"
            )
        else:
            notes.append(
                f"judged on the typical request over {sec:.0f} s spans (sparse or subtle "
                f"slowdown): median {e.baseline_ms:.1f} ms before, threshold "
                f"{e.threshold_ms:.1f} ms"
            )
    first = e.opened if e.carried else e.start
    # the clean windows that ended it: what "p99 back to" reports
    after = v["p99_ms"][e.end + 1 : e.end + 1 + p.close_windows] if not e.open else np.empty(0)
    after = after[np.isfinite(after)]
    return Diagnosis(
        model=model,
        gpu=w.gpu,
        start_ns=w.since_ns + first * w.step_ns,
        end_ns=w.since_ns + (e.end + 1) * w.step_ns,
        open=e.open,
        detected_ns=w.since_ns + (max(e.opened, e.start) + 1) * w.step_ns,
        peak_p99_ms=float(v["p99_ms"][e.peak]),
        baseline_p99_ms=frozen,
        slo_ms=slo_ms,
        phases_ms=att.phases_ms,
        causes=causes,
        notes=notes,
        severity=e.severity,
        threshold_ms=e.threshold_ms,
        carried=e.carried,
        during_windows=int(
            np.count_nonzero(during & (v["count"] >= (1 if judged else p.min_count)))
        ),
        after_p99_ms=float(np.median(after)) if len(after) else None,
        indicator=indicator,
        judged_on=(
            {"rule": e.rule, "span_windows": e.span, "baseline_ms": _r(e.baseline_ms)}
            if judged
            else None
        ),
    )
