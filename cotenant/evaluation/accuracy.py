"""``cotenant bench``: diagnosis accuracy on simulated scenarios, side by side with baselines.

For every scenario file: simulate it, decide each fault's victims by counterfactual runs
(:func:`simulator.output.truth`), load the outputs into an in-memory store, detect and attribute
incidents for every model, and score:

* AC@k — for each fault with victims, a hit when a cause with the fault's ``kind`` and
  ``culprit`` is among the top k causes of an incident of one of its victims that overlaps the
  fault (plus the settle time); Avg@5 is the mean of AC@1..AC@5;
* detection delay — from the fault's start to the first such incident's detection;
* false incidents per simulated hour — incidents that overlap no fault;
* bystanders named — incidents overlapping a fault that give a share to a model that is no
  fault's culprit (other than the victim's own ``load``): a fellow victim taken for a cause;
* within-SLO victims (:mod:`evaluation.goal`: slowed at least as much as the goal's bar,
  never over an SLO): found (an incident of it overlaps the fault) and attributed (one names
  the fault's cause first);
* analysis time.

The baselines rank the same candidate series (:mod:`analysis.candidates`) for the same
incidents, so the comparison is like for like.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cotenant.analysis.baselines.base import Ranker
from cotenant.analysis.candidates import Candidate, candidate_series
from cotenant.analysis.detector.detect import DetectorParams
from cotenant.analysis.detector.verdicts import diagnosis_causes
from cotenant.analysis.diagnose import diagnose
from cotenant.analysis.diagnosis import Diagnosis
from cotenant.analysis.windows import GpuWindows, gpu_windows
from cotenant.core.timerange import TimeRange
from cotenant.evaluation.goal import slowed
from cotenant.evaluation.victim_score import Found
from cotenant.simulator import output
from cotenant.simulator.scenario import Scenario
from cotenant.simulator.scenario_load import load_scenario
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

SETTLE_NS = int(output.SETTLE_S * 1e9)


@dataclass
class FaultScore:
    scenario: str
    kind: str
    culprit: str
    victims: list[str]
    ranks: dict[str, int | None]  # method -> rank of the true cause (None = missed)
    delay_s: float | None


@dataclass
class ScenarioResult:
    name: str
    hours: float
    faults: list[FaultScore]
    incidents: int
    false_incidents: int
    analysis_s: float
    diagnoses: list[Diagnosis] = field(default_factory=list)
    fault_incidents: int = 0  # incidents overlapping a fault (and its settle time)
    bystander_named: int = 0  # ...of which give a bystander model a share
    bystander_first: int = 0  # ...of which rank a bystander model first
    within: list[Within] = field(default_factory=list)  # within-SLO victims at the goal's bar


@dataclass(frozen=True)
class Within:
    """A within-SLO victim of one fault (:mod:`evaluation.goal`), as the batch found it."""

    fault: str  # kind:culprit
    victim: str
    found: bool  # an incident of it overlaps the fault
    attributed: bool  # ... naming the fault's cause first


def _matches(kind: str, culprit: str, truth: dict[str, Any]) -> bool:
    return bool(kind == truth["kind"] and culprit == truth["culprit"])


def _our_rank(d: Diagnosis, truth: dict[str, Any]) -> int | None:
    named = [c for c in d.causes if c.kind != "unknown"]
    for i, c in enumerate(named):
        if _matches(c.kind, c.culprit, truth):
            return i + 1
    return None


def _baseline_rank(ranked: list[tuple[str, float]], truth: dict[str, Any]) -> int | None:
    seen: list[str] = []
    for key, _ in ranked:
        kind, culprit = key.split(":")[:2]
        if f"{kind}:{culprit}" in seen:
            continue
        seen.append(f"{kind}:{culprit}")
        if _matches(kind, culprit, truth):
            return len(seen)
    return None


def load_outputs(result: output.SimOutput) -> Store:
    """An in-memory store holding a simulation's tables."""
    store = Store(":memory:")
    append_tables(
        store,
        {
            "requests": result.requests,
            "gpu_samples": result.gpu_samples,
            "process_samples": result.process_samples,
        },
    )
    return store


def _overlaps(d: Diagnosis, lo: int, hi: int) -> bool:
    return d.start_ns < hi and d.end_ns > lo


