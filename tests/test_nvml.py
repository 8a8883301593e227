"""The NVML collector against FakeNvml: what lands in the store and on /metrics, and how it
behaves when fields are unsupported, a GPU is lost, the driver goes away or NVML is missing.
Time is virtual (the fake and the collector share a clock) except where the thread runs."""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from spans import SpanFactory

from cotenant.app.config import Config, load_config
from cotenant.app.service import Service
from cotenant.cli.main import nvml_report
from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.nvml.collector import NvmlCollector
from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.collectors.nvml.metrics import NvmlMetrics
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.collectors.procfs.pod_identity import PodIdentity, PodName, StaticPods
from cotenant.core.errors import NvmlUnavailable, Overloaded
from cotenant.store.db import Store
from cotenant.store.schema import arrow_schema

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_764_000_000_000_000_000
HOST = "gpu-node-1"
GIB = 1 << 30


class Clock:
    """Virtual time in integer nanoseconds, shared by the fake and the collector."""

    def __init__(self) -> None:
        self.ns = T0

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += round(seconds * 1e9)


class Sink:
    """Records the Arrow batches the collector submits, as ``Writer.submit`` would get them."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, pa.Table]] = []
        self.error: Exception | None = None

    def __call__(self, table: str, batch: pa.Table) -> None:
        if self.error is not None:
            raise self.error
        self.batches.append((table, batch))

    def rows(self, table: str) -> list[dict[str, Any]]:
        return [r for t, b in self.batches if t == table for r in b.to_pylist()]

    def last(self, table: str) -> list[dict[str, Any]]:
        """Rows of the latest poll (all rows share its timestamp)."""
        rows = self.rows(table)
        ts = max((r["ts_ns"] for r in rows), default=None)
        return [r for r in rows if r["ts_ns"] == ts]


@dataclasses.dataclass
class Rig:
    fake: FakeNvml
    clock: Clock
    sink: Sink
    resolver: GpuResolver
    registry: CollectorRegistry
    collector: NvmlCollector

    def poll(self, after_s: float = 1.0) -> None:
        self.clock.advance(after_s)
        self.collector.poll_once()

    def metric(self, series: str, /, **labels: str) -> float | None:
        return self.registry.get_sample_value(series, labels)


def make_rig(fake: FakeNvml | None = None, clock: Clock | None = None, **kw: Any) -> Rig:
    clock = clock or Clock()
    fake = fake or FakeNvml(clock=clock)
    sink, resolver = Sink(), GpuResolver()
    registry = CollectorRegistry(auto_describe=True)
    kw = {"poll_interval_s": 1.0, "backoff_max_s": 4.0, "batch_interval_s": 0.0, **kw}
    collector = NvmlCollector(
        fake,
        sink=sink,
        resolver=resolver,
        host=HOST,
        metrics=NvmlMetrics(registry),
        clock=clock,
        **kw,
    )
    return Rig(fake, clock, sink, resolver, registry, collector)


@pytest.fixture
def rig() -> Iterator[Rig]:
    clock = Clock()
    fake = FakeNvml(clock=clock)
    fake.model.add_gpu()
    fake.model.add_gpu(name="NVIDIA L4", memory_total_bytes=24 * GIB, nvlink=False)
    r = make_rig(fake, clock)
    r.collector.open()
    yield r
    r.collector.stop()


def by_gpu(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["gpu"]: r for r in rows}


def test_every_gpu_field_lands_in_base_units_in_rows_and_metrics(rig: Rig) -> None:
    g0, g1 = (d.uuid for d in rig.collector.devices())
    rig.fake.model.set_gpu(
        g0,
        sm_util=70,
        mem_util=40,
        memory_used_bytes=30 * GIB,
        pcie_tx_bps=2e9,
        pcie_rx_bps=1e9,
        nvlink_tx_bps=5e10,
        nvlink_rx_bps=4e10,
        power_w=350.5,
        temp_c=61,
        sm_clock_mhz=1755,
        clock_event_reasons=0x4 | 0x40,
    )
    rig.poll()
    first = by_gpu(rig.sink.last("gpu_samples"))
    # byte rates come from counter deltas: none on the first read, the rest is there at once
    assert first[g0]["pcie_tx_bps"] is None and first[g0]["nvlink_rx_bps"] is None
    assert first[g0]["sm_util"] == 70.0 and first[g0]["power_w"] == 350.5
    rig.poll(0.5)
    row = by_gpu(rig.sink.last("gpu_samples"))[g0]
    assert row["host"] == HOST and row["ts_ns"] == rig.clock.ns
    assert (row["sm_util"], row["mem_util"], row["dram_active"]) == (70.0, 40.0, None)
    assert (row["mem_used_bytes"], row["mem_total_bytes"]) == (30 * GIB, 80 * GIB)
    assert row["pcie_tx_bps"] == pytest.approx(2e9) and row["pcie_rx_bps"] == pytest.approx(1e9)
    # NVLink counters are KiB: at most 1 KiB of rounding per 0.5 s
    assert row["nvlink_tx_bps"] == pytest.approx(5e10, abs=2048)
    assert row["nvlink_rx_bps"] == pytest.approx(4e10, abs=2048)
    assert (row["power_w"], row["temp_c"]) == (350.5, 61.0)
    assert (row["sm_clock_mhz"], row["max_sm_clock_mhz"]) == (1755.0, 1980.0)
    assert row["clock_event_reasons"] == 0x44
    assert by_gpu(rig.sink.last("gpu_samples"))[g1]["mem_total_bytes"] == 24 * GIB

    for table, batch in rig.sink.batches:
        assert batch.schema.equals(arrow_schema(table))

    m = rig.metric
    assert m("cotenant_gpu_up", host=HOST, gpu=g0) == 1.0
    assert m("cotenant_gpu_sm_utilization_ratio", host=HOST, gpu=g0) == pytest.approx(0.70)
    assert m("cotenant_gpu_memory_utilization_ratio", host=HOST, gpu=g0) == pytest.approx(0.40)
    assert m("cotenant_gpu_memory_used_bytes", host=HOST, gpu=g0) == 30 * GIB
    assert m("cotenant_gpu_memory_total_bytes", host=HOST, gpu=g0) == 80 * GIB
    assert m("cotenant_gpu_pcie_transmit_bytes_per_second", host=HOST, gpu=g0) == pytest.approx(2e9)
    assert m("cotenant_gpu_nvlink_receive_bytes_per_second", host=HOST, gpu=g0) == pytest.approx(
        4e10, abs=2048
    )
    assert m("cotenant_gpu_power_watts", host=HOST, gpu=g0) == 350.5
    assert m("cotenant_gpu_temperature_celsius", host=HOST, gpu=g0) == 61.0
    assert m("cotenant_gpu_sm_clock_hertz", host=HOST, gpu=g0) == 1.755e9
    assert m("cotenant_gpu_sm_clock_max_hertz", host=HOST, gpu=g0) == 1.98e9
    assert m("cotenant_gpu_clock_event_reasons", host=HOST, gpu=g0) == 0x44
    active = {
        r: m("cotenant_gpu_clock_event_active", host=HOST, gpu=g0, reason=r)
        for r in ("sw_power_cap", "hw_thermal_slowdown", "hw_slowdown", "gpu_idle")
    }
    assert active == {
        "sw_power_cap": 1.0,
        "hw_thermal_slowdown": 1.0,
        "hw_slowdown": 0.0,
        "gpu_idle": 0.0,
    }
    info = m("cotenant_gpu_info", host=HOST, gpu=g1, index="1", name="NVIDIA L4", parent="")
    assert info == 1.0
    assert m("cotenant_nvml_available") == 1.0
    assert m("cotenant_nvml_polls_total") == 2.0


def test_unsupported_fields_are_null_with_one_log_line_and_the_gpu_stays_up(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    g0, g1 = (d.uuid for d in rig.collector.devices())
    rig.fake.model.set_unsupported(g0, "power", "temperature", "clock_event_reasons")
    rig.fake.model.set_gpu(g0, sm_util=55, pcie_tx_bps=1e9)
    caplog.set_level(logging.INFO, logger="cotenant.collectors.nvml.collector")
    for _ in range(4):
        rig.poll()
    rows = by_gpu(rig.sink.last("gpu_samples"))
    r0 = rows[g0]
    assert (r0["power_w"], r0["temp_c"], r0["clock_event_reasons"]) == (None, None, None)
    assert r0["sm_util"] == 55.0 and r0["pcie_tx_bps"] == pytest.approx(1e9)
    # the L4 has no NVLink: NULL there, and everything else present
    assert rows[g1]["nvlink_tx_bps"] is None and rows[g1]["power_w"] == 70.0
    assert rows[g1]["pcie_tx_bps"] == 0.0
    about = [r.getMessage() for r in caplog.records if "does not support" in r.getMessage()]
    [a0] = [a for a in about if g0 in a]
    assert all(w in a0 for w in ("power", "temperature", "clock_event_reasons"))
    [a1] = [a for a in about if g1 in a]
    assert "nvlink" in a1 and "power" not in a1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert rig.metric("cotenant_gpu_up", host=HOST, gpu=g0) == 1.0
    assert rig.metric("cotenant_gpu_power_watts", host=HOST, gpu=g0) is None
    assert rig.metric("cotenant_gpu_power_watts", host=HOST, gpu=g1) == 70.0


def test_pcie_falls_back_to_the_sampled_throughput_without_byte_counters(rig: Rig) -> None:
    g0 = rig.collector.devices()[0].uuid
    rig.fake.model.set_unsupported(g0, "pcie_counters")
    rig.fake.model.set_gpu(g0, pcie_tx_bps=3 * 1024**3, pcie_rx_bps=512 * 1024)
    rig.poll()
    row = by_gpu(rig.sink.last("gpu_samples"))[g0]
    # nvmlDeviceGetPcieThroughput is KiB/s over its own 20 ms window: a rate on the first poll
    assert (row["pcie_tx_bps"], row["pcie_rx_bps"]) == (3 * 1024**3, 512 * 1024)
    assert row["nvlink_tx_bps"] is None  # first NVLink counter read
    rig.fake.model.set_unsupported(g0, "pcie_throughput")
    rig.poll(10)  # support is probed again at each rediscovery (rediscover_interval_s)
    assert by_gpu(rig.sink.last("gpu_samples"))[g0]["pcie_tx_bps"] is None


def test_a_lost_gpu_is_marked_down_and_reopened_with_backoff(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    g0, g1 = (d.uuid for d in rig.collector.devices())
    caplog.set_level(logging.INFO, logger="cotenant.collectors.nvml.collector")
    rig.poll()
    rig.fake.model.lose_gpu(g0)
    t_lost = rig.clock.ns + 10**9
    up: dict[float, bool] = {}

    def poll_at(t: float) -> None:
        rig.clock.ns = t_lost + round(t * 1e9)
        rig.collector.poll_once()
        up[t] = rig.metric("cotenant_gpu_up", host=HOST, gpu=g0) == 1.0
        assert g1 in by_gpu(rig.sink.last("gpu_samples"))  # the other GPU is still polled

    # attempts 1 s, 2 s, then 4 s (backoff_max_s) apart: at 1 and 3 (both fail), then 7
    for t in (0, 1, 2, 3, 4):
        poll_at(t)
    rig.fake.model.recover_gpu(g0)
    for t in (5, 6, 7, 8):
        poll_at(t)
    assert [t for t, ok in up.items() if ok] == [7, 8]
    rows = rig.sink.rows("gpu_samples")
    down_rows = [r for r in rows if r["gpu"] == g0 and t_lost <= r["ts_ns"] < t_lost + 7 * 10**9]
    assert down_rows == []
    assert rig.metric("cotenant_nvml_errors_total", kind="gpu_lost") >= 1
    msgs = [r.getMessage() for r in caplog.records]
    assert len([m for m in msgs if "is down" in m]) == 1
    assert len([m for m in msgs if "is back" in m]) == 1


def test_backoff_waits_for_the_next_attempt_after_recovery(rig: Rig) -> None:
    g0 = rig.collector.devices()[0].uuid
    rig.fake.model.lose_gpu(g0)
    rig.poll(0)  # down; next attempt after 1 s
    rig.poll(1)  # fails; next after 2 s
    rig.fake.model.recover_gpu(g0)
    rig.poll(1)  # 1 s into a 2 s wait: not tried yet
    assert rig.metric("cotenant_gpu_up", host=HOST, gpu=g0) == 0.0
    rig.poll(1)
    assert rig.metric("cotenant_gpu_up", host=HOST, gpu=g0) == 1.0
    assert g0 in by_gpu(rig.sink.last("gpu_samples"))


def test_driver_gone_marks_every_gpu_down_and_nvml_is_reinitialised(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    gpus = [d.uuid for d in rig.collector.devices()]
    rig.poll()
    rig.fake.model.unload_driver()
    rig.poll()
    assert [rig.metric("cotenant_gpu_up", host=HOST, gpu=g) for g in gpus] == [0.0, 0.0]
    assert rig.metric("cotenant_nvml_available") == 0.0
    before = len(rig.sink.rows("gpu_samples"))
    rig.poll()
    rig.poll()
    assert len(rig.sink.rows("gpu_samples")) == before
    rig.fake.model.load_driver()
    rig.poll(4)
    assert [rig.metric("cotenant_gpu_up", host=HOST, gpu=g) for g in gpus] == [1.0, 1.0]
    assert rig.metric("cotenant_nvml_available") == 1.0
    assert set(by_gpu(rig.sink.last("gpu_samples"))) == set(gpus)
    assert rig.fake.model.init_count == 1  # re-initialised, not leaked
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "driver" in errors[0].getMessage().lower()
    rig.collector.stop()
    assert rig.fake.model.init_count == 0


def test_no_nvml_library_is_one_clear_error_and_nothing_polls() -> None:
    r = make_rig(FakeNvml(library_found=False))
    with pytest.raises(NvmlUnavailable) as err:
        r.collector.open()
    text = str(err.value)
    assert "NVML Shared Library Not Found" in text
    assert "install the NVIDIA driver" in text and "nvml.enabled = false" in text
    r.collector.poll_once()
    r.collector.stop()
    assert r.sink.batches == []
    assert r.metric("cotenant_nvml_available") == 0.0


def test_mig_instances_are_their_own_gpus_with_their_processes() -> None:
    clock = Clock()
    fake = FakeNvml(clock=clock)
    parent = fake.model.add_gpu(name="NVIDIA A100-SXM4-80GB")
    plain = fake.model.add_gpu()
    mig_a = fake.model.create_mig(parent, memory_total_bytes=10 * GIB)
    mig_b = fake.model.create_mig(parent, memory_total_bytes=20 * GIB, profile="2g.20gb")
    fake.model.add_process(mig_a, 501, "triton", 6 * GIB)
    fake.model.add_process(mig_b, 502, "vllm", 15 * GIB)
    fake.model.add_process(plain, 503, "python3", 1 * GIB)
    fake.model.set_gpu(parent, power_w=300, sm_util=90)
    r = make_rig(fake, clock)
    r.collector.open()
    r.poll()
    devices = {d.uuid: d for d in r.collector.devices()}
    assert devices[parent].mig_enabled and devices[mig_a].parent == parent
    assert devices[mig_b].name.endswith("MIG 2g.20gb")
    rows = by_gpu(r.sink.last("gpu_samples"))
    assert set(rows) == {parent, mig_a, mig_b, plain}
    # NVML gives a MIG-mode GPU's power, not its utilization; an instance its memory
    assert rows[parent]["power_w"] == 300.0 and rows[parent]["sm_util"] is None
    assert rows[mig_b]["mem_total_bytes"] == 20 * GIB
    assert rows[mig_b]["mem_used_bytes"] == 15 * GIB
    procs = {p["pid"]: p for p in r.sink.last("process_samples")}
    assert {pid: p["gpu"] for pid, p in procs.items()} == {501: mig_a, 502: mig_b, 503: plain}
    assert procs[502]["mem_used_bytes"] == 15 * GIB and procs[502]["process_name"] == "vllm"
    # a span from pid 502 that names no GPU is put on its MIG instance
    assert r.resolver.resolve(None, HOST, 502, "any") == mig_b
    info = r.metric(
        "cotenant_gpu_info",
        host=HOST,
        gpu=mig_a,
        index="0",
        name="NVIDIA A100-SXM4-80GB MIG 1g.10gb",
        parent=parent,
    )
    assert info == 1.0
    # an instance created later shows up at the next rediscovery
    mig_c = fake.model.create_mig(parent, memory_total_bytes=10 * GIB)
    r.poll(1)
    assert mig_c not in by_gpu(r.sink.last("gpu_samples"))
    r.poll(10)
    assert mig_c in by_gpu(r.sink.last("gpu_samples"))
    r.collector.stop()


def test_process_samples_are_counted_once(rig: Rig) -> None:
    g0 = rig.collector.devices()[0].uuid
    rig.fake.model.add_process(g0, 100, "a", 2 * GIB)
    rig.fake.model.add_process(g0, 200, "b", 3 * GIB)

    def util() -> dict[int, tuple[float | None, float | None, int | None]]:
        rows = [r for r in rig.sink.last("process_samples") if r["gpu"] == g0]
        return {r["pid"]: (r["sm_util"], r["mem_util"], r["mem_used_bytes"]) for r in rows}

    rig.clock.advance(0.2)
    rig.fake.model.record_process_util(100, 40, 10)
    rig.clock.advance(0.2)
    rig.fake.model.record_process_util(100, 60, 30)
    rig.fake.model.record_process_util(200, 5, 1)
    rig.poll()
    assert util() == {100: (50.0, 20.0, 2 * GIB), 200: (5.0, 1.0, 3 * GIB)}
    rig.poll()  # nothing new: listed with memory, utilization unknown, nothing re-counted
    assert util() == {100: (None, None, 2 * GIB), 200: (None, None, 3 * GIB)}
    rig.fake.model.record_process_util(200, 80, 20)
    rig.fake.model.set_process_memory(100, 4 * GIB)
    rig.poll()
    assert util() == {100: (None, None, 4 * GIB), 200: (80.0, 20.0, 3 * GIB)}
    # a sample stamped before the last one taken is not counted (NVML's lastSeenTimeStamp)
    rig.fake.model.record_process_util(100, 99, 99, ts_ns=rig.clock.ns - 1_500_000_000)
    rig.poll()
    assert util()[100] == (None, None, 4 * GIB)
    assert rig.metric(
        "cotenant_gpu_process_memory_used_bytes",
        host=HOST,
        gpu=g0,
        pid="100",
        process="a",
        model="",
    ) == float(4 * GIB)
    # a defunct process's garbage sample (NVML can report more than 100 %) is dropped
    rig.fake.model.record_process_util(100, 4_000_000, 7)
    rig.fake.model.record_process_util(200, 30, 3)
    rig.poll()
    assert util() == {100: (None, None, 4 * GIB), 200: (30.0, 3.0, 3 * GIB)}
    rig.fake.model.remove_process(200)
    rig.poll()
    assert set(util()) == {100}


def test_processes_are_read_at_their_interval_and_no_sample_is_lost(rig: Rig) -> None:
    """At 10 Hz with process_interval_s = 1, GPU rows come every poll and process rows once a
    second, each the mean of every sample NVML made since the previous read."""
    c = NvmlCollector(
        rig.fake,
        sink=rig.sink,
        resolver=rig.resolver,
        host=HOST,
        metrics=NvmlMetrics(CollectorRegistry()),
        clock=rig.clock,
        poll_interval_s=0.1,
        process_interval_s=1.0,
        batch_interval_s=10.0,
    )
    c.open()
    g0 = c.devices()[0].uuid
    rig.fake.model.add_process(g0, 100, "a", 2 * GIB)
    c.poll_once()  # the first poll reads processes
    for k in range(20):  # two seconds at 10 Hz, a sample every poll: 10, 20, ..., 200 %/10
        rig.clock.advance(0.1)
        rig.fake.model.record_process_util(100, 10.0 * (k % 10), 1.0)
        c.poll_once()
    c.flush()
    gpu_ts = [r["ts_ns"] for r in rig.sink.rows("gpu_samples") if r["gpu"] == g0]
    procs = [r for r in rig.sink.rows("process_samples") if r["pid"] == 100]
    assert len(gpu_ts) == 21
    assert len(procs) == 3  # at 0, 1 and 2 s
    assert [r["sm_util"] for r in procs] == [None, 45.0, 45.0]  # mean of 0..90, twice
    assert procs[-1]["ts_ns"] == gpu_ts[-1]


def test_a_gpu_process_in_a_pod_is_named_namespace_pod_container(tmp_path: Path) -> None:
    """With ``pods``, a GPU process in a Kubernetes pod is named by its pod; the others keep
    NVML's process name."""
    uid = "8d2b6c1e-3f4a-4b5c-9d6e-7f8a9b0c1d2e"
    cid = "a3f1c2d4e5b6a7980123456789abcdef0123456789abcdef0123456789abcdef"
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
    )
    (tmp_path / "9").mkdir()
    (tmp_path / "9" / "cgroup").write_text("0::/system.slice/batch.service\n")
    pods = PodIdentity(StaticPods([(uid, "serving", "vllm-0", [("vllm", cid)])]), proc=tmp_path)
    clock = Clock()
    fake = FakeNvml(clock=clock)
    gpu = fake.model.add_gpu()
    r = make_rig(fake, clock, pods=pods)
    r.collector.open()
    fake.model.add_process(gpu, 4242, "python3", 20 * GIB)
    fake.model.add_process(gpu, 9, "python3", 1 * GIB)
    r.poll()
    r.collector.stop()
    names = {p["pid"]: p["process_name"] for p in r.sink.last("process_samples")}
    assert names == {4242: "serving/vllm-0 (vllm)", 9: "python3"}


