"""The simulator's LLM physics: prefill, continuous-batching decode, contention per token, and
the ``length_shift`` fault whose truth is the ``mix`` cause."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from cotenant.core.errors import ScenarioError
from cotenant.simulator.engine import Simulation
from cotenant.simulator.output import run, truth, truth_entry
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
from cotenant.simulator.scenario_load import SCENARIOS_DIR, parse_scenario


def chat(**kw: Any) -> Model:
    base = Model(
        name="chat",
        gpu="gpu0",
        arrival=Arrival("poisson", rate_rps=4),
        kernel=Kernel(base_ms=4, per_item_ms=0.5, sm_demand=0.5, dram_demand=0.6, memory_bound=0.8),
        batching=Batching(8, 2),
        llm=Llm(
            prefill_ms_per_1k=20,
            decode_step_ms=10,
            decode_per_seq_ms=0.2,
            max_seqs=128,
            prompt_tokens=800,
            output_tokens=100,
        ),
    )
    return replace(base, **kw)


def scenario(*faults: Fault, model: Model | None = None, duration: float = 200.0) -> Scenario:
    return Scenario(
        name="llm",
        seed=5,
        duration_s=duration,
        gpus=(Gpu("gpu0", GPU_TYPES["h100-sxm"], "mps"),),
        models=(model or chat(),),
        processes=(Process("train-job", "gpu0", sm_demand=0.9, dram_demand=0.8),),
        faults=faults,
    )


def requests(s: Scenario) -> dict[str, np.ndarray]:
    sim = Simulation(s)
    sim.run()
    cols = sim.take_requests()
    out = {k: np.asarray(v, dtype=float) for k, v in cols.items() if k not in ("model", "gpu")}
    out["t0"] = (out["ts_start_ns"] - sim.start_ns) / 1e9
    out["tpot"] = (out["latency_ms"] - out["ttft_ms"]) / np.maximum(out["output_tokens"] - 1, 1)
    return out


def test_latency_is_first_token_plus_one_decode_step_per_further_token() -> None:
    r = requests(scenario())
    assert len(r["latency_ms"]) > 500
    assert np.isfinite(r["ttft_ms"]).all() and (r["ttft_ms"] > 0).all()
    long = r["output_tokens"] > 1
    # alone, a step takes 10 ms + 0.2 ms per sequence decoding: a few sequences at 4 rps
    assert 10.0 <= float(np.median(r["tpot"][long])) <= 13.0
    # the first token comes out of prefill: longer prompts wait longer for it
    big = r["prompt_tokens"] > np.percentile(r["prompt_tokens"], 80)
    small = r["prompt_tokens"] < np.percentile(r["prompt_tokens"], 20)
    assert np.median(r["ttft_ms"][big]) > 1.5 * np.median(r["ttft_ms"][small])
    # e2e grows with the output: the long answers take longest
    many = r["output_tokens"] > np.percentile(r["output_tokens"], 80)
    few = r["output_tokens"] < np.percentile(r["output_tokens"], 20)
    assert np.median(r["latency_ms"][many]) > 3 * np.median(r["latency_ms"][few])


def test_a_bigger_decode_batch_takes_longer_per_step() -> None:
    slow = requests(scenario(model=chat(arrival=Arrival("poisson", rate_rps=40))))
    fast = requests(scenario())
    assert np.median(slow["batch_size"]) > 3 * np.median(fast["batch_size"])
    assert np.median(slow["tpot"]) > 1.2 * np.median(fast["tpot"])


def test_a_cotenant_stretches_the_time_per_token_while_it_runs() -> None:
    r = requests(scenario(Fault("process_active", 80, 60, target="train-job")))
    during = (r["t0"] >= 90) & (r["t0"] < 130)
    before = r["t0"] < 70
    assert np.median(r["tpot"][during]) > 1.3 * np.median(r["tpot"][before])


def test_the_decode_batch_is_capped_and_the_queue_waits_for_room() -> None:
    small = chat(llm=replace(chat().llm, max_seqs=4), arrival=Arrival("poisson", rate_rps=10))
    r = requests(scenario(model=small))
    assert r["batch_size"].max() <= 4
    assert np.median(r["queue_ms"]) > 50  # waiting for a sequence to finish


def test_length_shift_multiplies_output_tokens_in_its_range_only() -> None:
    f = Fault("length_shift", 80, 60, target="chat", factor=3.0)
    shifted, plain = requests(scenario(f)), requests(scenario())
    sel = (plain["t0"] >= 85) & (plain["t0"] < 135)
    # the same requests arrive: only their output lengths change
    np.testing.assert_array_equal(np.sort(shifted["t0"]), np.sort(plain["t0"]))
    ratio = shifted["output_tokens"].mean() / plain["output_tokens"].mean()
    assert ratio > 1.3
    by_rid = dict(zip(plain["rid"].tolist(), plain["output_tokens"].tolist(), strict=True))
    out = dict(zip(shifted["rid"].tolist(), shifted["output_tokens"].tolist(), strict=True))
    inside = [r for r, t in zip(plain["rid"], plain["t0"], strict=True) if 85 <= t < 135]
    outside = [r for r, t in zip(plain["rid"], plain["t0"], strict=True) if t < 75]
    assert all(abs(out[r] - round(by_rid[r] * 3)) <= 1 for r in inside)
    assert all(out[r] == by_rid[r] for r in outside)
    assert sel.any()


def test_length_shift_truth_is_mix_and_names_the_model_as_victim() -> None:
    s = scenario(Fault("length_shift", 60, 80, target="chat", factor=4.0), duration=180)
    got = truth(s, run(s))
    assert (got[0]["kind"], got[0]["culprit"], got[0]["victims"]) == ("mix", "chat", ["chat"])
    assert truth_entry(s.faults[0], s)["fault"] == "length_shift"


def test_models_without_an_llm_section_have_no_first_token_time() -> None:
    s = scenario(model=chat(llm=None))
    r = requests(s)
    assert np.isnan(r["ttft_ms"]).all()
    assert np.isnan(r["output_tokens"]).all()  # poisson arrivals carry no token counts


LLM_DOC: dict[str, Any] = {
    "version": 1,
    "name": "x",
    "seed": 1,
    "duration_s": 100,
    "gpus": [{"id": "gpu0", "type": "h100-sxm"}],
    "models": [
        {
            "name": "chat",
            "gpu": "gpu0",
            "arrival": {"kind": "poisson", "rate_rps": 2},
            "kernel": {"base_ms": 3},
            "llm": {"decode_step_ms": 9, "max_seqs": 32, "output_tokens": 50},
        },
        {
            "name": "tts",
            "gpu": "gpu0",
            "arrival": {"kind": "poisson", "rate_rps": 2},
            "kernel": {"base_ms": 3},
        },
    ],
    "faults": [
        {"kind": "length_shift", "target": "chat", "factor": 2, "start_s": 10, "duration_s": 20}
    ],
}


def test_the_llm_section_and_length_shift_load_from_yaml() -> None:
    s = parse_scenario(copy.deepcopy(LLM_DOC), SCENARIOS_DIR)
    assert s.models[0].llm == Llm(decode_step_ms=9, max_seqs=32, output_tokens=50)
    assert (s.faults[0].kind, s.faults[0].factor, s.faults[0].lengths) == (
        "length_shift",
        2,
        "output",
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["faults"][0].update(target="tts"), "faults[0].target: bad value 'tts'"),
        (lambda d: d["faults"][0].update(factor=1), "faults[0].factor: bad value 1"),
        (lambda d: d["faults"][0].update(lengths="all"), "faults[0].lengths: bad value 'all'"),
        (lambda d: d["models"][0]["llm"].update(max_seqs=0), "models[0].llm.max_seqs"),
        (lambda d: d["models"][0]["llm"].update(speed=2), "models[0].llm.speed: unknown key"),
    ],
)
def test_bad_llm_fields_are_refused_naming_the_field(edit: Any, message: str) -> None:
    doc = copy.deepcopy(LLM_DOC)
    edit(doc)
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(doc, SCENARIOS_DIR)
