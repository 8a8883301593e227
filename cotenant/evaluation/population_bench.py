"""``cotenant bench --population``: run a scenario population through one path and score it.

Each job draws one scenario (:mod:`evaluation.population`; or reads a library file),
simulates it, decides its faults' victims by counterfactual runs, runs it through the
**batch** path (:func:`evaluation.accuracy.diagnose_models`, what on-demand diagnosis does) or
the **live** loop (:func:`evaluation.live.replay`, the real analysis loop and incident book on
a virtual clock), and scores the incidents per victim (:mod:`evaluation.victim_score`). Jobs
run in a process pool of ``jobs`` workers, the costliest first; progress (scenario i of n,
elapsed, ETA) goes to ``progress``. A job that fails is recorded with its error, not dropped.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from cotenant.core.timerange import TimeRange
from cotenant.evaluation.accuracy import diagnose_models, found_from_diagnoses, load_outputs
from cotenant.evaluation.live import found_from_events, replay
from cotenant.evaluation.population import (
    Kind,
    controls_for_hours,
    draw_scenario,
    draw_spec,
    population_indices,
)
from cotenant.evaluation.victim_score import Requests, ScenarioScore, score_scenario
from cotenant.simulator import output
from cotenant.simulator.arrivals import mean_rate
from cotenant.simulator.scenario import Scenario
from cotenant.simulator.scenario_load import library, load_scenario
from cotenant.store.source import StoreSource

START_NS = 1_767_225_600_000_000_000
"""Virtual time 0 of every run (2026-01-01T00:00:00Z), as the other benches."""


@dataclass(frozen=True)
class Job:
    """One scenario to run: drawn (``population``, ``kind``, ``index``) or a file (``file``)."""

    population: str
    kind: Kind
    index: int = 0
    file: str = ""
    live: bool = False
    cost: float = 1.0  # relative cost estimate, to run the costliest first and for the ETA

    @property
    def label(self) -> str:
        return Path(self.file).stem if self.file else f"{self.population}/{self.kind}/{self.index}"


def _scenario(job: Job) -> Scenario:
    if job.file:
        return load_scenario(job.file)
    return draw_scenario(job.population, job.index, job.kind)


def run_job(job: Job) -> ScenarioScore:
    """Run and score one job; an exception is recorded in the score's ``error``."""
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        s = _scenario(job)
        kind = job.kind if not job.file else ("faulted" if s.faults else "control")
        if job.live:
            events, truth, store, _, _ = replay(s, with_truth=bool(s.faults))
            found = found_from_events(events)
        else:
            sim = output.run(s, start_ns=START_NS)
            truth = output.truth(s, sim, start_ns=START_NS) if s.faults else []
            store = load_outputs(sim)
            rng = TimeRange(START_NS, START_NS + int(s.duration_s * 1e9))
            found = found_from_diagnoses(diagnose_models(StoreSource(store), s, rng))
        requests = Requests.of_store(store)
        store.close()
        score = score_scenario(
            s, truth, found, requests, START_NS, path="live" if job.live else "batch", kind=kind
        )
    except Exception as exc:  # a bench records a failing scenario and goes on
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        score = ScenarioScore(
            job.label,
            0,
            job.kind,
            "live" if job.live else "batch",
            0,
            0,
            0,
            0,
            0,
            {},
            0,
            0,
            0,
            error=tb,
        )
    score.wall_s = time.perf_counter() - t0
    score.cpu_s = time.process_time() - c0
    if not job.file:
        score.drawn = draw_spec(job.population, job.index, job.kind).drawn
    return score


def _cost(rates: float, duration_s: float, faults: int, live: bool) -> float:
    """Relative cost: requests simulated (the run and one counterfactual per fault) plus,
    live, a fixed cost per pass."""
    sim = (rates + 5.0) * duration_s * (1 + faults)
    return sim + (duration_s / 5.0 * 5000.0 if live else 0.0)


def plan(
    population: str,
    *,
    count: int,
    controls_hours: float,
    start: int = 0,
    live: bool = False,
) -> list[Job]:
    """The jobs of a run, costliest first: ``count`` faulted scenarios from index ``start``
    and the first controls adding up to ``controls_hours`` of ``population`` (``dev`` or
    ``test``), or every bundled library scenario (``library``: count and hours ignored)."""
    jobs: list[Job] = []
    if population == "library":
        for p in library():
            s = load_scenario(p)
            rates = sum(mean_rate(m, s.duration_s) for m in s.models)
            kind: Kind = "faulted" if s.faults else "control"
            cost = _cost(rates, s.duration_s, len(s.faults), live)
            jobs.append(Job("library", kind, file=str(p), live=live, cost=cost))
    else:
        for kind, indices in (
            ("faulted", population_indices(count, start)),
            ("control", controls_for_hours(population, controls_hours)),
        ):
            for i in indices:
                spec = draw_spec(population, i, kind)
                rates = sum(m["rate_rps"] for m in spec.drawn["models"].values())
                cost = _cost(rates, spec.doc["duration_s"], len(spec.doc.get("faults", [])), live)
                jobs.append(Job(population, kind, i, live=live, cost=cost))
    return sorted(jobs, key=lambda j: -j.cost)


def run_jobs(
    jobs: Sequence[Job], workers: int, progress: Callable[[str], None] = lambda _: None
) -> list[ScenarioScore]:
    """Run ``jobs`` in a pool of ``workers`` processes (in this process when 1); scores in
    the jobs' order."""
    total = sum(j.cost for j in jobs) or 1.0
    t0 = time.perf_counter()
    done_cost = 0.0
    out: dict[int, ScenarioScore] = {}

    def report(i: int, score: ScenarioScore) -> None:
        nonlocal done_cost
        done_cost += jobs[i].cost
        elapsed = time.perf_counter() - t0
        eta = elapsed / done_cost * (total - done_cost) if done_cost else 0.0
        what = (
            f"ERROR {score.error}"
            if score.error
            else f"{len(score.victims)} victims, {sum(v.found for v in score.victims)} found, "
            f"{score.false_incidents} false"
        )
        progress(
            f"[{len(out)}/{len(jobs)}] {score.name} ({score.kind}, {score.hours * 60:.0f} min): "
            f"{what}; {score.wall_s:.1f} s | elapsed {elapsed:.0f} s, ETA {eta:.0f} s"
        )

    if workers <= 1:
        for i, j in enumerate(jobs):
            out[i] = run_job(j)
            report(i, out[i])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(run_job, j): i for i, j in enumerate(jobs)}
            for fut in as_completed(futures):
                i = futures[fut]
                out[i] = fut.result()
                report(i, out[i])
    return [out[i] for i in range(len(jobs))]


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    return {"nproc": os.cpu_count(), "load_avg": os.getloadavg()}
