"""Ray Serve's real /metrics page through the fleet path: a real Prometheus scrapes the Ray
cluster's metrics port on loopback, and ``PrometheusSource`` reads the requests a client sent
back out of it under the names Ray Serve 2.60 really exposes, keyed ``application/deployment``,
the model the same requests' spans got in ``cotenant serve``: spans and metrics join."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange
from tests.conftest import Served
from tests.engines.conftest import RayCluster, rows_for
from tests.engines.test_spans import traceparent
from tests.promserver import PromServer, needs_prometheus, start_prometheus, wait_until

pytestmark = needs_prometheus

SCRAPE_S = 0.5
STEP_S = 20.0
N_SLEEPER = 20
SLEEP_S = 0.05
N_MATMUL = 30
COUNTER = "ray_serve_deployment_request_counter_total"
SLACK_MS = 50.0  # Ray's processing time past the client's round trip (see below)
SPAN_LEAD_MS = 1.0
"""How much longer than Ray's processing timer a replica span may run (its request's handling
before the user's method): MatMul's 2-3 ms spans ran 0.5 ms over it, 2 runs of 2 on one machine."""
PAGE = Path(__file__).parents[1] / "fixtures" / "engines" / "rayserve-2.60.0" / "metrics.txt"
BUCKETS_MS = sorted(
    float(b)
    for b in set(re.findall(r'processing_latency_ms_bucket\{.*?le="([\d.]+)"', PAGE.read_text()))
)
"""Ray Serve's latency buckets (ms), as its recorded page has them."""


@pytest.fixture(scope="module")
def prom(ray_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    with start_prometheus(
        tmp_path_factory.mktemp("prom"), [ray_cluster.metrics], scrape_interval_s=SCRAPE_S
    ) as p:
        yield p


def total(prom: PromServer, app: str) -> float:
    got = prom.query(f'sum({COUNTER}{{application="{app}"}})')
    return float(got[0]["value"][1]) if got else 0.0


def test_prometheus_source_reads_ray_serve_requests_under_the_spans_model(
    ray_cluster: RayCluster, served: Served, prom: PromServer
) -> None:
    with httpx.Client(timeout=30) as client:
        # the deployments' series exist once they served a request (and Ray reported it)
        for path in ("/mm", "/slow"):
            assert client.get(f"{ray_cluster.http}{path}", params={"s": 0}).status_code == 200
        for app in ("mm", "slow"):
            wait_until(lambda a=app: total(prom, a) > 0, f"{app}'s counter in Prometheus", 60)
        before = {app: total(prom, app) for app in ("mm", "slow")}
        # the load goes inside one window, a second after it starts (see the Triton test)
        step_ns = int(STEP_S * 1e9)
        since_ns = -(-time.time_ns() // step_ns) * step_ns
        wait_until(lambda: time.time_ns() > since_ns + 1_000_000_000, "a window's start", 30)
        took: dict[str, list[float]] = {"mm": [], "slow": []}
        traces: dict[str, set[str]] = {"mm": set(), "slow": set()}
        for app, n, params in (
            ("slow", N_SLEEPER, {"s": SLEEP_S}),
            ("mm", N_MATMUL, {"n": 64}),
        ):
            for _ in range(n):
                trace, header = traceparent()
                t0 = time.perf_counter()
                r = client.get(
                    f"{ray_cluster.http}/{app}", params=params, headers={"traceparent": header}
                )
                took[app].append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text
                traces[app].add(trace)
    for app, n in (("slow", N_SLEEPER), ("mm", N_MATMUL)):
        want = before[app] + n
        wait_until(lambda a=app, w=want: total(prom, a) == w, f"{app}'s counter at {want}", 30)
    until_ns = since_ns + step_ns
    assert time.time_ns() < until_ns - 1_000_000_000, "the load outlasted its window"
    wait_until(lambda: time.time_ns() > until_ns + int(2 * SCRAPE_S * 1e9), "its end", 2 * STEP_S)
    rng = TimeRange(since_ns, until_ns)
    with PrometheusSource(prom.url, scrape_interval_s=SCRAPE_S) as source:
        served_by = dict(source.model_gpus(rng))
        rows = {r["model"]: r for r in source.request_windows(rng, STEP_S).to_pylist()}
        gauges = {r["model"]: r for r in source.serving_windows(rng, STEP_S).to_pylist()}
    for app, model, n in (("slow", "slow/Sleeper", N_SLEEPER), ("mm", "mm/MatMul", N_MATMUL)):
        # the spans of the same requests, in cotenant serve, name the same model
        spans = rows_for(served, model, traces[app])
        assert {r["model"] for r in spans.values()} == {model}
        assert served_by.get(model) == "", served_by
        row = rows[model]
        assert row["gpu"] in ("", None), row
        assert n <= row["count"] <= n * STEP_S / (STEP_S - 2 * SCRAPE_S), (model, row)
        assert row["errors"] == pytest.approx(0.0, abs=1e-9), row
        client_mean = float(np.mean(took[app]))
        span_compute = float(np.mean([r["compute_ms"] for r in spans.values()]))
        # the replica's processing time is about its span (the replica span, the spans'
        # compute; the span may open up to SPAN_LEAD_MS before Ray's timer starts); it closes
        # once the ASGI app returned, after the proxy had the answer: on these two busy cores
        # up to ~20 ms after the client's round trip for the async Sleeper
        low = 0.9 * span_compute - SPAN_LEAD_MS
        assert low <= row["mean_ms"] <= client_mean + SLACK_MS, (
            model,
            row,
            span_compute,
            client_mean,
        )
        assert row["compute_ms"] == pytest.approx(row["mean_ms"])
        # the histogram's quantiles: ordered, and below the bucket holding the slowest request
        upper = next(b for b in BUCKETS_MS if b >= max(took[app]) + SLACK_MS)
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] <= upper, (row, upper)
        assert model in gauges and gauges[model]["requests_waiting"] >= 0, gauges
        print(
            f"{model}: client n={n} mean {client_mean:.1f} ms, spans' compute "
            f"{span_compute:.1f} ms; fleet count {row['count']:.1f} mean {row['mean_ms']:.1f} ms "
            f"p50 {row['p50_ms']:.1f} p99 {row['p99_ms']:.1f}"
        )
    # the Sleeper's processing time is its sleep
    assert rows["slow/Sleeper"]["mean_ms"] >= SLEEP_S * 1e3 * 0.95, rows["slow/Sleeper"]
