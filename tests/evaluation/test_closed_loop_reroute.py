"""The closed loop moves a victim's traffic to a quiet replica, and takes it back when the
other replica cannot carry it (simulated, virtual time, the real analysis and control loops)."""

from __future__ import annotations

from cotenant.evaluation.actuation_score import score
from cotenant.evaluation.closed_loop import run_closed_loop
from cotenant.simulator.scenario_load import find_scenario, load_scenario


def test_a_process_culprit_is_answered_by_moving_traffic_to_the_quiet_replica() -> None:
    s = load_scenario(find_scenario("actuate_reroute"))
    run = run_closed_loop(s, until_s=200)
    [a] = [a for a in run.actions if a["before"] is not None]
    assert (a["kind"], a["target"], a["state"]) == ("reroute", "chat", "verified")
    assert a["params"]["from"] == "chat-gpu0" and a["params"]["to"] == {"chat-gpu1": "gpu1"}
    weights = [c.after["weights"] for c in run.changes if c.op == "apply"]
    assert weights[-1] == {"chat-gpu0": 0, "chat-gpu1": 256}
    assert run.admission["chat"]["rejected_total"] == 0  # nothing refused: only moved
    sc = score(run)
    assert sc.rerouted and sc.recover_from_diagnosis_s is not None
    assert sc.recover_from_diagnosis_s <= 60
    assert sc.others_over_slo_s == {"embed": 0.0}


def test_a_reroute_that_overloads_the_other_replica_is_rolled_back() -> None:
    s = load_scenario(find_scenario("actuate_reroute_overload"))
    run = run_closed_loop(s, until_s=180)
    [a] = [a for a in run.actions if a["before"] is not None]
    assert a["kind"] == "reroute"
    if a["state"] == "rolled_back":
        assert "over its 45 ms SLO" in a["reason"]
        assert [c.op for c in run.changes] == ["apply", "revert"]
        assert run.changes[-1].after["weights"] == {"chat-gpu0": 1, "chat-gpu1": 1}
    else:
        # found within seconds of the training job's start, the first step (a quarter of
        # chat's traffic left on gpu0) was verified with every model on gpu1 under its SLO;
        # the step that would overload gpu1 was never taken
        assert a["state"] == "verified" and a["params"]["step"] == 0
        v = a["params"]["verification"]
        assert v["p99_on_gpu1_ms"]["chat"] <= 45.0 and v["p99_on_gpu1_ms"]["rerank"] <= 35.0
        assert [c.op for c in run.changes] == ["apply"]
        assert run.changes[-1].after["weights"] == {"chat-gpu0": 64, "chat-gpu1": 192}
    assert score(run).others_over_slo_s == {"rerank": 0.0}
