"""The simulated week's rows: faults where they were injected, bad specs named."""

from __future__ import annotations

import pyarrow.compute as pc
import pytest

from cotenant.core.errors import ScenarioError
from cotenant.reports.isoweek import parse_week
from cotenant.simulator.week import WeekFault, WeekGpu, WeekModel, WeekSpec, simulate_week
from cotenant.store.schema import arrow_schema

START = parse_week("2026-W48").start_ns


def _spec(*faults: WeekFault) -> WeekSpec:
    return WeekSpec(
        start_ns=START,
        days=1,
        gpus=(WeekGpu("g"),),
        models=(WeekModel("a", "g", 5, compute_ms=10), WeekModel("b", "g", 5, compute_ms=10)),
        faults=faults,
    )


def test_a_throttle_slows_compute_and_sets_its_reason_bit() -> None:
    w = simulate_week(_spec(WeekFault("throttle", 3600, 600, gpu="g", clock_factor=0.5)))
    assert w.request_rollup.schema == arrow_schema("request_rollup_1m")
    assert w.gpu_rollup.num_rows == 1440 and w.gpu_rollup.schema == arrow_schema("gpu_rollup_1m")
    reasons = w.gpu_rollup.column("clock_event_reasons").to_numpy()
    assert (reasons != 0).sum() == 10 and set(reasons[60:70]) == {0x40}
    a = w.request_rollup.filter(pc.equal(w.request_rollup.column("model"), "a"))
    comp = a.column("compute_ms").to_numpy()
    assert comp[60:70].mean() == pytest.approx(2 * comp[:60].mean(), rel=0.05)
    assert w.truth[0].victims == ("a", "b") and w.truth[0].kind == "throttle"
    assert simulate_week(_spec()).request_rollup.equals(simulate_week(_spec()).request_rollup)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (WeekFault("cotenant_burst", 0, 60, target="nobody"), "faults[0].target 'nobody'"),
        (WeekFault("throttle", 0, 60, gpu="g9"), "faults[0].gpu 'g9'"),
        (WeekFault("throttle", 0, 60, gpu="g", reason="heat"), "faults[0].reason 'heat'"),
        (WeekFault("load_surge", 0, 0, target="a"), "faults[0].duration_s 0"),
        (WeekFault("process_active", 0, 60, target="a"), "faults[0].target 'a': a process_active"),
    ],
)
def test_a_bad_spec_names_the_field(fault: WeekFault, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        simulate_week(_spec(fault))
