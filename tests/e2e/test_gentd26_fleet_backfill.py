"""A GenTD26 import backfilled into a real Prometheus (``cotenant import-gentd26 --openmetrics``
then ``promtool tsdb create-blocks-from openmetrics``): the fleet's reads of the week
(:class:`collectors.prometheus.week.PromQLWeekRollups`) give what the store's give."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from promserver import PROMETHEUS, needs_prometheus, start_prometheus

from cotenant.cli.main import main
from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.collectors.prometheus.week import PromQLWeekRollups
from cotenant.core.slos import SloTable
from cotenant.core.week_reads import GpuThresholds
from cotenant.reports.isoweek import parse_week
from cotenant.store.db import Store
from cotenant.store.week_rollups import StoreWeekRollups
from tests.evaluation.test_gentd26_import import IDLE, A, B, small_trace

pytestmark = needs_prometheus

PROMTOOL = str(Path(PROMETHEUS).with_name("promtool"))
WEEK = parse_week("2022-W36")
TH = GpuThresholds(sm=32.0, dram=0.9, pcie_bps=2e10, memory_full=0.95, throttle_bits=0xEC)

Both = tuple[StoreWeekRollups, PromQLWeekRollups]


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Both]:
    tmp = tmp_path_factory.mktemp("gentd26-fleet")
    db, om = tmp / "g.duckdb", tmp / "g.om"
    argv = [
        "import-gentd26",
        str(small_trace(tmp / "t")),
        "--store",
        str(db),
        "--openmetrics",
        str(om),
    ]
    assert main(argv) == 0
    r = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp / "blocks")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    store = Store(db, read_only=True)
    # the trace's clock is 2022: keep the blocks past the default 15-day retention
    retention = ("--storage.tsdb.retention.time=100y",)
    with start_prometheus(tmp / "prom", [], blocks=tmp / "blocks", extra_args=retention) as prom:
        source = PrometheusSource(prom.url, 30.0)
        try:
            yield StoreWeekRollups(store), PromQLWeekRollups(source)
        finally:
            source.close()
            store.close()


def test_requests_minutes_and_load_waits_agree(both: Both) -> None:
    embedded, fleet = both
    lo, hi = WEEK.start_ns, WEEK.end_ns
    slos = SloTable({"sd-pool-b": 20_000.0}, default=0.0)
    want = embedded.model_weeks(lo, hi, slos)
    assert want["sd-pool-b"]["requests"] == 5 and want["sd-pool-b"]["met"] == 4
    assert fleet.model_weeks(lo, hi, slos) == want
    waits = embedded.load_wait_weeks(lo, hi)
    got = fleet.load_wait_weeks(lo, hi)
    assert [w["model"] for w in got] == [w["model"] for w in waits] == ["sd-pool-b", "sd-pool-a"]
    for w, g in zip(waits, got, strict=True):
        for k in ("requests", "latency_ms", "wait_ms"):
            assert g[k] == pytest.approx(w[k]), (k, w, g)


def test_gpu_hours_and_tenants_agree(both: Both) -> None:
    embedded, fleet = both
    want = embedded.gpu_weeks(WEEK.start_ns, WEEK.end_ns, TH)
    got = fleet.gpu_weeks(WEEK.start_ns, WEEK.end_ns, TH)
    assert [r["gpu"] for r in got] == [r["gpu"] for r in want] == sorted([A, B, IDLE])
    for w, g in zip(want, got, strict=True):
        for k in ("hours_sampled", "sm_h", "memory_full_h", "cotenancy_h"):
            assert g[k] == pytest.approx(w[k]), (k, w, g)
        assert (g["models"], g["processes"]) == (list(w["models"]), list(w["processes"]))
    # duty cycles 30..35 %: the steps at 32 % and more count as SM-saturated at this threshold
    assert {r["gpu"]: r["sm_h"] > 0 for r in want} == {A: True, B: True, IDLE: True}
    # the GPU-telemetry-only container serves no model: its process is a tenant of its own
    assert next(r for r in want if r["gpu"] == IDLE)["processes"] == [IDLE]
