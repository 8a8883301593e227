"""Ray Serve, SGLang and TGI /metrics pages scraped by a real Prometheus and read through
``PrometheusSource`` (issue 27): the requests each page counts, their latency (mean and
quantiles), phases, TTFT / TPOT and queue, under the model names the engines' spans use, on the
GPU the DCGM exporter's pod labels give their pods (and those pods' GPU rows named with them).

* Ray Serve: the page **recorded** from Ray Serve 2.60.0 (tests/fixtures/engines/
  rayserve-2.60.0/metrics.txt, see its PROVENANCE.md); its model key is joined with the spans
  recorded in the same run.
* SGLang and TGI: pages **built here from their sources**, not recorded (no engine of either
  runs on this machine): SGLang's with ``prometheus_client``, as SGLang itself renders them,
  under the names, labels and buckets of ``python/sglang/srt/metrics/collector.py``; TGI's in
  the text ``metrics-exporter-prometheus`` writes (counters without ``_total``, no labels), with
  the names and buckets of TGI v3.3.7's ``router/src/server.rs``. See
  :mod:`collectors.prometheus.engines` for what was read where.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from promserver import TextExporter, needs_prometheus, start_prometheus, wait_until, zeroed

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.decode import PROTOBUF, decode
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange

pytestmark = needs_prometheus

RAY = Path(__file__).parents[1] / "fixtures" / "engines" / "rayserve-2.60.0"
SCRAPE_S = 0.25
STEP_S = 2.0
SGLANG_MODEL = "qwen-tiny"
TGI_MODEL = "tgi-llama"  # the `model` target label of one TGI scrape; the other's is its job
TGI_JOB = "test"  # tests/promserver.py's job name
GPU = "GPU-x"
PODS = {"sglang": ("serving", "sglang-0"), "ray": ("serving", "ray-0")}
"""The pods the SGLang and Ray Serve pages are scraped from (target labels), both on GPU-x by
the DCGM exporter's pod labels; TGI's name no pod."""
DCGM_PAGE = "".join(
    f'{name}{{gpu="0",UUID="{GPU}",Hostname="n1",namespace="{ns}",pod="{pod}",container="c"}} {v}\n'
    for name, values in (("DCGM_FI_DEV_GPU_UTIL", (40, 30)), ("DCGM_FI_DEV_FB_USED", (1000, 2000)))
    for (ns, pod), v in zip(PODS.values(), values, strict=True)
)
"""dcgm-exporter with ``KUBERNETES_VIRTUAL_GPUS=true``: GPU-x shared by the two pods."""


# -- SGLang, built with prometheus_client as SGLang renders it ---------------------------------

E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040]
QUEUE_BUCKETS = [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10]
TOKEN_BUCKETS = [100, 300, 500, 700, 1000, 1500, 2000]
E2E_S = [0.3] * 5 + [0.5] * 4 + [3.0]  # 10 requests: 5 in (0.2, 0.4], 4 in (0.4, 0.6], 1 in (2, 4]


def sglang_page() -> str:
    """The tokenizer manager's series (labels model_name, engine_type) and the scheduler's
    (also tp_rank, pp_rank), after the 10 requests of :data:`E2E_S`."""
    reg = CollectorRegistry()
    tok = {"model_name": SGLANG_MODEL, "engine_type": "unified"}
    sched = {**tok, "tp_rank": "0", "pp_rank": "0"}

    def hist(name: str, labels: dict[str, str], buckets: list[float], values: list[float]) -> None:
        h = Histogram(name, name, labelnames=list(labels), buckets=buckets, registry=reg)
        for v in values:
            h.labels(**labels).observe(v)

    hist("sglang:e2e_request_latency_seconds", tok, E2E_BUCKETS, E2E_S)
    hist("sglang:time_to_first_token_seconds", tok, TTFT_BUCKETS, [0.15] * 10)
    hist("sglang:inter_token_latency_seconds", tok, ITL_BUCKETS, [0.012] * 100)
    hist("sglang:prompt_tokens_histogram", tok, TOKEN_BUCKETS, [200] * 10)
    hist("sglang:generation_tokens_histogram", tok, TOKEN_BUCKETS, [10] * 10)
    hist("sglang:queue_time_seconds", sched, QUEUE_BUCKETS, [0.05] * 10)
    Counter("sglang:num_requests", "", labelnames=list(tok), registry=reg).labels(**tok).inc(10)
    for name, value in (("num_queue_reqs", 3), ("num_running_reqs", 7), ("token_usage", 0.25)):
        Gauge(f"sglang:{name}", "", labelnames=list(sched), registry=reg).labels(**sched).set(value)
    return generate_latest(reg).decode()


# -- TGI, in metrics-exporter-prometheus's text -----------------------------------------------


def geometric(start: float, factor: float, n: int) -> list[float]:
    """TGI's duration buckets: ``value *= 1.5`` from 0.0001, 35 times (f64, as Rust does)."""
    out, v = [], start
    for _ in range(n):
        v *= factor
        out.append(v)
    return out


