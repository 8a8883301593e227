"""The product's attribution of GenTD26-shaped spike events (evaluation/gentd26_attribution),
scored by the enrichment measures on the held-out half."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cotenant.evaluation.gentd26 import STEP_S, Trace
from cotenant.evaluation.gentd26_attribution import StepWindows, score_events, spike_events
from cotenant.evaluation.gentd26_enrichment import Evidence
from cotenant.evaluation.gentd26_measures import split_step
from cotenant.evaluation.gentd26_steps import MeasureParams, Panels, TraceIncident

T0 = 1_700_000_000
N, SPIKE = 120, 90


def _trace() -> Trace:
    """Four containers of one pool, e2e ~10 s with a 40-s spike at step ``SPIKE``:

    * ``heavier``: its pure inference time per step (model_predict) quadrupled then;
    * ``slow-load``: its LoRA load took 30 s then (usually 2 s);
    * ``blank``: no inference series at all, its compute time rose with the e2e;
    * ``no-predict``: model_predict was not reported in the spike, compute rose all the same.
    """
    rng = np.random.default_rng(3)
    names = ("blank", "heavier", "no-predict", "slow-load")
    e2e = 10_000 + rng.normal(0, 200, (N, 4))
    e2e[SPIKE] = 40_000
    predict = 6_000 + rng.normal(0, 150, (N, 4))
    predict[SPIKE, 1] = 24_000
    predict[SPIKE, 2] = np.nan
    predict[:, 0] = np.nan
    lora = 2_000 + rng.normal(0, 50, (N, 4))
    lora[SPIKE, 3] = 30_000
    empty = np.full((N, 4), np.nan)
    panels = {
        "e2e": e2e,
        "model_predict": predict,
        "queue_rt": np.full((N, 4), 100.0),
        "qps": np.full((N, 4), 0.1),
        "duty_cycle": np.full((N, 4), 40.0) + rng.normal(0, 1, (N, 4)),
        "gpu_memory": np.full((N, 4), 2e10),
        "load_basemodel": empty,
        "load_lora": lora,
        "load_controlnet": empty,
        "load_pipeline": empty,
    }
    return Trace(
        folder=Path("synthetic"),
        ts=T0 + STEP_S * np.arange(N, dtype=np.int64),
        containers=names,
        panels=panels,
        cluster={"queue_size": np.zeros(N), "api_qps": np.zeros(N)},
    )


def _attributed(t: Trace) -> tuple[Panels, dict[str, TraceIncident]]:
    """The product's attribution of each container's spike event at ``SPIKE``."""
    panels = Panels.of(t, MeasureParams())
    view = StepWindows(t, panels)
    out = {}
    for c, a, b in spike_events(panels, range(len(t.containers)), split_step(t)):
        inc = view.attribute(c, a, b)
        assert inc is not None and inc.container is not None
        if a == SPIKE:
            out[inc.container] = inc
    return panels, out


@pytest.fixture(scope="module")
def attributed() -> tuple[Panels, dict[str, TraceIncident]]:
    return _attributed(_trace())


def _first(inc: TraceIncident) -> str:
    return max(inc.causes, key=lambda c: c.share).kind


def test_every_spike_event_of_the_second_half_is_attributed(
    attributed: tuple[Panels, dict[str, TraceIncident]],
) -> None:
    _, got = attributed
    assert sorted(got) == ["blank", "heavier", "no-predict", "slow-load"]
    assert {(i.start_s, i.end_s) for i in got.values()} == {(T0 + SPIKE * STEP_S,) * 2}


def test_heavier_inference_is_the_containers_own_mix_and_a_slow_load_model_load(
    attributed: tuple[Panels, dict[str, TraceIncident]],
) -> None:
    _, got = attributed
    assert _first(got["heavier"]) == "mix"
    assert _first(got["slow-load"]) == "model_load"
    # no inference series, or none in the spike: its compute time stands in
    assert _first(got["blank"]) == "mix"
    assert _first(got["no-predict"]) == "mix"


def test_enrichment_counts_named_events_holding_the_evidence_against_the_first_half(
    attributed: tuple[Panels, dict[str, TraceIncident]],
) -> None:
    panels, got = attributed
    t = _trace()
    cut = split_step(t)
    res = score_events(t, panels, Evidence.of(t, MeasureParams(), cut), list(got.values()), cut)
    mix = res["causes"]["mix"]
    # named on three events; only 'heavier' reports an inference time twice its median
    assert (mix["with_evidence"], mix["windows"]) == (1, 3)
    load = res["causes"]["model_load"]
    assert load["with_evidence"] == load["windows"] == 1
    assert res["naming"]["mix"] == 3 and res["events"] == 4
    lo, hi = res["explained"]["unexplained_ci90"]
    assert 0.0 <= lo <= res["explained"]["unexplained_share"] <= hi <= 1.0


def test_an_events_attribution_uses_nothing_after_it() -> None:
    t = _trace()
    _, before = _attributed(t)
    for name in ("e2e", "model_predict", "load_lora", "duty_cycle"):
        t.panels[name][SPIKE + 2 :] *= 7.0  # a later event of its own, nothing else
    _, after = _attributed(t)
    assert after == before
