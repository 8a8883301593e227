"""Run the whole control loop on a simulated scenario, in virtual time.

The simulation advances in ticks; after each tick its completed requests and counter samples
are written to an in-memory store, as the collectors would write them. On the simulation's
clock the real :class:`analysis.loop.AnalysisLoop` diagnoses and writes incidents every
``analysis_interval_s``, and the real :class:`actuators.controller.ActionController` steps
every ``[actuators] interval_s`` — proposing, applying (through
:class:`evaluation.sim_backend.SimulatorBackend`, so a change acts on the running
simulation from that virtual instant), verifying, rolling back and expiring actions.

:func:`run_closed_loop` returns everything the benchmark scores
(:mod:`evaluation.actuation_score`): the requests served, the changes the backend made, the
actions, the incidents' detection times and the admission counts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from cotenant.actuators.controller import ActionController
from cotenant.actuators.policy import Policy, load_policy
from cotenant.actuators.settings import ActuatorSettings
from cotenant.analysis.incident_record import IncidentEvent
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.loop import AnalysisLoop
from cotenant.core.cause_kinds import CauseKind
from cotenant.evaluation.sim_backend import BackendEvent, SimulatorBackend
from cotenant.simulator.engine import Simulation
from cotenant.simulator.output import requests_table, samples_tables
from cotenant.simulator.scenario import Scenario
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

START_NS = 1_767_225_600_000_000_000
"""Wall-clock nanoseconds of virtual time 0 (as :mod:`evaluation.accuracy` uses)."""


@dataclass(frozen=True)
class Detection:
    """An incident the analysis loop opened: when (loop time), for whom, and its top cause."""

    at_ns: int
    incident_id: str
    model: str
    kind: str
    culprit: str


@dataclass
class ClosedLoopRun:
    scenario: Scenario
    start_ns: int
    settings: ActuatorSettings
    requests: pa.Table
    changes: list[BackendEvent]
    actions: list[dict[str, Any]]
    detections: list[Detection]
    admission: dict[str, dict[str, Any]]
    rejected_s: dict[str, np.ndarray]  # model -> virtual times of refused requests
    offered_s: dict[str, np.ndarray]  # model -> virtual times of its open-loop arrivals
    wall_s: float
    passes: dict[str, int] = field(default_factory=dict)


def loop_settings(s: Scenario, base: ActuatorSettings | None = None) -> ActuatorSettings:
    """``base`` (default: the configuration's defaults) in ``auto`` mode, with the scenario's
    ``loop`` overrides (ttl_s, settle_s, cooldown_s)."""
    out = replace(base or ActuatorSettings(), mode="auto")
    a = s.actuation
    for name in ("ttl_s", "settle_s", "cooldown_s"):
        value = getattr(a, name)
        if value is not None:
            out = replace(out, **{name: value})
    return out


def run_closed_loop(
    s: Scenario,
    *,
    settings: ActuatorSettings | None = None,
    policy: Policy | None = None,
    analysis_interval_s: float = 5.0,
    horizon_s: float = 300.0,
    tick_s: float = 5.0,
    start_ns: int = START_NS,
    until_s: float | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> ClosedLoopRun:
    """Simulate ``s`` with the analysis loop and the control loop acting on it (``auto``
    mode; ``settings`` default to the configuration's defaults with the scenario's ``loop``
    overrides). ``until_s``: stop early (virtual seconds). Raises what the simulator, the
    policy loader or the store raise (all :class:`store.errors.CotenantError`)."""
    t_wall = time.perf_counter()
    cfg = settings if settings is not None else loop_settings(s)
    pol = policy if policy is not None else load_policy()
    sim = Simulation(s, start_ns=start_ns)
    store = Store(":memory:")
    source = StoreSource(store)
    book = IncidentBook(store)
    slo = {m.name: m.slo_p99_ms for m in s.models if m.slo_p99_ms is not None}

    def clock() -> int:
        return start_ns + round(sim.t * 1e9)

    detections: list[Detection] = []

    def on_incident(e: IncidentEvent) -> None:
        if e.kind == "opened":  # published with its cause (not while diagnosing)
            inc = e.incident
            top = inc.top
            detections.append(
                Detection(
                    clock(),
                    inc.id,
                    inc.model,
                    str(top.kind) if top is not None else CauseKind.UNKNOWN.value,
                    top.culprit if top is not None else "",
                )
            )

    analysis = AnalysisLoop(
        source,
        book,
        slos=s.slos(),
        interval_s=analysis_interval_s,
        horizon_s=horizon_s,
        clock_ns=clock,
        on_incident=on_incident,
    )
    backend = SimulatorBackend(sim)
    controller = ActionController(
        settings=cfg,
        policy=pol,
        incidents=book,
        source=source,
        backend=backend,
        store=store,
        clock_ns=clock,
        slo_ms=slo,
    )
    end = s.duration_s if until_s is None else min(s.duration_s, until_s)
    t = 0.0
    next_analysis = analysis_interval_s
    next_control = cfg.interval_s
    tables: list[pa.Table] = []
    try:
        while t < end - 1e-9:
            t = min(end, t + tick_s)
            sim.run_until(t)
            reqs = sim.take_requests()
            table = requests_table(sim, reqs)
            tables.append(table)
            gpu, proc = samples_tables(sim.take_samples())
            _insert(store, table, gpu, proc)
            if t + 1e-9 >= next_analysis:
                analysis.run_once()
                next_analysis += analysis_interval_s
            if t + 1e-9 >= next_control:
                controller.step(clock())
                next_control += cfg.interval_s
            if int(t) % 60 == 0 and abs(t - round(t)) < 1e-9:
                progress(f"{s.name}: {t:.0f}/{end:.0f} s simulated")
        actions = controller.list_actions(limit=10_000)
    finally:
        store.close()
    names = [m.name for m in s.models]
    return ClosedLoopRun(
        scenario=s,
        start_ns=start_ns,
        settings=cfg,
        requests=pa.concat_tables(tables) if tables else requests_table(sim, sim.take_requests()),
        changes=list(backend.log),
        actions=actions,
        detections=detections,
        admission={n: sim.controls.admission(n) for n in names},
        rejected_s={n: np.asarray(sim.controls.rejected_times(n)) for n in names},
        offered_s={n: sim.controls.arrival_times(n) for n in names},
        wall_s=time.perf_counter() - t_wall,
        passes={"analysis": analysis.passes, "control": controller.passes},
    )


def _insert(store: Store, reqs: pa.Table, gpu: pa.Table, proc: pa.Table) -> None:
    append_tables(store, {"requests": reqs, "gpu_samples": gpu, "process_samples": proc})
