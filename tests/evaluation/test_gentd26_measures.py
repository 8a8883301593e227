"""The GenTD26 measures on constructed traces whose answers are known: recall, precision, cause
enrichment over first-half base rates, excess explained, and no look into the future."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cotenant.core.errors import UsageError
from cotenant.evaluation.gentd26 import STEP_S, Trace
from cotenant.evaluation.gentd26_enrichment import Evidence
from cotenant.evaluation.gentd26_measures import (
    MeasureParams,
    NamedCause,
    TraceIncident,
    measure,
    split_step,
)
from cotenant.evaluation.gentd26_product import from_diagnosis
from cotenant.evaluation.gentd26_steps import Panels

T0 = 1_662_858_720
STEPS = 200  # the halves cut at step 100 (every step of every container has an e2e row)


def trace(containers: int = 2, steps: int = STEPS, seed: int = 0) -> Trace:
    """``containers`` serving containers (``c0``, ``c1``, ...; pool B: they report ControlNet
    loads) at ~10 s e2e with 3 % noise on every step, LoRA loads of ~4 s on every step."""
    rng = np.random.default_rng(seed)
    shape = (steps, containers)
    empty = np.full(shape, np.nan)
    panels = {
        "e2e": 10_000 * (1 + 0.03 * rng.standard_normal(shape)),
        "model_predict": 8_000 * (1 + 0.03 * rng.standard_normal(shape)),
        "queue_rt": np.full(shape, 200.0),
        "qps": np.full(shape, 0.09),
        "duty_cycle": 20 + rng.uniform(0, 10, shape),
        "gpu_memory": np.full(shape, 2e10),
        "load_basemodel": empty.copy(),
        "load_lora": 4_000 * (1 + 0.03 * rng.standard_normal(shape)),
        "load_controlnet": np.full(shape, 3_000.0),
        "load_pipeline": empty.copy(),
    }
    return Trace(
        folder=Path("constructed"),
        ts=T0 + STEP_S * np.arange(steps, dtype=np.int64),
        containers=tuple(f"c{i}" for i in range(containers)),
        panels=panels,
        cluster={"queue_size": np.zeros(steps), "api_qps": np.zeros(steps)},
    )


def at(step: int) -> float:
    return float(T0 + STEP_S * step)


def incident(c: str, s0: int, s1: int | None = None, *causes: NamedCause) -> TraceIncident:
    return TraceIncident("sd-pool-b", c, at(s0), at(s1 if s1 is not None else s0), causes)


def test_a_spike_missed_lowers_recall_and_spikes_before_the_cut_are_not_scored() -> None:
    t = trace()
    e2e = t.panels["e2e"]
    e2e[50, 0] = 40_000  # first half: not scored
    e2e[120, 0] = 40_000
    e2e[121, 0] = 45_000  # one event of two steps
    e2e[150, 1] = 60_000
    e2e[170, 1] = 35_000
    e2e[180, 1] = 25_000  # 2.5x: not unambiguous
    found = [incident("c0", 121), incident("c1", 150, 151)]
    d = measure(t, found)["detection"]
    assert d["spike_events"] == 3
    assert (d["recall"]["k"], d["recall"]["n"]) == (2, 3)
    lo, hi = d["recall"]["ci90"]
    assert lo < 2 / 3 < hi
    # the excess the found events hold: (30 + 35 + 50) of (30 + 35 + 50 + 25) s
    assert d["spike_excess_covered"] == pytest.approx(115 / 140, abs=0.02)
    assert measure(t, [*found, incident("c1", 170)])["detection"]["recall"]["rate"] == 1.0


def test_an_incident_on_a_flat_stretch_lowers_precision() -> None:
    t = trace()
    t.panels["e2e"][130, 0] = 16_000  # 1.6x: elevated, not a spike
    good = incident("c0", 129, 131)
    flat = incident("c1", 140, 149)
    d = measure(t, [good, flat, incident("c0", 20)])["detection"]  # the last: first half
    assert d["incidents"] == 2
    assert (d["precision"]["k"], d["precision"]["n"]) == (1, 2)
    # 1 elevated step of the 3 + 10 covered
    assert (d["step_precision"]["k"], d["step_precision"]["n"]) == (1, 13)


def test_a_model_wide_incident_is_one_incident_true_when_any_container_is_elevated() -> None:
    t = trace(containers=3)
    t.panels["e2e"][160, 2] = 50_000
    wide = TraceIncident("sd-pool-b", None, at(159), at(161))
    d = measure(t, [wide])["detection"]
    assert d["incidents"] == 1 and d["model_wide_incidents"] == 1
    assert d["precision"]["rate"] == 1.0 and d["recall"]["rate"] == 1.0


def _slow_loads_everywhere(containers: int, rate: float, seed: int) -> Trace:
    """LoRA loads 3x their usual time on a random ``rate`` of the steps, everywhere."""
    t = trace(containers=containers, seed=seed)
    rng = np.random.default_rng(seed + 1)
    slow = rng.random(t.panels["load_lora"].shape) < rate
    t.panels["load_lora"][slow] *= 3
    return t


def test_a_cause_whose_evidence_is_as_common_in_normal_windows_is_not_enriched() -> None:
    t = _slow_loads_everywhere(containers=40, rate=0.1, seed=3)
    rng = np.random.default_rng(9)
    cause = NamedCause("model_load", "lora", 0.5)
    # named at random places of the second half, whatever the loads did
    anywhere = [
        incident(f"c{c}", s, s, cause)
        for c in range(40)
        for s in rng.choice(np.arange(102, STEPS - 1), size=16, replace=False)
    ]
    e = measure(t, anywhere)["causes"]["model_load:lora"]
    assert e["windows"] == 640
    assert e["base_rate_first_half"] == pytest.approx(1 - 0.9**2, abs=0.05)  # 2-step windows
    assert 0.75 < e["enrichment"] < 1.3
    assert e["ci90"][0] < 1.2  # far from what would count as enriched (2x)
    # named only where a slow load is: enriched about 1 / base rate, its interval above 2
    slow = t.panels["load_lora"] > 9_000
    where = [
        incident(f"c{c}", s, s, cause)
        for c in range(40)
        for s in np.flatnonzero(slow[101:, c])[:8] + 101
    ]
    e = measure(t, where)["causes"]["model_load:lora"]
    assert e["enrichment"] == pytest.approx(1 / e["base_rate_first_half"], rel=0.01)
    assert e["ci90"][0] > 2


def test_a_cause_without_evidence_in_the_trace_is_untestable_and_excess_shares_add_up() -> None:
    t = trace()
    e2e = t.panels["e2e"]
    e2e[120, 0] = 30_000  # 20 s over its median
    e2e[150, 1] = 50_000  # 40 s over
    m = measure(
        t,
        [
            incident(
                "c0", 120, 120, NamedCause("cpu", "host", 0.75), NamedCause("unknown", "", 0.25)
            ),
            incident("c1", 150, 150, NamedCause("unknown", "", 1.0)),
        ],
    )
    assert m["causes"]["cpu"]["untestable"] is True
    x = m["explained"]
    assert x["explained_share"] == pytest.approx(0.75 * 20 / 60, abs=0.01)
    assert x["explained_by_enriched_share"] == 0.0  # an untestable cause is never enriched
    assert x["naming_nothing"] == 1


def test_nothing_uses_data_after_the_step_judged() -> None:
    t = trace(containers=3)
    p = MeasureParams()
    before = Panels.of(t, p)
    ev_before = Evidence.of(t, p, 100)
    k = 140
    for x in t.panels.values():
        x[k + 1 :] = x[k + 1 :] * 7 + 1_000  # the future changes beyond recognition
    after = Panels.of(t, p)
    ev_after = Evidence.of(t, p, 100)
    for a, b in ((before.median, after.median), (before.spike, after.spike)):
        np.testing.assert_array_equal(a[: k + 1], b[: k + 1])
    np.testing.assert_array_equal(before.elevated[: k + 1], after.elevated[: k + 1])
    for name in ev_before.masks:
        np.testing.assert_array_equal(ev_before.masks[name][: k + 1], ev_after.masks[name][: k + 1])
    # levels and base rates are the first half's: a second half changed leaves them be
    assert ev_before.fitted() == ev_after.fitted()
    assert ev_before.base(("queue",), 0, 3) == ev_after.base(("queue",), 0, 3)


def test_the_halves_cut_where_half_the_rows_lie_behind() -> None:
    t = trace()
    assert split_step(t) == 100 and split_step(t, "time") == 100
    t.panels["e2e"][:150] = np.nan  # traffic only in the last quarter
    assert split_step(t) == 175
    with pytest.raises(UsageError, match="'rows' or 'time'"):
        split_step(t, "days")


def test_incidents_on_what_the_trace_lacks_are_refused() -> None:
    t = trace()
    with pytest.raises(UsageError, match="'zz': not in the trace"):
        measure(t, [incident("zz", 120)])
    with pytest.raises(UsageError, match="no such model"):
        measure(t, [TraceIncident("llama", None, at(120), at(121))])


def test_a_product_diagnosis_becomes_an_incident_on_its_replica() -> None:
    d = {
        "model": "sd-pool-b",
        "gpu": "c1",
        "replica": "c1",
        "start_ns": int(at(120) * 1e9),
        "end_ns": int(at(122) * 1e9),
        "causes": [{"kind": "model_load", "culprit": "base", "share": 0.4}],
    }
    inc = from_diagnosis(d, {"c0", "c1"})
    assert inc.container == "c1" and inc.causes[0].key == "model_load:basemodel"
    assert from_diagnosis({**d, "replica": None, "gpu": "gpu-7"}, {"c0", "c1"}).container is None
