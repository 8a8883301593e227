"""The batch bench scores within-SLO victims at issue 25's bar, as the live one does: the goal
(found >= 0.9) is asked of both paths."""

from __future__ import annotations

from cotenant.evaluation.accuracy import Within, run_scenario, summarize
from cotenant.simulator.scenario_load import find_scenario, load_scenario


def test_the_batch_bench_scores_victims_slowed_within_their_slo() -> None:
    r = run_scenario(
        load_scenario(find_scenario("within-slo-reranker-slowed-by-embedding-flood-mps"))
    )
    assert sorted(r.within, key=lambda v: v.victim) == [
        Within("cotenant:embed", "rerank", True, True),
        Within("cotenant:embed", "summarise", True, True),
    ]
    s = summarize([r], ["cotenant"])
    assert (s["within_slo_victims"], s["within_found"], s["within_attributed"]) == (2, 1.0, 1.0)


def test_an_slo_victim_is_not_a_within_slo_one_and_its_fellow_victim_is_found() -> None:
    r = run_scenario(load_scenario(find_scenario("cpu-hog-silent-burner-bystander-imagegen-flat")))
    # tts crossed its SLO; imagegen, without one, was slowed 1.22x for the two minutes: a
    # fellow victim of tts's incident naming the CPU hog (analysis.fellows)
    assert r.within == [Within("cpu:etl-burner", "imagegen", True, True)]
