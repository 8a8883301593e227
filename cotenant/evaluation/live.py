"""``cotenant bench --live``: score the incident stream people, alerts and actuators consume.

Each scenario is simulated, loaded into an in-memory store, and replayed through the real
:class:`analysis.loop.AnalysisLoop` and :class:`analysis.incidents.IncidentBook` on a virtual
clock (a pass every ``interval_s`` of scenario time, no waiting): the code ``cotenant serve``
runs. The events it publishes are scored against the simulator's truth, per fault and victim:

* **SLO victims** (the victim's 1-s p99 crossed its SLO during the fault): incidents opened
  for it over the fault (exactly one is right), coverage of its breach windows by its
  incidents, premature resolutions (an incident resolved while the victim still breaches
  later in the same fault), the first published top cause and the final one (AC@1), and the
  time from the fault's start to the first event naming the true cause;
* **within-SLO victims** (slowed by the fault but never over an SLO, or without one, as much
  as the goal's bar: 1.2x and 1 ms over its p99 without the fault, for at least
  60 s, at 0.5 requests a second or more; slighter, shorter or sparser victims are counted
  apart as ``below the bar``): found (an incident overlaps the fault), attributed (its top
  cause is the truth), and recorded (found, or kept in the store's ``contention`` table as
  the model's ordinary contention over the fault: a recurring fault's later rounds);
* **false incidents** per simulated hour: incidents overlapping no fault (plus settle time),
  overall and on the fault-free controls;
* the loop's cost: CPU seconds per pass.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cotenant.analysis.attribution import Cause
from cotenant.analysis.detector.detect import DetectorParams
from cotenant.analysis.incident_record import IncidentEvent
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.loop import AnalysisLoop
from cotenant.analysis.windows import gpu_windows
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.timerange import TimeRange
from cotenant.evaluation.accuracy import load_outputs
from cotenant.evaluation.goal import (
    GOAL_MARGIN_MS,
    GOAL_RATE_RPS,
    GOAL_RATIO,
    GOAL_S,
    at_goal,
    slowed,
)
from cotenant.evaluation.victim_score import Found
from cotenant.simulator import output
from cotenant.simulator.scenario import Scenario
from cotenant.simulator.scenario_load import load_scenario
from cotenant.store.contention_rows import find_contention
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

START_NS = 1_767_225_600_000_000_000
SETTLE_S = output.SETTLE_S


@dataclass(frozen=True)
class Seen:
    """An event as it was published (incidents are updated in place later)."""

    kind: str
    incident_id: str
    model: str
    at_ns: int
    start_ns: int
    end_ns: int
    cause: str | None
    severity: str
    indicator: str = "e2e"
    causes: tuple[str, ...] = ()  # ranked kind:culprit, unknown left out


def _seen(e: IncidentEvent) -> Seen:
    i = e.incident
    causes = tuple(f"{c.kind}:{c.culprit}" for c in i.causes if c.kind != CauseKind.UNKNOWN)
    return Seen(
        e.kind,
        i.id,
        i.model,
        e.at_ns,
        i.start_ns,
        i.end_ns,
        _cause(i.top),
        i.severity,
        i.indicator,
        causes,
    )


def found_from_events(events: Sequence[Seen]) -> list[Found]:
    """The live loop's incidents as people saw them, for :mod:`evaluation.victim_score`: each
    incident that was published (an event other than ``diagnosing``; withdrawn transients
    never were), detected when first published, its first causes those of that event and its
    final ones those of its last event."""
    by_inc: dict[str, list[Seen]] = {}
    for e in events:
        by_inc.setdefault(e.incident_id, []).append(e)
    out = []
    for evs in by_inc.values():
        shown = [e for e in evs if e.kind not in ("diagnosing", "dismissed")]
        if not shown or evs[-1].kind == "dismissed":
            continue
        last = evs[-1]
        out.append(
            Found(
                last.model,
                last.start_ns,
                last.end_ns,
                shown[0].at_ns,
                shown[0].causes,
                last.causes,
                last.severity,
            )
        )
    return out


@dataclass
class VictimScore:
    scenario: str
    kind: str
    culprit: str
    victim: str
    slo_victim: bool  # crossed its SLO during the fault
    slowdown: float  # its p99 over the fault with / without the fault (the truth's counterfactual)
    excess_ms: float  # the same, with - without
    rate_rps: float  # its requests per second during the fault
    incidents: int
    coverage: float | None  # of its breach windows (SLO victims)
    premature: int
    first_cause: str | None
    final_cause: str | None
    first_ok: bool
    final_ok: bool
    time_to_cause_s: float | None
    fault_s: float = 0.0  # how long the fault lasted
    ordinary: bool = False  # kept as the model's ordinary contention over the fault

    @property
    def truth(self) -> str:
        return f"{self.kind}:{self.culprit}"


@dataclass
class LiveResult:
    name: str
    hours: float
    victims: list[VictimScore]
    incidents: int
    false_incidents: int
    passes: int
    cpu_s: float
    events: list[str] = field(default_factory=list)


def _cause(c: Cause | None) -> str | None:
    return None if c is None else f"{c.kind}:{c.culprit}"


def replay(
    s: Scenario,
    *,
    interval_s: float = 5.0,
    horizon_s: float = 600.0,
    with_truth: bool = True,
    params: DetectorParams | None = None,
) -> tuple[list[Seen], list[dict[str, Any]], Store, float, int]:
    """Run the live loop over a simulation of ``s``: (events as published, the faults' truth
    (empty without ``with_truth``), the store, CPU seconds of the loop, passes). ``params``:
    the detector's (its defaults when None)."""
    sim = output.run(s, start_ns=START_NS)
    truth = output.truth(s, sim, start_ns=START_NS) if with_truth else []
    store = load_outputs(sim)
    now = [START_NS]
    book = IncidentBook(store)
    events: list[Seen] = []
    loop = AnalysisLoop(
        StoreSource(store),
        book,
        slos=s.slos(),
        interval_s=interval_s,
        horizon_s=horizon_s,
        clock_ns=lambda: now[0],
        on_incident=lambda e: events.append(_seen(e)),
        params=params,
    )
    step = int(interval_s * 1e9)
    end = START_NS + int(s.duration_s * 1e9)
    t0 = time.process_time()
    while now[0] < end + step * 4:  # a few passes past the end let incidents resolve
        now[0] += step
        loop.run_once()
    return events, truth, store, time.process_time() - t0, loop.passes


