"""A simulated fortnight in a real DuckDB store file: week 2026-W47 with one fault, week
2026-W48 with four known faults, incidents found by cotenant's own analysis, and actions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cotenant.reports.backfill import backfill_incidents
from cotenant.reports.isoweek import parse_week
from cotenant.simulator.week import (
    TruthFault,
    WeekFault,
    WeekGpu,
    WeekModel,
    WeekProcess,
    WeekSpec,
    simulate_week,
    write_week,
)
from cotenant.store.db import Store

WEEK = parse_week("2026-W48")
PREV = parse_week("2026-W47")
DAY = 86_400.0
HOUR = 3_600.0
MODELS = (
    WeekModel("chat", "gpu-0", 20, compute_ms=30, slo_ms=150, sm_util=25),
    WeekModel("embed", "gpu-0", 40, compute_ms=5, slo_ms=40, sm_util=15),
    WeekModel("tts", "gpu-1", 10, compute_ms=20, slo_ms=100, sm_util=20),
    WeekModel("rerank", "gpu-1", 15, compute_ms=8, slo_ms=50, sm_util=10),
)
SLO = {m.name: float(m.slo_ms or 0) for m in MODELS}
W = 7 * DAY  # W48 starts one week after the spec's start
FAULTS = (
    # last week: one co-tenant burst
    WeekFault("cotenant_burst", 2 * DAY + 10 * HOUR, HOUR, target="embed", factor=4),
    # this week
    WeekFault("cotenant_burst", W + DAY + 10 * HOUR, HOUR, target="embed", factor=4),
    WeekFault("process_active", W + 2 * DAY + 14 * HOUR, 1.5 * HOUR, target="train-job", level=0.7),
    WeekFault("bandwidth_hog", W + 3 * DAY + 9 * HOUR, HOUR, target="memcopy", level=0.8),
    WeekFault("throttle", W + 4 * DAY + 3 * HOUR, 0.75 * HOUR, gpu="gpu-1", clock_factor=0.6),
)


@dataclass
class Fortnight:
    path: Path
    truth: list[TruthFault]  # faults of WEEK only

    def open(self) -> Store:
        return Store(self.path, read_only=True)


@pytest.fixture(scope="package")
def fortnight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fortnight]:
    spec = WeekSpec(
        start_ns=PREV.start_ns,
        days=14,
        gpus=(WeekGpu("gpu-0"), WeekGpu("gpu-1")),
        models=MODELS,
        processes=(
            WeekProcess("train-job", "gpu-1", memory_gib=20),
            WeekProcess("memcopy", "gpu-0", memory_gib=2),
        ),
        faults=FAULTS,
        seed=7,
    )
    week = simulate_week(spec)
    path = tmp_path_factory.mktemp("fortnight") / "cotenant.duckdb"
    store = Store(path)
    try:
        write_week(store, week)
        backfill_incidents(store, PREV.start_ns, WEEK.end_ns, slo_ms=SLO)
        _actions(store)
    finally:
        store.close()
    yield Fortnight(path, [t for t in week.truth if t.start_ns >= WEEK.start_ns])


def _actions(store: Store) -> None:
    """Two actions this week, as the control loop records them: one that held after it was
    applied, one rolled back; one proposal last week."""
    with store.cursor() as cur:
        inc = cur.execute(
            "SELECT id, model, start_ns FROM incidents WHERE model = 'chat' AND start_ns >= ? "
            "ORDER BY start_ns",
            [WEEK.start_ns],
        ).fetchall()
        lo = WEEK.start_ns
        rows = []
        for n, (iid, _, start) in enumerate(inc[:2]):
            created = start + 5 * 60 * 10**9
            state = "verified" if n == 0 else "rolled_back"
            # the control loop's own measurement where it verified; the rollups otherwise
            verification = {"victim_p99_before_ms": 180.0, "victim_p99_after_ms": 80.0}
            params = {"rate_rps": 30, **({"verification": verification} if n == 0 else {})}
            rows.append(
                (
                    f"act-{n}",
                    iid,
                    "rate_limit",
                    "embed",
                    "gateway",
                    state,
                    created,
                    created + 600 * 10**9,
                    json.dumps(params),
                    "{}",
                    "{}",
                    "test",
                )
            )
            cur.execute(
                "INSERT INTO audit VALUES (?, 'control-loop', ?, 'applied', '{}')",
                [created + 10**9, f"act-{n}"],
            )
        cur.execute("INSERT INTO audit VALUES (?, 'control-loop', 'act-1', 'held', '{}')", [lo])
        rows.append(
            (
                "act-old",
                None,
                "notify",
                "embed",
                "gateway",
                "proposed",
                PREV.start_ns + 10**12,
                PREV.start_ns + 10**12,
                "{}",
                "{}",
                "{}",
                "test",
            )
        )
        cur.executemany(f"INSERT INTO actions VALUES ({', '.join('?' * 12)})", rows)
