"""Diagnosis with Prometheus as the only source: no spans, no NVML, only the series a cluster
with the DCGM exporter, vLLM and Triton already has.

An hour of history is written as OpenMetrics and turned into TSDB blocks by ``promtool tsdb
create-blocks-from openmetrics`` (so the test does not wait an hour for scrapes); a real
Prometheus serves them. One GPU is shared by a vLLM model (the victim) and a Triton model whose
request rate jumps eightfold for six minutes, saturating the GPU's SM and DRAM while the
victim's inference time and p99 climb. The diagnosis must find that spike, blame the Triton
model, and say what it could not see without spans.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from promserver import PROMETHEUS, needs_prometheus, start_prometheus

from cotenant.analysis.analyzer import Analyzer
from cotenant.analysis.incidents import IncidentBook
from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.store.db import Store

pytestmark = needs_prometheus

PROMTOOL = str(Path(PROMETHEUS).with_name("promtool"))
SCRAPE_S = 15
MINUTES = 60
FAULT = (40 * 60, 46 * 60)  # seconds after the start of the history
POD = {"namespace": "serving", "container": "main"}

# cumulative share of the victim's requests at or below each bucket bound (seconds)
NORMAL = [(0.1, 0.3), (0.25, 0.8), (0.5, 0.99), (1.0, 1.0), (2.5, 1.0)]
SLOW = [(0.1, 0.1), (0.25, 0.5), (0.5, 0.9), (1.0, 0.995), (2.5, 1.0)]


def _labels(d: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in d.items()) + "}"


def openmetrics(t0_s: int) -> str:
    """An hour of DCGM, vLLM and Triton series, one sample every 15 s."""
    rng = np.random.default_rng(3)
    ts = np.arange(0, MINUTES * 60 + 1, SCRAPE_S)
    fault = (ts >= FAULT[0]) & (ts < FAULT[1])
    jitter = 1 + 0.03 * rng.standard_normal(len(ts))
    out: list[str] = []

    def family(name: str, typ: str, series: list[tuple[str, dict[str, str], np.ndarray]]) -> None:
        out.append(f"# TYPE {name} {typ}")
        for sample, labels, values in series:
            lb = _labels(labels)
            out.extend(f"{sample}{lb} {v:.6f} {t0_s + t}" for t, v in zip(ts, values, strict=True))

    def cumulative(rate: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(rate[1:] * SCRAPE_S)])

    # DCGM: the GPU's series, once per pod on it (as the exporter's pod attribution does)
    gpu = {"gpu": "0", "UUID": "GPU-aaaa", "Hostname": "node-a"}
    pods = [{**gpu, **POD, "pod": "vllm-0"}, {**gpu, **POD, "pod": "triton-0"}]
    dcgm = {
        "DCGM_FI_DEV_GPU_UTIL": np.where(fault, 98.0, 45.0) * jitter,
        "DCGM_FI_PROF_DRAM_ACTIVE": np.where(fault, 0.88, 0.25) * jitter,
        "DCGM_FI_DEV_MEM_COPY_UTIL": np.where(fault, 80.0, 20.0) * jitter,
        "DCGM_FI_PROF_PCIE_TX_BYTES": np.full(len(ts), 2e8),
        "DCGM_FI_PROF_PCIE_RX_BYTES": np.full(len(ts), 2e8),
        "DCGM_FI_DEV_FB_USED": np.full(len(ts), 40000.0),
        "DCGM_FI_DEV_FB_FREE": np.full(len(ts), 40000.0),
        "DCGM_FI_DEV_POWER_USAGE": np.where(fault, 620.0, 300.0),
        "DCGM_FI_DEV_SM_CLOCK": np.full(len(ts), 1980.0),
        "DCGM_FI_DEV_MAX_SM_CLOCK": np.full(len(ts), 1980.0),
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": np.zeros(len(ts)),
    }
    for name, v in dcgm.items():
        family(name, "gauge", [(name, p, v) for p in pods])

    # vLLM: the victim, 20 requests/s; its inference time grows during the fault
    victim = {"model_name": "llama-8b", **POD, "pod": "vllm-0"}
    rate = 20.0 * jitter
    count = cumulative(rate)
    e2e = "vllm:e2e_request_latency_seconds"
    buckets = []
    for (le, normal), (_, slow) in zip(NORMAL, SLOW, strict=True):
        share = np.where(fault, slow, normal)
        buckets.append((f"{e2e}_bucket", {**victim, "le": str(le)}, cumulative(rate * share)))
    buckets.append((f"{e2e}_bucket", {**victim, "le": "+Inf"}, count))
    mean = np.where(fault, 0.34, 0.2)
    buckets += [(f"{e2e}_sum", victim, cumulative(rate * mean)), (f"{e2e}_count", victim, count)]
    family(e2e, "histogram", buckets)
    for metric, m in (
        ("vllm:request_queue_time_seconds", np.where(fault, 0.03, 0.02)),
        ("vllm:request_inference_time_seconds", np.where(fault, 0.31, 0.17)),
    ):
        family(
            metric,
            "histogram",
            [
                (f"{metric}_bucket", {**victim, "le": "+Inf"}, count),
                (f"{metric}_sum", victim, cumulative(rate * m)),
                (f"{metric}_count", victim, count),
            ],
        )
    family(
        "vllm:num_requests_running", "gauge", [("vllm:num_requests_running", victim, 4 * jitter)]
    )

    # Triton: the culprit, 1 request/s, 8/s during the fault
    culprit = {"model": "sdxl", "version": "1", **POD, "pod": "triton-0"}
    crate = np.where(fault, 8.0, 1.0) * jitter
    ccount = cumulative(crate)
    for name, per_request_us in (
        ("nv_inference_request_success", None),
        ("nv_inference_count", None),
        ("nv_inference_exec_count", None),
        ("nv_inference_request_duration_us", 500_000.0),
        ("nv_inference_queue_duration_us", 10_000.0),
        ("nv_inference_compute_input_duration_us", 5_000.0),
        ("nv_inference_compute_infer_duration_us", 470_000.0),
        ("nv_inference_compute_output_duration_us", 5_000.0),
    ):
        v = ccount if per_request_us is None else ccount * per_request_us
        family(name, "unknown", [(name, culprit, v)])
    failures = "nv_inference_request_failure"
    family(failures, "unknown", [(failures, culprit, np.zeros(len(ts)))])
    return "\n".join(out) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    tmp = tmp_path_factory.mktemp("prom-history")
    # three hours ago, on a two-hour block boundary's safe side: history well before "now"
    t0 = (int(time.time()) // 3600 - 3) * 3600
    src = tmp / "history.om"
    src.write_text(openmetrics(t0))
    blocks = tmp / "blocks"
    done = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(src), str(blocks)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with start_prometheus(tmp / "server", [], scrape_interval_s=SCRAPE_S, blocks=blocks) as p:
        yield p.url, t0


def test_a_prometheus_only_diagnosis_blames_the_cotenant_and_says_what_it_lacks(
    prom: tuple[str, int], tmp_path: Path
) -> None:
    url, t0 = prom
    store = Store(tmp_path / "incidents.duckdb")
    try:
        with PrometheusSource(url, scrape_interval_s=SCRAPE_S) as source:
            analyzer = Analyzer(source, IncidentBook(store), step_s=SCRAPE_S)
            s = int(1e9)
            got = analyzer.diagnose("llama-8b", (t0 + 36 * 60) * s, (t0 + 52 * 60) * s)
    finally:
        store.close()
    assert got["spans"] is False
    assert any("spans" in note for note in got["limits"])
    assert got["diagnoses"], got
    d = got["diagnoses"][0]
    # the spike is found where the Triton burst was, give or take the 60 s rate window
    assert abs(d["start_ns"] / 1e9 - (t0 + FAULT[0])) <= 120
    assert d["end_ns"] / 1e9 <= t0 + FAULT[1] + 180
    top = d["causes"][0]
    assert top["culprit"] == "sdxl", d["causes"]
    assert top["kind"] in ("cotenant", "bandwidth"), d["causes"]
    assert top["share"] >= 0.5
    # the growth is in compute, the phase the exporters report
    phases = d["phases_ms"]
    assert max(phases, key=lambda ph: phases[ph]) == "compute_ms", phases
