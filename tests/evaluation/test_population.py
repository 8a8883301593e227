"""The scenario generator: deterministic per seed, dev and test apart, every drawn scenario as
valid as a file, and the stated distributions honoured over a large draw (no simulation)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import pytest

from cotenant.core.errors import UsageError
from cotenant.evaluation.population import (
    DEFAULT,
    MAX_INDEX,
    POPULATIONS,
    ScenarioSpec,
    controls_for_hours,
    draw_spec,
    materialise,
    parse_spec,
    scenario_seed,
    scenario_yaml,
)
from cotenant.simulator.engine import Simulation
from cotenant.simulator.scenario_load import load_scenario

N = 400


@pytest.fixture(scope="module")
def specs() -> list[ScenarioSpec]:
    return [draw_spec("dev", i) for i in range(N)]


def test_the_same_index_draws_the_same_scenario_and_another_index_another() -> None:
    a, b = draw_spec("test", 7), draw_spec("test", 7)
    assert a.doc == b.doc and a.slo == b.slo and a.drawn == b.drawn
    assert draw_spec("test", 8).doc != a.doc
    assert draw_spec("dev", 7).doc != a.doc
    assert materialise(a) == materialise(b)


def test_dev_and_test_never_share_a_seed() -> None:
    seeds = {
        p: {scenario_seed(p, i, k) for k in ("faulted", "control") for i in (0, 1, MAX_INDEX - 1)}
        for p in POPULATIONS
    }
    assert not seeds["dev"] & seeds["test"]
    ranges = sorted(
        (scenario_seed(p, 0, k), scenario_seed(p, MAX_INDEX - 1, k), p)
        for p in POPULATIONS
        for k in ("faulted", "control")
    )
    for (_, hi, _), (lo, _, _) in itertools.pairwise(ranges):
        assert hi < lo  # disjoint, whatever the counts
    assert draw_spec("dev", 3).seed == scenario_seed("dev", 3)
    with pytest.raises(UsageError, match="unknown population 'prod'"):
        scenario_seed("prod", 0)
    with pytest.raises(UsageError, match="index"):
        scenario_seed("dev", MAX_INDEX)


def test_every_drawn_scenario_passes_the_loaders_checks(specs: list[ScenarioSpec]) -> None:
    for spec in specs:
        s = parse_spec(spec.doc, spec.name)
        assert s.seed == spec.seed and len(s.faults) >= 1
    for i in range(20):
        c = draw_spec("test", i, "control")
        assert parse_spec(c.doc, c.name).faults == ()


def test_a_drawn_scenario_simulates_and_reads_back_from_its_yaml(tmp_path: Path) -> None:
    for kind, index in (("faulted", 2), ("faulted", 9), ("control", 0)):
        spec = draw_spec("dev", index, kind)
        s = materialise(spec)
        path = tmp_path / f"{s.name}.yaml"
        path.write_text(scenario_yaml(s, spec))
        assert load_scenario(path) == s
        tight_or_loose = [m for m in s.models if spec.slo[m.name][0] != "absent"]
        assert all(m.slo_p99_ms for m in tight_or_loose)
        sim = Simulation(s)
        sim.run_until(30.0)
        assert len(sim.take_requests()["rid"]) > 0


def _log_share_below(values: list[float], x: float, lo: float, hi: float) -> tuple[float, float]:
    """Observed and expected share below ``x`` of a log-uniform on [lo, hi]."""
    got = sum(v < x for v in values) / len(values)
    return got, math.log(x / lo) / math.log(hi / lo)


def test_the_node_distributions_are_honoured(specs: list[ScenarioSpec]) -> None:
    rates = [m["rate_rps"] for sp in specs for m in sp.drawn["models"].values()]
    assert min(rates) >= 0.1 and max(rates) <= 200
    for x in (0.5, 2, 20):  # log-uniform: a share per decade, within sampling error
        got, want = _log_share_below(rates, x, 0.1, 200)
        assert abs(got - want) < 0.05, (x, got, want)
    per_gpu = Counter(
        sum(1 for m in sp.doc["models"] if m["gpu"] == g["id"])
        for sp in specs
        for g in sp.doc["gpus"]
    )
    assert set(per_gpu) == {1, 2, 3, 4, 5}
    presets = Counter((g["type"], g["sharing"]) for sp in specs for g in sp.doc["gpus"])
    for preset in DEFAULT.gpu_presets:
        modes = {m for p, m in presets if p == preset}
        assert modes == ({"timeslice", "mps"} if preset == "l4" else {"timeslice", "mps", "mig"})
    arrivals = Counter(m["arrival"]["kind"] for sp in specs for m in sp.doc["models"])
    assert set(arrivals) == {"poisson", "bursty", "trace"}
    files = Counter(
        m["arrival"]["file"] for sp in specs for m in sp.doc["models"] if "file" in m["arrival"]
    )
    assert set(files) == set(DEFAULT.traces)
    classes = Counter(c for sp in specs for c, _ in sp.slo.values())
    total = sum(classes.values())
    assert all(abs(classes[c] / total - 1 / 3) < 0.05 for c in ("tight", "loose", "absent"))


def test_kernels_keep_the_unfaulted_gpus_under_their_load_budget(specs: list[ScenarioSpec]) -> None:
    """Offered GPU load at the models' mean rates, batch of one (the worst case), below the
    largest drawn budget — batching only lowers it."""
    for sp in specs:
        for g in sp.doc["gpus"]:
            load = 0.0
            for m in sp.doc["models"]:
                if m["gpu"] != g["id"] or "llm" in m:
                    continue
                k = m["kernel"]
                rate = sp.drawn["models"][m["name"]]["rate_rps"]
                load += rate * (k["base_ms"] + k["per_item_ms"]) / 1000
            assert load < DEFAULT.gpu_utilisation[1] * 1.05 or _clamped(sp, g["id"]), sp.name


def _clamped(sp: ScenarioSpec, gpu: str) -> bool:
    """A kernel at the 0.2 ms floor can push a fast model over its share."""
    return any(
        m["gpu"] == gpu and m["kernel"]["base_ms"] + m["kernel"]["per_item_ms"] <= 0.21
        for m in sp.doc["models"]
    )


def test_the_fault_distributions_are_honoured(specs: list[ScenarioSpec]) -> None:
    drawn = [f for sp in specs for f in sp.drawn["faults"]]
    assert Counter(f["kind"] for f in drawn).keys() == set(DEFAULT.fault_kinds)
    sizes = [f["size"] for f in drawn]
    assert min(sizes) >= 1.1 and max(sizes) <= 3.0
    got, want = _log_share_below(sizes, 1.5, 1.1, 3.0)
    assert abs(got - want) < 0.06
    durations = [f["duration_s"] for f in drawn]
    assert min(durations) >= 30 and max(durations) <= 600
    got, want = _log_share_below(durations, 120, 30, 600)
    assert abs(got - want) < 0.06
    per = Counter(len(sp.drawn["faults"]) for sp in specs)
    assert abs(per[1] / N - 0.5) < 0.07 and per[3] > 0
    for sp in specs:
        first = min(f["start_s"] for f in sp.doc["faults"])
        assert first >= DEFAULT.first_fault_s[0]  # history before the first fault
        assert sp.doc["duration_s"] <= 22 * 60
    overlapping = sum(1 for sp in specs if _overlap(sp.doc["faults"]))
    assert overlapping > N / 10
    throttles = [f for sp in specs for f in sp.doc["faults"] if f["kind"] == "throttle"]
    assert all(1 / 3.0 - 1e-3 <= f["clock_factor"] <= 1 / 1.1 + 1e-3 for f in throttles)


def _overlap(faults: list[dict[str, float]]) -> bool:
    spans = sorted((f["start_s"], f["start_s"] + f["duration_s"]) for f in faults)
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def test_controls_add_up_to_the_hours_asked() -> None:
    idx = controls_for_hours("test", 2.0)
    hours = [draw_spec("test", i, "control").doc["duration_s"] / 3600 for i in idx]
    assert sum(hours) >= 2.0 and sum(hours[:-1]) < 2.0
    assert all(20 / 60 <= h <= 1.0 for h in hours)
    assert controls_for_hours("test", 0) == []
