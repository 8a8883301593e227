"""A real engine's spans through the fleet path: tritonserver traces every request to a
``cotenant agent``'s OTLP receiver, a real Prometheus scrapes the agent's ``/metrics``, and
``PrometheusSource`` (then a central ``cotenant serve`` reading that Prometheus) gives back the
requests the client sent: their count, a latency like the client's, queue and compute phases,
the model's name, and the node and GPU the agent assigned."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
from fleet_rig import Proc, spawn, started

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.core.timerange import TimeRange
from tests.engines.conftest import TritonServer, free_port, running_triton
from tests.promserver import PromServer, needs_prometheus, start_prometheus, wait_until

pytestmark = needs_prometheus

SCRAPE_S = 0.5
STEP_S = 10.0
NODE = "node-triton"
GPU = "GPU-triton-0"  # what the agent's [gpu] model_gpu assigns (Triton runs on the CPU here)
N_SLEEPER = 30
SLEEP_S = 0.05
N_MATMUL = 20


@dataclass
class Fleet:
    tmp: Path
    agent: Proc
    prom: PromServer
    triton: TritonServer
    source: PrometheusSource


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("agent-fleet")
    port = free_port()
    spawned = spawn(
        ["agent", "--store", str(tmp / "agent.duckdb")],
        tmp,
        "agent",
        {
            "COTENANT_AGENT_NODE": NODE,
            "COTENANT_SERVER_PORT": str(port),
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.1",
            "COTENANT_GPU_MODEL_GPU": f"sleeper={GPU},matmul={GPU}",
        },
    )
    agent = started(spawned, tmp, "agent")
    try:
        with (
            start_prometheus(
                tmp / "prom", [f"127.0.0.1:{port}"], scrape_interval_s=SCRAPE_S
            ) as prom,
            running_triton(agent.otlp, tmp / "triton") as triton,
            PrometheusSource(prom.url, scrape_interval_s=SCRAPE_S) as source,
        ):
            wait_until(lambda: prom.query('up{job="test"} == 1'), "Prometheus's first scrape")
            yield Fleet(tmp, agent, prom, triton, source)
    finally:
        agent.stop()


def total_count(prom: PromServer, model: str) -> float:
    sel = f'model="{model}",phase="total"'
    got = prom.query(f"sum(cotenant_request_duration_seconds_count{{{sel}}})")
    return float(got[0]["value"][1]) if got else 0.0


def test_triton_spans_through_an_agent_and_prometheus_read_back_as_the_client_sent_them(
    fleet: Fleet,
) -> None:
    prom, url = fleet.prom, fleet.triton.url
    bodies = {
        "sleeper": {"inputs": [{"name": "s", "shape": [1, 1], "datatype": "FP32",
                                "data": [SLEEP_S]}]},
        "matmul": {"inputs": [{"name": "x", "shape": [2, 256], "datatype": "FP32",
                               "data": [1.0] * 512}]},
    }  # fmt: skip
    # one request of each model first, scraped: the agent makes a model's series at its first
    # request, and rate() / increase() count nothing of what a series holds at its first sample
    # (20 matmul requests take less than a scrape interval)
    first_ms: dict[str, float] = {}
    for model in bodies:
        t0 = time.perf_counter()
        assert httpx.post(f"{url}/v2/models/{model}/infer", json=bodies[model]).status_code == 200
        first_ms[model] = (time.perf_counter() - t0) * 1e3
        wait_until(lambda m=model: total_count(prom, m) == 1, f"{model}'s first request scraped")
    # the load goes inside one window, a second after it starts: the counters are flat at both
    # of its edges, so its increase is the client's requests (rate() extrapolates the first
    # and last samples to the window's edges: up to one scrape interval in STEP_S more)
    step_ns = int(STEP_S * 1e9)
    since_ns = -(-time.time_ns() // step_ns) * step_ns
    wait_until(lambda: time.time_ns() > since_ns + 1_000_000_000, "a window's start", 2 * STEP_S)
    took: dict[str, list[float]] = {"sleeper": [], "matmul": []}
    with httpx.Client(timeout=30) as client:
        for model, n in (("sleeper", N_SLEEPER), ("matmul", N_MATMUL)):
            for _ in range(n):
                t0 = time.perf_counter()
                r = client.post(f"{url}/v2/models/{model}/infer", json=bodies[model])
                took[model].append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text
    # every span reached the agent's histogram, and Prometheus scraped it
    for model, n in (("sleeper", N_SLEEPER), ("matmul", N_MATMUL)):
        wait_until(
            lambda m=model, w=n + 1: total_count(prom, m) == w,
            f"{model}'s {n} requests in the agent's series in Prometheus "
            f"(agent log: {fleet.agent.log})",
        )
    until_ns = since_ns + step_ns
    assert time.time_ns() < until_ns - 1_000_000_000, "the load outlasted its window"
    wait_until(
        lambda: time.time_ns() > until_ns + int(2 * SCRAPE_S * 1e9), "the window's end", 2 * STEP_S
    )
    # the series carry the agent's node and the GPU it assigned, and nothing else
    labels = prom.query('cotenant_request_duration_seconds_count{phase="total"}')
    assert {(s["metric"]["model"], s["metric"]["node"], s["metric"]["gpu"]) for s in labels} == {
        ("sleeper", NODE, GPU),
        ("matmul", NODE, GPU),
    }, labels

    rng = TimeRange(since_ns, until_ns)
    source = fleet.source
    assert dict(source.model_gpus(rng)) == {"sleeper": GPU, "matmul": GPU}
    rows = {r["model"]: r for r in source.request_windows(rng, STEP_S).to_pylist()}
    assert source.has_spans  # cotenant's own phase series, not an exporter's
    assert set(rows) == {"sleeper", "matmul"}, rows
    for model, n in (("sleeper", N_SLEEPER), ("matmul", N_MATMUL)):
        row, ms = rows[model], np.asarray(took[model])
        assert row["ts_ns"] == since_ns and row["gpu"] == GPU, row
        assert n <= row["count"] <= n * STEP_S / (STEP_S - 2 * SCRAPE_S), (model, row, n)
        assert row["errors"] == pytest.approx(0.0, abs=1e-9), row
        # the span's request lies within the client's round trip
        assert 0 < row["mean_ms"] <= ms.mean() * 1.05, (model, row, ms.mean())
        assert row["queue_ms"] > 0 and row["compute_ms"] > 0, row
        phases = sum(row[c] or 0 for c in PHASE_COLUMNS)
        assert row["compute_ms"] <= phases <= row["mean_ms"] * 1.01, row
        # histogram_quantile over the agent's buckets (~26 % wide): within a bucket of the
        # client's own quantiles. The p99 may read the first request's bucket, though it was
        # scraped before the window: rate() extrapolates a bucket's increase to the range's
        # start only where the bucket was above 0 there (the first inference of matmul may take
        # 40 ms, its load 3 ms: p99 42 ms seen once)
        top = max(ms.max(), first_ms[model])
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= top * 1.27, (model, row, ms.max(), top)
        assert row["p50_ms"] <= np.percentile(ms, 50) * 1.27, (model, row)
        print(
            f"{model}: client n={n} mean {ms.mean():.2f} ms p50 {np.percentile(ms, 50):.2f} "
            f"max {ms.max():.2f}; fleet count {row['count']:.1f} mean {row['mean_ms']:.2f} ms "
            f"(queue {row['queue_ms']:.3f}, compute {row['compute_ms']:.2f}) p50 "
            f"{row['p50_ms']:.2f} p99 {row['p99_ms']:.2f}; first request {first_ms[model]:.1f} ms"
        )
    # the sleeper's compute is its sleep
    assert rows["sleeper"]["compute_ms"] >= SLEEP_S * 1e3 * 0.95, rows["sleeper"]
    assert rows["sleeper"]["p50_ms"] >= SLEEP_S * 1e3 * 0.79, rows["sleeper"]  # its bucket

    # a central serve in fleet mode, reading that Prometheus, diagnoses the model from it
    central = started(
        spawn(
            ["serve", "--store", str(fleet.tmp / "central.duckdb")],
            fleet.tmp,
            "central",
            {
                "COTENANT_PROMETHEUS_URL": prom.url,
                "COTENANT_PROMETHEUS_SCRAPE_INTERVAL_S": str(SCRAPE_S),
                "COTENANT_ACTUATORS_MODE": "off",
            },
        ),
        fleet.tmp,
        "central",
    )
    try:
        body = {"model": "sleeper", "start": str(since_ns / 1e9), "end": str(until_ns / 1e9)}
        r = httpx.post(f"{central.api}/api/v1/diagnose", json=body, timeout=60)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["model"] == "sleeper" and got["spans"] is True and got["limits"] == [], got
        r = httpx.post(f"{central.api}/api/v1/diagnose", json={**body, "model": "nope"})
        assert r.status_code == 404, r.text
    finally:
        central.stop()