def diagnose_models(
    source: StoreSource, s: Scenario, rng: TimeRange, params: DetectorParams | None = None
) -> list[Diagnosis]:
    """Every model's incidents over ``rng``, as an on-demand diagnosis finds them beside the
    incidents stored (here, the other models' incidents found first stand for those: they may
    make a smaller slowdown a fellow victim). Ordinary contention is left out."""
    own = {
        m.name: diagnose(source, m.name, rng, slo_ms=m.slo_p99_ms, params=params) for m in s.models
    }
    causes = diagnosis_causes(d for ds in own.values() for d in ds)
    out: list[Diagnosis] = []
    for m in s.models:
        mine = own[m.name]
        if any(c.victim != m.name and c.gpu == m.gpu for c in causes):
            mine = diagnose(source, m.name, rng, slo_ms=m.slo_p99_ms, params=params, causes=causes)
        out += [d for d in mine if d.is_incident]
    return out


def found_from_diagnoses(diags: Sequence[Diagnosis]) -> list[Found]:
    """The batch path's incidents for :mod:`evaluation.victim_score` (one cause list each)."""
    out = []
    for d in diags:
        causes = tuple(f"{c.kind}:{c.culprit}" for c in d.causes if c.kind != "unknown")
        early = d.first_causes
        first = (
            causes
            if early is None
            else tuple(f"{c.kind}:{c.culprit}" for c in early if c.kind != "unknown")
        )
        out.append(Found(d.model, d.start_ns, d.end_ns, d.detected_ns, first, causes, d.severity))
    return out


def run_scenario(
    s: Scenario, rankers: Sequence[Ranker] = (), progress: Callable[[str], None] = lambda _: None
) -> ScenarioResult:
    start_ns = 1_767_225_600_000_000_000
    sim = output.run(s, start_ns=start_ns)
    truth = output.truth(s, sim, start_ns=start_ns)
    store = load_outputs(sim)
    source = StoreSource(store)
    rng = TimeRange(start_ns, start_ns + int(s.duration_s * 1e9))
    t0 = time.perf_counter()
    diags = diagnose_models(source, s, rng)
    analysis_s = time.perf_counter() - t0
    windows = {}
    faults = []
    for f in truth:
        if not f["victims"]:
            continue
        lo = start_ns + int(f["start_s"] * 1e9)
        hi = start_ns + int(f["end_s"] * 1e9) + SETTLE_NS
        mine = [d for d in diags if d.model in f["victims"] and _overlaps(d, lo, hi)]
        ranks: dict[str, int | None] = {"cotenant": _best(_our_rank(d, f) for d in mine)}
        for r in rankers:
            got = []
            for d in mine:
                if d.gpu not in windows:  # one read per GPU serves all its victims
                    windows[d.gpu] = gpu_windows(source, d.gpu, rng, 1.0)
                w = windows[d.gpu]
                series = {
                    c.key: x for c, x in _named(candidate_series(w, d.model), source, d).items()
                }
                got.append(_baseline_rank(r.rank(series, w.index(d.start_ns)), f))
            ranks[r.name] = _best(got)
        delay = min((max(0.0, (d.detected_ns - lo) / 1e9) for d in mine), default=None)
        faults.append(FaultScore(s.name, f["kind"], f["culprit"], f["victims"], ranks, delay))
    within = _within(s, truth, diags, source, rng, windows, start_ns)
    windows_f = [
        (start_ns + int(f["start_s"] * 1e9), start_ns + int(f["end_s"] * 1e9) + SETTLE_NS)
        for f in truth
    ]
    false = sum(1 for d in diags if not any(_overlaps(d, lo, hi) for lo, hi in windows_f))
    in_faults = [d for d in diags if any(_overlaps(d, lo, hi) for lo, hi in windows_f)]
    named = [_bystanders(d, s, truth) for d in in_faults]
    store.close()
    progress(
        f"{s.name}: {len(diags)} incidents, {len(faults)} faults with victims, "
        f"{false} false, analysis {analysis_s:.2f} s"
    )
    return ScenarioResult(
        s.name,
        s.duration_s / 3600,
        faults,
        len(diags),
        false,
        analysis_s,
        diags,
        len(in_faults),
        sum(1 for n in named if n),
        sum(1 for n in named if n and n[0] == 0),
        within,
    )


