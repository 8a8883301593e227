"""vLLM 0.32's real /metrics page (tests/fixtures/engines/vllm-0.32.0/metrics.txt, see its
PROVENANCE.md), scraped by a real Prometheus, read through ``PrometheusSource``: the 16
requests it counts, their mean latency, queue and compute, and TTFT, TPOT and token counts
from the histograms this vLLM exposes: TPOT from ``vllm:inter_token_latency_seconds``, since
``vllm:time_per_output_token_seconds``, the only name read before issue 27, is gone (live:
tests/engines/test_vllm.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from promserver import TextExporter, needs_prometheus, start_prometheus, wait_until

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange
from tests.e2e.test_triton_page_fleet import zeroed

pytestmark = needs_prometheus

PAGE = (
    Path(__file__).parents[1] / "fixtures" / "engines" / "vllm-0.32.0" / "metrics.txt"
).read_text()
SCRAPE_S = 0.25
STEP_S = 2.0


def test_the_real_page_gives_its_requests_and_tpot_from_the_current_names(
    tmp_path: Path,
) -> None:
    assert "vllm:time_per_output_token_seconds" not in PAGE
    state = {"page": zeroed(PAGE)}
    step_ns = int(STEP_S * 1e9)
    with (
        TextExporter(lambda: state["page"]) as exp,
        start_prometheus(tmp_path, [exp.target], scrape_interval_s=SCRAPE_S) as prom,
    ):
        wait_until(lambda: prom.query("vllm:request_success_total"), "the first scrape")
        since = -(-time.time_ns() // step_ns) * step_ns
        # the 16 requests arrive inside one window, after two scrapes of the page at 0
        wait_until(lambda: time.time_ns() > since + 700_000_000, "the window's start", 10)
        state["page"] = PAGE
        wait_until(lambda: time.time_ns() > since + step_ns + 500_000_000, "its end", 10)
        rng = TimeRange(since, since + step_ns)
        with PrometheusSource(prom.url, scrape_interval_s=SCRAPE_S) as source:
            [req] = source.request_windows(rng, STEP_S, model="tiny").to_pylist()
            [tok] = source.token_windows(rng, STEP_S, lengths=True).to_pylist()
    # rate() extrapolates the first and last samples to the window's edges
    assert 16 <= req["count"] <= 16 * STEP_S / (STEP_S - 2 * SCRAPE_S), req
    # sums / counts, as the page has them
    assert req["mean_ms"] == pytest.approx(0.5465102195739746 / 16 * 1e3)
    assert req["queue_ms"] == pytest.approx(0.0004828180026379414 / 16 * 1e3)
    assert req["compute_ms"] == pytest.approx(0.3991923859975941 / 16 * 1e3)
    assert 0 < req["p50_ms"] <= req["p99_ms"], req
    assert tok["model"] == "tiny" and tok["count"] >= 16, tok
    assert tok["ttft_mean_ms"] == pytest.approx(0.20598173141479492 / 16 * 1e3)
    # one observation per output token after the first: 136 tokens, 16 requests
    assert tok["tpot_mean_ms"] == pytest.approx(0.3107978379994165 / 120 * 1e3)
    assert tok["tpot_p99_ms"] is not None and tok["tpot_p99_ms"] > 0, tok
    assert tok["output_tokens_mean"] == pytest.approx(136 / 16)
    assert tok["prompt_tokens_mean"] == pytest.approx(132 / 16)