DURATION_BUCKETS = geometric(0.0001, 1.5, 35)
INPUT_BUCKETS = [1024 / 100 * (x + 1) for x in range(100)]  # --max-input-tokens 1024
TOTAL_BUCKETS = [2048 / 100 * (x + 1) for x in range(100)]  # --max-total-tokens 2048


def tgi_histogram(name: str, buckets: list[float], values: list[float]) -> list[str]:
    lines = [f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{b!r}"}} {sum(v <= b for v in values)}' for b in buckets]
    lines += [f'{name}_bucket{{le="+Inf"}} {len(values)}', f"{name}_sum {sum(values)!r}"]
    return [*lines, f"{name}_count {len(values)}"]


def tgi_page() -> str:
    """5 requests, 1 refused by validation, 4 served in 0.5 s each (0.1 s queued, 1 ms of
    validation, 0.39 s of inference), 19 tokens each at 20 ms per token."""
    lines = [
        "# TYPE tgi_request_count counter",
        "tgi_request_count 5",
        "# HELP tgi_request_success Number of successful requests",
        "# TYPE tgi_request_success counter",
        "tgi_request_success 4",
        "# TYPE tgi_request_failure counter",
        'tgi_request_failure{err="validation"} 1',
        "# TYPE tgi_queue_size gauge",
        "tgi_queue_size 2",
        "# TYPE tgi_batch_current_size gauge",
        "tgi_batch_current_size 3",
    ]
    for name, values in (
        ("tgi_request_duration", [0.5] * 4),
        ("tgi_request_queue_duration", [0.1] * 4),
        ("tgi_request_validation_duration", [0.001] * 4),
        ("tgi_request_inference_duration", [0.39] * 4),
        ("tgi_request_mean_time_per_token_duration", [0.02] * 4),
    ):
        lines += tgi_histogram(name, DURATION_BUCKETS, values)
    lines += tgi_histogram("tgi_request_input_length", INPUT_BUCKETS, [100.0] * 4)
    lines += tgi_histogram("tgi_request_generated_tokens", TOTAL_BUCKETS, [19.0] * 4)
    return "\n".join(lines) + "\n"


def interpolated(q: float, buckets: list[float], values: list[float]) -> float:
    """``histogram_quantile`` of one bucket holding every value (linear in the bucket)."""
    hi = next(b for b in buckets if values[0] <= b)
    lo = max(b for b in buckets if b < hi)
    assert all(lo < v <= hi for v in values)
    return lo + q * (hi - lo)


# -- one Prometheus scraping every page ---------------------------------------------------------


@dataclass
class Read:
    requests: dict[str, dict]  # model -> its row in the window of the requests
    tokens: dict[str, dict]  # model -> its token row, same window
    serving: dict[str, dict]  # model -> its gauges, the window after (all samples set)
    placed: dict[str, str]  # model -> GPU (model_gpus)
    filtered: list[dict]  # request_windows(model="mm/MatMul")
    pods: dict[str, str | None]  # process name of a pod's DCGM series -> its model


@pytest.fixture(scope="module")
def read(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Read]:
    pages = {
        "ray": (RAY / "metrics.txt").read_text(),
        "sglang": sglang_page(),
        "tgi": tgi_page(),
    }
    state = {k: zeroed(v) for k, v in pages.items()}
    exporters = [TextExporter(lambda k=k: state[k]) for k in ("ray", "sglang", "tgi", "tgi")]
    exporters.append(TextExporter(lambda: DCGM_PAGE))
    labels = {exporters[2].target: {"model": TGI_MODEL}}
    for e, engine in zip(exporters, ("ray", "sglang"), strict=False):
        ns, pod = PODS[engine]
        labels[e.target] = {"namespace": ns, "pod": pod}
    step_ns = int(STEP_S * 1e9)
    try:
        with start_prometheus(
            tmp_path_factory.mktemp("prom"),
            [e.target for e in exporters],
            scrape_interval_s=SCRAPE_S,
            labels=labels,
        ) as prom:
            wait_until(lambda: len(prom.query("up == 1")) == 5, "the first scrapes")
            since = -(-time.time_ns() // step_ns) * step_ns
            # every request arrives inside one window, after two scrapes of the pages at 0
            wait_until(lambda: time.time_ns() > since + 700_000_000, "the window's start", 10)
            state.update(pages)
            end = since + 2 * step_ns  # and the next window, for the gauges' settled values
            wait_until(lambda: time.time_ns() > end + 500_000_000, "the next window's end", 10)
            with PrometheusSource(prom.url, scrape_interval_s=SCRAPE_S) as source:
                first = TimeRange(since, since + step_ns)
                second = TimeRange(since + step_ns, end)
                yield Read(
                    {r["model"]: r for r in source.request_windows(first, STEP_S).to_pylist()},
                    {r["model"]: r for r in source.token_windows(first, STEP_S).to_pylist()},
                    {r["model"]: r for r in source.serving_windows(second, STEP_S).to_pylist()},
                    dict(source.model_gpus(first)),
                    source.request_windows(first, STEP_S, model="mm/MatMul").to_pylist(),
                    {
                        r["process_name"]: r["model"]
                        for r in source.process_windows(first, STEP_S).to_pylist()
                    },
                )
    finally:
        for e in exporters:
            e.close()


def counted(row: dict, n: float) -> None:
    """``n`` requests in one window (rate() extrapolates to the window's edges)."""
    assert n <= row["count"] <= n * STEP_S / (STEP_S - 2 * SCRAPE_S), row


# -- Ray Serve ----------------------------------------------------------------------------------


def ray_span_models() -> set[str]:
    """The models cotenant gives the requests of the recorded Ray Serve spans (same run)."""
    norm = Normalizer(GpuResolver())
    models: set[str] = set()
    for path in sorted((RAY / "process-detector").glob("v1_traces_*.pb")):
        models |= set(norm.normalize(decode(path.read_bytes(), PROTOBUF)).requests["model"])
    return {str(m) for m in models}


def test_ray_serve_rows_carry_the_spans_model_key_and_the_replicas_latency(read: Read) -> None:
    assert ray_span_models() == {"mm/MatMul"}
    row = read.requests["mm/MatMul"]  # application/deployment, as its spans are named
    # placed on the GPU whose DCGM series name its pod
    assert read.placed["mm/MatMul"] == GPU and row["gpu"] == GPU
    assert read.pods["serving/ray-0 (c)"] == "mm/MatMul"
    counted(row, 8)
    assert row["errors"] == pytest.approx(0.0, abs=1e-9)  # no error counter on the page
    # ray_serve_deployment_processing_latency_ms: 22 ms in 8 requests, ms -> ms
    assert row["mean_ms"] == pytest.approx(22 / 8)
    assert row["compute_ms"] == pytest.approx(22 / 8)
    # its buckets: 5 requests in (1, 2] ms, 2 in (2, 5], 1 in (5, 10]
    assert row["p50_ms"] == pytest.approx(1 + 4 / 5)
    assert row["p95_ms"] == pytest.approx(5 + 0.6 * 5)
    assert row["p99_ms"] == pytest.approx(5 + 0.92 * 5)
    # a model selected by name: its application and deployment, nothing else
    assert [r["model"] for r in read.filtered] == ["mm/MatMul"]
    assert read.filtered[0]["count"] == pytest.approx(row["count"])


def test_ray_serve_queue_and_running_gauges(read: Read) -> None:
    row = read.serving["mm/MatMul"]
    assert row["requests_waiting"] == 0 and row["requests_running"] == 0
    assert "mm/MatMul" not in read.tokens  # Ray Serve has no token histograms


# -- SGLang -------------------------------------------------------------------------------------


def test_sglang_requests_latency_quantiles_and_queue(read: Read) -> None:
    row = read.requests[SGLANG_MODEL]
    assert read.placed[SGLANG_MODEL] == GPU and row["gpu"] == GPU
    assert read.pods["serving/sglang-0 (c)"] == SGLANG_MODEL
    counted(row, 10)
    assert row["mean_ms"] == pytest.approx(1e3 * sum(E2E_S) / 10)
    assert row["p50_ms"] == pytest.approx(1e3 * (0.2 + 5 / 5 * 0.2))
    assert row["p95_ms"] == pytest.approx(1e3 * (2 + 0.5 * 2))
    assert row["p99_ms"] == pytest.approx(1e3 * (2 + 0.9 * 2))
    assert row["queue_ms"] == pytest.approx(50.0)


def test_sglang_ttft_tpot_and_token_counts(read: Read) -> None:
    row = read.tokens[SGLANG_MODEL]
    counted(row, 10)
    assert row["ttft_mean_ms"] == pytest.approx(150.0)
    assert row["ttft_p99_ms"] == pytest.approx(1e3 * (0.1 + 0.99 * 0.1))
    assert row["tpot_mean_ms"] == pytest.approx(12.0)  # the current name, inter_token_latency
    assert row["tpot_p99_ms"] == pytest.approx(1e3 * (0.010 + 0.99 * 0.005))
    assert row["prompt_tokens_mean"] == pytest.approx(200.0)
    assert row["output_tokens_mean"] == pytest.approx(10.0)


def test_sglang_serving_gauges(read: Read) -> None:
    row = read.serving[SGLANG_MODEL]
    assert (row["requests_waiting"], row["requests_running"]) == (3, 7)
    assert row["kv_cache_usage"] == pytest.approx(0.25)


# -- TGI ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [TGI_MODEL, TGI_JOB])
def test_tgi_rows_named_by_the_model_label_else_the_job(read: Read, model: str) -> None:
    row = read.requests[model]
    assert read.placed[model] == ""
    counted(row, 4)  # the successes; the refused one is an error
    assert row["errors"] * 4 == pytest.approx(row["count"])
    assert row["mean_ms"] == pytest.approx(500.0)
    for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        assert row[f"{name}_ms"] == pytest.approx(1e3 * interpolated(q, DURATION_BUCKETS, [0.5]))
    assert row["queue_ms"] == pytest.approx(100.0)
    assert row["preprocess_ms"] == pytest.approx(1.0)
    assert row["compute_ms"] == pytest.approx(390.0)


@pytest.mark.parametrize("model", [TGI_MODEL, TGI_JOB])
def test_tgi_tpot_token_counts_and_gauges(read: Read, model: str) -> None:
    row = read.tokens[model]
    counted(row, 4)  # TGI has no TTFT: its requests are those that finished with tokens
    assert row["ttft_p99_ms"] is None and row["ttft_mean_ms"] is None
    assert row["tpot_mean_ms"] == pytest.approx(20.0)
    assert row["tpot_p99_ms"] == pytest.approx(1e3 * interpolated(0.99, DURATION_BUCKETS, [0.02]))
    assert row["prompt_tokens_mean"] == pytest.approx(100.0)
    assert row["output_tokens_mean"] == pytest.approx(19.0)
    gauges = read.serving[model]
    assert (gauges["requests_waiting"], gauges["requests_running"]) == (2, 3)