def test_a_gpu_process_whose_pod_is_listed_later_is_named_by_pod_then(tmp_path: Path) -> None:
    uid, cid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "c" * 64
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{uid}/{cid}\n")
    listed: list[tuple[str, str, str, list[tuple[str, str]]]] = []

    class Kubelet:
        def containers(self) -> Mapping[tuple[str, str], PodName]:
            return StaticPods(listed).containers()

    clock = Clock()
    now = [0.0]
    pods = PodIdentity(Kubelet(), proc=tmp_path, refresh_s=5.0, monotonic=lambda: now[0])
    fake = FakeNvml(clock=clock)
    gpu = fake.model.add_gpu()
    r = make_rig(fake, clock, pods=pods)
    r.collector.open()
    fake.model.add_process(gpu, 77, "python3", GIB)
    seen = []
    for k in range(8):
        now[0] = float(k)
        if k == 2:
            listed.append((uid, "batch", "etl-0", [("etl", cid)]))
        r.poll()
        seen += [p["process_name"] for p in r.sink.last("process_samples")]
    r.collector.stop()
    # the list is read at the first poll (t = 0) and again at t = 5: named by pod from then on
    assert seen == ["python3"] * 5 + ["batch/etl-0 (etl)"] * 3


def test_pid_to_model_join_through_span_resources(rig: Rig) -> None:
    g0, g1 = (d.uuid for d in rig.collector.devices())
    rig.fake.model.add_process(g0, 4242, "python3", 20 * GIB)
    rig.fake.model.add_process(g1, 777, "python3", 2 * GIB)
    rig.fake.model.add_process(g1, 9, "unrelated", 1 * GIB)
    rig.fake.model.record_process_util(4242, 65, 30)
    norm = Normalizer(rig.resolver)
    spans = SpanFactory({"host.name": HOST, "process.pid": 4242})
    spans.ours("llama-8b", T0, 10.0)
    bare = SpanFactory({"process.pid": 777})  # no host.name: taken to be this host's
    bare.ours("sdxl", T0, 10.0)
    norm.normalize(spans.otlp())
    norm.normalize(bare.otlp())
    rig.poll()
    procs = {p["pid"]: p for p in rig.sink.last("process_samples")}
    assert procs[4242]["model"] == "llama-8b" and procs[4242]["sm_util"] == 65.0
    assert procs[777]["model"] == "sdxl"
    assert procs[9]["model"] is None
    ratio = rig.metric(
        "cotenant_gpu_process_sm_utilization_ratio",
        host=HOST,
        gpu=g0,
        pid="4242",
        process="python3",
        model="llama-8b",
    )
    assert ratio == pytest.approx(0.65)
    # and the other way: requests whose span names no GPU get the pid's GPU from NVML
    spans.ours("llama-8b", T0, 10.0)
    bare.ours("sdxl", T0, 10.0)
    got = [r["gpu"] for s in (spans, bare) for r in norm.normalize(s.otlp()).requests.to_pylist()]
    assert got == [g0, g1]
    # a process that exits is forgotten: its pid no longer places requests
    rig.fake.model.remove_process(4242)
    rig.poll()
    spans.ours("llama-8b", T0, 10.0)
    assert norm.normalize(spans.otlp()).requests.to_pylist()[0]["gpu"] == ""


