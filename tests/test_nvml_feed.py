"""The simulated GPU across processes: ``cotenant simulate --nvml-feed`` writes the simulator's
counter samples as JSON lines, :class:`simulator.nvml_feed_tail.FeedTail` (``cotenant agent
--fake-nvml``) follows them into the FakeNvml that the real NVML collector polls; bad input is
named by file and line and never stops the feed. Time is virtual (one manual wall clock)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from fleet_rig import spawn, started
from prometheus_client.parser import text_string_to_metric_families
from promserver import wait_until

from cotenant.cli.main import main
from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.nvml.collector import NvmlCollector
from cotenant.core.errors import UsageError
from cotenant.simulator.engine import Simulation
from cotenant.simulator.nvml_feed import FeedWriter, header_for, sample_records
from cotenant.simulator.nvml_feed_tail import FeedClock, FeedTail
from cotenant.simulator.scenario import Scenario
from cotenant.simulator.scenario_load import find_scenario, load_scenario

T0 = 1_764_000_000_000_000_000
S = 1_000_000_000


class Wall:
    def __init__(self) -> None:
        self.ns = T0

    def __call__(self) -> int:
        return self.ns


class Sink:
    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def __call__(self, table: str, batch: pa.Table) -> None:
        self.rows.setdefault(table, []).extend(batch.to_pylist())


@pytest.fixture
def scenario() -> Scenario:
    return load_scenario(find_scenario("demo"))


def _tail(path: Path, wall: Wall, **kw: Any) -> FeedTail:
    return FeedTail(path, clock=FeedClock(wall_ns=wall), **kw)


def test_the_feed_drives_the_real_nvml_collector_sample_by_sample(
    tmp_path: Path, scenario: Scenario
) -> None:
    path, wall = tmp_path / "feed.jsonl", Wall()
    tail = _tail(path, wall)
    sink = Sink()
    collector = NvmlCollector(
        tail.fake,
        sink=sink,
        resolver=GpuResolver(),
        host="sim-node",
        clock=tail.clock,
        batch_interval_s=0.0,
        process_interval_s=0.0,
    )
    tail.on_gpus = collector.rediscover_soon
    tail.step()  # no file yet: waits
    collector.open()
    assert collector.devices() == []  # no GPU until the feed's header
    # the stream started 2 s ago on the wall clock, at virtual time T0
    sim = Simulation(scenario, start_ns=T0)
    writer = FeedWriter(path, header_for(scenario, start_ns=T0, wall_start_ns=T0, speed=1.0))
    sim.run_until(5.0)
    gpu_rows, proc_rows = sim.take_samples()
    writer.write(gpu_rows, proc_rows)
    wall.ns = T0 + int(2.5 * S)
    tail.step()
    assert tail.bad_lines == 0 and tail.header is not None
    collector.poll_once()
    want = {f"GPU-{g.id}" for g in scenario.gpus}
    assert {d.uuid for d in collector.devices()} == want
    by_ts = {(r[0], r[2]): r for r in gpu_rows}
    # the 2 s sample is set, the 3 s one waits for its time
    got = {r["gpu"]: r for r in sink.rows["gpu_samples"]}
    for g in scenario.gpus:
        row = by_ts[(T0 + 2 * S, g.id)]
        assert got[f"GPU-{g.id}"]["sm_util"] == round(row[3])
        assert got[f"GPU-{g.id}"]["mem_used_bytes"] == row[10]
    wall.ns = T0 + int(5.5 * S)
    tail.step()
    sink.rows.clear()
    collector.poll_once()
    got = {r["gpu"]: r for r in sink.rows["gpu_samples"]}
    for g in scenario.gpus:
        assert got[f"GPU-{g.id}"]["sm_util"] == round(by_ts[(T0 + 5 * S, g.id)][3])
    # per-process SM: the mean of the samples of each busy process up to now
    procs = sink.rows["process_samples"]
    busy = {r[3] for r in proc_rows if r[2] is not None and r[6]}
    assert busy and busy <= {r["pid"] for r in procs if r["sm_util"]}
    for r in procs:
        mine = [round(x[6]) for x in proc_rows if x[3] == r["pid"] and x[2] is not None]
        if r["sm_util"] is not None and mine:
            assert min(mine) <= r["sm_util"] <= max(mine)
    assert tail.applied == sum(1 for r in proc_rows if r[2] is not None) + len(gpu_rows)
    writer.close()
    collector.stop()
    tail.stop()


def _header(tmp_path: Path, scenario: Scenario) -> tuple[Path, str]:
    path = tmp_path / "feed.jsonl"
    w = FeedWriter(path, header_for(scenario, start_ns=T0, wall_start_ns=T0, speed=1.0))
    w.close()
    return path, scenario.gpus[0].id


def test_bad_lines_are_named_by_file_and_line_and_the_feed_goes_on(
    tmp_path: Path, scenario: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    path, gpu = _header(tmp_path, scenario)
    good = {"kind": "gpu", "ts_ns": T0, "gpu": gpu, "sm_util": 77.0, "power_w": 300.0}
    stranger = {"kind": "process", "ts_ns": T0, "pid": 424242, "sm_util": 5.0, "mem_util": 1.0}
    lines = [
        "this is not JSON",
        json.dumps({**good, "gpu": "gpu-nowhere"}),
        json.dumps({**good, "sm_util": "high"}),
        json.dumps({**stranger, "used_memory_bytes": 1}),
        json.dumps({"kind": "temperature", "ts_ns": T0}),
        "[1, 2]",
        json.dumps(good),
    ]
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")
    wall = Wall()
    tail = _tail(path, wall)
    with caplog.at_level(logging.ERROR, "cotenant.simulator.nvml_feed_tail"):
        tail.step()
    assert tail.bad_lines == 6
    msgs = [r.getMessage() for r in caplog.records]
    for n, what in (
        (2, "not a JSON line"),
        (3, "gpu 'gpu-nowhere': not one of the header's gpus"),
        (4, "sm_util 'high': expected a finite number"),
        (5, "pid 424242: not one of the header's processes"),
        (6, "kind 'temperature'"),
        (7, "expected a JSON object"),
    ):
        assert any(f"{path}:{n}: {what}" in m for m in msgs), (n, msgs)
    # the good record after them still arrives
    tail.fake.nvmlInit()
    h = tail.fake.nvmlDeviceGetHandleByIndex(0)
    assert tail.fake.nvmlDeviceGetUtilizationRates(h).gpu == 77
    assert tail.fake.nvmlDeviceGetPowerUsage(h) == 300_000
    tail.stop()


def test_a_partial_line_waits_for_its_end_and_a_restarted_feed_is_followed(
    tmp_path: Path, scenario: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "feed.jsonl"
    wall = Wall()
    tail = _tail(path, wall)
    path.write_text('{"kind": "header", "version": 1, "scenario": ')  # the writer is mid-line
    with caplog.at_level(logging.ERROR, "cotenant.simulator.nvml_feed_tail"):
        tail.step()
        assert tail.header is None and tail.bad_lines == 0
        path.unlink()  # replaced (as FeedWriter does)
        path.write_text('{"kind": "header", "version": 7}\n{"kind": "gpu"}\n')
        tail.step()
    assert tail.header is None and tail.bad_lines == 1  # the rest of that file is ignored
    assert f"{path}:1: version 7: this cotenant reads 1" in caplog.text
    # the stream restarts: a new file with a valid header is followed from its start
    path.unlink()
    _header(tmp_path, scenario)
    tail.step()
    assert tail.header is not None and tail.header.scenario == scenario.name
    tail.fake.nvmlInit()
    assert tail.fake.nvmlDeviceGetCount() == len(scenario.gpus)
    tail.stop()


def test_the_clock_follows_the_streams_virtual_time(tmp_path: Path, scenario: Scenario) -> None:
    wall = Wall()
    clock = FeedClock(wall_ns=wall)
    assert clock() == T0  # the wall clock until a header maps it
    h = header_for(scenario, start_ns=5 * S, wall_start_ns=T0, speed=10.0)
    clock.follow(h)
    wall.ns = T0 + 2 * S
    assert clock() == 25 * S


def test_samples_a_clock_never_reaches_are_bounded(tmp_path: Path, scenario: Scenario) -> None:
    path = tmp_path / "feed.jsonl"
    far = header_for(scenario, start_ns=T0, wall_start_ns=T0 + 3600 * S, speed=1.0)
    w = FeedWriter(path, far)  # its clock reads an hour before T0 at T0
    gpu = scenario.gpus[0].id
    w.write([(T0 + i * S, "h", gpu, 10.0 * i, 0, 0, 0, 0, None, None, 0, 0, 100, 40, 1980,
              1980, 0) for i in range(1, 6)], [])  # fmt: skip
    w.close()
    tail = _tail(path, Wall(), max_pending=3)
    tail.step()
    assert (tail.applied_early, tail.pending) == (2, 3)
    tail.fake.nvmlInit()
    assert (
        tail.fake.nvmlDeviceGetUtilizationRates(tail.fake.nvmlDeviceGetHandleByIndex(0)).gpu == 20
    )
    tail.stop()


def test_usage_errors_name_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        FeedTail(tmp_path / "no-such-dir" / "feed.jsonl")
    with pytest.raises(UsageError, match="a directory"):
        FeedTail(tmp_path)
    assert main(["agent", "--fake-nvml", str(tmp_path / "no-such-dir" / "feed.jsonl")]) == 2
    assert "no-such-dir does not exist" in capsys.readouterr().err
    for argv, what in (
        (["--out", str(tmp_path), "--nvml-feed", str(tmp_path / "f")], "goes with --otlp"),
        (["--otlp", "http://127.0.0.1:9", "--speed", "max", "--nvml-feed", "f"], "--speed"),
        (["--otlp", "http://127.0.0.1:9", "--nvml-feed", str(tmp_path / "x" / "f")],
         "does not exist"),
    ):  # fmt: skip
        assert main(["simulate", "demo", *argv]) == 2
        err = capsys.readouterr().err
        assert "--nvml-feed" in err and what in err, err


def test_an_agent_with_fake_nvml_publishes_the_simulated_gpu(
    tmp_path: Path, scenario: Scenario
) -> None:
    """``cotenant agent --fake-nvml`` (started before the file exists): its /metrics carries
    the feed's GPU counters under DCGM names and its processes' SM, named after the node; a bad
    line is logged by file and line and the agent goes on."""
    feed = tmp_path / "nvml.jsonl"
    cmd = ["agent", "--store", str(tmp_path / "a.duckdb"), "--fake-nvml", str(feed)]
    agent = started(spawn(cmd, tmp_path, "agent", {"COTENANT_AGENT_NODE": "node-x"}), tmp_path,
                    "agent")  # fmt: skip
    try:
        now = time.time_ns()
        writer = FeedWriter(feed, header_for(scenario, start_ns=now, wall_start_ns=now, speed=1))
        sim = Simulation(scenario, start_ns=now)
        sim.run_until(2.0)
        gpu_rows, proc_rows = sim.take_samples()
        writer.write(gpu_rows, proc_rows)
        writer.close()
        bad_at = 2 + len(sample_records(gpu_rows, proc_rows))
        late = {"kind": "gpu", "ts_ns": now + int(2.5 * S), "gpu": "gpu0", "sm_util": 55.0}
        with feed.open("a") as f:
            f.write("{oops\n" + json.dumps(late) + "\n")
        want = {f"GPU-{r[2]}": round(r[3]) for r in gpu_rows if r[0] == now + 2 * S}
        want["GPU-gpu0"] = 55
        busy = {str(r[3]) for r in proc_rows if r[2] is not None and r[6]}
        seen: set[str] = (
            set()
        )  # processes the agent published busy (each read finds new samples once)

        def published() -> dict[str, Any] | None:
            text = httpx.get(f"{agent.api}/metrics", timeout=5).text
            got: dict[str, Any] = {"gpu": {}, "pids": set()}
            for fam in text_string_to_metric_families(text):
                for smp in fam.samples:
                    if smp.name == "DCGM_FI_DEV_GPU_UTIL":
                        assert smp.labels["hostname"] == "node-x", smp
                        got["gpu"][smp.labels["UUID"]] = smp.value
                    if smp.name == "cotenant_gpu_process_sm_utilization_ratio" and smp.value:
                        got["pids"].add(smp.labels["pid"])
            seen.update(got["pids"])
            return got if got["gpu"] == want and busy <= seen else None

        wait_until(published, "the agent to publish the feed's GPU counters", 30)
        assert f"{feed}:{bad_at}: not a JSON line" in agent.log.read_text()
        assert agent.proc.poll() is None
    finally:
        agent.stop()
