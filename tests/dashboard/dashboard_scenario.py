"""A store filled by a simulated scenario with a known fault, with its incidents diagnosed.

The bundled ``process-active-training-job-slows-chat-mps`` scenario: ``chat`` and ``embed``
share ``gpu0`` (MPS) with ``train-job``, a non-model process that emits no spans; from 180 s to
330 s the job runs and slows ``chat`` (truth: cotenant, culprit train-job). The store holds the
whole run (raw rows and rollups); incidents are diagnosed up to :attr:`Filled.now_ns`, inside
the fault, so the chat incident is still open there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from cotenant.analysis.diagnose import diagnose
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.timerange import TimeRange
from cotenant.simulator import output
from cotenant.simulator.scenario_load import find_scenario, load_scenario
from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance
from cotenant.store.source import StoreSource

SCENARIO = "process-active-training-job-slows-chat-mps"
VICTIM = "chat"
CULPRIT = "train-job"
NOW_S = 240.0
"""Virtual seconds into the run that the service's clock stands at: inside the fault, and
late enough that ``embed``'s slowdown within its SLO has lasted ``degradation_s`` (30 s)
and is a degradation."""


@dataclass(frozen=True)
class Filled:
    path: Path
    start_ns: int
    now_ns: int
    slo_ms: dict[str, float]


def fill(path: Path, start_ns: int | None = None) -> Filled:
    s = load_scenario(find_scenario(SCENARIO))
    if start_ns is None:  # the run ends a little before the wall clock
        start_ns = time.time_ns() - int(s.duration_s * 1e9) - 60_000_000_000
    start_ns -= start_ns % 1_000_000_000
    sim = output.run(s, start_ns=start_ns)
    now_ns = start_ns + int(NOW_S * 1e9)
    with Store(path) as store:
        with store.cursor() as cur:
            for name, table in (
                ("requests", sim.requests),
                ("gpu_samples", sim.gpu_samples),
                ("process_samples", sim.process_samples),
            ):
                cur.register("_t", table)
                cur.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _t")
                cur.unregister("_t")
        Maintenance(store).refresh_rollups()
        book = IncidentBook(store)
        src = StoreSource(store)
        for m in s.models:
            diags = diagnose(src, m.name, TimeRange(start_ns, now_ns), slo_ms=m.slo_p99_ms)
            for gpu in {d.gpu for d in diags}:
                mine = [d for d in diags if d.gpu == gpu]
                book.update(mine, m.name, gpu, start_ns, now_ns)
    return Filled(path, start_ns, now_ns, {m.name: m.slo_p99_ms for m in s.models if m.slo_p99_ms})
