"""Latency spikes of the GenTD26 trace, merged into incidents and attributed to causes.

**Spikes.** Per container, a step's e2e latency (ms, the mean of the requests of that 57 s
step) is a spike when it exceeds its *baseline*, the median of the container's e2e over the
previous ``window`` steps (at least ``min_count`` values; the current step excluded so a spike
cannot hide itself), by more than ``max(k_mad x 1.4826 x MAD, (min_ratio - 1) x median)``.
Why this margin (there are no labels, so false alarms can only be reasoned about): 1.4826 x MAD
estimates the standard deviation of the recent normal values without being moved by the
outliers it must find; for Gaussian noise ``k_mad = 4`` would alarm on ~3e-5 of ordinary steps,
but these values are means of 1–4 requests of mixed sizes (heavy-tailed), so the MAD term alone
is not enough: the relative floor (the step at least twice its baseline, the profile's own
spike definition) keeps a container whose recent values repeat (MAD near 0) from alarming on a
wobble nobody would call a spike. Pool A's bimodal e2e (modes near 9 s and 67 s) keeps a wide
MAD, so its switches between modes alarm less often than with a fixed ratio. On the published
trace this flags 1.7 % of pool B's judged steps and 17.5 % of pool A's (k_mad = 3 would add a
quarter more in pool B; 6 would halve it). A step with fewer than ``min_count`` values in its
window (the start of the trace, a container waking up) is not judged at all.

**Incidents.** Spike steps of one container less than ``merge_gap`` steps apart merge into one
incident (start, end, peak). Its *excess* is the sum over its spike steps of e2e − baseline.

**Causes** (shares of the excess, summing to at most 1, ranked, ``unknown`` last):

* ``model_load`` (culprit: ``basemodel``, ``lora`` or ``controlnet``): a load of that kind on
  the container in the incident's steps or the step before (load rows lead the e2e rows they
  delay by 0–1 step) took at least ``slow_ratio`` x the container's median for that kind.
  Ordinary loads happen on nearly every request, so they are normal and never named. Share:
  the extra load time (load − median, summed over the slow loads) over the excess. ``pipeline``
  is the per-step sum of the other kinds, so it is evidence only.
* ``load`` (culprit: the container): its gateway queue time rose above its own trailing
  baseline (> ``queue_ratio`` x); share: the extra queue time over the excess. Its QPS ratio is
  in the evidence.
* ``unknown``: the rest. There is no node or GPU identity in the trace, so a saturated duty
  cycle cannot be pinned on a co-tenant; the evidence gives the duty cycle, the pure-inference
  (``model_predict``) ratio and the GPU memory ratio against the container's own baseline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from cotenant.analysis.attribution import MIN_SHARE, Cause
from cotenant.evaluation.gentd26 import LOAD_KINDS, Trace, load_trace


@dataclass(frozen=True)
class Params:
    window: int = 30  # steps of the trailing baseline (~28.5 anonymised minutes)
    min_count: int = 5  # values the window needs before a step is judged
    k_mad: float = 4.0
    min_ratio: float = 2.0
    merge_gap: int = 3  # spike steps closer than this many steps are one incident
    slow_ratio: float = 2.0  # a load this many times its usual time is unusually slow
    queue_ratio: float = 1.5


def iso(ts: float) -> str:
    """``timestamp_anon`` seconds as ISO 8601 UTC (``...Z``)."""
    return datetime.fromtimestamp(float(ts), tz=UTC).isoformat().replace("+00:00", "Z")


def trailing_median_mad(
    x: np.ndarray, window: int, min_count: int
) -> tuple[np.ndarray, np.ndarray]:
    """Median and MAD of each column of ``x`` (``(steps, series)``, NaN = no value) over the
    ``window`` steps before each step, the step itself excluded. NaN where fewer than
    ``min_count`` values are in the window. Returns two arrays shaped like ``x``."""
    steps, cols = x.shape
    padded = np.vstack([np.full((window, cols), np.nan), x])
    win = np.lib.stride_tricks.sliding_window_view(padded, window, axis=0)[:steps]
    n = np.isfinite(win).sum(axis=-1)
    med = _sorted_median(win, n)
    mad = _sorted_median(np.abs(win - med[..., None]), n)
    short = n < min_count
    med[short] = np.nan
    mad[short] = np.nan
    return med, mad


def _sorted_median(win: np.ndarray, n: np.ndarray) -> np.ndarray:
    # NaN sorts last; the median of the first n values of each sorted window
    s = np.sort(win, axis=-1)
    lo = np.take_along_axis(s, np.clip((n - 1) // 2, 0, None)[..., None], axis=-1)[..., 0]
    hi = np.take_along_axis(s, np.clip(n // 2, 0, win.shape[-1] - 1)[..., None], axis=-1)[..., 0]
    out: np.ndarray = (lo + hi) / 2
    out[n == 0] = np.nan
    return out


def column_median(x: np.ndarray) -> np.ndarray:
    """Median of each column of ``x`` (``(steps, series)``) over its finite values; NaN for a
    column without any."""
    return _sorted_median(x.T, np.isfinite(x.T).sum(axis=-1))


def spikes(e2e: np.ndarray, p: Params) -> tuple[np.ndarray, np.ndarray]:
    """Boolean spike mask and the baseline (ms), both ``(steps, containers)``."""
    med, mad = trailing_median_mad(e2e, p.window, p.min_count)
    margin = np.maximum(p.k_mad * 1.4826 * mad, (p.min_ratio - 1.0) * med)
    with np.errstate(invalid="ignore"):
        mask = np.isfinite(e2e) & np.isfinite(med) & (e2e > med + margin)
    return mask, med


@dataclass
class Incident:
    container: str
    model: str
    start_ts: int
    end_ts: int
    peak_ts: int
    peak_ms: float
    baseline_ms: float  # at the first spike step
    excess_ms: float  # summed over spike steps
    spikes: int
    causes: list[Cause] = field(default_factory=list)
    load_ratio: dict[str, float] = field(default_factory=dict)  # max per kind in the window

    def names(self, kind: str) -> bool:
        return any(c.kind == kind for c in self.causes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "container": self.container,
            "model": self.model,
            "start": iso(self.start_ts),
            "end": iso(self.end_ts),
            "indicator": "e2e",
            "peak": iso(self.peak_ts),
            "peak_ms": round(self.peak_ms, 1),
            "baseline_ms": round(self.baseline_ms, 1),
            "excess_ms": round(self.excess_ms, 1),
            "spikes": self.spikes,
            "causes": [c.to_dict() for c in self.causes],
        }


def _runs(steps: np.ndarray, gap: int) -> list[tuple[int, int, np.ndarray]]:
    if not len(steps):
        return []
    cut = np.flatnonzero(np.diff(steps) >= gap) + 1
    return [(int(g[0]), int(g[-1]), g) for g in np.split(steps, cut)]


def _ratio(during: np.ndarray, before: np.ndarray) -> float | None:
    d, b = np.nanmean(during) if np.isfinite(during).any() else np.nan, before
    if not np.isfinite(d) or not np.isfinite(b) or b <= 0:
        return None
    return round(float(d / b), 3)


class _Diagnoser:
    """Holds the trace's panels and their baselines; :meth:`incident` attributes one run."""

    def __init__(self, trace: Trace, p: Params) -> None:
        self.t, self.p = trace, p
        self.e2e = trace.panels["e2e"]
        self.mask, self.base = spikes(self.e2e, p)
        self.usual = {k: column_median(trace.load(k)) for k in LOAD_KINDS}
        base = {
            name: trailing_median_mad(trace.panels[name], p.window, 1)[0]
            for name in ("queue_rt", "qps", "duty_cycle", "model_predict", "gpu_memory")
        }
        self.series_base = base
        self.models = trace.models()

    def incident(self, c: int, s0: int, s1: int, steps: np.ndarray) -> Incident:
        t, p = self.t, self.p
        e = self.e2e[steps, c]
        b = self.base[steps, c]
        excess = float(np.sum(e - b))
        k = int(np.argmax(e))
        inc = Incident(
            container=t.containers[c],
            model=self.models[c],
            start_ts=int(t.ts[s0]),
            end_ts=int(t.ts[s1]),
            peak_ts=int(t.ts[steps[k]]),
            peak_ms=float(e[k]),
            baseline_ms=float(b[0]),
            excess_ms=excess,
            spikes=len(steps),
        )
        w = slice(max(0, s0 - 1), s1 + 1)  # loads lead the e2e rows they delay by 0-1 step
        named: list[Cause] = []
        for kind in LOAD_KINDS:
            loads = t.load(kind)[w, c]
            usual = self.usual[kind][c]
            ok = np.isfinite(loads)
            if not ok.any() or not np.isfinite(usual) or usual <= 0:
                continue
            ratio = loads[ok] / usual
            inc.load_ratio[kind] = float(ratio.max())
            slow = ratio >= p.slow_ratio
            if slow.any():
                extra = float(np.sum(loads[ok][slow] - usual))
                named.append(
                    Cause(
                        kind="model_load",
                        culprit=kind,
                        share=extra / excess if excess > 0 else 0.0,
                        confidence=min(1.0, float(ratio.max()) / (2 * p.slow_ratio)),
                        evidence={
                            "loads_ms": [round(float(v), 1) for v in loads[ok][slow]],
                            "usual_ms": round(float(usual), 1),
                            "max_ratio": round(float(ratio.max()), 2),
                            "slow_loads": int(slow.sum()),
                            "extra_ms": round(extra, 1),
                            "excess_ms": round(excess, 1),
                        },
                        excess_ms=extra,
                    )
                )
        q = t.panels["queue_rt"][steps, c]
        qb = self.series_base["queue_rt"][steps, c]
        with np.errstate(invalid="ignore"):
            grew = np.isfinite(q) & np.isfinite(qb) & (q > p.queue_ratio * qb)
        qps_ratio = _ratio(t.panels["qps"][w, c], self.series_base["qps"][s0, c])
        if grew.any():
            extra_q = float(np.sum(q[grew] - qb[grew]))
            named.append(
                Cause(
                    kind="load",
                    culprit=inc.container,
                    share=extra_q / excess if excess > 0 else 0.0,
                    confidence=min(1.0, float(np.max(q[grew] / qb[grew])) / 4),
                    evidence={
                        "queue_rt_ms": round(float(np.mean(q[grew])), 1),
                        "queue_rt_baseline_ms": round(float(np.mean(qb[grew])), 1),
                        "extra_queue_ms": round(extra_q, 1),
                        "qps_ratio": qps_ratio,
                    },
                    excess_ms=extra_q,
                )
            )
        inc.causes = self._ranked(named, excess, w, s0, c, qps_ratio)
        return inc

    def _ranked(
        self, named: list[Cause], excess: float, w: slice, s0: int, c: int, qps: float | None
    ) -> list[Cause]:
        left = 1.0
        out: list[Cause] = []
        for cause in sorted(named, key=lambda x: -x.share):
            cause.share = min(cause.share, left)
            left -= cause.share
            if cause.share >= MIN_SHARE or cause.kind == "model_load":
                out.append(cause)
            else:
                left += cause.share
        if left >= MIN_SHARE:
            panels, base = self.t.panels, self.series_base
            duty = panels["duty_cycle"][w, c]
            out.append(
                Cause(
                    kind="unknown",
                    culprit="",
                    share=left,
                    confidence=0.0,
                    evidence={
                        "duty_cycle_max_pct": (
                            round(float(np.nanmax(duty)), 1) if np.isfinite(duty).any() else None
                        ),
                        "duty_cycle_baseline_pct": _round(base["duty_cycle"][s0, c]),
                        "duty_cycle_saturated": bool(np.nanmax(duty, initial=0.0) >= 90.0),
                        "model_predict_ratio": _ratio(
                            panels["model_predict"][w, c], base["model_predict"][s0, c]
                        ),
                        "gpu_memory_ratio": _ratio(
                            panels["gpu_memory"][w, c], base["gpu_memory"][s0, c]
                        ),
                        "qps_ratio": qps,
                    },
                    excess_ms=left * excess,
                )
            )
        return out


