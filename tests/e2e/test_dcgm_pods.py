"""DCGM exporter's pod labels and label variants through ``PrometheusSource`` and a real
Prometheus: several pods per GPU (``KUBERNETES_VIRTUAL_GPUS=true``: per-pod ``GPU_UTIL`` and
``FB_USED`` beside the GPU's own series, copies of the rest), one pod per GPU (the default),
``--use-old-namespace`` (``uuid``, ``pod_name``, ...) with the newer ``hostname``, and
``DCGM_EXP_CLOCK_EVENTS_COUNT`` where the clock-event bitmask is not collected.

The series are shaped as dcgm-exporter's ``internal/pkg/transformation/kubernetes.go`` and
``internal/pkg/collector/clock_events_collector.go`` write them (checked at its May 2026 HEAD).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from promserver import TextExporter, needs_prometheus, start_prometheus, wait_until

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange

pytestmark = needs_prometheus

MIB = 1_048_576
STEP_S = 2.0
STEP_NS = int(STEP_S * 1e9)

VIRTUAL = {"gpu": "0", "UUID": "GPU-vvvv", "Hostname": "node-v", "device": "nvidia0"}
LLAMA_POD = {"namespace": "serving", "pod": "vllm-1", "container": "vllm", "pod_uid": "u-1"}
TRAIN_POD = {"namespace": "research", "pod": "trainer-0", "container": "trainer", "pod_uid": "u-2"}
OLD = {"gpu": "1", "uuid": "GPU-oooo", "hostname": "node-o", "device": "nvidia1"}
ETL_POD = {"pod_namespace": "batch", "pod_name": "etl-0", "container_name": "etl"}
EMBED_POD = {"pod_namespace": "serving", "pod_name": "embed-0", "container_name": "embed"}
ONE = {"gpu": "2", "UUID": "GPU-1111", "Hostname": "node-v", "device": "nvidia2"}
QWEN_POD = {"namespace": "serving", "pod": "vllm-2", "container": "vllm"}
WINDOW = {"window_size_in_ms": "300000"}
EVENTS = "DCGM_EXP_CLOCK_EVENTS_COUNT"


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


class DcgmExporter:
    """The exposition: three GPUs as dcgm-exporter labels them, vLLM's counters of two pods,
    and one agent's per-process series."""

    def __init__(self) -> None:
        self.t0 = time.time()

    def render(self) -> str:
        ts = int(time.time() * 1000)
        e = time.time() - self.t0
        out: list[str] = []

        def line(name: str, value: float, *labels: dict[str, str]) -> None:
            merged: dict[str, str] = {}
            for lb in labels:
                merged |= lb
            out.append(f"{name}{{{_labels(merged)}}} {value!r} {ts}")

        # several pods per GPU, current dcgm-exporter: GPU_UTIL and FB_USED per pod beside the
        # GPU's own series; every other field copied once per pod, none of the GPU's own left
        line("DCGM_FI_DEV_GPU_UTIL", 80.0, VIRTUAL)
        line("DCGM_FI_DEV_FB_USED", 60000.0, VIRTUAL)
        for pod, util, used in ((LLAMA_POD, 30.0, 20000.0), (TRAIN_POD, 50.0, 40000.0)):
            line("DCGM_FI_DEV_GPU_UTIL", util, VIRTUAL, pod)
            line("DCGM_FI_DEV_FB_USED", used, VIRTUAL, pod)
            line("DCGM_FI_DEV_MEM_COPY_UTIL", 25.0, VIRTUAL, pod)
            line("DCGM_FI_DEV_FB_FREE", 20000.0, VIRTUAL, pod)
            line("DCGM_FI_DEV_SM_CLOCK", 1500.0, VIRTUAL, pod)
            # software thermal slowdown seen 3 times in the last 5 min, no power cap event
            for event, count in (("sw_thermal", 3.0), ("power_cap", 0.0)):
                line(EVENTS, count, VIRTUAL, pod, WINDOW, {"clock_event": event})
        # several pods per GPU, --use-old-namespace (an older release: copies of every field),
        # and the host under the newer lower-case name
        for pod in (ETL_POD, EMBED_POD):
            line("DCGM_FI_DEV_GPU_UTIL", 60.0, OLD, pod)
            line("DCGM_FI_DEV_FB_USED", 10000.0, OLD, pod)
            line("DCGM_FI_DEV_FB_FREE", 70000.0, OLD, pod)
            line("DCGM_FI_DEV_MEM_COPY_UTIL", 5.0, OLD, pod)
            line(EVENTS, 0.0, OLD, pod, WINDOW)  # no event: no reason
        # one pod per GPU (no KUBERNETES_VIRTUAL_GPUS): the GPU's series, labelled in place
        line("DCGM_FI_DEV_GPU_UTIL", 90.0, ONE, QWEN_POD)
        line("DCGM_FI_DEV_FB_USED", 50000.0, ONE, QWEN_POD)
        line("DCGM_FI_DEV_FB_FREE", 30000.0, ONE, QWEN_POD)
        for model, pod in (("llama-8b", LLAMA_POD), ("qwen-7b", QWEN_POD)):
            lb = {"model_name": model, "namespace": pod["namespace"], "pod": pod["pod"]}
            e2e = "vllm:e2e_request_latency_seconds"
            line(f"{e2e}_bucket", 10 * e, lb, {"le": "+Inf"})
            line(f"{e2e}_sum", 3 * e, lb)
            line(f"{e2e}_count", 10 * e, lb)
            line("vllm:num_requests_running", 4.0, lb)
        # an agent on node-v sees the trainer's process through NVML
        agent = {"host": "node-v", "gpu": "GPU-vvvv", "pid": "4242", "model": ""}
        agent["process"] = "research/trainer-0 (trainer)"
        line("cotenant_gpu_process_sm_utilization_ratio", 0.47, agent)
        line("cotenant_gpu_process_memory_used_bytes", 41000.0 * MIB, agent)
        return "\n".join(out) + "\n"


