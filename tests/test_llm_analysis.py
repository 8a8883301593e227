"""TTFT / TPOT indicators and the ``mix`` cause, on LLM scenarios run through the simulator,
the store and the analysis (diagnose, the incident book, the live loop, the API's filter)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pytest

from cotenant.analysis.analyzer import Analyzer
from cotenant.analysis.diagnose import Diagnosis, diagnose
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.loop import AnalysisLoop
from cotenant.analysis.pass_reads import PassReads
from cotenant.core.errors import QueryError
from cotenant.core.slos import Slos
from cotenant.core.timerange import TimeRange
from cotenant.evaluation.accuracy import load_outputs
from cotenant.simulator import output
from cotenant.simulator.scenario import (
    GPU_TYPES,
    Arrival,
    Batching,
    Fault,
    Gpu,
    Kernel,
    Llm,
    Model,
    Process,
    Scenario,
)
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

START = 1_767_225_600_000_000_000
S = 1_000_000_000

CHAT = Model(
    name="chat",
    gpu="gpu0",
    arrival=Arrival("poisson", rate_rps=8),
    kernel=Kernel(base_ms=4, per_item_ms=0.5, sm_demand=0.5, dram_demand=0.3, memory_bound=0.3),
    batching=Batching(8, 2),
    llm=Llm(15, 9, 0.02, 256, prompt_tokens=1000, output_tokens=200),
)
EMBED = Model(
    name="embed",
    gpu="gpu0",
    arrival=Arrival("poisson", rate_rps=60),
    kernel=Kernel(base_ms=3, per_item_ms=0.3, sm_demand=0.2, dram_demand=0.2, memory_bound=0.3),
    batching=Batching(32, 4),
    slo_p99_ms=40,
)
TRAIN = Process("train-job", "gpu0", sm_demand=0.8, dram_demand=0.2)


def scenario(*faults: Fault) -> Scenario:
    return Scenario(
        name="llm",
        seed=43,
        duration_s=390,
        gpus=(Gpu("gpu0", GPU_TYPES["h100-sxm"], "mps"),),
        models=(CHAT, EMBED),
        processes=(TRAIN,),
        faults=faults,
    )


SHIFT = scenario(Fault("length_shift", 240, 120, target="chat", factor=3.0))
DECODE = scenario(
    Fault("process_active", 240, 120, target="train-job"),
    Fault("length_shift", 240, 120, target="chat", factor=0.6),
)


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, tuple[Store, output.SimOutput]]]:
    out = {}
    for name, s in (("shift", SHIFT), ("decode", DECODE)):
        sim = output.run(s, start_ns=START)
        out[name] = (load_outputs(sim), sim)
    yield out
    for store, _ in out.values():
        store.close()


def _diags(store: Store, s: Scenario, **kw: Any) -> list[Diagnosis]:
    src = StoreSource(store)
    rng = TimeRange(START, START + int(s.duration_s * S))
    return [d for m in s.models for d in diagnose(src, m.name, rng, slo_ms=m.slo_p99_ms, **kw)]


def test_token_windows_hold_ttft_and_tpot_quantiles_of_the_requests(runs: Any) -> None:
    store, sim = runs["shift"]
    src = StoreSource(store)
    t = src.token_windows(TimeRange(START + 60 * S, START + 120 * S), 60.0, lengths=True)
    assert t.column("model").to_pylist() == ["chat"]  # embed carries no token counts
    r = sim.requests
    end = r.column("ts_end_ns").to_numpy()
    sel = (end >= START + 60 * S) & (end < START + 120 * S)
    sel &= np.asarray([m == "chat" for m in r.column("model").to_pylist()])
    lat = r.column("latency_ms").to_numpy()[sel]
    ttft = np.asarray(r.column("ttft_ms").to_pylist(), dtype=float)[sel]
    out = np.asarray(r.column("output_tokens").to_pylist(), dtype=float)[sel]
    tpot = ((lat - ttft) / (out - 1))[out > 1]
    row = t.to_pylist()[0]
    assert row["count"] == sel.sum()
    assert row["ttft_p99_ms"] == pytest.approx(np.percentile(ttft, 99), rel=1e-6)
    assert row["tpot_p99_ms"] == pytest.approx(np.percentile(tpot, 99), rel=1e-6)
    assert row["output_tokens_mean"] == pytest.approx(out.mean())
    assert row["output_tokens_p99"] == pytest.approx(np.percentile(out, 99))
    plain = src.token_windows(TimeRange(START + 60 * S, START + 120 * S), 60.0)
    assert plain.column("output_tokens_p99").to_pylist() == [None]  # only when asked for


def test_tpot_falls_back_to_compute_per_output_token_without_ttft() -> None:
    with Store(":memory:") as store:
        with store.cursor() as cur:
            cur.execute(
                "INSERT INTO requests (ts_start_ns, ts_end_ns, latency_ms, model, gpu, "
                "compute_ms, output_tokens, prompt_tokens) VALUES "
                f"({START}, {START + S // 2}, 500, 'chat', 'gpu0', 400, 100, 10)"
            )
        t = StoreSource(store).token_windows(TimeRange(START, START + S), 1.0)
        assert t.column("tpot_p99_ms").to_pylist() == [pytest.approx(4.0)]
        assert t.column("ttft_p99_ms").to_pylist() == [None]


def test_longer_answers_without_contention_are_a_mix_change_not_a_cotenant(runs: Any) -> None:
    store, _ = runs["shift"]
    diags = _diags(store, SHIFT)
    e2e = [d for d in diags if d.model == "chat" and d.indicator == "e2e"]
    assert e2e, "the e2e slowdown is detected"
    for d in e2e:
        assert d.top is not None and (d.top.kind, d.top.culprit) == ("mix", "chat")
        ev = d.top.evidence
        assert ev["output_tokens"]["during"]["mean"] > 2 * ev["output_tokens"]["before"]["mean"]
        assert ev["tpot_ms"]["during"] < 1.2 * ev["tpot_ms"]["before"]
    named = {c.culprit for d in diags for c in d.causes if c.kind != "unknown"}
    assert named <= {"chat"}  # embed, the busy neighbour, is blamed nowhere


def test_decode_contention_with_flat_e2e_is_found_on_tpot_and_names_the_job(runs: Any) -> None:
    store, _ = runs["decode"]
    diags = [d for d in _diags(store, DECODE) if d.model == "chat"]
    tpot = [d for d in diags if d.indicator == "tpot"]
    assert [d.indicator for d in diags if d.indicator == "e2e"] == []  # e2e stayed in range
    assert len(tpot) == 1
    d = tpot[0]
    assert d.top is not None and (d.top.kind, d.top.culprit) == ("cotenant", "train-job")
    assert 235 * S <= d.start_ns - START <= 260 * S
    assert d.peak_p99_ms > 1.3 * d.baseline_p99_ms
    assert d.to_dict()["indicator"] == "tpot"


def test_a_tpot_slo_makes_the_decode_slowdown_a_breach(runs: Any) -> None:
    store, _ = runs["decode"]
    slos = {"tpot": 12.0, "ttft": None}
    [d] = [x for x in _diags(store, DECODE, slos=slos) if x.indicator == "tpot"]
    assert (d.severity, d.slo_ms) == ("breach", 12.0)


def test_the_live_loop_keeps_one_incident_per_indicator_and_the_filter_finds_it(
    runs: Any,
) -> None:
    store, _ = runs["decode"]
    book = IncidentBook(store)
    loop = AnalysisLoop(
        StoreSource(store),
        book,
        slos=Slos.of_maps({"embed": 40}, tpot={"chat": 12.0}),
        horizon_s=300,
        clock_ns=lambda: START + 380 * S,
    )
    loop.run_once()
    tpot = book.find(model="chat", indicator="tpot")
    assert len(tpot) == 1 and tpot[0].indicator == "tpot" and tpot[0].severity == "breach"
    assert tpot[0].top is not None and tpot[0].top.culprit == "train-job"
    assert book.find(model="chat", indicator="e2e") == []
    analyzer = Analyzer(StoreSource(store), book)
    assert [i["indicator"] for i in analyzer.incidents(indicator="tpot")] == ["tpot"]
    with pytest.raises(QueryError, match="indicator 'p50'"):
        analyzer.incidents(indicator="p50")
    # a second pass continues the same incidents instead of opening others
    loop.run_once()
    assert len(book.find(model="chat", indicator="tpot")) == 1


def test_batched_pass_reads_give_each_gpu_its_token_windows_from_one_read(runs: Any) -> None:
    store, _ = runs["decode"]
    src = StoreSource(store)
    rng = TimeRange(START + 160 * S, START + 380 * S)
    gpus = sorted(
        {str(g) for g in pc.unique(src.token_windows(rng, 1.0).column("gpu")).to_pylist()}
    )
    reads = PassReads(src)
    for lengths in (False, True):
        for g in gpus:
            assert reads.token_windows(rng, 1.0, g, lengths=lengths).equals(
                src.token_windows(rng, 1.0, g, lengths=lengths)
            )
    assert gpus and reads.reads == 2  # one fleet-wide read with, one without token lengths


def test_models_without_token_counts_keep_e2e_only(runs: Any) -> None:
    store, _ = runs["decode"]
    src = StoreSource(store)
    rng = TimeRange(START + 210 * S, START + 390 * S)
    diags = diagnose(src, "embed", rng, on_demand=True, slos={"tpot": 1.0, "ttft": 1.0})
    assert diags and {d.indicator for d in diags} == {"e2e"}
    t = src.token_windows(TimeRange(START, START + 390 * S), 1.0)
    assert "embed" not in set(pc.unique(t.column("model")).to_pylist())


def test_the_mix_share_is_zero_when_token_counts_do_not_change(runs: Any) -> None:
    from cotenant.analysis.mix import mix_excess

    n = 120
    tok = {
        "count": np.full(n, 10.0),
        "output_tokens_mean": np.full(n, 200.0),
        "prompt_tokens_mean": np.full(n, 1000.0),
        "tpot_mean_ms": np.full(n, 10.0),
        "ttft_mean_ms": np.full(n, 40.0),
        "output_tokens_p99": np.full(n, 600.0),
        "prompt_tokens_p99": np.full(n, 3000.0),
    }
    before = np.arange(n) < 60
    assert mix_excess(tok, "e2e", before, ~before) is None
    longer = replace_out(tok, 60, 600.0)
    got = mix_excess(longer, "e2e", before, ~before)
    assert got is not None and got.ms == pytest.approx(10.0 * 400)
    assert mix_excess(longer, "tpot", before, ~before) is None


def test_without_a_ttft_the_token_costs_come_from_the_baseline_not_from_a_decode_time() -> None:
    """Reproduction of dev 78: an embedding replaying a trace carried its output tokens (up
    20 %) while a co-tenant's DRAM hog slowed it 2x; a "time per output token" of compute over
    output tokens made the longer answers explain half its excess, and ``mix`` was named first.
    Its compute follows its prompt alone: the baseline's own regression says so."""
    from cotenant.analysis.mix import mix_excess

    rng = np.random.default_rng(7)
    n = 240
    prompt = rng.lognormal(np.log(1000.0), 0.3, n)
    output = rng.lognormal(np.log(200.0), 0.3, n)
    compute = 0.002 * prompt + rng.normal(0.0, 0.05, n)
    tok = {
        "count": np.full(n, 20.0),
        "output_tokens_mean": output,
        "prompt_tokens_mean": prompt,
        "tpot_mean_ms": compute / output,  # the store's fallback without a TTFT
        "ttft_mean_ms": np.full(n, np.nan),
        "output_tokens_p99": 3 * output,
        "prompt_tokens_p99": 3 * prompt,
    }
    before = np.arange(n) < 120
    longer = dict(tok, output_tokens_mean=np.where(before, output, 1.5 * output))
    got = mix_excess(longer, "e2e", before, ~before, compute)
    assert got is None or got.ms < 0.05 * 0.002 * 1000  # answers cost an embedding nothing
    heavier = dict(tok, prompt_tokens_mean=np.where(before, prompt, 2.0 * prompt))
    got = mix_excess(heavier, "e2e", before, ~before, compute)
    assert got is not None
    assert got.ms == pytest.approx(0.002 * 1000, rel=0.25)  # its slope times the prompts' move
    assert got.evidence["compute_ms_per_prompt_token"] == pytest.approx(0.002, rel=0.2)
    assert mix_excess(heavier, "e2e", before, ~before) is None  # no compute series: no guess


