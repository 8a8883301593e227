"""The product's attribution on GenTD26's incidents, with base rates fit on the first half.

The product's detector does not open incidents on the trace's 57-s steps yet, so the incidents
are those of the side detector (:mod:`evaluation.gentd26_diagnosis`: a step at least twice its
container's trailing median, runs merged). Each is attributed by
:func:`analysis.attribution.attribute`, as an incident of the product would be, on windows built
from the trace as :mod:`evaluation.gentd26_import` maps it (each container its own GPU; per step
one request-window: latency = e2e, queue = ``queue_rt``, other = the step's load time, compute
the rest; the container's duty cycle as its GPU and process activity) against the up to
:data:`BEFORE_STEPS` non-spike steps before it; the victim's work per request is its pure
inference time (``model_predict``, a :class:`analysis.mix.WorkSeries` of kind ``time``). The
trace holds no request counts (a step is a mean over its requests), so arrivals are one per step
and the ``load`` cause is not weighed.

**Halves.** The trace is cut in two at the start of its median incident (incidents are not
spread evenly over the day: cutting the steps in two would leave a few dozen in the second
half), so each half holds half the incidents. The first half *fits*: per container and evidence
series (``model_predict`` for ``mix``, the load time for ``model_load``, ``queue_rt`` for
``load``), the threshold that :data:`NORMAL_QUANTILE` of its normal (non-spike) steps stay
under. The second half *reports*: the incidents that start in it, what share of their excess
each cause kind gets, and for each kind named, its **enrichment** — the share of the named
incidents' steps whose evidence is over the fitted threshold, over that share among the
second half's normal steps (the evidence's base rate). A kind whose evidence is no more common
in its incidents than in ordinary steps (ratio near 1) is named from presence, not cause.

``python -m cotenant.evaluation.gentd26_attribution [FOLDER] [--json OUT]`` prints both halves.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cotenant.analysis.attribution import Attribution, attribute
from cotenant.analysis.windows import GpuWindows
from cotenant.analysis.work import WorkSeries
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.evaluation.gentd26 import STEP_S, Trace, load_trace
from cotenant.evaluation.gentd26_diagnosis import Params, spikes
from cotenant.evaluation.gentd26_diagnosis import diagnose as side_detector
from cotenant.evaluation.gentd26_import import request_phases

BEFORE_STEPS = 30
"""Normal steps before an incident its attribution compares with (the side detector's window)."""
NORMAL_QUANTILE = 0.9
"""Quantile of a container's normal first-half steps that an evidence series' threshold is."""
EVIDENCE = {
    CauseKind.MIX: "model_predict",
    CauseKind.MODEL_LOAD: "other_ms",
    CauseKind.LOAD: "queue_ms",
}
"""Cause kind -> the per-step series that shows it."""


@dataclass
class Attributed:
    container: int
    model: str
    start: int  # first step of the incident
    end: int  # last step
    excess_ms: float  # the side detector's summed excess over its spike steps
    attribution: Attribution

    def share(self, kind: str) -> float:
        return sum(c.share for c in self.attribution.causes if c.kind == kind)


class Panels:
    """The trace's per-step series on the product's terms, ``(steps, containers)`` each."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.phases = request_phases(trace)
        self.mask, _ = spikes(trace.panels["e2e"], Params())
        self.models = trace.models()

    def series(self, name: str) -> np.ndarray:
        if name in self.phases:
            return self.phases[name]
        return self.trace.panels[name]

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

    def attribute(self, c: int, s0: int, s1: int, excess_ms: float) -> Attributed | None:
        """The incident of container ``c`` over steps ``[s0, s1]``, or None when it has no
        normal step with a latency before it."""
        lo = max(0, s0 - 3 * BEFORE_STEPS)
        normal = np.flatnonzero(
            ~self.mask[lo:s0, c] & np.isfinite(self.phases["latency_ms"][lo:s0, c])
        )
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
        return Attributed(c, model, s0, s1, excess_ms, att)


def thresholds(p: Panels, steps: slice) -> dict[str, np.ndarray]:
    """Per evidence series, per container: :data:`NORMAL_QUANTILE` of its normal steps in
    ``steps`` (NaN for a container with none)."""
    out = {}
    for name in EVIDENCE.values():
        x = np.where(p.mask, np.nan, p.series(name))[steps]
        ok = np.isfinite(x).any(axis=0)
        q = np.full(x.shape[1], np.nan)
        q[ok] = np.nanquantile(x[:, ok], NORMAL_QUANTILE, axis=0)
        out[name] = q
    return out


def enrichment(
    p: Panels, incidents: list[Attributed], limit: dict[str, np.ndarray], steps: slice
) -> dict[str, dict[str, Any]]:
    """Per cause kind named among ``incidents``: the share of their steps whose evidence is
    over ``limit``, the same share among the normal steps of ``steps`` of the same containers
    (the base rate), and their ratio."""
    out: dict[str, dict[str, Any]] = {}
    for kind, name in EVIDENCE.items():
        named = [i for i in incidents if i.share(kind) > 0]
        if not named:
            continue
        over = p.series(name) > limit[name][None, :]
        known = np.isfinite(p.series(name))
        hits = [
            bool(over[s, i.container])
            for i in named
            for s in range(i.start, i.end + 1)
            if known[s, i.container]
        ]
        cols = sorted({i.container for i in named})
        normal = ~p.mask[steps][:, cols] & known[steps][:, cols]
        base = float(over[steps][:, cols][normal].mean()) if normal.any() else float("nan")
        slow = float(np.mean(hits)) if hits else float("nan")
        out[str(kind)] = {
            "incidents": len(named),
            "slow_rate": _r(slow),
            "base_rate": _r(base),
            "enrichment": _r(slow / base) if base > 0 else None,
        }
    return out


def unexplained_interval(incidents: list[Attributed], draws: int = 2000) -> list[float | None]:
    """95 % bootstrap interval (incidents resampled, seed 0) of the unexplained share."""
    if not incidents:
        return [None, None]
    ex = np.array([i.excess_ms for i in incidents])
    unk = np.array([i.share(CauseKind.UNKNOWN) for i in incidents]) * ex
    idx = np.random.default_rng(0).integers(0, len(ex), size=(draws, len(ex)))
    shares = unk[idx].sum(axis=1) / np.maximum(ex[idx].sum(axis=1), 1e-12)
    return [_r(float(np.quantile(shares, q))) for q in (0.025, 0.975)]


def summary(incidents: list[Attributed]) -> dict[str, Any]:
    """Counts, the excess-weighted share of each cause kind, and a 95 % interval of the
    unexplained share."""
    total = sum(i.excess_ms for i in incidents) or 1.0
    kinds = sorted({str(c.kind) for i in incidents for c in i.attribution.causes})
    return {
        "incidents": len(incidents),
        "unexplained_ci": unexplained_interval(incidents),
        "excess_share": {
            k: _r(sum(i.share(k) * i.excess_ms for i in incidents) / total) for k in kinds
        },
        "naming": {
            k: sum(i.share(k) > 0 for i in incidents) for k in kinds if k != CauseKind.UNKNOWN
        },
        "only_unknown": sum(
            all(c.kind == CauseKind.UNKNOWN for c in i.attribution.causes) for i in incidents
        ),
    }


def bench(folder: Path | str | None = None) -> dict[str, Any]:
    """Attribute every side-detector incident; summarise each half, enrichment on the second
    (see the module doc). JSON-ready."""
    trace = load_trace(folder)
    p = Panels(trace)
    index = {name: i for i, name in enumerate(trace.containers)}
    ts0 = int(trace.ts[0])
    got: list[Attributed] = []
    for inc in side_detector(trace).incidents:
        s0 = (inc.start_ts - ts0) // STEP_S
        s1 = (inc.end_ts - ts0) // STEP_S
        a = p.attribute(index[inc.container], int(s0), int(s1), inc.excess_ms)
        if a is not None:
            got.append(a)
    starts = sorted(a.start for a in got)
    half = starts[len(starts) // 2] if starts else len(trace.ts) // 2
    fit = [a for a in got if a.start < half]
    held = [a for a in got if a.start >= half]
    limit = thresholds(p, slice(0, half))
    return {
        "trace": str(trace.folder),
        "steps": len(trace.ts),
        "halves_at_step": half,
        "fit": {**summary(fit), "enrichment": enrichment(p, fit, limit, slice(0, half))},
        "report": {**summary(held), "enrichment": enrichment(p, held, limit, slice(half, None))},
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"GenTD26 {res['trace']}: {res['steps']} steps, halves at step {res['halves_at_step']}"
    ]
    for half in ("fit", "report"):
        h = res[half]
        lines.append(
            f"{half}: {h['incidents']} incidents, {h['only_unknown']} naming nothing; "
            f"unexplained {100 * (h['excess_share'].get('unknown') or 0):.1f} % of the excess "
            f"(95 % bootstrap {h['unexplained_ci']})"
        )
        for kind, share in h["excess_share"].items():
            if kind != CauseKind.UNKNOWN:
                lines.append(
                    f"  {kind:10s} {100 * (share or 0):5.1f} % of the excess, "
                    f"named in {h['naming'][kind]} incidents"
                )
        for kind, e in h["enrichment"].items():
            lines.append(
                f"  {kind:10s} evidence in {e['slow_rate']} of its incidents' steps vs "
                f"{e['base_rate']} of normal steps: x{e['enrichment']}"
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
