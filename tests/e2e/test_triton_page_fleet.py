"""Triton 2.51's real /metrics page (tests/fixtures/engines/triton-2.51.0/metrics.txt, see its
PROVENANCE.md), scraped by a real Prometheus, read through ``PrometheusSource``: the five
requests it counts, their mean, batch size and phases, and the quantiles of its optional
latency summary (``--metrics-config=summary_latencies=true``), which the fleet path left null
before issue 27 (live: tests/engines/test_engine_metrics_fleet.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from promserver import TextExporter, needs_prometheus, start_prometheus, wait_until, zeroed

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange

pytestmark = needs_prometheus

PAGE = (
    Path(__file__).parents[1] / "fixtures" / "engines" / "triton-2.51.0" / "metrics.txt"
).read_text()
SCRAPE_S = 0.25
STEP_S = 2.0


def test_the_real_page_gives_the_requests_it_counts_and_its_summary_quantiles(
    tmp_path: Path,
) -> None:
    state = {"page": zeroed(PAGE)}
    step_ns = int(STEP_S * 1e9)
    with (
        TextExporter(lambda: state["page"]) as exp,
        start_prometheus(tmp_path, [exp.target], scrape_interval_s=SCRAPE_S) as prom,
    ):
        wait_until(lambda: prom.query("nv_inference_request_success"), "the first scrape")
        since = -(-time.time_ns() // step_ns) * step_ns
        # the five requests arrive inside one window, after two scrapes of the page at 0
        wait_until(lambda: time.time_ns() > since + 700_000_000, "the window's start", 10)
        state["page"] = PAGE
        wait_until(lambda: time.time_ns() > since + step_ns + 500_000_000, "its end", 10)
        with PrometheusSource(prom.url, scrape_interval_s=SCRAPE_S) as source:
            rows = source.request_windows(TimeRange(since, since + step_ns), STEP_S).to_pylist()
    [row] = [r for r in rows if r["model"] == "matmul"]
    # rate() extrapolates the first and last samples to the window's edges
    assert 5 <= row["count"] <= 5 * STEP_S / (STEP_S - 2 * SCRAPE_S), row
    assert row["batch_size_mean"] == pytest.approx(2.0)  # 10 inferences in 5 executions
    assert row["mean_ms"] == pytest.approx(35847 / 5 / 1e3)
    # the summary's quantiles as the page has them, µs -> ms (0.95 is there, as are 0.5, 0.99)
    assert row["p50_ms"] == pytest.approx(0.814)
    assert row["p95_ms"] == pytest.approx(0.833)
    assert row["p99_ms"] == pytest.approx(0.833)
    assert row["queue_ms"] > 0 and row["compute_ms"] > 0