def test_a_refused_batch_is_counted_and_polling_goes_on(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.sink.error = Overloaded("writer queue full", 1.0)
    rig.poll()
    rig.poll()
    assert rig.metric("cotenant_nvml_dropped_rows_total", table="gpu_samples") == 4.0
    assert len([r for r in caplog.records if "dropping" in r.getMessage()]) == 1
    rig.sink.error = None
    rig.poll()
    assert len(rig.sink.last("gpu_samples")) == 2


def test_rows_are_batched_per_interval_and_flushed_on_stop() -> None:
    clock = Clock()
    fake = FakeNvml(clock=clock)
    fake.model.add_gpu()
    r = make_rig(fake, clock, batch_interval_s=1.0)
    r.collector.open()
    for _ in range(25):
        r.poll(0.1)
    assert len(r.sink.batches) == 3  # one gpu_samples batch per second of polls
    r.collector.stop()
    assert len(r.sink.rows("gpu_samples")) == 25


def test_the_thread_polls_at_100_ms_until_stopped() -> None:
    fake = FakeNvml()  # real time
    gpu = fake.model.add_gpu()
    fake.model.set_gpu(gpu, sm_util=12)
    sink, registry = Sink(), CollectorRegistry(auto_describe=True)
    c = NvmlCollector(
        fake,
        sink=sink,
        resolver=GpuResolver(),
        host=HOST,
        metrics=NvmlMetrics(registry),
        poll_interval_s=0.1,
        batch_interval_s=0.2,
    )
    c.start()
    deadline = time.monotonic() + 30
    while len(sink.rows("gpu_samples")) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    c.stop()
    assert not [t for t in threading.enumerate() if t.name == "cotenant-nvml"]
    rows = sink.rows("gpu_samples")
    assert len(rows) >= 5 and {r["sm_util"] for r in rows} == {12.0}
    # every poll's row was handed over by stop(), and NVML was released
    assert len(rows) == registry.get_sample_value("cotenant_nvml_polls_total")
    assert fake.model.init_count == 0


def test_metrics_exposition_parses_and_drops_series_of_exited_processes(rig: Rig) -> None:
    g0 = rig.collector.devices()[0].uuid
    rig.fake.model.add_process(g0, 31, "x", GIB)
    rig.poll()
    text = generate_latest(rig.registry).decode()
    assert 'cotenant_gpu_process_memory_used_bytes{gpu="' in text and 'pid="31"' in text
    rig.fake.model.remove_process(31)
    rig.poll()
    assert 'pid="31"' not in generate_latest(rig.registry).decode()


# ---- cotenant serve and cotenant nvml ---------------------------------------------------


def serve_config(tmp: Path, **env: str) -> Config:
    return load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_ENABLED": "false",
            "COTENANT_STORE_PATH": str(tmp / "s.duckdb"),
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.05",
            "COTENANT_NVML_POLL_INTERVAL_S": "0.05",
            "COTENANT_NVML_HOST": HOST,
            **env,
        }
    )