@dataclass
class Fleet:
    source: PrometheusSource
    rng: TimeRange


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with (
        TextExporter(DcgmExporter().render) as exp,
        start_prometheus(tmp_path_factory.mktemp("prom"), [exp.target]) as prom,
    ):
        wait_until(
            lambda: prom.query('count_over_time(DCGM_FI_DEV_GPU_UTIL{gpu="2"}[1m]) >= 9'),
            "nine scrapes of the exporter",
        )
        latest_s = float(prom.query("max(timestamp(DCGM_FI_DEV_GPU_UTIL))")[0]["value"][1])
        until = int(latest_s * 1e9) // STEP_NS * STEP_NS
        with PrometheusSource(prom.url, timeout_s=10, scrape_interval_s=1.0) as source:
            yield Fleet(source, TimeRange(until - 2 * STEP_NS, until))


def by_gpu(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {r["gpu"]: r for r in rows}
    assert len(out) * 2 == len(rows)  # two windows per GPU
    return out


def test_a_gpus_values_are_its_own_not_the_mean_of_its_pods_whatever_the_labels(
    fleet: Fleet,
) -> None:
    g = by_gpu(fleet.source.gpu_windows(fleet.rng, STEP_S).to_pylist())
    assert {gpu: r["host"] for gpu, r in g.items()} == {
        "GPU-vvvv": "node-v",
        "GPU-oooo": "node-o",  # UUID as `uuid`, host as `hostname`
        "GPU-1111": "node-v",
    }
    v = g["GPU-vvvv"]
    assert v["sm_util"] == pytest.approx(80.0)  # the GPU's series, not mean(80, 30, 50)
    assert v["mem_used_bytes"] == pytest.approx(60000 * MIB)
    assert v["mem_util"] == pytest.approx(25.0)  # only copies per pod: their value
    assert v["mem_total_bytes"] == pytest.approx(80000 * MIB)
    assert v["sm_clock_mhz"] == pytest.approx(1500.0)
    assert v["clock_event_reasons"] == 0x20  # sw_thermal counted, power_cap at 0
    assert g["GPU-oooo"]["sm_util"] == pytest.approx(60.0)
    assert g["GPU-oooo"]["clock_event_reasons"] == 0  # counted: no reason
    assert g["GPU-1111"]["sm_util"] == pytest.approx(90.0)
    assert g["GPU-1111"]["clock_event_reasons"] is None  # neither series: unknown
    old = fleet.source.gpu_windows(fleet.rng, STEP_S, gpu="GPU-oooo").to_pylist()
    assert {r["gpu"] for r in old} == {"GPU-oooo"} and len(old) == 2


def test_pods_sharing_a_gpu_are_named_as_agents_name_them_and_one_pod_per_gpu_is_no_pod_row(
    fleet: Fleet,
) -> None:
    rows = fleet.source.process_windows(fleet.rng, STEP_S).to_pylist()
    got = {(r["gpu"], r["process_name"]): r for r in rows}
    assert set(got) == {
        ("GPU-vvvv", "serving/vllm-1 (vllm)"),
        ("GPU-vvvv", "research/trainer-0 (trainer)"),
        ("GPU-oooo", "batch/etl-0 (etl)"),
        ("GPU-oooo", "serving/embed-0 (embed)"),
    }  # GPU-1111's one pod: the GPU's values under its allocated pod's name, no pod's own
    llama = got[("GPU-vvvv", "serving/vllm-1 (vllm)")]
    assert (llama["pid"], llama["model"]) == (None, "llama-8b")  # its vLLM series' model
    assert llama["sm_util"] == pytest.approx(30.0)  # its own share of the GPU
    assert llama["mem_used_bytes"] == pytest.approx(20000 * MIB)
    trainer = got[("GPU-vvvv", "research/trainer-0 (trainer)")]
    assert trainer["pid"] == 4242  # the agent's row wins over DCGM's for the same pod
    assert trainer["sm_util"] == pytest.approx(47.0)
    assert got[("GPU-oooo", "batch/etl-0 (etl)")]["sm_util"] == pytest.approx(60.0)
    only = fleet.source.process_windows(fleet.rng, STEP_S, gpu="GPU-oooo").to_pylist()
    assert {r["process_name"] for r in only} == {"batch/etl-0 (etl)", "serving/embed-0 (embed)"}


def test_the_one_pod_label_still_places_its_models_requests_on_the_gpu(fleet: Fleet) -> None:
    assert fleet.source.model_gpus(fleet.rng) == [("llama-8b", "GPU-vvvv"), ("qwen-7b", "GPU-1111")]


EXPORTER_POD = {"namespace": "gpu-operator", "pod": "dcgm-exporter-x1", "container": "exporter"}


@pytest.fixture(scope="module")
def renamed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The same exposition, the DCGM series scraped as the dcgm-exporter chart's ServiceMonitor
    scrapes them by default (``honorLabels: false``): Prometheus adds the exporter pod's own
    namespace/pod/container as target labels, and renames the series' own ``exported_*``. The
    vLLM and agent series come from targets of their own (the old-namespace GPU is left out:
    one exporter has one label set)."""
    source = DcgmExporter()

    def dcgm() -> str:
        lines = source.render().splitlines()
        return "".join(x + "\n" for x in lines if x.startswith("DCGM") and "GPU-oooo" not in x)

    def rest() -> str:
        return "".join(x + "\n" for x in source.render().splitlines() if not x.startswith("DCGM"))

    with (
        TextExporter(dcgm) as d,
        TextExporter(rest) as r,
        start_prometheus(
            tmp_path_factory.mktemp("prom-renamed"),
            [d.target, r.target],
            labels={d.target: EXPORTER_POD},
        ) as prom,
    ):
        wait_until(
            lambda: prom.query(
                'count_over_time(DCGM_FI_DEV_GPU_UTIL{gpu="2",exported_pod="vllm-2"}[1m]) >= 9'
            ),
            "nine scrapes of the exporter, its pod labels renamed",
        )
        latest_s = float(prom.query("max(timestamp(DCGM_FI_DEV_GPU_UTIL))")[0]["value"][1])
        until = int(latest_s * 1e9) // STEP_NS * STEP_NS
        with PrometheusSource(prom.url, timeout_s=10, scrape_interval_s=1.0) as src:
            yield Fleet(src, TimeRange(until - 2 * STEP_NS, until))


def test_exported_pod_labels_name_the_pods_when_the_scrape_does_not_honor_labels(
    renamed: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    g = by_gpu(renamed.source.gpu_windows(renamed.rng, STEP_S).to_pylist())
    assert g["GPU-vvvv"]["sm_util"] == pytest.approx(80.0)  # the GPU's own, not its pods' mean
    assert g["GPU-1111"]["sm_util"] == pytest.approx(90.0)
    with caplog.at_level("WARNING", logger="cotenant.collectors.prometheus.joins"):
        rows = renamed.source.process_windows(renamed.rng, STEP_S).to_pylist()
        renamed.source.process_windows(renamed.rng, STEP_S)
    got = {(r["gpu"], r["process_name"]): r for r in rows}
    # the workloads, never the exporter's own pod
    assert set(got) == {
        ("GPU-vvvv", "serving/vllm-1 (vllm)"),
        ("GPU-vvvv", "research/trainer-0 (trainer)"),
    }
    assert got[("GPU-vvvv", "serving/vllm-1 (vllm)")]["sm_util"] == pytest.approx(30.0)
    assert got[("GPU-vvvv", "serving/vllm-1 (vllm)")]["model"] == "llama-8b"
    warned = [r.message for r in caplog.records if "exported_pod" in r.message]
    assert len(warned) == 1 and "honorLabels: true" in warned[0]
    # the one-pod label still places qwen's requests on its GPU
    assert renamed.source.model_gpus(renamed.rng) == [
        ("llama-8b", "GPU-vvvv"),
        ("qwen-7b", "GPU-1111"),
    ]
