"""The product's attribution on GenTD26's unambiguous spike events, scored by the enrichment and
excess measures of ``cotenant bench --gentd26``.

The product's detector finds few of the trace's spikes, so its causes are weighed here on
incidents no detector chose: the trace's **unambiguous spike events**
(:mod:`cotenant.evaluation.gentd26_steps`: a run of steps of one container, each at least 3x its
trailing median and 5 s above it). Each event is attributed by
:func:`cotenant.analysis.attribution.attribute`, as an incident of the product would be, on
windows built from the trace as :mod:`cotenant.evaluation.gentd26_import` maps it (each
container its own GPU; per step one request-window: latency = e2e, queue = ``queue_rt``, other =
the step's load time, compute the rest; the container's duty cycle as its GPU and process
activity) against up to :data:`BEFORE_STEPS` *ordinary* steps before it (steps under 1.5x their
trailing median, the measures' elevated bar). The victim's work per request is its pure
inference time (``model_predict``, a :class:`~cotenant.analysis.work.WorkSeries` of kind
``time``). The trace holds no request counts (a step is a mean over its requests), so arrivals
are one per step and the ``load`` cause is not weighed.

**Scoring** is that of :mod:`cotenant.evaluation.gentd26_measures`: the trace is cut where half
of its e2e rows lie behind; only the events that start in the second half are attributed; for
each cause named, its **enrichment** (:mod:`cotenant.evaluation.gentd26_enrichment`: the named
windows holding its evidence over the sum of their base rates, fitted on the first half), and
the excess-weighted share of the events' excess left ``unknown``, with a 90 % bootstrap
interval. Every reference is a trailing median: nothing uses data after the step judged. Recall
and precision are not reported: the events are the spikes by definition.

``python -m cotenant.evaluation.gentd26_attribution [FOLDER] [--json OUT]`` prints them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cotenant.analysis.attribution import attribute
from cotenant.analysis.windows import GpuWindows
from cotenant.analysis.work import WorkSeries
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.evaluation.gentd26 import STEP_S, Trace, load_trace
from cotenant.evaluation.gentd26_enrichment import Evidence, enrichment
from cotenant.evaluation.gentd26_import import request_phases
from cotenant.evaluation.gentd26_measures import explained, score, split_step
from cotenant.evaluation.gentd26_steps import (
    UNKNOWN,
    MeasureParams,
    NamedCause,
    Panels,
    Scored,
    TraceIncident,
    runs,
)

BEFORE_STEPS = 30
"""Ordinary steps before an event that its attribution compares with (the trailing window)."""


class StepWindows:
    """The trace's per-step series on the product's terms, and the attribution of one event."""

    def __init__(self, trace: Trace, panels: Panels) -> None:
        self.trace = trace
        self.phases = request_phases(trace)
        self.ordinary = ~panels.elevated & np.isfinite(self.phases["latency_ms"])
        self.models = trace.models()

    def windows(self, c: int, lo: int, hi: int) -> GpuWindows:
        """Container ``c``'s steps ``[lo, hi)`` as one GPU's windows (see the module doc)."""
        t, n = self.trace, hi - lo
        name = t.containers[c]
        w = GpuWindows(name, int(t.ts[lo]) * 1_000_000_000, STEP_S * 1_000_000_000, n)
        lat = self.phases["latency_ms"][lo:hi, c]
        seen = np.isfinite(lat)
        count = seen.astype(float)
        v: dict[str, np.ndarray] = {p: self.phases[p][lo:hi, c] for p in PHASE_COLUMNS}
        v |= {
            "count": count,
            "rate_rps": count / STEP_S,
            "arrival_rps": count / STEP_S,
            "errors": np.zeros(n),
            "mean_ms": lat,
            "p50_ms": lat,
            "p95_ms": lat,
            "p99_ms": lat,
            "batch_size_mean": np.where(seen, 1.0, np.nan),
        }
        w.models[self.models[c]] = v
        duty = t.panels["duty_cycle"][lo:hi, c]
        mem = t.panels["gpu_memory"][lo:hi, c]
        w.counters = {"sm_util": duty, "mem_used_bytes": mem}
        w.processes[name] = {"sm_util": duty, "mem_util": np.full(n, np.nan), "mem_used_bytes": mem}
        w.process_model[name] = self.models[c]
        return w

    def attribute(self, c: int, s0: int, s1: int) -> TraceIncident | None:
        """Container ``c``'s steps ``[s0, s1]`` as an incident attributed by the product, or
        None when no ordinary step with a latency lies in the :data:`BEFORE_STEPS` x 3 steps
        before it."""
        lo = max(0, s0 - 3 * BEFORE_STEPS)
        normal = np.flatnonzero(self.ordinary[lo:s0, c])
        if not len(normal):
            return None
        w = self.windows(c, lo, s1 + 1)
        before = np.zeros(w.n, dtype=bool)
        before[normal[-BEFORE_STEPS:]] = True
        during = np.zeros(w.n, dtype=bool)
        during[s0 - lo :] = True
        model = self.models[c]
        work = WorkSeries(
            self.trace.panels["model_predict"][lo : s1 + 1, c],
            "time",
            f"{model} pure inference time per request (model_predict)",
            "ms (scaled by the publisher)",
        )
        att = attribute(w, model, before, during, work=work)
        t = self.trace
        return TraceIncident(
            model=model,
            container=t.containers[c],
            start_s=float(t.ts[s0]),
            end_s=float(t.ts[s1]),
            causes=tuple(NamedCause(str(x.kind), x.culprit, x.share) for x in att.causes),
        )


def spike_events(panels: Panels, columns: Sequence[int], split: int) -> list[tuple[int, int, int]]:
    """``(column, first, last)`` of each unambiguous spike event of ``columns`` that starts at
    or after ``split``."""
    return [(c, a, b) for c in columns for a, b in runs(panels.spike[:, c]) if a >= split]


def unexplained_interval(scored: Sequence[Scored], draws: int = 2000) -> list[float | None]:
    """90 % bootstrap interval (events resampled, seed 0) of the excess-weighted unexplained
    share."""
    if not scored:
        return [None, None]
    ex = np.array([s.excess_ms for s in scored])
    unk = np.array([1.0 - s.named_share for s in scored]) * ex
    idx = np.random.default_rng(0).integers(0, len(ex), size=(draws, len(ex)))
    shares = unk[idx].sum(axis=1) / np.maximum(ex[idx].sum(axis=1), 1e-12)
    return [_r(float(np.quantile(shares, q))) for q in (0.05, 0.95)]


def score_events(
    trace: Trace, panels: Panels, evidence: Evidence, incidents: Sequence[TraceIncident], cut: int
) -> dict[str, Any]:
    """Enrichment of each cause named on ``incidents`` and the share of their excess explained
    (see the module doc); ``incidents`` all start at or after ``cut``."""
    scored = score(trace, panels, incidents)
    causes = enrichment(evidence, scored, cut)
    enriched = {k for k, e in causes.items() if (e.get("enrichment") or 0.0) >= 2.0}
    ex = explained(scored, cut, enriched)
    ex["unexplained_share"] = None if ex["explained_share"] is None else 1 - ex["explained_share"]
    ex["unexplained_ci90"] = unexplained_interval(scored)
    naming: dict[str, int] = {}
    for i in incidents:
        for key in {c.key for c in i.causes if c.kind != UNKNOWN}:
            naming[key] = naming.get(key, 0) + 1
    return {"events": len(incidents), "explained": ex, "causes": causes, "naming": naming}


def bench(folder: Path | str | None = None) -> dict[str, Any]:
    """Attribute every unambiguous spike event of the second half; score them overall and per
    pool (JSON-ready)."""
    trace = load_trace(folder)
    p = MeasureParams()
    cut = split_step(trace)
    panels = Panels.of(trace, p)
    view = StepWindows(trace, panels)
    models = np.asarray(trace.models())
    serving = np.flatnonzero(models != "sd-idle").tolist()
    events = spike_events(panels, serving, cut)
    incidents = [i for c, a, b in events if (i := view.attribute(c, a, b)) is not None]
    evidence = Evidence.of(trace, p, cut)
    pools = {
        pool: score_events(trace, panels, evidence, [i for i in incidents if i.model == pool], cut)
        for pool in sorted(set(models.tolist()) - {"sd-idle"})
    }
    return {
        "trace": str(trace.folder),
        "steps": len(trace.ts),
        "split_step": cut,
        "spike_events": len(events),
        "without_ordinary_steps_before": len(events) - len(incidents),
        **score_events(trace, panels, evidence, incidents, cut),
        "pools": pools,
    }


def _share(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def render(res: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    lines = [
        f"GenTD26 {res['trace']}: {res['steps']} steps, halves cut at step {res['split_step']}; "
        f"{res['spike_events']} unambiguous spike events in the second half, "
        f"{res['without_ordinary_steps_before']} without an ordinary step before"
    ]
    for name, r in [("all", res), *res["pools"].items()]:
        e = r["explained"]
        lo, hi = e["unexplained_ci90"]
        lines.append(
            f"{name}: {r['events']} events attributed; unexplained {_share(e['unexplained_share'])}"
            f" of the excess (90 % bootstrap {_share(lo)}-{_share(hi)}); by causes enriched "
            f">= 2x {_share(e['explained_by_enriched_share'])}; {e['naming_nothing']} name nothing"
        )
        for key, c in r["causes"].items():
            if c["untestable"]:
                lines.append(f"  {key}: named on {c['windows']} events; no evidence in the trace")
                continue
            ci = c["ci90"]
            lines.append(
                f"  {key}: evidence in {c['with_evidence']} of {c['windows']} named events, "
                f"base rate {_share(c['base_rate_first_half'])} (first half) -> "
                + ("—" if c["enrichment"] is None else f"{c['enrichment']:.1f}x")
                + (f" (90 % {ci[0]:.1f}-{ci[1]:.1f})" if ci else "")
            )
    return "\n".join(lines)


def _r(x: float) -> float | None:
    return round(float(x), 4) if np.isfinite(x) else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cotenant.evaluation.gentd26_attribution")
    ap.add_argument("folder", nargs="?", type=Path, help="the GenTD26 folder")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    res = bench(args.folder)
    print(render(res))
    if args.json is not None:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