def run_service(svc: Service) -> threading.Thread:
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(30)
    return t


def test_serve_polls_an_injected_nvml_into_the_store_and_metrics(tmp_path: Path) -> None:
    fake = FakeNvml()
    gpu = fake.model.add_gpu()
    fake.model.set_gpu(gpu, sm_util=33, power_w=250)
    fake.model.add_process(gpu, 4242, "python3", 5 * GIB)
    fake.model.record_process_util(4242, 20, 5)
    svc = Service(serve_config(tmp_path), nvml=fake)
    t = run_service(svc)
    assert svc.endpoints is not None
    url = f"{svc.endpoints.api}/metrics"
    labels = {"gpu": gpu, "host": HOST}
    deadline = time.monotonic() + 30
    values: dict[str, float] = {}
    while "cotenant_gpu_sm_utilization_ratio" not in values and time.monotonic() < deadline:
        values = {
            s.name: s.value
            for fam in text_string_to_metric_families(httpx.get(url).text)
            for s in fam.samples
            if s.labels == labels
        }
        time.sleep(0.05)
    assert values["cotenant_gpu_sm_utilization_ratio"] == pytest.approx(0.33)
    assert values["cotenant_gpu_up"] == 1.0 and values["cotenant_gpu_power_watts"] == 250.0
    svc.stop()
    t.join(60)
    assert fake.model.init_count == 0  # stopped before the store closed, NVML released
    store = Store(tmp_path / "s.duckdb", read_only=True)
    with store.cursor() as cur:
        gpu_rows = cur.execute(
            "SELECT count(*), min(sm_util), max(power_w) FROM gpu_samples WHERE gpu = ?", [gpu]
        ).fetchone()
        proc = cur.execute(
            "SELECT max(sm_util), max(mem_used_bytes) FROM process_samples WHERE pid = 4242"
        ).fetchone()
    store.close()
    assert gpu_rows is not None and gpu_rows[0] >= 1 and gpu_rows[1:] == (33.0, 250.0)
    assert proc == (20.0, 5 * GIB)


