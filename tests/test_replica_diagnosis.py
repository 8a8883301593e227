"""Diagnosis names the slow replica and shows its siblings as evidence the model is fine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cotenant.analysis.diagnose import diagnose
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.loop import AnalysisLoop
from cotenant.analysis.replicas import FINE, WORST, listed_siblings, summarise
from cotenant.core.slos import Slos
from cotenant.core.timerange import TimeRange
from cotenant.evaluation.accuracy import load_outputs
from cotenant.simulator.output import run
from cotenant.simulator.scenario_load import find_scenario, load_scenario
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

S = 10**9


@pytest.fixture(scope="module")
def reroute_store() -> Store:
    """actuate_reroute: train-job on gpu0 from 120 s to 420 s slows chat-gpu0 only."""
    return load_outputs(run(load_scenario(find_scenario("actuate_reroute")), start_ns=0))


def test_the_store_source_names_each_models_replica_per_gpu(reroute_store: Store) -> None:
    names = StoreSource(reroute_store).replicas(TimeRange(0, 480 * S))
    assert names == {("chat", "gpu0"): "chat-gpu0", ("chat", "gpu1"): "chat-gpu1"}


def test_diagnosis_names_the_slow_replica_and_its_healthy_sibling(reroute_store: Store) -> None:
    diags = diagnose(StoreSource(reroute_store), "chat", TimeRange(0, 480 * S), slo_ms=75.0)
    slow = [d for d in diags if d.incident and d.severity == "breach"]
    assert slow and {d.gpu for d in slow} == {"gpu0"}
    d = slow[0]
    assert 115 * S <= d.start_ns <= 135 * S
    assert (d.causes[0].kind, d.causes[0].culprit) == ("cotenant", "train-job")
    assert d.replica == "chat-gpu0"
    assert (d.siblings["count"], d.siblings["fine"], d.siblings["omitted"]) == (1, 1, 0)
    [sib] = d.siblings["listed"]
    assert (sib["replica"], sib["gpu"], sib["fine"]) == ("chat-gpu1", "gpu1", True)
    assert sib["p99_ms"] < 75 and sib["p99_ms"] <= 1.2 * sib["baseline_p99_ms"]
    assert d.siblings["p99_ms"]["median"] == sib["p99_ms"]
    assert any("chat-gpu1 on gpu1" in n and "the model itself is fine" in n for n in d.notes)
    assert d.to_dict()["replica"] == "chat-gpu0" and d.to_dict()["siblings"] == d.siblings


def test_the_live_loop_stores_the_replica_on_the_incident(reroute_store: Store) -> None:
    with reroute_store.cursor() as cur:
        cur.execute("DELETE FROM incidents")
    book = IncidentBook(reroute_store)
    now = [0]
    loop = AnalysisLoop(
        StoreSource(reroute_store),
        book,
        slos=Slos.of_maps({"chat": 75.0, "embed": 50.0}),
        horizon_s=120,
        clock_ns=lambda: now[0],
    )
    for t in range(150, 200, 5):
        now[0] = t * S
        loop.run_once()
    [inc] = [i for i in book.find() if i.model == "chat"]
    assert (inc.gpu, inc.replica, inc.state) == ("gpu0", "chat-gpu0", "open")
    assert inc.to_dict()["replica"] == "chat-gpu0"
    assert inc.told.siblings["listed"][0]["replica"] == "chat-gpu1"
    [again] = [i for i in IncidentBook(reroute_store).find() if i.model == "chat"]
    assert again.replica == "chat-gpu0"  # read back from the incidents.replica column


def test_the_report_and_the_incident_page_show_the_replica(reroute_store: Store) -> None:
    from cotenant.dashboard.pages.incident import _summary
    from cotenant.reports.compute import ReportBuilder
    from cotenant.reports.html import render_html
    from cotenant.reports.isoweek import week_of
    from cotenant.reports.markdown import render_markdown

    test_the_live_loop_stores_the_replica_on_the_incident(reroute_store)
    summary = ReportBuilder(reroute_store, slos=Slos.of_maps({"chat": 75.0})).build(
        week_of(150 * S)
    )
    [worst] = [i for i in summary.worst if i.model == "chat"]
    assert (worst.gpu, worst.replica) == ("gpu0", "chat-gpu0")
    assert "chat on gpu0 (replica chat-gpu0)" in render_markdown(summary)
    assert "gpu0 (chat-gpu0)" in render_html(summary)
    [inc] = [i for i in IncidentBook(reroute_store).find() if i.model == "chat"]
    assert "on gpu0 (replica chat-gpu0)" in str(_summary(inc))


def _pool_scenario(path: Path, n: int) -> Path:
    """chat on ``n`` replicas, one per GPU, 5 req/s each; a training job slows gpu0 (after the
    detector's 3-minute warm-up)."""
    scenario = {
        "version": 1,
        "name": "pool",
        "seed": 7,
        "duration_s": 300,
        "gpus": [{"id": f"gpu{i}", "type": "h100-sxm", "sharing": "mps"} for i in range(n)],
        "models": [
            {
                "name": "chat",
                "slo_p99_ms": 75,
                "routing": "weighted",
                "replicas": [
                    {"name": f"chat-{i}", "gpu": f"gpu{i}", "weight": 1} for i in range(n)
                ],
                "arrival": {"kind": "poisson", "rate_rps": 5.0 * n},
                "batching": {"max_batch": 16, "max_wait_ms": 3},
                "kernel": {
                    "base_ms": 30,
                    "per_item_ms": 1,
                    "sm_demand": 0.6,
                    "dram_demand": 0.8,
                    "memory_bound": 0.8,
                },
                "memory_gib": 16,
            }
        ],
        "processes": [{"name": "train-job", "gpu": "gpu0", "sm_demand": 0.95, "dram_demand": 0.9}],
        "faults": [
            {"kind": "process_active", "target": "train-job", "start_s": 190, "duration_s": 100}
        ],
    }
    path.write_text(yaml.safe_dump(scenario))
    return path


@pytest.mark.timeout(300)
def test_a_105_replica_pool_diagnosis_stays_readable(tmp_path: Path) -> None:
    """104 siblings are summarised, not listed: the diagnosis JSON stays under 8 KB."""
    store = load_outputs(
        run(load_scenario(_pool_scenario(tmp_path / "pool.yaml", 105)), start_ns=0)
    )
    diags = diagnose(StoreSource(store), "chat", TimeRange(0, 300 * S), slo_ms=75.0)
    [d] = [d for d in diags if d.incident and d.gpu == "gpu0"]
    sibs = d.siblings
    assert (sibs["count"], sibs["fine"]) == (104, 104)
    assert len(sibs["listed"]) == WORST + FINE and sibs["omitted"] == 104 - WORST - FINE
    assert sibs["p99_ms"]["p10"] <= sibs["p99_ms"]["median"] <= sibs["p99_ms"]["p90"] < 75
    note = next(n for n in d.notes if "sibling replicas" in n)
    assert "104 of its 104 sibling replicas are fine" in note and len(note) < 600
    size = len(json.dumps(d.to_dict()))
    assert size < 8 * 1024, size


def _sib(gpu: str, p99: float, base: float, fine: bool) -> dict[str, Any]:
    return {
        "replica": f"r-{gpu}",
        "gpu": gpu,
        "p99_ms": p99,
        "baseline_p99_ms": base,
        "slo_ms": 75.0,
        "rate_rps": 5.0,
        "fine": fine,
    }


def test_the_summary_lists_the_slowest_and_the_fastest_fine_siblings() -> None:
    fine = [_sib(f"f{i}", 30.0 + i, 30.0, True) for i in range(20)]
    slow = [
        _sib("s1", 90.0, 30.0, False),
        _sib("s2", 60.0, 20.0, False),
        _sib("s3", 80.0, 40.0, False),
        _sib("s4", 70.0, 50.0, False),
    ]
    out = summarise(fine + slow)
    assert (out["count"], out["fine"], out["omitted"]) == (24, 20, 24 - WORST - FINE)
    # slowest by p99 over its baseline: 3.0x, 3.0x, 2.0x (not the 1.4x one)
    assert [s["gpu"] for s in out["listed"][:WORST]] == ["s1", "s2", "s3"]
    assert [s["gpu"] for s in out["listed"][WORST:]] == ["f0", "f1", "f2", "f3", "f4"]
    assert out["p99_ms"]["max"] == 90.0
    few = summarise(slow[:2])
    assert few["listed"] == slow[:2] and few["omitted"] == 0
    assert summarise([]) == {}
    # stored incidents of either form give reroute the siblings listed
    assert listed_siblings(out) == out["listed"] and listed_siblings(slow) == slow
    assert listed_siblings(None) == []