def replace_out(tok: dict[str, np.ndarray], start: int, value: float) -> dict[str, np.ndarray]:
    out = dict(tok)
    x = tok["output_tokens_mean"].copy()
    x[start:] = value
    out["output_tokens_mean"] = x
    return out


def test_the_dashboard_shows_ttft_and_tpot_for_the_llm_incident_and_overview(runs: Any) -> None:
    from cotenant.dashboard.app import create_app
    from cotenant.dashboard.data import DashboardData

    store, _ = runs["decode"]
    book = IncidentBook(store)
    AnalysisLoop(
        StoreSource(store), book, horizon_s=300, clock_ns=lambda: START + 380 * S
    ).run_once()
    [inc] = book.find(model="chat", indicator="tpot")
    data = DashboardData(
        store, book=book, clock_ns=lambda: START + 390 * S, slos=Slos.of_maps(tpot={"chat": 12})
    )
    client = create_app(data).server.test_client()
    graphs = ("latency", "tokens", "phases", "causes", "evidence")
    out = "inc-summary.children..." + "...".join(f"inc-{g}-box.children" for g in graphs)
    body = {
        "output": f"..{out}...inc-actions.children...inc-drill.children..",
        "outputs": [
            dict(zip(("id", "property"), o.rsplit(".", 1), strict=True))
            for o in [*out.split("..."), "inc-actions.children", "inc-drill.children"]
        ],
        "inputs": [{"id": "inc-params", "property": "data", "value": {"id": inc.id}}],
        "changedPropIds": ["inc-params.data"],
        "state": [],
    }
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200, r.text
    got = r.get_json()["response"]
    assert "time per token p99 peak" in str(got["inc-summary"])
    tokens = got["inc-tokens-box"]["children"]
    fig = tokens[1]["props"]["figure"]
    assert {t["name"] for t in fig["data"]} == {"chat TTFT p99", "chat TPOT p99"}
    assert any(a["text"] == "chat TPOT SLO" for a in fig["layout"]["annotations"])
    ov = {
        "output": "ov-tokens-box.children",
        "outputs": {"id": "ov-tokens-box", "property": "children"},
        "inputs": [
            {"id": "ov-params", "property": "data", "value": {"range": "5m"}},
            {"id": "shell-tick", "property": "n_intervals", "value": None},
        ],
        "changedPropIds": ["ov-params.data"],
        "state": [],
    }
    r = client.post("/_dash-update-component", json=ov)
    assert r.status_code == 200, r.text
    assert "chat TPOT p99" in r.text and "embed" not in r.text


