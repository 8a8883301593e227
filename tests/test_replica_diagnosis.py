"""Diagnosis names the slow replica and shows its siblings as evidence the model is fine."""

from __future__ import annotations

import pytest

from cotenant.analysis.diagnose import diagnose
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.loop import AnalysisLoop
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
    [sib] = d.siblings
    assert (sib["replica"], sib["gpu"], sib["fine"]) == ("chat-gpu1", "gpu1", True)
    assert sib["p99_ms"] < 75 and sib["p99_ms"] <= 1.2 * sib["baseline_p99_ms"]
    assert any("chat-gpu1 on gpu1" in n and "the model itself is fine" in n for n in d.notes)
    assert d.to_dict()["replica"] == "chat-gpu0" and d.to_dict()["siblings"] == [sib]


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
    assert inc.detail["siblings"][0]["replica"] == "chat-gpu1"
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