def _round(x: float) -> float | None:
    return round(float(x), 1) if np.isfinite(x) else None


@dataclass
class Diagnosis:
    incidents: list[Incident]
    spikes: int
    judged_steps: int  # e2e steps with a baseline
    params: Params


def diagnose(trace: Trace, params: Params | None = None) -> Diagnosis:
    """Every e2e incident of every container of ``trace``, attributed (see the module doc)."""
    p = params or Params()
    d = _Diagnoser(trace, p)
    incidents: list[Incident] = []
    for c in np.flatnonzero(d.mask.any(axis=0)):
        for s0, s1, steps in _runs(np.flatnonzero(d.mask[:, c]), p.merge_gap):
            incidents.append(d.incident(int(c), s0, s1, steps))
    incidents.sort(key=lambda i: (i.start_ts, i.container))
    judged = int((np.isfinite(d.e2e) & np.isfinite(d.base)).sum())
    return Diagnosis(incidents, int(d.mask.sum()), judged, p)


def summarize(dg: Diagnosis, run_s: float | None = None) -> dict[str, Any]:
    """Counts and the excess-weighted share of each cause kind. How far the incidents and
    their causes hold is measured by :mod:`cotenant.evaluation.gentd26_measures`."""
    incs = dg.incidents
    total = sum(i.excess_ms for i in incs) or 1.0
    kinds = sorted({c.kind for i in incs for c in i.causes})
    explained = {
        k: {
            "incidents": sum(i.names(k) for i in incs),
            "excess_share": round(
                sum(c.share * i.excess_ms for i in incs for c in i.causes if c.kind == k) / total, 4
            ),
        }
        for k in kinds
    }
    return {
        "judged_steps": dg.judged_steps,
        "spikes": dg.spikes,
        "spike_rate": _div(dg.spikes, dg.judged_steps),
        "incidents": len(incs),
        "containers_with_incidents": len({i.container for i in incs}),
        "incidents_by_model": {
            m: sum(i.model == m for i in incs) for m in sorted({i.model for i in incs})
        },
        "explained": explained,
        "unexplained_share": explained.get("unknown", {}).get("excess_share", 0.0),
        "only_unknown": sum(all(c.kind == "unknown" for c in i.causes) for i in incs),
        "incidents_without_loads": sum(not i.load_ratio for i in incs),
        "run_s": None if run_s is None else round(run_s, 3),
        "params": dg.params.__dict__,
    }