def test_serve_without_nvml_warns_once_and_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    svc = Service(serve_config(tmp_path), nvml=FakeNvml(library_found=False))
    t = run_service(svc)
    assert svc.endpoints is not None
    assert httpx.get(f"{svc.endpoints.api}/readyz").status_code == 200
    text = httpx.get(f"{svc.endpoints.api}/metrics").text
    assert "cotenant_nvml_available 0.0" in text and "cotenant_gpu_up{" not in text
    svc.stop()
    t.join(60)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "NVML" in warnings[0] and "without GPU counters" in warnings[0]


def test_serve_with_nvml_disabled_does_not_touch_it(tmp_path: Path) -> None:
    fake = FakeNvml()
    fake.model.add_gpu()
    svc = Service(serve_config(tmp_path, COTENANT_NVML_ENABLED="false"), nvml=fake)
    t = run_service(svc)
    svc.stop()
    t.join(60)
    assert svc.nvml is None and fake.model.init_count == 0


def test_cotenant_nvml_lists_gpus_and_one_poll() -> None:
    clock = Clock()
    fake = FakeNvml(clock=clock)
    gpu = fake.model.add_gpu()
    other = fake.model.add_gpu(name="NVIDIA L4", memory_total_bytes=24 * GIB)
    mig = fake.model.create_mig(other, memory_total_bytes=12 * GIB, profile="3g.12gb")
    fake.model.set_gpu(gpu, sm_util=70, pcie_tx_bps=2e9, power_w=300, clock_event_reasons=0x4)
    fake.model.add_process(gpu, 4242, "python3", 20 * GIB)
    out = io.StringIO()
    cfg = dataclasses.replace(Config(), nvml=dataclasses.replace(Config().nvml, host=HOST))
    assert nvml_report(fake, cfg, out, clock=clock, sleep=clock.advance) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == f"NVML: 2 GPUs on host {HOST} (driver {fake.model.driver_version})"
    assert lines[1].startswith(f"GPU 0  {gpu}  NVIDIA H100 80GB HBM3  memory 80.0 GiB  MIG off")
    assert lines[2].startswith(f"GPU 1  {other}  NVIDIA L4  memory 24.0 GiB  MIG on")
    assert lines[3].startswith(f"  MIG  {mig}  NVIDIA L4 MIG 3g.12gb  memory 12.0 GiB")
    text = out.getvalue()
    g = next(x for x in lines if x.startswith(gpu))
    assert "sm 70%" in g and "pcie tx 2.00 GB/s" in g and "power 300 W" in g
    assert "clock events 0x4 sw_power_cap" in g
    assert "pid 4242  python3" in text and "used 20.0 GiB" in text
    assert fake.model.init_count == 0


