"""The simulator backend and the closed loop: changes act on the running simulation, and the
real analysis and control loops recover a victim, roll back a change that cannot help and let
a change expire once the culprit has stopped by itself."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from cotenant.actuators.backend import Backend, Change
from cotenant.core.errors import BackendError, ScenarioError, UsageError
from cotenant.evaluation.actuation_score import rolling_p99, score
from cotenant.evaluation.closed_loop import START_NS, run_closed_loop
from cotenant.evaluation.sim_backend import SimulatorBackend
from cotenant.simulator.admission import VirtualTokenBucket
from cotenant.simulator.engine import Simulation
from cotenant.simulator.output import requests_table
from cotenant.simulator.scenario_load import find_scenario, load_scenario, parse_scenario


def _sim_with(
    name: str, change: Change | None, at_s: float, until_s: float
) -> tuple[Simulation, SimulatorBackend, pa.Table]:
    s = load_scenario(find_scenario(name))
    sim = Simulation(s, start_ns=START_NS)
    backend = SimulatorBackend(sim)
    sim.run_until(at_s)
    parts = [requests_table(sim, sim.take_requests())]
    if change is not None:
        backend.apply(change)
    sim.run_until(until_s)
    parts.append(requests_table(sim, sim.take_requests()))
    return sim, backend, pa.concat_tables(parts)


def _p99(t: pa.Table, model: str, lo_s: float, hi_s: float) -> float:
    end = (t.column("ts_end_ns").to_numpy() - START_NS) / 1e9
    mine = np.asarray(t.column("model").to_pylist(), dtype=object) == model
    lat = t.column("latency_ms").to_numpy()[mine & (end >= lo_s) & (end < hi_s)]
    return float(np.percentile(lat, 99))


# --- the simulator backend ------------------------------------------------------------------


def test_rate_limit_mid_run_brings_the_victim_back_and_counts_refusals() -> None:
    limit = Change("rate_limit", "embed", {"rate_rps": 20.0, "burst": 20})
    _, _, without = _sim_with("actuate_cotenant", None, 150, 190)
    sim, backend, with_limit = _sim_with("actuate_cotenant", limit, 150, 190)
    assert _p99(without, "rerank", 160, 190) > 50  # the flood breaches rerank's SLO
    assert _p99(with_limit, "rerank", 160, 190) < 50  # the limit restores it
    assert _p99(with_limit, "rerank", 120, 150) > 50  # before the change: still slow
    state = sim.controls.admission("embed")
    assert state["rejected_total"] > 1000 and state["admitted_total"] > 0
    assert backend.current("embed")["rate_rps"] == 20.0
    (event,) = backend.log
    assert (event.op, event.t_s, event.before["rate_rps"]) == ("apply", 150.0, None)
    after = backend.revert("embed", event.before)
    assert after["rate_rps"] is None and backend.log[-1].op == "revert"


def test_lower_culprit_priority_gives_the_victim_more_of_the_gpu() -> None:
    # vLLM semantics: a higher number is served later
    demote = Change("priority", "sdxl", {"priority": 4})
    _, _, without = _sim_with("actuate_cannot_help", None, 130, 200)
    _, backend, demoted = _sim_with("actuate_cannot_help", demote, 130, 200)
    assert _p99(demoted, "tts", 150, 200) < 0.5 * _p99(without, "tts", 150, 200)
    assert backend.current("sdxl")["priority"] == 4
    sdxl = demoted.filter(pc.equal(demoted["model"], "sdxl"))
    # rows carry the simulator's priority (higher gets more): 1 before, -4 after
    assert set(sdxl["priority"].to_pylist()) == {1, -4}


def test_bounded_wait_defers_requests_into_their_queue_phase() -> None:
    wait = Change("rate_limit", "embed", {"rate_rps": 100.0, "burst": 1, "max_wait_s": 0.05})
    sim, _, t = _sim_with("actuate_cotenant", wait, 150, 170)
    state = sim.controls.admission("embed")
    assert state["deferred_total"] > 0 and state["rejected_total"] > 0
    end = (t.column("ts_end_ns").to_numpy() - START_NS) / 1e9
    embed = np.asarray(t.column("model").to_pylist(), dtype=object) == "embed"
    sel = embed & (end > 155)
    phases = [
        "queue_ms",
        "lock_wait_ms",
        "preprocess_ms",
        "h2d_ms",
        "compute_ms",
        "d2h_ms",
        "postprocess_ms",
        "other_ms",
    ]
    total = sum(t.column(c).to_numpy()[sel] for c in phases)
    assert np.allclose(total, t.column("latency_ms").to_numpy()[sel])
    assert float(np.median(t.column("queue_ms").to_numpy()[sel])) > 5.0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (Change("rate_limit", "nope", {"rate_rps": 1.0, "burst": 1}), "no model 'nope'"),
        (Change("rate_limit", "embed", {"rate_rps": 0, "burst": 1}), "rate_rps: bad value 0"),
        (Change("rate_limit", "embed", {"rate_rps": 5.0, "burst": 1.5}), "burst: bad value 1.5"),
        (Change("priority", "embed", {"priority": "high"}), "priority: bad value 'high'"),
        (Change("scale", "embed", {}), "unknown change kind 'scale'"),  # type: ignore[arg-type]
    ],
)
def test_bad_change_is_refused_and_changes_nothing(change: Change, says: str) -> None:
    sim = Simulation(load_scenario(find_scenario("actuate_cotenant")), start_ns=START_NS)
    backend = SimulatorBackend(sim)
    before = backend.current("embed")
    with pytest.raises(BackendError, match=says):
        backend.apply(change)
    assert backend.current("embed") == before and backend.log == []


def test_token_bucket_admits_its_burst_then_its_rate() -> None:
    bucket = VirtualTokenBucket(10.0, 5)
    at_once = [bucket.admit(0.0) for _ in range(8)]
    assert at_once == [0.0] * 5 + [None] * 3  # the burst, then refusals (no wait allowed)
    assert [bucket.admit(0.35) for _ in range(4)] == [0.0] * 3 + [None]  # 3.5 tokens back
    waiting = VirtualTokenBucket(10.0, 1, max_wait_s=0.25)
    assert [waiting.admit(0.0) for _ in range(4)] == pytest.approx([0.0, 0.1, 0.2, None])
    with pytest.raises(UsageError, match="burst 0"):
        VirtualTokenBucket(1.0, 0)


def test_backend_is_a_backend_and_names_unknown_targets() -> None:
    sim = Simulation(load_scenario(find_scenario("actuate_cotenant")), start_ns=START_NS)
    backend: Backend = SimulatorBackend(sim)
    assert backend.name == "simulator"
    assert backend.current("rerank") == {
        "rate_rps": None,
        "burst": None,
        "max_wait_s": None,
        "priority": 0,
    }
    with pytest.raises(BackendError, match="no model 'ghost'"):
        backend.current("ghost")


@pytest.mark.parametrize(
    ("loop", "says"),
    [
        ({"expect": "win"}, "loop.expect: bad value 'win'"),
        ({"ttl_s": 0}, "loop.ttl_s: bad value 0"),
        ({"ttl": 5}, "loop.ttl: unknown key; allowed: cooldown_s, expect, settle_s, ttl_s"),
    ],
)
def test_scenario_loop_section_is_validated(loop: dict[str, object], says: str) -> None:
    doc = yaml.safe_load(find_scenario("actuate_cotenant").read_text())
    doc["loop"] = loop
    with pytest.raises(ScenarioError, match=re.escape(says)):
        parse_scenario(doc, Path("."), source="x.yaml")


# --- the closed loop ------------------------------------------------------------------------


def test_closed_loop_recovers_the_victim_of_a_bandwidth_culprit() -> None:
    s = load_scenario(find_scenario("actuate_bandwidth"))
    run = run_closed_loop(s, until_s=200)
    applied = [a for a in run.actions if a["target"] == "vecsearch" and a["before"] is not None]
    assert applied and applied[0]["kind"] == "rate_limit"
    assert applied[0]["state"] == "verified"
    t_apply = min(c.t_s for c in run.changes if c.op == "apply")
    assert 120 < t_apply < 150
    assert _p99(run.requests, "decode", 120, max(t_apply, 125) + 1) > 75  # slow before it
    assert _p99(run.requests, "decode", t_apply + 10, 200) < 75  # back under its SLO after
    assert run.admission["vecsearch"]["rejected_total"] > 0
    sc = score(run)
    assert sc.recover_from_diagnosis_s is not None and sc.recover_from_diagnosis_s <= 60


def test_closed_loop_rolls_back_a_change_that_cannot_help() -> None:
    s = load_scenario(find_scenario("actuate_cannot_help"))
    run = run_closed_loop(s, until_s=190)
    states = {a["state"] for a in run.actions if a["target"] == "sdxl" and a["before"]}
    assert "rolled_back" in states
    rolled = next(a for a in run.actions if a["state"] == "rolled_back")
    assert "did not help" in rolled["reason"]
    assert [c.op for c in run.changes if c.target == "sdxl"][:2] == ["apply", "revert"]
    assert run.admission["sdxl"]["rate_rps"] is None  # the limit is gone again


def test_closed_loop_change_expires_after_the_culprit_stops_by_itself() -> None:
    s = load_scenario(find_scenario("actuate_stops_by_itself"))
    run = run_closed_loop(s, until_s=330)
    expired = [a for a in run.actions if a["state"] == "expired" and a["before"] is not None]
    assert expired and "ttl_s=150" in expired[0]["reason"]
    revert = next(c for c in run.changes if c.op == "revert")
    assert revert.t_s > 220  # after the job ended by itself
    ts, p99 = rolling_p99(run.requests, "decode", run.start_ns, 330)
    after = p99[(ts > revert.t_s + 10) & np.isfinite(p99)]
    assert len(after) > 20 and (after <= 75).all()  # it stays inside its SLO without the limit


def test_bench_actuate_names_a_scenario_it_cannot_use(capsys: pytest.CaptureFixture[str]) -> None:
    from cotenant.cli.main import main

    assert main(["bench", "--actuate", "no-such-scenario"]) == 2
    assert "no such file or bundled scenario" in capsys.readouterr().err
    control = find_scenario("control-mig-training-isolated")
    assert main(["bench", "--actuate", str(control)]) == 2
    assert "no fault to act on" in capsys.readouterr().err