def _div(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def bench(folder: Path | str | None = None) -> dict[str, Any]:
    """Load and diagnose the whole trace; ``{"summary": ..., "incidents": [...]}`` (JSON-ready,
    incidents in start order). Raises :class:`~cotenant.evaluation.gentd26.TraceError`."""
    t0 = time.perf_counter()
    trace = load_trace(folder)
    t1 = time.perf_counter()
    dg = diagnose(trace)
    run_s = time.perf_counter() - t0
    summary = summarize(dg, run_s)
    summary["load_s"] = round(t1 - t0, 3)
    summary["trace"] = {
        "folder": str(trace.folder),
        "steps": len(trace.ts),
        "containers": len(trace.containers),
        "start": iso(trace.ts[0]),
        "end": iso(trace.ts[-1]),
    }
    return {"summary": summary, "incidents": [i.to_dict() for i in dg.incidents]}


def render(summary: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    lines = [
        f"GenTD26 {summary['trace']['start']} .. {summary['trace']['end']}: "
        f"{summary['trace']['containers']} containers, {summary['trace']['steps']} steps",
        f"spikes {summary['spikes']} of {summary['judged_steps']} judged e2e steps "
        f"({summary['spike_rate']}); incidents {summary['incidents']} on "
        f"{summary['containers_with_incidents']} containers {summary['incidents_by_model']}",
    ]
    for kind, e in summary["explained"].items():
        lines.append(
            f"  {kind:11s} named in {e['incidents']:5d} incidents, "
            f"{100 * e['excess_share']:5.1f} % of the excess latency"
        )
    lines += [
        f"unexplained {100 * summary['unexplained_share']:.1f} % of the excess; "
        f"{summary['only_unknown']} incidents with no named cause",
        f"run time {summary['run_s']} s (load {summary['load_s']} s)",
    ]
    return "\n".join(lines)