def test_cotenant_nvml_without_the_library_exits_2_saying_what_to_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = io.StringIO()
    assert nvml_report(FakeNvml(library_found=False), Config(), out) == 2
    err = capsys.readouterr().err
    assert err.startswith("cotenant nvml: NVML unavailable (NVML Shared Library Not Found)")
    assert "install the NVIDIA driver" in err and out.getvalue() == ""


def _have_nvml() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_cotenant_nvml_command_on_this_machine() -> None:
    """The real binding: exit 2 and the message where there is no driver, else the GPUs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COTENANT_")}
    proc = subprocess.run(
        [sys.executable, "-m", "cotenant", "nvml"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    if _have_nvml():
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("NVML: ") and "GPU 0  GPU-" in proc.stdout
    else:
        assert proc.returncode == 2
        assert "NVML unavailable" in proc.stderr and "install the NVIDIA driver" in proc.stderr
        assert proc.stdout == ""


def test_metrics_doc_lists_every_series() -> None:
    from cotenant.collectors.ingest_metrics import IngestMetrics

    registry = CollectorRegistry(auto_describe=True)
    IngestMetrics(registry)
    NvmlMetrics(registry)
    doc = (ROOT / "docs" / "metrics.md").read_text()
    names = {fam.name for fam in registry.collect()}
    assert "cotenant_gpu_sm_utilization_ratio" in names
    missing = [n for n in names if f"`{n}" not in doc]
    assert missing == []