def test_the_weekly_report_gives_ttft_and_tpot_slo_attainment(runs: Any) -> None:
    from cotenant.reports.compute import ReportBuilder
    from cotenant.reports.isoweek import week_of
    from cotenant.reports.markdown import render_markdown
    from cotenant.store.maintenance import Maintenance

    store, sim = runs["decode"]
    m = Maintenance(store, clock_ns=lambda: START + 460 * S)
    m.recover()
    m.refresh_rollups()
    slos = Slos.of_maps(tpot={"chat": 12.0}, ttft={"chat": 10_000.0})
    s = ReportBuilder(store, slos=slos).build(week_of(START))
    [chat] = [m for m in s.models if m.model == "chat"]
    [embed] = [m for m in s.models if m.model == "embed"]
    assert (chat.tpot_slo_ms, chat.ttft_slo_ms, embed.tpot_slo_ms) == (12.0, 10_000.0, None)
    assert chat.ttft_attainment == 1.0
    # the training job ran over 2 of the 7 minutes: their per-token p99 is over 12 ms
    r = sim.requests
    end = (r.column("ts_end_ns").to_numpy() - START) // (60 * S)
    chat_rows = np.asarray([m == "chat" for m in r.column("model").to_pylist()])
    ttft = np.asarray(r.column("ttft_ms").to_pylist(), dtype=float)
    out = np.asarray(r.column("output_tokens").to_pylist(), dtype=float)
    tpot = (r.column("latency_ms").to_numpy() - ttft) / (out - 1)
    ok = chat_rows & (out > 1)
    minutes = sorted(set(end[ok].tolist()))
    met = [np.percentile(tpot[ok & (end == mn)], 99) <= 12.0 for mn in minutes]
    assert chat.tpot_attainment == pytest.approx(sum(met) / len(minutes))
    assert 0 < chat.tpot_attainment < 1
    md = render_markdown(s)
    got = f"{100 * chat.tpot_attainment:.1f}%"
    assert f"| chat | 10,000.0 ms | 100.0% | 12 ms/token | {got} |" in md


def test_ingest_histograms_of_ttft_and_tpot_count_only_requests_with_tokens(runs: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from cotenant.collectors.ingest_metrics import IngestMetrics

    _, sim = runs["decode"]
    reg = CollectorRegistry()
    m = IngestMetrics(reg)
    m.tokens.observe_requests(sim.requests)
    text = generate_latest(reg).decode()
    r = sim.requests
    chat = np.asarray([x == "chat" for x in r.column("model").to_pylist()])
    out = np.asarray(r.column("output_tokens").to_pylist(), dtype=float)
    n_ttft, n_tpot = int(chat.sum()), int((chat & (out > 1)).sum())
    assert (
        f'cotenant_time_to_first_token_seconds_count{{gpu="gpu0",model="chat"}} {n_ttft}.0' in text
    )
    assert (
        f'cotenant_time_per_output_token_seconds_count{{gpu="gpu0",model="chat"}} {n_tpot}.0'
        in text
    )
    assert 'model="embed"' not in text.split("cotenant_time_to_first_token_seconds")[-1]
