"""``PrometheusSource`` against a real Prometheus scraping a small exporter that serves DCGM-,
vLLM-, Triton- and cotenant-shaped series, plus the ways a Prometheus can fail.

The exporter stamps every sample with the time it computed it, and every counter is a linear
function of that time, so rates, means and histogram quantiles are known exactly.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from promserver import (
    PromServer,
    TextExporter,
    needs_prometheus,
    start_prometheus,
    wait_until,
)

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.errors import CotenantError, SourceError
from cotenant.core.frames import (
    GPU_WINDOWS,
    PROCESS_WINDOWS,
    REQUEST_WINDOWS,
    SERVING_WINDOWS,
    TOKEN_WINDOWS,
)
from cotenant.core.phases import PHASES
from cotenant.core.timerange import TimeRange

pytestmark = needs_prometheus

MIB = 1_048_576
STEP_S = 2.0
STEP_NS = int(STEP_S * 1e9)

# --- what the exporter serves -----------------------------------------------------------------

GPUS: list[dict[str, Any]] = [
    {  # plain DCGM labels, the current clock-event name alternating two reasons
        "labels": {"gpu": "0", "UUID": "GPU-aaaa", "Hostname": "node-a", "device": "nvidia0"},
        "util": 73.0,
        "sm_active": None,
        "copy": 22.0,
        "dram": 0.61,
        "tx": 1.5e9,
        "rx": 2.5e8,
        "power": 250.5,
        "clock": 1410.0,
        "fb_used": 30000.0,
        "fb_free": 50000.0,
        "reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", (0x4, 0x40)),
    },
    {  # Kubernetes pod attribution, the older clock-throttle name
        "labels": {
            "gpu": "1",
            "UUID": "GPU-bbbb",
            "Hostname": "node-a",
            "namespace": "serving",
            "pod": "vllm-0",
            "container": "vllm",
        },
        "util": 41.0,
        "sm_active": None,
        "copy": 35.0,
        "dram": 0.2,
        "tx": 3.0e8,
        "rx": 1.0e8,
        "power": 180.0,
        "clock": 1980.0,
        "fb_used": 70000.0,
        "fb_free": 10000.0,
        "reasons": ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", (0x1, 0x1)),
    },
    {  # also served by a second target (DCGM_TWIN): one GPU, whoever exposes it
        "labels": {"gpu": "3", "UUID": "GPU-cccc", "Hostname": "node-c"},
        "util": 40.0,
        "sm_active": None,
        "copy": 10.0,
        "dram": 0.1,
        "tx": 1.0e6,
        "rx": 1.0e6,
        "power": 100.0,
        "clock": 1500.0,
        "fb_used": 2000.0,
        "fb_free": 78000.0,
        "reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", (0x0, 0x0)),
    },
    {  # no UUID, lower-case hostname, profiling SM activity but no GPU_UTIL
        "labels": {"gpu": "2", "hostname": "node-b"},
        "util": None,
        "sm_active": 0.55,
        "copy": 10.0,
        "dram": 0.05,
        "tx": 1.0e6,
        "rx": 1.0e6,
        "power": 90.0,
        "clock": 1200.0,
        "fb_used": 1000.0,
        "fb_free": 79000.0,
        "reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", (0x0, 0x0)),
    },
]

# cumulative bucket fractions: (le seconds, share of requests at or below)
VLLM_BUCKETS = [(0.1, 0.3), (0.25, 0.6), (0.5, 0.9), (1.0, 0.97), (2.5, 1.0)]
OWN_BUCKETS = [(0.005, 0.1), (0.01, 0.7), (0.025, 0.95), (0.05, 1.0)]
TTFT_BUCKETS = [(0.05, 0.5), (0.1, 0.9), (0.25, 1.0)]
TPOT_BUCKETS = [(0.01, 0.4), (0.02, 0.95), (0.05, 1.0)]  # per output token
# current vLLM (0.12 hid time_per_output_token_seconds, later releases removed it): the
# per-token inter_token_latency_seconds, and the per-request request_time_per_output_token
ITL_BUCKETS = [(0.02, 0.5), (0.05, 0.9), (0.1, 1.0)]
REQUEST_TPOT_BUCKETS = [(0.5, 0.5), (1.0, 1.0)]
PROMPT_BUCKETS = [(256.0, 0.5), (1024.0, 0.9), (4096.0, 1.0)]
OUTPUT_BUCKETS = [(64.0, 0.3), (256.0, 0.9), (1024.0, 1.0)]
TOKENS_PER_REQUEST = 150.0


@dataclass(frozen=True)
class Vllm:
    labels: dict[str, str]
    rps: float
    mean_s: float
    queue_s: float


VLLM = [
    Vllm({"model_name": "llama-8b", "namespace": "serving", "pod": "vllm-0"}, 10.0, 0.3, 0.05),
    Vllm({"model_name": "mistral-7b"}, 4.0, 0.5, 0.1),
]


@dataclass(frozen=True)
class Triton:
    model: str
    rps: float
    fail_rps: float
    batch: float
    us: dict[str, float]  # per-request microseconds: request, queue, compute_input/infer/output


TRITON = [
    Triton(
        "resnet50",
        20.0,
        0.5,
        2.0,
        {
            "request": 12000,
            "queue": 3000,
            "compute_input": 1000,
            "compute_infer": 7000,
            "compute_output": 500,
        },
    ),
    # also exported by vLLM / cotenant: must lose to them
    Triton("llama-8b", 1.0, 0.0, 1.0, dict.fromkeys(("request", "queue"), 99999.0)),
    Triton("bert", 5.0, 0.0, 1.0, dict.fromkeys(("request", "queue"), 50000.0)),
]

OWN_RPS = 5.0
OWN_PHASE_S = {"queue": 0.002, "compute": 0.005, "other": 0.001}  # others 0; total 8 ms


def _labels(d: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in d.items())


def _histogram(
    out: list[str],
    name: str,
    labels: dict[str, str],
    n: float,
    mean_s: float,
    buckets: list[tuple[float, float]],
    ts: int,
) -> None:
    for le, share in buckets:
        out.append(f"{name}_bucket{{{_labels({**labels, 'le': str(le)})}}} {n * share!r} {ts}")
    out.append(f"{name}_bucket{{{_labels({**labels, 'le': '+Inf'})}}} {n!r} {ts}")
    out.append(f"{name}_sum{{{_labels(labels)}}} {n * mean_s!r} {ts}")
    out.append(f"{name}_count{{{_labels(labels)}}} {n!r} {ts}")


class FleetExporter:
    """Renders the exposition as a function of time since start (sample timestamps included)."""

    def __init__(self) -> None:
        self.t0_ms = int(time.time() * 1000)
        self._scrape = itertools.count()

    def render(self) -> str:
        ts = int(time.time() * 1000)
        e = (ts - self.t0_ms) / 1000
        n = next(self._scrape)
        out: list[str] = []

        def line(name: str, labels: dict[str, str], value: float) -> None:
            out.append(f"{name}{{{_labels(labels)}}} {value!r} {ts}")

        for g in GPUS:
            lb = g["labels"]
            if g["util"] is not None:
                line("DCGM_FI_DEV_GPU_UTIL", lb, g["util"])
            if g["sm_active"] is not None:
                line("DCGM_FI_PROF_SM_ACTIVE", lb, g["sm_active"])
            line("DCGM_FI_DEV_MEM_COPY_UTIL", lb, g["copy"])
            line("DCGM_FI_PROF_DRAM_ACTIVE", lb, g["dram"])
            line("DCGM_FI_PROF_PCIE_TX_BYTES", lb, g["tx"])
            line("DCGM_FI_PROF_PCIE_RX_BYTES", lb, g["rx"])
            line("DCGM_FI_DEV_POWER_USAGE", lb, g["power"])
            line("DCGM_FI_DEV_SM_CLOCK", lb, g["clock"])
            line("DCGM_FI_DEV_FB_USED", lb, g["fb_used"])
            line("DCGM_FI_DEV_FB_FREE", lb, g["fb_free"])
            name, values = g["reasons"]
            line(name, lb, float(values[n % 2]))
        for v in VLLM:
            done = v.rps * e
            _histogram(out, "vllm:e2e_request_latency_seconds", v.labels, done, v.mean_s,
                       VLLM_BUCKETS, ts)  # fmt: skip
            _histogram(out, "vllm:request_queue_time_seconds", v.labels, done, v.queue_s,
                       [(1.0, 1.0)], ts)  # fmt: skip
            _histogram(out, "vllm:time_to_first_token_seconds", v.labels, done, 0.08,
                       TTFT_BUCKETS, ts)  # fmt: skip
            if v.labels["model_name"] == "llama-8b":  # the rest only from one of the two
                _histogram(out, "vllm:time_per_output_token_seconds", v.labels,
                           done * TOKENS_PER_REQUEST, 0.015, TPOT_BUCKETS, ts)  # fmt: skip
                _histogram(out, "vllm:request_prompt_tokens", v.labels, done, 500.0,
                           PROMPT_BUCKETS, ts)  # fmt: skip
                _histogram(out, "vllm:request_generation_tokens", v.labels, done,
                           TOKENS_PER_REQUEST, OUTPUT_BUCKETS, ts)  # fmt: skip
            # both vLLMs export the new names (llama-8b with other values: where the old name
            # is there it wins); mistral-7b, like current vLLM, only the new ones
            _histogram(out, "vllm:inter_token_latency_seconds", v.labels,
                       done * TOKENS_PER_REQUEST, 0.03 if v.labels["model_name"] == "mistral-7b"
                       else 0.9, ITL_BUCKETS, ts)  # fmt: skip
            _histogram(out, "vllm:request_time_per_output_token_seconds", v.labels, done, 0.6,
                       REQUEST_TPOT_BUCKETS, ts)  # fmt: skip
            line("vllm:num_requests_waiting", v.labels, 3.0)
            line("vllm:num_requests_running", v.labels, 7.0)
            line("vllm:kv_cache_usage_perc", v.labels, 0.42)
            line("vllm:num_preemptions_total", v.labels, 0.5 * e)
        for t in TRITON:
            lb = {"model": t.model, "version": "1"}
            ok = t.rps * e
            line("nv_inference_request_success", lb, ok)
            line("nv_inference_request_failure", lb, t.fail_rps * e)
            line("nv_inference_count", lb, ok * t.batch)
            line("nv_inference_exec_count", lb, ok)
            for stage, us in t.us.items():
                line(f"nv_inference_{stage}_duration_us", lb, ok * us)
        done = OWN_RPS * e
        own = {"model": "bert", "gpu": "GPU-aaaa"}
        _histogram(out, "cotenant_request_duration_seconds", {**own, "phase": "total"}, done,
                   sum(OWN_PHASE_S.values()), OWN_BUCKETS, ts)  # fmt: skip
        for p in PHASES:
            _histogram(out, "cotenant_request_duration_seconds", {**own, "phase": p}, done,
                       OWN_PHASE_S.get(p, 0.0), [], ts)  # fmt: skip
        line("cotenant_request_errors_total", {"node": "node-a", **own}, 0.25 * e)
        return "\n".join(out) + "\n"


def dcgm_twin() -> str:
    """A second exporter of GPU-cccc (a node running both an agent and the DCGM exporter: the
    same GPU under another ``instance``), with utilisation 20 against the first's 40."""
    ts = int(time.time() * 1000)
    lb = _labels({"gpu": "3", "UUID": "GPU-cccc", "Hostname": "node-c"})
    return (
        f"DCGM_FI_DEV_GPU_UTIL{{{lb}}} 20.0 {ts}\n"
        f"DCGM_FI_DEV_FB_USED{{{lb}}} 2000.0 {ts}\n"
        f"DCGM_FI_DEV_FB_FREE{{{lb}}} 78000.0 {ts}\n"
    )


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile: linear interpolation inside the first bucket whose
    cumulative share reaches ``q`` (the lowest bucket starts at 0)."""
    lo, below = 0.0, 0.0
    for le, share in buckets:
        if share >= q:
            return lo + (le - lo) * (q - below) / (share - below)
        lo, below = le, share
    raise AssertionError("q above the last finite bucket")


# --- fixtures ---------------------------------------------------------------------------------


@dataclass
class Fleet:
    prom: PromServer
    source: PrometheusSource
    rng: TimeRange


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    exporter = FleetExporter()
    with (
        TextExporter(exporter.render) as exp,
        TextExporter(dcgm_twin) as twin,
        start_prometheus(tmp_path_factory.mktemp("prom"), [exp.target, twin.target]) as prom,
    ):
        # enough history for a 4 s rate window behind two 2 s windows
        wait_until(
            lambda: prom.query('count_over_time(DCGM_FI_DEV_GPU_UTIL{gpu="0"}[1m]) >= 9'),
            "nine scrapes of the exporter",
        )
        latest_s = float(prom.query("max(timestamp(DCGM_FI_DEV_GPU_UTIL))")[0]["value"][1])
        until = int(latest_s * 1e9) // STEP_NS * STEP_NS
        with PrometheusSource(
            prom.url,
            timeout_s=10,
            scrape_interval_s=1.0,
            model_gpu={"mistral-7b": "GPU-aaaa"},
        ) as source:
            yield Fleet(prom, source, TimeRange(until - 2 * STEP_NS, until))


def rows(t: pa.Table, **match: object) -> list[dict[str, Any]]:
    return [r for r in t.to_pylist() if all(r[k] == v for k, v in match.items())]


# --- frames -----------------------------------------------------------------------------------


def test_every_frame_has_the_store_schema(fleet: Fleet) -> None:
    s, rng = fleet.source, fleet.rng
    assert s.gpu_windows(rng, STEP_S).schema == GPU_WINDOWS
    assert s.process_windows(rng, STEP_S).schema == PROCESS_WINDOWS
    assert s.request_windows(rng, STEP_S).schema == REQUEST_WINDOWS
    assert s.serving_windows(rng, STEP_S).schema == SERVING_WINDOWS
    assert s.token_windows(rng, STEP_S).schema == TOKEN_WINDOWS


def test_gpu_windows_carry_the_served_dcgm_values_in_store_units(fleet: Fleet) -> None:
    t = fleet.source.gpu_windows(fleet.rng, STEP_S)
    starts = sorted(set(t.column("ts_ns").to_pylist()))
    assert starts == [fleet.rng.since_ns, fleet.rng.since_ns + STEP_NS]
    assert {(r["host"], r["gpu"]) for r in t.to_pylist()} == {
        ("node-a", "GPU-aaaa"),
        ("node-a", "GPU-bbbb"),
        ("node-b", "2"),  # no UUID: the index; lower-case hostname label
        ("node-c", "GPU-cccc"),  # once, though two targets expose it
    }
    for r in rows(t, gpu="GPU-cccc"):
        assert r["sm_util"] == pytest.approx(30.0)  # the two exporters' mean
        assert r["mem_used_bytes"] == pytest.approx(2000 * MIB)
        assert r["mem_util"] == pytest.approx(10.0)  # from the one that exports it
    for r in rows(t, gpu="GPU-aaaa"):
        assert r["sm_util"] == pytest.approx(73.0)
        assert r["mem_util"] == pytest.approx(22.0)
        assert r["dram_active"] == pytest.approx(0.61)
        assert r["pcie_tx_bps"] == pytest.approx(1.5e9)
        assert r["pcie_rx_bps"] == pytest.approx(2.5e8)
        assert r["power_w"] == pytest.approx(250.5)
        assert r["sm_clock_mhz"] == pytest.approx(1410.0)
        assert r["mem_used_bytes"] == pytest.approx(30000 * MIB)
        assert r["mem_total_bytes"] == pytest.approx(80000 * MIB)
        assert r["clock_event_reasons"] == 0x44  # OR of the two alternating reasons
        assert r["nvlink_tx_bps"] is None and r["temp_c"] is None  # not exported
    for r in rows(t, gpu="GPU-bbbb"):
        assert r["clock_event_reasons"] == 0x1  # read from the older metric name
        assert r["mem_used_bytes"] == pytest.approx(70000 * MIB)
    for r in rows(t, gpu="2"):
        assert r["sm_util"] == pytest.approx(55.0)  # 100 x DCGM_FI_PROF_SM_ACTIVE


def test_gpu_filter_keeps_only_that_gpu(fleet: Fleet) -> None:
    t = fleet.source.gpu_windows(fleet.rng, STEP_S, gpu="GPU-bbbb")
    assert t.num_rows == 2
    assert set(t.column("gpu").to_pylist()) == {"GPU-bbbb"}


def test_a_gpu_labelled_with_one_pod_gives_no_pod_row(fleet: Fleet) -> None:
    """GPU-bbbb's series name one pod (dcgm-exporter without KUBERNETES_VIRTUAL_GPUS): the
    GPU's values under the pod it was allocated to, not that pod's own; they place the pod's
    model on the GPU (below) but make no process row (tests/e2e/test_dcgm_pods.py has pods
    sharing a GPU)."""
    assert fleet.source.process_windows(fleet.rng, STEP_S).num_rows == 0


def test_vllm_requests_rates_means_and_quantiles_from_the_histograms(fleet: Fleet) -> None:
    t = fleet.source.request_windows(fleet.rng, STEP_S)
    llama = rows(t, model="llama-8b")
    assert len(llama) == 2  # one per window: Triton's llama-8b series lost to vLLM's
    for r in llama:
        assert r["gpu"] == "GPU-bbbb"  # its pod's DCGM series name the GPU
        assert r["rate_rps"] == pytest.approx(10.0, rel=1e-3)
        assert r["count"] == pytest.approx(10.0 * STEP_S, rel=1e-3)
        assert r["mean_ms"] == pytest.approx(300.0, rel=1e-3)
        assert r["p50_ms"] == pytest.approx(1e3 * bucket_quantile(0.5, VLLM_BUCKETS), rel=1e-3)
        assert r["p95_ms"] == pytest.approx(1e3 * bucket_quantile(0.95, VLLM_BUCKETS), rel=1e-3)
        assert r["p99_ms"] == pytest.approx(1e3 * bucket_quantile(0.99, VLLM_BUCKETS), rel=1e-3)
        assert r["queue_ms"] == pytest.approx(50.0, rel=1e-3)
        assert r["lock_wait_ms"] is None and r["errors"] is None
    for r in rows(t, model="mistral-7b"):
        assert r["gpu"] == "GPU-aaaa"  # no GPU label, no pod: the configured model -> GPU map
        assert r["rate_rps"] == pytest.approx(4.0, rel=1e-3)


def test_triton_means_are_the_ratio_of_counter_increments(fleet: Fleet) -> None:
    t = fleet.source.request_windows(fleet.rng, STEP_S)
    resnet = rows(t, model="resnet50")
    assert len(resnet) == 2
    for r in resnet:
        assert r["gpu"] == ""  # nothing places it: the default GPU
        assert r["rate_rps"] == pytest.approx(20.0, rel=1e-3)
        assert r["errors"] == pytest.approx(0.5 * STEP_S, rel=1e-3)
        assert r["mean_ms"] == pytest.approx(12.0, rel=1e-3)
        assert r["queue_ms"] == pytest.approx(3.0, rel=1e-3)
        assert r["h2d_ms"] == pytest.approx(1.0, rel=1e-3)
        assert r["compute_ms"] == pytest.approx(7.0, rel=1e-3)
        assert r["d2h_ms"] == pytest.approx(0.5, rel=1e-3)
        assert r["batch_size_mean"] == pytest.approx(2.0, rel=1e-3)
        assert r["p99_ms"] is None  # counters carry no distribution


def test_cotenant_own_series_win_and_give_every_phase(fleet: Fleet) -> None:
    t = fleet.source.request_windows(fleet.rng, STEP_S)
    bert = rows(t, model="bert")
    assert len(bert) == 2  # not Triton's bert
    for r in bert:
        assert r["gpu"] == "GPU-aaaa"
        assert r["rate_rps"] == pytest.approx(OWN_RPS, rel=1e-3)
        assert r["mean_ms"] == pytest.approx(8.0, rel=1e-3)
        assert r["errors"] == pytest.approx(0.25 * STEP_S, rel=1e-3)  # the agent's counter
        assert r["p99_ms"] == pytest.approx(1e3 * bucket_quantile(0.99, OWN_BUCKETS), rel=1e-3)
        for p in PHASES:
            assert r[f"{p}_ms"] == pytest.approx(1e3 * OWN_PHASE_S.get(p, 0.0), abs=1e-6)
    assert fleet.source.has_spans


def test_model_filter_returns_only_that_model(fleet: Fleet) -> None:
    t = fleet.source.request_windows(fleet.rng, STEP_S, model="resnet50")
    assert t.num_rows == 2 and set(t.column("model").to_pylist()) == {"resnet50"}
    assert fleet.source.request_windows(fleet.rng, STEP_S, model="nope").num_rows == 0


def test_serving_windows_from_vllm_gauges(fleet: Fleet) -> None:
    t = fleet.source.serving_windows(fleet.rng, STEP_S, model="llama-8b")
    assert t.num_rows == 2
    for r in t.to_pylist():
        assert (r["model"], r["gpu"]) == ("llama-8b", "GPU-bbbb")
        assert r["requests_waiting"] == pytest.approx(3.0)
        assert r["requests_running"] == pytest.approx(7.0)
        assert r["kv_cache_usage"] == pytest.approx(0.42)
        assert r["preemptions_per_s"] == pytest.approx(0.5, rel=1e-3)


def test_token_windows_from_vllm_ttft_tpot_and_token_histograms(fleet: Fleet) -> None:
    t = fleet.source.token_windows(fleet.rng, STEP_S, lengths=True)
    llama = rows(t, model="llama-8b")
    assert len(llama) == 2
    for r in llama:
        assert r["gpu"] == "GPU-bbbb"
        assert r["count"] == pytest.approx(10.0 * STEP_S, rel=1e-3)
        assert r["ttft_mean_ms"] == pytest.approx(80.0, rel=1e-3)
        assert r["ttft_p99_ms"] == pytest.approx(1e3 * bucket_quantile(0.99, TTFT_BUCKETS), 1e-3)
        assert r["tpot_mean_ms"] == pytest.approx(15.0, rel=1e-3)
        assert r["tpot_p99_ms"] == pytest.approx(1e3 * bucket_quantile(0.99, TPOT_BUCKETS), 1e-3)
        assert r["prompt_tokens_mean"] == pytest.approx(500.0, rel=1e-3)
        assert r["output_tokens_mean"] == pytest.approx(TOKENS_PER_REQUEST, rel=1e-3)
        assert r["output_tokens_p99"] == pytest.approx(bucket_quantile(0.99, OUTPUT_BUCKETS), 1e-3)
    assert {
        r["output_tokens_p99"] for r in rows(fleet.source.token_windows(fleet.rng, STEP_S))
    } == {None}  # the token counts' p99 only when asked for
    [mistral, _] = rows(t, model="mistral-7b")
    assert mistral["gpu"] == "GPU-aaaa"
    assert mistral["ttft_mean_ms"] == pytest.approx(80.0, rel=1e-3)
    # no vllm:time_per_output_token_seconds (current vLLM): TPOT from inter_token_latency,
    # not from the per-request histogram
    assert mistral["tpot_mean_ms"] == pytest.approx(30.0, rel=1e-3)
    assert mistral["tpot_p99_ms"] == pytest.approx(1e3 * bucket_quantile(0.99, ITL_BUCKETS), 1e-3)
    assert fleet.source.token_windows(fleet.rng, STEP_S, gpu="GPU-aaaa").column(
        "model"
    ).to_pylist() == ["mistral-7b", "mistral-7b"]


def test_instant_and_range_helpers(fleet: Fleet) -> None:
    s = fleet.source
    got = s.instant('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-bbbb"}')
    assert [(labels["gpu"], value) for labels, value in got] == [("1", 41.0)]
    series = s.range('DCGM_FI_DEV_POWER_USAGE{gpu="0"}', fleet.rng, STEP_S)
    assert len(series) == 1
    _, ts, values = series[0]
    assert ts.tolist() == [fleet.rng.since_ns, fleet.rng.since_ns + STEP_NS]
    assert values.tolist() == [250.5, 250.5]


def test_a_rejected_query_names_the_server_and_its_complaint(fleet: Fleet) -> None:
    with pytest.raises(SourceError) as err:
        fleet.source.instant("rate(")
    assert fleet.prom.url in str(err.value)
    assert "rate(" in str(err.value) and "parse error" in str(err.value)


# --- failures ---------------------------------------------------------------------------------


def test_a_stopped_prometheus_gives_a_clear_error(tmp_path: Path) -> None:
    with start_prometheus(tmp_path, []) as prom, PrometheusSource(prom.url, timeout_s=5) as source:
        assert source.instant("vector(1)") == [({}, 1.0)]
        assert source.has_spans is False  # no cotenant series: exporter metrics only
        rng = TimeRange(time.time_ns() - 60_000_000_000, time.time_ns())
        assert source.gpu_windows(rng, 15.0).num_rows == 0
        prom.stop()
        with pytest.raises(SourceError) as err:
            source.gpu_windows(rng, 15.0)
    msg = str(err.value)
    assert prom.url in msg and "cannot be reached" in msg and "DCGM_FI_" in msg
    assert "running" in msg  # says what to check
    assert isinstance(err.value, CotenantError)


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # accepts connections into the backlog, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with PrometheusSource(url, timeout_s=0.5) as source, pytest.raises(SourceError) as err:
            source.instant("up")
    assert "did not answer within 0.5 s" in str(err.value) and url in str(err.value)


@pytest.mark.parametrize(
    ("status", "body", "expect"),
    [
        (200, "<html>a login page</html>", "not the Prometheus HTTP API"),
        (200, '{"status": "success"}', "not the Prometheus HTTP API"),
        (200, '{"status":"success","data":{"resultType":"vector","result":"x"}}', "not the"),
        (200, '{"status":"success","data":{"result":[{"metric":{},"value":[1]}]}}', "not the"),
        (503, "upstream unavailable", "refused the query"),
    ],
)
def test_garbage_answers_give_a_clear_error(status: int, body: str, expect: str) -> None:
    with (
        TextExporter(lambda: body, path=None, status=status) as fake,
        PrometheusSource(fake.url, timeout_s=5) as source,
        pytest.raises(SourceError) as err,
    ):
        source.instant("up")
    assert expect in str(err.value) and fake.url in str(err.value) and "up" in str(err.value)
