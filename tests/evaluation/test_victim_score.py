"""Strict scoring per victim: found but wrong, duplicates, false incidents on controls and
outside faults, AC@k over victims, and exact intervals on known counts; then one drawn
scenario through both paths."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from cotenant.core.errors import UsageError
from cotenant.evaluation.intervals import poisson_rate, proportion
from cotenant.evaluation.live import Seen, found_from_events
from cotenant.evaluation.population_bench import Job, run_job
from cotenant.evaluation.population_summary import render, summarize
from cotenant.evaluation.victim_score import Found, Requests, ScenarioScore, score_scenario
from cotenant.simulator.scenario import GPU_TYPES, Arrival, Gpu, Kernel, Model, Scenario

T0 = 1_767_225_600_000_000_000
S = 1_000_000_000


def _scenario(duration_s: float = 600.0) -> Scenario:
    def model(name: str) -> Model:
        return Model(name, "gpu0", Arrival("poisson", rate_rps=2.0), Kernel(base_ms=10))

    return Scenario(
        name="two-models",
        seed=1,
        duration_s=duration_s,
        gpus=(Gpu("gpu0", GPU_TYPES["l4"]),),
        models=(model("tts"), model("sdxl")),
    )


def _truth(
    fault: str = "cotenant_burst", kind: str = "cotenant", victims: tuple[str, ...] = ("tts",)
) -> dict[str, Any]:
    return {
        "fault": fault,
        "kind": kind,
        "culprit": "sdxl",
        "start_s": 300.0,
        "end_s": 420.0,
        "victims": list(victims),
        "p99": {v: {"p99_ms": 30.0, "p99_without_ms": 20.0} for v in victims},
    }


def _requests(*models: str, rate: float = 2.0, duration_s: float = 600.0) -> Requests:
    n = int(rate * duration_s)
    ends = T0 + (np.arange(n) * (S / rate)).astype(np.int64)
    return Requests(
        np.asarray([m for m in models for _ in range(n)], dtype=object),
        np.concatenate([ends for _ in models]),
        np.full(n * len(models), 20.0),
    )


def _inc(
    model: str, start_s: float, end_s: float, *causes: str, detected_s: float | None = None
) -> Found:
    det = start_s if detected_s is None else detected_s
    return Found(
        model,
        T0 + int(start_s * S),
        T0 + int(end_s * S),
        T0 + int(det * S),
        causes,
        causes,
        "degradation",
    )


def _score(
    found: list[Found], truth: list[dict[str, Any]] | None = None, kind: str = "faulted"
) -> ScenarioScore:
    truth = [_truth()] if truth is None else truth
    return score_scenario(
        _scenario(), truth, found, _requests("tts", "sdxl"), T0, path="batch", kind=kind
    )


def test_a_victim_found_with_the_wrong_cause_counts_as_found_but_wrong() -> None:
    r = _score([_inc("tts", 310, 400, "throttle:gpu0", "cotenant:sdxl")])
    (v,) = r.victims
    assert v.found and not v.right_first and not v.right_final
    assert (v.final_rank, v.first_cause) == (2, "throttle:gpu0")
    s = summarize([r])["all_victims"]
    assert (s["found"]["k"], s["ac1"]["k"], s["ac3"]["k"], s["found_wrong_cause"]) == (1, 0, 1, 1)


def test_an_incident_on_another_model_does_not_find_the_victim() -> None:
    r = _score([_inc("sdxl", 300, 420, "cotenant:sdxl")])
    (v,) = r.victims
    assert not v.found and v.delay_s is None
    assert (r.bystander_incidents, r.false_incidents) == (1, 0)


def test_a_second_incident_on_the_same_victim_is_a_duplicate_and_the_first_decides() -> None:
    r = _score(
        [
            _inc("tts", 360, 420, "cotenant:sdxl", detected_s=365),
            _inc("tts", 320, 350, "throttle:gpu0", detected_s=330),
        ]
    )
    (v,) = r.victims
    assert (v.incidents, v.duplicates, v.delay_s) == (2, 1, 30.0)
    assert not v.right_final  # its incident is the first detected, which named nothing right
    s = summarize([r])["all_victims"]
    assert (s["duplicates"], s["one_incident"]["k"], s["one_incident"]["n"]) == (1, 0, 1)


def test_incidents_of_a_control_and_outside_faults_are_false_per_model_hour() -> None:
    control = score_scenario(
        _scenario(),
        [],
        [_inc("tts", 100, 130, "cotenant:sdxl")],
        _requests("tts"),
        T0,
        path="live",
        kind="control",
    )
    assert (control.false_incidents, control.model_hours_outside) == (1, 2 * 600 / 3600)
    faulted = _score([_inc("tts", 100, 130, "x:y"), _inc("tts", 425, 440, "x:y")])
    # the fault's window ends 10 s (settle time) after it: 425 s is inside, 100 s is not
    assert faulted.false_incidents == 1
    assert math.isclose(faulted.model_hours_outside, 2 * (600 - 130) / 3600)
    f = summarize([control, faulted])
    assert f["false_controls"]["incidents"] == 1
    assert f["false_controls"]["per_model_hour"]["estimate"] == pytest.approx(3.0)
    assert f["false_faulted_outside"]["incidents"] == 1


def test_ac_at_k_is_over_victims_not_faults() -> None:
    r = _score(
        [_inc("tts", 310, 400, "cotenant:sdxl"), _inc("sdxl", 310, 400, "throttle:gpu0")],
        [_truth(fault="throttle", kind="throttle", victims=("tts", "sdxl")) | {"culprit": "gpu0"}],
    )
    s = summarize([r])["all_victims"]
    # one fault, two victims: only sdxl's incident names the throttle
    assert (s["victims"], s["ac1"]["k"], s["found"]["k"]) == (2, 1, 2)


def test_a_neighbour_of_a_surge_is_slowed_by_a_cotenant_and_the_target_by_its_load() -> None:
    truth = _truth(fault="load_surge", kind="load", victims=("tts", "sdxl"))
    r = _score(
        [_inc("tts", 310, 400, "cotenant:sdxl"), _inc("sdxl", 310, 400, "load:sdxl")], [truth]
    )
    assert {v.victim: (v.truth, v.right_final) for v in r.victims} == {
        "tts": ("cotenant:sdxl", True),
        "sdxl": ("load:sdxl", True),
    }


def test_the_goal_bar_needs_the_rate() -> None:
    slow = score_scenario(
        _scenario(), [_truth()], [], _requests("tts", rate=0.2), T0, path="batch", kind="faulted"
    )
    fast = _score([])
    assert not slow.victims[0].at_goal and fast.victims[0].at_goal


def test_live_incidents_are_those_published_with_first_and_final_causes() -> None:
    def seen(kind: str, inc: str, at: float, cause: str) -> Seen:
        return Seen(
            kind,
            inc,
            "tts",
            T0 + int(at * S),
            T0,
            T0 + int(at * S),
            cause,
            "breach",
            causes=(cause,),
        )

    events = [
        seen("diagnosing", "a", 300, "load:tts"),
        seen("opened", "a", 320, "load:tts"),
        seen("cause_changed", "a", 340, "cotenant:sdxl"),
        seen("resolved", "a", 400, "cotenant:sdxl"),
        seen("diagnosing", "b", 100, "cpu:x"),
        seen("dismissed", "b", 110, "cpu:x"),
        seen("diagnosing", "c", 500, "cpu:x"),  # never published
    ]
    (f,) = found_from_events(events)
    assert (f.detected_ns, f.first, f.final) == (T0 + 320 * S, ("load:tts",), ("cotenant:sdxl",))


@pytest.mark.parametrize("k,t", [(0, 1.0), (1, 2.0), (7, 30.0), (250, 100.0)])
def test_the_garwood_interval_matches_the_chi_square_form(k: int, t: float) -> None:
    i = poisson_rate(k, t)
    low = stats.chi2.ppf(0.05, 2 * k) / 2 / t if k else 0.0
    high = stats.chi2.ppf(0.95, 2 * k + 2) / 2 / t
    assert (i.low, i.high) == (pytest.approx(low, rel=1e-6), pytest.approx(high, rel=1e-6))
    if k == 0:
        assert i.high == pytest.approx(-math.log(0.05) / t)  # 0 events: 3.0 / exposure


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (3, 10), (95, 100), (400, 1000)])
def test_the_clopper_pearson_interval_matches_the_beta_form(k: int, n: int) -> None:
    i = proportion(k, n)
    low = stats.beta.ppf(0.05, k, n - k + 1) if k else 0.0
    high = stats.beta.ppf(0.95, k + 1, n - k) if k < n else 1.0
    assert (i.low, i.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    if k == 0:
        assert i.high == pytest.approx(1 - 0.05 ** (1 / n))


def test_intervals_refuse_impossible_counts() -> None:
    with pytest.raises(UsageError, match="0 <= k <= n"):
        proportion(3, 2)
    with pytest.raises(UsageError, match="exposure"):
        poisson_rate(1, 0.0)
    assert math.isnan(proportion(0, 0).estimate)


@pytest.mark.parametrize("live", [False, True])
def test_a_drawn_scenario_runs_through_each_path_and_its_victim_is_scored(live: bool) -> None:
    # dev 2: one model, its own memory growth preempts its KV cache for 165 s
    r = run_job(Job("dev", "faulted", 2, live=live))
    assert r.error is None and r.path == ("live" if live else "batch")
    (v,) = r.victims
    assert (v.truth, v.victim, v.fault_kind) == ("memory:tts-0", "tts-0", "memory_pressure")
    assert v.slowdown >= 1.2 and r.drawn["faults"][0]["kind"] == "memory_pressure"
    text = render(summarize([r]), live=live)
    assert "| all | 1 |" in text