def _within(
    s: Scenario,
    truth: list[dict[str, Any]],
    diags: list[Diagnosis],
    source: StoreSource,
    rng: TimeRange,
    windows: dict[str, GpuWindows],
    start_ns: int,
) -> list[Within]:
    """The within-SLO victims at the goal's bar and what the diagnoses made of them
    (``windows``: the GPUs' windows read so far, added to)."""
    slo = {m.name: m.slo_p99_ms for m in s.models}
    gpu_of = {m.name: m.gpu for m in s.models}
    out = []
    for f in truth:
        lo = start_ns + int(f["start_s"] * 1e9)
        hi = start_ns + int(f["end_s"] * 1e9) + SETTLE_NS
        for m in f["victims"]:
            g = gpu_of[m]
            if g not in windows:
                windows[g] = gpu_windows(source, g, rng, 1.0)
            got = slowed(f, m, windows[g], lo, hi, slo.get(m))
            if got.slo_victim or not got.at_goal:
                continue
            mine = [d for d in diags if d.model == m and _overlaps(d, lo, hi)]
            first = any(_our_rank(d, f) == 1 for d in mine)
            out.append(Within(f"{f['kind']}:{f['culprit']}", m, bool(mine), first))
    return out


def _bystanders(d: Diagnosis, s: Scenario, truth: list[dict[str, Any]]) -> list[int]:
    """Ranks (0 = first) among ``d``'s named causes of those that name a model of ``s`` that is
    no fault's culprit; the victim's own ``load`` is not one."""
    culprits = {str(f["culprit"]) for f in truth}
    models = {m.name for m in s.models}
    named = [c for c in d.causes if c.kind != "unknown"]
    return [
        i
        for i, c in enumerate(named)
        if c.culprit in models
        and c.culprit not in culprits
        and not (c.kind == "load" and c.culprit == d.model)
    ]


def _named(
    series: dict[Candidate, np.ndarray], source: StoreSource, d: Diagnosis
) -> dict[Candidate, np.ndarray]:
    """Give the generic lock candidate the name of the lock the victim waited on most."""
    out = {}
    locks = source.lock_waits(TimeRange(d.start_ns, d.end_ns), d.model)
    top = locks.column("lock_name")[0].as_py() if locks.num_rows else "lock"
    for c, x in series.items():
        out[Candidate("lock", top) if c.kind == "lock" else c] = x
    return out


def _best(ranks: Any) -> int | None:
    got = [r for r in ranks if r is not None]
    return min(got) if got else None


def summarize(results: list[ScenarioResult], methods: Sequence[str]) -> dict[str, Any]:
    faults = [f for r in results for f in r.faults]
    out: dict[str, Any] = {"scenarios": len(results), "faults": len(faults)}
    for m in methods:
        ranks = [f.ranks.get(m) for f in faults]
        ac = {
            k: (
                sum(1 for x in ranks if x is not None and x <= k) / len(ranks)
                if ranks
                else float("nan")
            )
            for k in range(1, 6)
        }
        out[m] = {
            "AC@1": ac[1],
            "AC@3": ac[3],
            "Avg@5": float(np.mean([ac[k] for k in range(1, 6)])),
        }
    delays = [f.delay_s for f in faults if f.delay_s is not None]
    out["median_delay_s"] = float(np.median(delays)) if delays else None
    out["detected"] = len(delays)
    hours = sum(r.hours for r in results)
    out["false_per_hour"] = sum(r.false_incidents for r in results) / hours if hours else 0.0
    controls = [r for r in results if not r.faults and r.hours > 0]
    ch = sum(r.hours for r in controls)
    out["false_per_hour_controls"] = sum(r.false_incidents for r in controls) / ch if ch else None
    out["analysis_s"] = sum(r.analysis_s for r in results)
    out["fault_incidents"] = sum(r.fault_incidents for r in results)
    out["bystander_named"] = sum(r.bystander_named for r in results)
    out["bystander_first"] = sum(r.bystander_first for r in results)
    within = [v for r in results for v in r.within]
    out["within_slo_victims"] = len(within)
    out["within_found"] = sum(v.found for v in within) / len(within) if within else None
    out["within_attributed"] = sum(v.attributed for v in within) / len(within) if within else None
    return out


def run_suite(
    paths: Sequence[Path],
    rankers: Sequence[Ranker] = (),
    progress: Callable[[str], None] = lambda _: None,
) -> list[ScenarioResult]:
    return [run_scenario(load_scenario(p), rankers, progress) for p in paths]
