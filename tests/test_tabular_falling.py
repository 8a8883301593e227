"""Direction-aware evidence in tabular mode, on generated cases whose fault is a metric falling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cotenant.analysis.metric_direction import Direction, direction_of, family_of
from cotenant.analysis.tabular import Rules, cause_kind_of, load_case, rank_entities, rca_table
from cotenant.analysis.tabular_load import TabularCase
from cotenant.core.cause_kinds import CauseKind
from cotenant.evaluation.tabular_cases import bench_tabular
from cotenant.evaluation.tabular_falling import (
    GPU_BEFORE,
    GPU_FAULTS,
    STAT_BEFORE,
    STAT_FAULTS,
    component_stats,
    write_cases,
)


@pytest.mark.parametrize(
    ("metric", "family", "direction"),
    [
        ("sm-clock", "clock", Direction.FALL),
        ("cpu-freq", "clock", Direction.FALL),
        ("cpuFreqMhz", "clock", Direction.FALL),
        ("availability", "availability", Direction.FALL),
        ("success", "availability", Direction.FALL),
        ("mem-free", "headroom", Direction.FALL),
        ("latency-p90", "latency", Direction.EITHER),
        ("error_rate", "errors", Direction.RISE),
        ("cpu", "utilisation", Direction.RISE),
        ("num-waiting", "queue", Direction.RISE),
        ("net-rx", "traffic", Direction.RISE),
        ("widgets", "cost", Direction.RISE),
        # DCGM's bitmask of why the clock is held: it rises from 0 when the clock is locked
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "throttling", Direction.RISE),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "throttling", Direction.RISE),
        ("DCGM_FI_DEV_SM_CLOCK", "clock", Direction.FALL),
        ("node_cpu_scaling_frequency_hertz", "clock", Direction.FALL),
        ("container_cpu_cfs_throttled_periods_total", "throttling", Direction.RISE),
        ("pclk", "clock", Direction.FALL),  # nvidia-smi dmon's processor clock
        ("sm_clk", "clock", Direction.FALL),
        ("node_cpufreq", "clock", Direction.FALL),
        ("node_load1", "utilisation", Direction.RISE),
    ],
)
def test_each_metric_family_knows_which_way_hurts(
    metric: str, family: str, direction: Direction
) -> None:
    assert family_of(metric).name == family
    assert direction_of(metric) == direction


@pytest.mark.parametrize(
    ("metric", "kind"),
    [
        ("sm-clock", CauseKind.THROTTLE),
        ("cpu-freq", CauseKind.CPU),
        ("cpu", CauseKind.CPU),
        ("mem-mib", CauseKind.MEMORY),
        ("mem-util", CauseKind.BANDWIDTH),
        ("pcie-tx", CauseKind.BANDWIDTH),
        ("requests", CauseKind.LOAD),
        ("availability", CauseKind.UNKNOWN),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", CauseKind.THROTTLE),
        ("DCGM_FI_DEV_SM_CLOCK", CauseKind.THROTTLE),
        ("DCGM_FI_DEV_POWER_USAGE", CauseKind.COTENANT),  # a GPU's, not a CPU's
        ("DCGM_FI_DEV_GPU_UTIL", CauseKind.COTENANT),
        ("vllm:gpu_cache_usage_perc", CauseKind.MEMORY),  # the KV cache filling
        ("container_cpu_cfs_throttled_periods_total", CauseKind.CPU),
        ("node_cpu_scaling_frequency_hertz", CauseKind.CPU),
        ("scaling_cur_freq", CauseKind.CPU),  # Linux cpufreq's name
        ("mclk", CauseKind.THROTTLE),
        ("node_load1", CauseKind.CPU),
    ],
)
def test_evidence_names_the_kind_of_cause_it_points_at(metric: str, kind: CauseKind) -> None:
    assert cause_kind_of(metric) == kind


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("falling")
    write_cases(root, range(3))
    return root


@pytest.mark.parametrize("fault", GPU_FAULTS)
@pytest.mark.parametrize("seed", range(3))
def test_the_faulty_resource_ranks_first_in_gpu_serving(cases: Path, fault: str, seed: int) -> None:
    r = rca_table(cases / f"gpu-{fault}-{seed:02d}")
    root = {"gpu-clock-locked": "gpu0", "cpu-freq-clamped": "node", "cpu-squeeze": "batch"}[fault]
    assert r.ranks[0] == root
    ev = r.evidence[root]
    if fault == "gpu-clock-locked":
        assert ev.metric == "gpu0_sm-clock" and ev.during < 0.7 * ev.before
        assert ev.capacity and ev.kind == CauseKind.THROTTLE and ev.direction == Direction.FALL
    if fault == "cpu-freq-clamped":
        assert ev.metric == "node_cpu-freq" and ev.kind == CauseKind.CPU and ev.capacity


@pytest.mark.parametrize("fault", ["gpu-clock-locked", "cpu-freq-clamped"])
def test_without_directions_a_fallen_clock_is_not_seen(cases: Path, fault: str) -> None:
    case = load_case(cases / f"gpu-{fault}-00")
    ranks, _, _ = rank_entities(case, GPU_BEFORE)
    assert ranks[0] in ("gpu0", "node")
    off, _, _ = rank_entities(case, GPU_BEFORE, Rules(directions=False, capacity_first=False))
    assert off[0] == "vllm"  # the engine's queue and latency: the symptom
    queue_first, _, _ = rank_entities(case, GPU_BEFORE, Rules(capacity_first=False))
    assert queue_first[0] == "vllm"  # a fall alone scores below the symptom's rise


def test_a_clock_that_fell_because_its_processor_went_idle_is_no_capacity_lost(
    cases: Path,
) -> None:
    case = load_case(cases / "gpu-gpu-clock-locked-01")
    util = case.series["gpu0_sm-util"].copy()
    util[GPU_BEFORE:] = 2.0  # the GPU went idle: idle GPUs lower their clocks
    case.series["gpu0_sm-util"] = util
    _, _, evidence = rank_entities(case, GPU_BEFORE)
    assert not evidence["gpu0"].capacity


def test_a_locked_clock_whose_dram_traffic_fell_with_it_is_still_a_capacity_lost(
    cases: Path,
) -> None:
    """The SMs stay busy while the memory utilisation falls (kernels run slower, so their DRAM
    traffic per second falls): one busy measure that fell does not make the GPU idle."""
    case = load_case(cases / "gpu-gpu-clock-locked-01")
    mem = case.series["gpu0_mem-util"].copy()
    mem[GPU_BEFORE:] = 0.4 * np.median(mem[:GPU_BEFORE])
    case.series["gpu0_mem-util"] = mem
    ranks, _, evidence = rank_entities(case, GPU_BEFORE)
    assert ranks[0] == "gpu0" and evidence["gpu0"].capacity


@pytest.mark.parametrize("fault", ["availability-drop", "availability-dip"])
@pytest.mark.parametrize("seed", range(3))
def test_the_component_whose_availability_fell_ranks_first(
    cases: Path, fault: str, seed: int
) -> None:
    folder = cases / f"stats-{fault}-{seed:02d}"
    r = rca_table(folder)
    root = load_label(folder)
    assert r.ranks[0] == root
    ev = r.evidence[root]
    assert ev.metric == f"{root}_availability" and ev.direction == "fall"
    assert 99.0 < ev.before <= 100.0 and ev.during < ev.before  # shown in the column's percent
    if fault == "availability-drop":
        off, _, _ = rank_entities(load_case(folder), STAT_BEFORE, Rules(directions=False))
        assert off[0] != root


def test_a_dip_of_a_few_percent_in_availability_is_seen_on_its_shortfall() -> None:
    """Reproduction: 1-5 % of a component's requests failing (99.9 % -> 96 %) was scored on
    the rate's own scale, floored at 5 % of its level, and ranked below other components'
    latency noise: 5 of 20 generated dips named first, where NSigma named 20."""
    first = {True: 0, False: 0}
    for seed in range(10):
        frame, root = component_stats("availability-dip", seed)
        case = TabularCase(
            Path("dip"),
            frame["time"].to_numpy(dtype=np.float64),
            {c: frame[c].to_numpy(dtype=np.float64) for c in frame.columns if c != "time"},
        )
        for on in (True, False):
            ranks, _, _ = rank_entities(case, STAT_BEFORE, Rules(shortfall=on))
            first[on] += ranks[0] == root
    assert first[True] == 10
    assert first[False] <= 5


def test_the_bench_on_falling_cases_beats_the_baselines_that_see_no_direction(cases: Path) -> None:
    res = bench_tabular(cases)
    assert len(res["cases"]) == 3 * (len(GPU_FAULTS) + len(STAT_FAULTS))
    ours = res["summary"]["cotenant"]["AC@1"]
    assert ours == 1.0
    assert max(res["summary"][m]["AC@1"] for m in ("baro", "nsigma")) < ours


def load_label(folder: Path) -> str:
    return str(json.loads((folder / "label.json").read_text())["root_cause"])


@pytest.mark.parametrize("seed", range(3))
def test_a_locked_clock_seen_only_in_dcgm_throttle_reasons_names_the_gpu(
    cases: Path, seed: int
) -> None:
    """An export without the SM clock but with DCGM's bitmask of why the clock is held
    (0 while it runs free, a reason bit while it is locked): the bitmask rising is the
    evidence. Read as a clock, its rise was no harm and the engine's queue ranked first."""
    case = load_case(cases / f"gpu-gpu-clock-locked-{seed:02d}")
    series = {c: x for c, x in case.series.items() if "clock" not in c}
    reasons = np.zeros(len(case.time))
    reasons[GPU_BEFORE:] = 2.0  # DCGM_CLOCKS_EVENT_REASON_APPLICATIONS_CLOCKS_SETTING
    series["gpu0_DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] = reasons
    ranks, _, evidence = rank_entities(TabularCase(case.path, case.time, series), GPU_BEFORE)
    assert ranks[0] == "gpu0"
    ev = evidence["gpu0"]
    assert ev.metric == "gpu0_DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    assert ev.kind == CauseKind.THROTTLE and ev.direction == Direction.RISE