def run_scenario(s: Scenario, progress: Callable[[str], None] = lambda _: None) -> LiveResult:
    events, truth, store, cpu_s, passes = replay(s)
    source = StoreSource(store)
    rng = TimeRange(START_NS, START_NS + int(s.duration_s * 1e9))
    slo = {m.name: m.slo_p99_ms for m in s.models}
    gpu_of = {m.name: m.gpu for m in s.models}
    windows = {g: gpu_windows(source, g, rng, 1.0) for g in {m.gpu for m in s.models}}
    # each incident as last published, and its events in order
    by_inc: dict[str, list[Seen]] = {}
    for e in events:
        by_inc.setdefault(e.incident_id, []).append(e)
    # withdrawn transients were never published: not incidents
    final = {k: evs[-1] for k, evs in by_inc.items() if evs[-1].kind != "dismissed"}
    victims: list[VictimScore] = []
    spans = []
    for f in truth:
        lo = START_NS + int(f["start_s"] * 1e9)
        hi = START_NS + int((f["end_s"] + SETTLE_S) * 1e9)
        spans.append((lo, hi))
        for m in f["victims"]:
            w = windows[gpu_of[m]]
            v = _score_victim(s.name, f, m, lo, hi, slo.get(m), w, final, by_inc)
            kept = find_contention(store, m, gpu_of[m], lo)
            v.ordinary = any(c.start_ns < hi for c in kept)
            victims.append(v)
    false = sum(
        1
        for inc in final.values()
        if not any(inc.start_ns < hi and inc.end_ns > lo for lo, hi in spans)
    )
    store.close()
    lines = [
        f"[{(e.at_ns - START_NS) / 1e9:5.0f} s] {e.kind} {e.model} {e.severity} "
        f"{(e.start_ns - START_NS) / 1e9:.0f}-{(e.end_ns - START_NS) / 1e9:.0f} s "
        f"{e.cause or CauseKind.UNKNOWN}"
        for e in events
    ]
    progress(
        f"{s.name}: {len(final)} incidents, {len(victims)} fault victims, {false} false, "
        f"{cpu_s / max(passes, 1) * 1000:.0f} ms CPU per pass"
    )
    return LiveResult(s.name, s.duration_s / 3600, victims, len(final), false, passes, cpu_s, lines)


def _score_victim(
    scenario: str,
    f: dict[str, Any],
    model: str,
    lo: int,
    hi: int,
    slo_ms: float | None,
    w: Any,
    final: dict[str, Seen],
    by_inc: dict[str, list[Seen]],
) -> VictimScore:
    truth = f"{f['kind']}:{f['culprit']}"
    got = slowed(f, model, w, lo, hi, slo_ms)
    ts, breach = w.ts_ns, got.breach
    mine = sorted(
        (i for i in final.values() if i.model == model and i.start_ns < hi and i.end_ns > lo),
        key=lambda i: i.start_ns,
    )
    covered = np.zeros(w.n, dtype=bool)
    for i in mine:
        covered |= (ts >= i.start_ns) & (ts < i.end_ns)
    n_breach = int(breach.sum())
    coverage = float((breach & covered).sum() / n_breach) if n_breach else None
    premature = 0
    time_to: float | None = None
    published = [e for i in mine for e in by_inc[i.incident_id] if e.kind != "diagnosing"]
    published.sort(key=lambda e: e.at_ns)
    for e in published:
        # resolved during the fault, yet the victim breached again after the end it claimed
        if e.kind == "resolved" and e.at_ns >= lo and (breach & (ts >= e.end_ns)).any():
            premature += 1
        if time_to is None and e.cause == truth:
            time_to = max(0.0, (e.at_ns - lo) / 1e9)
    first_cause = published[0].cause if published else None
    final_cause = max(mine, key=lambda i: i.end_ns - i.start_ns).cause if mine else None
    return VictimScore(
        scenario,
        f["kind"],
        f["culprit"],
        model,
        n_breach > 0,
        got.slowdown,
        got.excess_ms,
        got.rate_rps,
        len(mine),
        coverage,
        premature,
        first_cause,
        final_cause,
        first_cause == truth,
        final_cause == truth,
        time_to,
        got.fault_s,
    )


