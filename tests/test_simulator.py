"""The simulator engine: calibration, physics of each sharing mode, faults, counters, truth."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cotenant.core.phases import PHASE_COLUMNS
from cotenant.simulator.calibration import calibrate
from cotenant.simulator.engine import Simulation
from cotenant.simulator.output import run, truth
from cotenant.simulator.scenario import (
    CLOCK_REASON_BITS,
    GPU_TYPES,
    Arrival,
    Batching,
    Fault,
    Gpu,
    Kernel,
    Lock,
    Model,
    Process,
    Scenario,
    Transfer,
)

TRACE = (
    Path(__file__).resolve().parent.parent
    / "cotenant"
    / "simulator"
    / "traces"
    / "azure-llm-inference-2023"
    / "AzureLLMInferenceTrace_code.csv"
)


def victim(**kw: object) -> Model:
    base = Model(
        name="tts",
        gpu="gpu0",
        arrival=Arrival("poisson", rate_rps=50),
        kernel=Kernel(base_ms=5, per_item_ms=1, sm_demand=0.3, dram_demand=0.3, memory_bound=0.5),
        batching=Batching(4, 2),
        preprocess_ms=1,
        locks=(Lock("tokenizer", 0.2),),
        transfer=Transfer(0.5, 0.5),
        memory_gib=4,
        slo_p99_ms=50,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def heavy(**kw: object) -> Model:
    base = Model(
        name="sdxl",
        gpu="gpu0",
        arrival=Arrival("closed", concurrency=1, think_ms=0),
        kernel=Kernel(base_ms=200, sm_demand=0.9, dram_demand=0.7, memory_bound=0.4),
        memory_gib=20,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def scenario(
    *models: Model,
    sharing: str = "timeslice",
    faults: tuple[Fault, ...] = (),
    processes: tuple[Process, ...] = (),
    duration: float = 120.0,
    host_cpus: int = 8,
) -> Scenario:
    return Scenario(
        name="t",
        seed=3,
        duration_s=duration,
        gpus=(Gpu("gpu0", GPU_TYPES["h100-sxm"], sharing),),  # type: ignore[arg-type]
        models=models,
        processes=processes,
        faults=faults,
        host_cpus=host_cpus,
    )


def simulate(s: Scenario) -> tuple[dict[str, np.ndarray], Simulation]:
    sim = Simulation(s)
    sim.run()
    cols = sim.take_requests()
    out = {k: np.asarray(v) for k, v in cols.items()}
    out["t_end_s"] = (out["ts_end_ns"] - sim.start_ns) / 1e9
    return out, sim


def window(r: dict[str, np.ndarray], model: str, lo: float, hi: float) -> np.ndarray:
    return (r["model"] == model) & (r["t_end_s"] >= lo) & (r["t_end_s"] < hi)


def test_calibration_reproduces_published_mps_colocation_within_15_percent() -> None:
    for p in calibrate(duration_s=30.0):
        assert p.simulated_alone_ms == pytest.approx(p.published_alone_ms, rel=0.02)
        assert abs(p.error) <= 0.15, p


def test_runs_are_deterministic_and_phases_sum_to_latency() -> None:
    s = scenario(victim(), heavy())
    a = run(s).requests
    b = run(s).requests
    assert a.equals(b)
    lat = a.column("latency_ms").to_numpy()
    total = sum(a.column(c).to_numpy() for c in PHASE_COLUMNS)
    assert np.allclose(total, lat, atol=1e-6)
    assert a.num_rows > 5000
    assert set(a.column("model").to_pylist()) == {"tts", "sdxl"}


def test_paced_runs_match_one_run_with_faults_in_flight() -> None:
    """Streaming advances the engine in small steps; rows and counters must not depend on the
    steps, even while faults start, re-arm (the lock hog) and end between them."""
    faults = (
        Fault("lock_hog", 5, 10, lock="tokenizer", holder="sdxl", hold_ms=20),
        Fault("cpu_hog", 8, 10, target="etl", cores=6),
        Fault("throttle", 12, 6, gpu="gpu0", clock_factor=0.5),
        Fault("process_active", 20, 8, target="train"),
    )
    procs = (Process("etl", pid=4001), Process("train", gpu="gpu0", sm_demand=0.5, pid=4002))
    s = scenario(victim(), heavy(), faults=faults, processes=procs, duration=40)
    whole = Simulation(s)
    whole.run()
    paced = Simulation(s)
    cols: dict[str, list[object]] = {}
    for step in np.arange(0.37, 40.5, 0.37):
        paced.run_until(float(step))
        for k, v in paced.take_requests().items():
            cols.setdefault(k, []).extend(v)
    assert cols == whole.take_requests()
    assert paced.take_samples() == whole.take_samples()
    assert any(name == "sdxl" for name in cols["lock_holder"])


@pytest.mark.parametrize(
    ("sharing", "inflated"), [("timeslice", True), ("mps", True), ("mig", False)]
)
def test_cotenant_inflates_compute_except_under_mig(sharing: str, inflated: bool) -> None:
    alone, _ = simulate(scenario(victim(), sharing=sharing))
    shared, _ = simulate(scenario(victim(), heavy(), sharing=sharing))
    a = np.median(alone["compute_ms"][alone["model"] == "tts"])
    b = np.median(shared["compute_ms"][shared["model"] == "tts"])
    if inflated:
        assert b > 1.3 * a
    else:
        assert b == pytest.approx(a, rel=0.01)


def test_throttle_stretches_kernels_and_sets_clock_reasons() -> None:
    f = Fault("throttle", 40, 40, gpu="gpu0", clock_factor=0.5, reason="hw_thermal")
    r, sim = simulate(scenario(victim(), faults=(f,)))
    before = np.median(r["compute_ms"][window(r, "tts", 5, 35)])
    during = np.median(r["compute_ms"][window(r, "tts", 45, 75)])
    assert during == pytest.approx(2 * before, rel=0.15)
    gpu, _ = sim.take_samples()
    t = np.array([(x[0] - sim.start_ns) / 1e9 for x in gpu])
    reasons = np.array([x[16] for x in gpu])
    clocks = np.array([x[14] for x in gpu])
    inside = (t > 41) & (t < 80)
    assert np.all(reasons[inside] & CLOCK_REASON_BITS["hw_thermal"])
    assert not np.any(reasons[t < 39] & CLOCK_REASON_BITS["hw_thermal"])
    assert np.all(clocks[inside] == pytest.approx(GPU_TYPES["h100-sxm"].max_sm_clock_mhz / 2))


def test_lock_hog_shows_as_lock_wait_with_the_holder() -> None:
    f = Fault("lock_hog", 40, 30, lock="tokenizer", holder="chat", hold_ms=30)
    r, _ = simulate(scenario(victim(), faults=(f,)))
    during = window(r, "tts", 45, 70)
    assert np.mean(r["lock_wait_ms"][during]) > 5
    assert np.mean(r["lock_wait_ms"][window(r, "tts", 5, 35)]) < 0.5
    assert "chat" in set(r["lock_holder"][during].tolist())
    assert set(r["lock_name"][during & (r["lock_wait_ms"] > 1)].tolist()) == {"tokenizer"}


def test_cpu_hog_grows_preprocess_time() -> None:
    f = Fault("cpu_hog", 40, 30, target="etl", cores=8)
    r, _ = simulate(
        scenario(
            victim(preprocess_ms=15), faults=(f,), processes=(Process("etl", pid=9),), host_cpus=9
        )
    )
    assert np.mean(r["preprocess_ms"][window(r, "tts", 45, 70)]) > 1.5 * np.mean(
        r["preprocess_ms"][window(r, "tts", 5, 35)]
    )


def test_load_surge_grows_queueing_without_slower_kernels() -> None:
    f = Fault("load_surge", 40, 30, target="tts", factor=4)
    r, _ = simulate(scenario(victim(arrival=Arrival("poisson", rate_rps=120)), faults=(f,)))
    before, during = window(r, "tts", 5, 35), window(r, "tts", 45, 70)
    assert np.sum(during) > 3 * np.sum(before) * 25 / 30
    assert np.percentile(r["queue_ms"][during], 99) > 2 * np.percentile(r["queue_ms"][before], 99)
    per_item_before = np.mean(r["compute_ms"][before] / r["batch_size"][before])
    per_item_during = np.mean(r["compute_ms"][during] / r["batch_size"][during])
    assert per_item_during <= per_item_before * 1.05


def test_pcie_hog_slows_transfers() -> None:
    p = Process("copy-loop", gpu="gpu0", pid=7)
    f = Fault("bandwidth_hog", 40, 30, target="copy-loop", resource="pcie", level=0.95)
    r, sim = simulate(scenario(victim(transfer=Transfer(20, 20)), faults=(f,), processes=(p,)))
    assert np.mean(r["h2d_ms"][window(r, "tts", 45, 70)]) > 5 * np.mean(
        r["h2d_ms"][window(r, "tts", 5, 35)]
    )
    gpu, _ = sim.take_samples()
    rx = {round((x[0] - sim.start_ns) / 1e9): x[7] for x in gpu}
    assert rx[50] > 0.9 * GPU_TYPES["h100-sxm"].pcie_gbps * 1e9


def test_memory_pressure_makes_kv_models_recompute() -> None:
    chat = victim(name="chat", kv_cache_gib=40, memory_gib=30, locks=())
    f = Fault("memory_pressure", 40, 30, target="chat", gib=30)
    r, sim = simulate(scenario(chat, faults=(f,)))
    assert np.mean(r["compute_ms"][window(r, "chat", 45, 70)]) > 1.3 * np.mean(
        r["compute_ms"][window(r, "chat", 5, 35)]
    )
    _, procs = sim.take_samples()
    mem = {round((x[0] - sim.start_ns) / 1e9): x[8] for x in procs if x[4] == "chat"}
    assert mem[50] - mem[20] == 30 * 1024**3


def test_counters_follow_the_work() -> None:
    # a closed loop: 10 ms kernel, 10 ms think -> the GPU is busy half the time
    m = heavy(
        arrival=Arrival("closed", concurrency=1, think_ms=10),
        kernel=Kernel(base_ms=10, sm_demand=1.0, dram_demand=0.5),
    )
    p = Process("train", gpu="gpu0", sm_demand=0.5, pid=4242)
    f = Fault("process_active", 30, 20, target="train")
    _, sim = simulate(scenario(m, processes=(p,), faults=(f,), duration=60))
    gpu, procs = sim.take_samples()
    sm = {round((x[0] - sim.start_ns) / 1e9): x[3] for x in gpu}
    assert sm[10] == pytest.approx(50, abs=3)
    assert sm[40] == pytest.approx(100, abs=1)  # the training job fills the gaps
    train = {round((x[0] - sim.start_ns) / 1e9): x[6] for x in procs if x[3] == 4242}
    assert min(train[t] for t in range(32, 50)) > 20
    assert all(t < 30 or t > 51 for t in train if train[t] == 0) or 10 not in train


def test_truth_names_victims_by_counterfactual_and_skips_unnoticeable_faults() -> None:
    faults = (
        Fault("cotenant_burst", 30, 30, target="sdxl", factor=40),
        Fault("throttle", 80, 20, gpu="gpu0", clock_factor=0.97),  # too small to notice
    )
    # rare alone (0.05 rps, under 1 % busy), then a burst keeps the GPU busy about 30 %
    sd = heavy(arrival=Arrival("poisson", rate_rps=0.05), kernel=Kernel(base_ms=150, sm_demand=0.9))
    s = scenario(victim(), sd, faults=faults, duration=110)
    rows = truth(s, run(s))
    assert rows[0]["kind"] == "cotenant" and rows[0]["culprit"] == "sdxl"
    assert rows[0]["victims"] == ["tts"]
    assert rows[1]["kind"] == "throttle" and rows[1]["victims"] == []


def test_trace_replay_keeps_the_real_rate_and_tokens() -> None:
    chat = victim(name="chat", locks=(), arrival=Arrival("trace", file=str(TRACE), scale=1.0))
    r, _ = simulate(scenario(chat, duration=600))
    rate = np.sum(r["model"] == "chat") / 600
    assert 1.0 < rate < 5.0  # the code trace: 8,818 requests in about an hour
    assert np.all(r["prompt_tokens"] > 0) and np.all(r["output_tokens"] >= 0)


def test_a_model_load_blocks_its_replica_and_books_the_wait_as_other() -> None:
    """Adapter churn: no batch of the target launches during a load; the wait behind it is
    ``other`` (a model.load span), the rest of the wait stays ``queue``; the neighbour is
    untouched."""
    import numpy as np

    from cotenant.simulator.output import run
    from cotenant.simulator.scenario_load import load_scenario

    s = load_scenario("cotenant/simulator/scenarios/model-load-lora-churn-slows-sdxl.yaml")
    out = run(s)
    t = out.requests.to_pandas()
    t0 = t["ts_start_ns"].min()
    t["start_s"] = (t["ts_start_ns"] - t0) / 1e9
    sdxl, embed = t[t["model"] == "sdxl"], t[t["model"] == "embed"]
    outside = sdxl[(sdxl["start_s"] < 230) | (sdxl["start_s"] > 370)]
    inside = sdxl[(sdxl["start_s"] >= 240) & (sdxl["start_s"] < 356)]
    assert outside["other_ms"].max() < 1.0
    # a request arriving just as a load starts waits about the whole 4 s for it
    assert inside["other_ms"].max() > 3500 and inside["other_ms"].mean() > 200
    assert np.allclose(
        t[[c for c in t.columns if c.endswith("_ms") and c != "latency_ms"]].sum(axis=1),
        t["latency_ms"],
    )
    assert embed["other_ms"].max() < 1.0
