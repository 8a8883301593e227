"""The product's attribution on GenTD26-shaped incidents (evaluation/gentd26_attribution)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cotenant.core.cause_kinds import CauseKind
from cotenant.evaluation.gentd26 import STEP_S, Trace
from cotenant.evaluation.gentd26_attribution import Panels, enrichment, summary, thresholds

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


@pytest.fixture(scope="module")
def attributed() -> tuple[Panels, dict[str, object]]:
    p = Panels(_trace())
    out = {}
    for c, name in enumerate(p.trace.containers):
        a = p.attribute(c, SPIKE, SPIKE, 30_000.0)
        assert a is not None
        out[name] = a
    return p, out


def _kinds(a: object) -> list[tuple[str, float]]:
    return [(str(c.kind), round(c.share, 2)) for c in a.attribution.causes]  # type: ignore[attr-defined]


def test_heavier_inference_is_the_containers_own_mix(attributed: tuple[Panels, dict]) -> None:
    _, got = attributed
    mix = got["heavier"].attribution.causes[0]
    assert (mix.kind, mix.culprit) == ("mix", "sd-pool-a")
    assert mix.evidence["series"].endswith("(model_predict)")
    assert mix.evidence["ratio"] == pytest.approx(4.0, rel=0.1)


def test_a_slow_load_is_model_load_and_compute_time_stands_in_for_a_missing_series(
    attributed: tuple[Panels, dict],
) -> None:
    _, got = attributed
    assert _kinds(got["slow-load"])[0][0] == "model_load"
    assert _kinds(got["blank"])[0][0] == "mix"  # no inference series: its compute time stands in
    no_predict = got["no-predict"].attribution.causes[0]
    assert no_predict.kind == "mix" and "compute time" in no_predict.evidence["series"]


def test_enrichment_compares_named_incidents_with_normal_steps(
    attributed: tuple[Panels, dict],
) -> None:
    p, got = attributed
    limit = thresholds(p, slice(0, N))
    enr = enrichment(p, list(got.values()), limit, slice(0, N))
    assert enr[CauseKind.MIX]["slow_rate"] == 1.0  # 'heavier''s spike step is over its limit
    assert enr[CauseKind.MIX]["base_rate"] < 0.15
    assert enr[CauseKind.MODEL_LOAD]["enrichment"] > 5
    s = summary(list(got.values()))
    assert s["incidents"] == 4 and s["naming"]["mix"] == 3
    lo, hi = s["unexplained_ci"]
    assert 0.0 <= lo <= hi <= 1.0