def _degraded(v: VictimScore) -> bool:
    return at_goal(v.slowdown, v.excess_ms, v.rate_rps, v.fault_s)


def summarize(results: Sequence[LiveResult]) -> dict[str, Any]:
    vs = [v for r in results for v in r.victims]
    slo_v = [v for v in vs if v.slo_victim]
    within = [v for v in vs if not v.slo_victim and _degraded(v)]
    below = [v for v in vs if not v.slo_victim and not _degraded(v)]

    def frac(xs: list[bool]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    cov = [v.coverage for v in slo_v if v.coverage is not None]
    hours = sum(r.hours for r in results)
    controls = [r for r in results if not r.victims]
    ch = sum(r.hours for r in controls)
    passes = sum(r.passes for r in results)
    tt = [v.time_to_cause_s for v in slo_v if v.time_to_cause_s is not None]
    return {
        "scenarios": len(results),
        "slo_victims": len(slo_v),
        "one_incident": frac([v.incidents == 1 for v in slo_v]),
        "coverage": float(np.mean(cov)) if cov else None,
        "premature_resolutions": sum(v.premature for v in slo_v),
        "first_ac1": frac([v.first_ok for v in slo_v]),
        "final_ac1": frac([v.final_ok for v in slo_v]),
        "median_time_to_cause_s": float(np.median(tt)) if tt else None,
        "within_slo_victims": len(within),
        "within_found": frac([v.incidents > 0 for v in within]),
        "within_attributed": frac([v.final_ok for v in within]),
        "within_recorded": frac([v.incidents > 0 or v.ordinary for v in within]),
        "below_the_bar": len(below),
        "below_found": frac([v.incidents > 0 for v in below]),
        "false_per_hour": sum(r.false_incidents for r in results) / hours if hours else 0.0,
        "false_per_hour_controls": (sum(r.false_incidents for r in controls) / ch if ch else None),
        "cpu_ms_per_pass": 1000 * sum(r.cpu_s for r in results) / passes if passes else None,
    }


def run_suite(
    paths: Sequence[Path], progress: Callable[[str], None] = lambda _: None
) -> list[LiveResult]:
    return [run_scenario(load_scenario(p), progress) for p in paths]


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "—" if x is None else format(x, fmt)


def _kind(v: VictimScore) -> str:
    if v.slo_victim:
        return "slo"
    if not _degraded(v):
        return "below"
    return "within" if v.incidents or not v.ordinary else "ordin."


def render(results: Sequence[LiveResult], summary: dict[str, Any]) -> str:
    """The per-victim table and the summary, as ``cotenant bench --live`` prints them."""
    lines = [
        f"{'scenario':48s} {'victim':10s} {'truth':24s} {'kind':6s} inc  cov  prem "
        f"{'first':24s} {'final':24s} to-cause"
    ]
    for r in results:
        for v in r.victims:
            lines.append(
                f"{r.name[:48]:48s} {v.victim[:10]:10s} {v.truth[:24]:24s} "
                f"{_kind(v):6s} {v.incidents:3d} "
                f"{_f(v.coverage):>4s} {v.premature:4d} {(v.first_cause or 'none')[:24]:24s} "
                f"{(v.final_cause or 'none')[:24]:24s} {_f(v.time_to_cause_s, '.0f'):>5s} s"
            )
        if not r.victims:
            lines.append(
                f"{r.name[:48]:48s} (no fault victims)  false incidents: {r.false_incidents}"
            )
    s = summary
    lines += [
        "",
        f"SLO victims {s['slo_victims']}: exactly one incident {_f(s['one_incident'])}, "
        f"coverage of breach windows {_f(s['coverage'])}, premature resolutions "
        f"{s['premature_resolutions']}, first-published AC@1 {_f(s['first_ac1'])}, "
        f"final AC@1 {_f(s['final_ac1'])}, median time to the right cause "
        f"{_f(s['median_time_to_cause_s'], '.0f')} s",
        f"within-SLO victims {s['within_slo_victims']}: found {_f(s['within_found'])}, "
        f"attributed {_f(s['within_attributed'])}, found or kept as ordinary contention "
        f"{_f(s['within_recorded'])}; below the bar ({GOAL_RATIO:g}x, {GOAL_MARGIN_MS:g} ms, "
        f"{GOAL_S:g} s, {GOAL_RATE_RPS:g} req/s) {s['below_the_bar']} "
        f"(found {_f(s['below_found'])})",
        f"false incidents per simulated hour: {_f(s['false_per_hour'])} overall, "
        f"{_f(s['false_per_hour_controls'])} on fault-free controls",
        f"live loop: {_f(s['cpu_ms_per_pass'], '.0f')} ms of CPU per pass",
    ]
    return "\n".join(lines)
