"""Memory that grew into a full GPU is named when the slowdown is found a little before it filled.

Seen on the development population: in dev 276 the LLM itself grows its memory by 58 GiB for
69 s and the GPU is full (100 %) for 60 of the 78 s of its slowdown, which was found 9 s
before the memory filled; in dev 9 a TTS model's memory grows by 16 GiB for 145 s beside two
LLMs. The memory explainer judged "nearly full" on the mean over the slowdown (90 % in dev
276), so the first named nothing (``unknown``, 100 %) and in the second the LLMs' slowdowns
were put on each other and on their own load. It now judges on the slowdown's median window.
"""

from __future__ import annotations

from cotenant.evaluation.population_bench import Job, run_job


def test_a_model_that_fills_the_gpu_itself_is_named() -> None:
    r = run_job(Job("dev", "faulted", 276))
    assert r.error is None
    [v] = [v for v in r.victims if v.victim == "llm-0"]
    assert v.found and v.final_cause == "memory:llm-0"


def test_a_neighbour_that_fills_the_gpu_is_named_for_both_llms() -> None:
    r = run_job(Job("dev", "faulted", 9))
    assert r.error is None
    got = {v.victim: v for v in r.victims if v.fault_kind == "memory_pressure"}
    for llm in ("llm-1", "llm-3"):
        assert got[llm].found and got[llm].final_cause == "memory:tts-0", got[llm]
