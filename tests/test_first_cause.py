"""A slowdown whose cause changes while it lasts keeps the cause it was found with.

Seen on the development population (dev 238): the GPU clock is locked at 0.59 of its maximum
for 71 s, and 21 s after it ends the same vision model starts reloading a LoRA every 8 s for
105 s. The model never recovers in between, so both are one slowdown; attributed over the whole
of it, the loads explain 84 % and the throttle 16 %, and the diagnosis named only the loads —
while the live loop, which published the incident 30 s in, named the throttle first. The batch
path (``cotenant diagnose``, the alert receiver) now keeps both."""

from __future__ import annotations

from cotenant.evaluation.population_bench import Job, run_job


def test_a_throttle_followed_by_loads_is_found_as_the_throttle_and_ends_as_the_loads() -> None:
    r = run_job(Job("dev", "faulted", 238))
    assert r.error is None
    got = {(v.victim, v.fault_kind): v for v in r.victims}
    throttled = got[("vision-1", "throttle")]
    loaded = got[("vision-1", "model_load")]
    # one incident for both faults: found by the throttle, ending on the loads
    assert throttled.found and loaded.found
    assert (throttled.first_cause, throttled.final_cause) == (
        "throttle:gpu0",
        "model_load:vision-1",
    )
    assert throttled.right_first and not throttled.right_final
    assert loaded.right_final


def test_the_first_causes_go_out_with_the_diagnosis_and_come_back() -> None:
    from diagnoses import diagnosis

    from cotenant.analysis.attribution import Cause
    from cotenant.analysis.diagnosis import Diagnosis

    loads = Cause("model_load", "vision-1", 0.84, 0.9)
    throttle = Cause("throttle", "gpu0", 1.0, 0.9)
    d = diagnosis("vision-1", "degradation", [loads, throttle], 276, 482)
    assert "first_causes" not in d.to_dict() and d.first_top == d.top  # the same: not said
    d.first_causes = [throttle]
    out = d.to_dict()
    assert [c["kind"] for c in out["first_causes"]] == ["throttle"]
    back = Diagnosis.from_dict(out)
    assert back.first_top is not None and back.first_top.kind == "throttle"
    assert back.top is not None and back.top.kind == "model_load"
    # and the terminal says what it was found as
    from cotenant.cli.diagnose import render

    text = render({"model": "vision-1", "start_ns": 0, "end_ns": 10**12, "diagnoses": [out]})
    assert "found as: throttle gpu0" in text


def test_a_breach_is_found_as_what_the_live_loop_would_publish() -> None:
    """Dev 274: the GPU clock drops to 0.37 of its maximum at 289 s and 7 s later the LLM
    starts reloading itself for two minutes. Over its SLO, the live loop publishes within
    10 s (the breach wait): found as the throttle. Attributed on its first 30 s the batch path
    named the reloads, whose seconds-long waits outweigh the throttle in the mean."""
    r = run_job(Job("dev", "faulted", 274))
    assert r.error is None
    [v] = [v for v in r.victims if (v.victim, v.fault_kind) == ("llm-3", "throttle")]
    assert v.found and v.first_cause == "throttle:gpu0"
    assert v.final_cause == "model_load:llm-3"
