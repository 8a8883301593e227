"""A real engine's /metrics page through the fleet path: a real Prometheus scrapes tritonserver's
metrics port on loopback, and cotenant's ``PrometheusSource`` reads the requests a client sent
back out of it, under the names Triton 2.51 really exposes: the count of requests, the model,
the batch size and a latency no larger than the client's own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import pytest

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange
from tests.engines.conftest import TritonServer
from tests.promserver import PromServer, needs_prometheus, start_prometheus, wait_until

pytestmark = needs_prometheus

SCRAPE_S = 0.5
STEP_S = 10.0
N_SLEEPER = 30
SLEEP_S = 0.05
N_MATMUL = 20
BATCH = 2


@dataclass
class Scraped:
    prom: PromServer
    source: PrometheusSource


@pytest.fixture(scope="module")
def scraped(triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    target = triton.metrics.removeprefix("http://")
    with start_prometheus(
        tmp_path_factory.mktemp("prom"), [target], scrape_interval_s=SCRAPE_S
    ) as prom:
        wait_until(
            lambda: prom.query('nv_inference_request_success{model="sleeper"}'),
            "Prometheus's first scrape of tritonserver",
        )
        with PrometheusSource(prom.url, scrape_interval_s=SCRAPE_S) as source:
            yield Scraped(prom, source)


def counter(prom: PromServer, name: str, model: str) -> float:
    got = prom.query(f'sum({name}{{model="{model}"}})')
    return float(got[0]["value"][1]) if got else 0.0


def settled(prom: PromServer, name: str, model: str, want: float) -> bool:
    return counter(prom, name, model) == want


def test_prometheus_source_reads_triton_requests_as_the_client_sent_them(
    triton: TritonServer, scraped: Scraped
) -> None:
    prom = scraped.prom
    before = {m: counter(prom, "nv_inference_request_success", m) for m in ("sleeper", "matmul")}
    # the load goes inside one window, a second after it starts: the counters are flat at both
    # of its edges, so its increase is the client's requests (rate() then extrapolates the
    # first and last samples to the window's edges: up to one scrape interval in STEP_S more)
    step_ns = int(STEP_S * 1e9)
    since_ns = -(-time.time_ns() // step_ns) * step_ns
    wait_until(lambda: time.time_ns() > since_ns + 1_000_000_000, "a window's start", 2 * STEP_S)
    sleeper_ms: list[float] = []
    matmul_ms: list[float] = []
    sleep_body = {"inputs": [{"name": "s", "shape": [1, 1], "datatype": "FP32", "data": [SLEEP_S]}]}
    mm_body = {
        "inputs": [
            {"name": "x", "shape": [BATCH, 256], "datatype": "FP32", "data": [1.0] * 256 * BATCH}
        ]
    }
    with httpx.Client(timeout=30) as client:
        for model, body, n, took in (
            ("sleeper", sleep_body, N_SLEEPER, sleeper_ms),
            ("matmul", mm_body, N_MATMUL, matmul_ms),
        ):
            for _ in range(n):
                t0 = time.perf_counter()
                r = client.post(f"{triton.url}/v2/models/{model}/infer", json=body)
                took.append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text
    # the raw counters, as scraped: one per request, under the names our queries use
    for model, n in (("sleeper", N_SLEEPER), ("matmul", N_MATMUL)):
        want = before[model] + n
        wait_until(
            lambda m=model, w=want: settled(prom, "nv_inference_request_success", m, w),
            f"{model}'s request counter to reach {want} in Prometheus",
        )
    until_ns = since_ns + step_ns
    assert time.time_ns() < until_ns - 1_000_000_000, "the load outlasted its window"
    # the window is over and scraped once more (its rate is evaluated at its end)
    wait_until(
        lambda: time.time_ns() > until_ns + int(2 * SCRAPE_S * 1e9), "the window's end", 2 * STEP_S
    )
    rng = TimeRange(since_ns, until_ns)
    # the fleet path finds the models that served requests, with no GPU (CPU instances)
    served = dict(scraped.source.model_gpus(rng))
    assert served.get("sleeper") == "" and served.get("matmul") == "", served
    t = scraped.source.request_windows(rng, STEP_S).to_pylist()

    by_model: dict[str, list[dict]] = {}
    for row in t:
        by_model.setdefault(row["model"], []).append(row)
    assert {"sleeper", "matmul"} <= set(by_model), sorted(by_model)
    for model, n, took in (("sleeper", N_SLEEPER, sleeper_ms), ("matmul", N_MATMUL, matmul_ms)):
        [row] = by_model[model]  # one window held all of its load
        assert row["gpu"] in ("", None), row
        assert n <= row["count"] <= n * STEP_S / (STEP_S - 2 * SCRAPE_S), (model, row, n)
        assert row["errors"] == pytest.approx(0.0, abs=1e-9), row
        client_mean = float(np.mean(took))
        # Triton's own request time lies inside the client's round trip, its compute inside that
        assert 0 < row["mean_ms"] <= client_mean * 1.05, (model, row, client_mean)
        assert row["queue_ms"] is not None and row["queue_ms"] >= 0, row
        assert row["compute_ms"] is not None and 0 < row["compute_ms"] <= row["mean_ms"], row
        # Triton's latency summary (summary_latencies=true), over its own sliding window
        assert 0 < row["p50_ms"] <= row["p99_ms"], row
        print(
            f"{model}: client n={n} mean {client_mean:.1f} ms; fleet count {row['count']:.1f} "
            f"mean {row['mean_ms']:.1f} ms (queue {row['queue_ms']:.2f}, compute "
            f"{row['compute_ms']:.1f}), batch {row['batch_size_mean']}, p99 {row['p99_ms']}"
        )
    # the sleeper's compute is its sleep; matmul's batches are the client's
    assert by_model["sleeper"][0]["compute_ms"] >= SLEEP_S * 1e3 * 0.95, by_model["sleeper"]
    assert by_model["matmul"][0]["batch_size_mean"] == pytest.approx(BATCH), by_model["matmul"]
