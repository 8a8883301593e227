"""``PrometheusSource`` reads the fleet loop's recorded windows (``cotenant-fleet-windows`` in
``fleet.rules.yml``, as ``cotenant rules render`` writes it) when a real Prometheus evaluates
them, and raw buckets when it does not, with the same numbers either way.

Two Prometheus servers scrape one exporter of agent-shaped latency histograms (counters linear
in time, samples stamped, so rates and quantiles are known exactly); one of them also loads the
rendered rules, a few seconds after it started (as an operator adding them to a running
Prometheus would). Every query each source sends is recorded, to tell which path it took.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import pytest
from prometheus_api_client import PrometheusConnect
from promserver import PromServer, TextExporter, needs_prometheus, start_prometheus, wait_until

from cotenant.alerts.rules.render import to_yaml
from cotenant.alerts.rules.windows import window_group
from cotenant.app.config import load_config
from cotenant.cli.rules import settings_from
from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange

pytestmark = needs_prometheus

SCRAPE_S = 0.5  # the rules' rate window is 4 x this: 2 s
STEP_S = 1.0
BUCKETS = [(0.005, 0.1), (0.01, 0.7), (0.025, 0.95), (0.05, 1.0)]  # (le, cumulative share)
MODELS = {("tts", "GPU-a"): (8.0, 0.008), ("asr", "GPU-b"): (3.0, 0.004)}  # rps, compute s
P50 = 0.005 + 0.005 * (0.5 - 0.1) / 0.6  # histogram_quantile's interpolation in BUCKETS
P99 = 0.025 + 0.025 * (0.99 - 0.95) / 0.05
MEAN_S = 0.011
RAW = "cotenant_request_duration_seconds_bucket"


class Exporter:
    def __init__(self) -> None:
        self.t0_ms = int(time.time() * 1000)

    def render(self) -> str:
        ts = int(time.time() * 1000)
        e = (ts - self.t0_ms) / 1000
        out = ["# TYPE cotenant_request_duration_seconds histogram"]
        name = "cotenant_request_duration_seconds"
        for (model, gpu), (rps, compute_s) in MODELS.items():
            n = rps * e
            base = f'model="{model}",gpu="{gpu}",node="node-1"'
            for le, share in [*BUCKETS, ("+Inf", 1.0)]:
                out.append(f'{name}_bucket{{{base},phase="total",le="{le}"}} {n * share!r} {ts}')
            for phase, mean in (("total", MEAN_S), ("compute", compute_s)):
                if phase != "total":
                    out.append(f'{name}_bucket{{{base},phase="{phase}",le="+Inf"}} {n!r} {ts}')
                out.append(f'{name}_sum{{{base},phase="{phase}"}} {n * mean!r} {ts}')
                out.append(f'{name}_count{{{base},phase="{phase}"}} {n!r} {ts}')
        return "\n".join(out) + "\n"


class Recording:
    """A PrometheusConnect that keeps the text of every query it sends."""

    def __init__(self, url: str) -> None:
        self._c = PrometheusConnect(url, disable_ssl=True)
        self.queries: list[str] = []

    def custom_query(self, query: str, params: dict[str, Any]) -> Any:
        self.queries.append(query)
        return self._c.custom_query(query, params=params)

    def custom_query_range(
        self,
        query: str,
        start_time: datetime,
        end_time: datetime,
        step: str,
        params: dict[str, Any] | None = None,
    ) -> Any:
        self.queries.append(query)
        return self._c.custom_query_range(query, start_time, end_time, step, params=params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


@dataclass
class Pair:
    ruled: PromServer
    plain: PromServer
    rng: TimeRange


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("recorded")
    settings = replace(settings_from(load_config(env={})), scrape_interval_s=SCRAPE_S)
    rules = tmp / "windows.rules.yml"
    rules.write_text("groups: []\n")  # loaded later: a history from before the rules ran
    exp = Exporter()
    with (
        TextExporter(exp.render) as text,
        start_prometheus(
            tmp / "ruled", [text.target], scrape_interval_s=SCRAPE_S, rule_files=[rules]
        ) as ruled,
        start_prometheus(tmp / "plain", [text.target], scrape_interval_s=SCRAPE_S) as plain,
    ):
        wait_until(
            lambda: plain.query(
                "count_over_time(cotenant_request_duration_seconds_count[1m]) >= 8"
            ),
            "four seconds of scrapes",
        )
        rules.write_text(to_yaml([window_group(settings)]))
        ruled.proc.send_signal(signal.SIGHUP)  # Prometheus reloads its rule files
        # rules evaluated for ten seconds: room for a 4 s window after the 2 s rate windows
        wait_until(
            lambda: ruled.query("count_over_time(cotenant:window_phase_requests:rate2s[1m]) >= 20"),
            "ten seconds of recorded windows",
        )
        latest = float(ruled.query("max(timestamp(cotenant:window_phase_requests:rate2s))")[0]
                       ["value"][1])  # fmt: skip
        until = int(latest * 1e9) // 1_000_000_000 * 1_000_000_000
        yield Pair(ruled, plain, TimeRange(until - 3_000_000_000, until))


def _read(url: str, rng: TimeRange, step_s: float = STEP_S) -> tuple[list[dict[str, Any]], str]:
    client = Recording(url)
    with PrometheusSource(url, scrape_interval_s=SCRAPE_S, client=client) as src:
        rows = src.request_windows(rng, step_s).to_pylist()
        assert src.has_spans
    return rows, "\n".join(client.queries)


def _check(rows: list[dict[str, Any]], step_s: float = STEP_S) -> None:
    assert {(r["model"], r["gpu"]) for r in rows} == set(MODELS)
    for r in rows:
        rps, compute_s = MODELS[(r["model"], r["gpu"])]
        assert r["rate_rps"] == pytest.approx(rps, rel=0.05)
        assert r["count"] == pytest.approx(rps * step_s, rel=0.05)
        assert r["p99_ms"] == pytest.approx(1e3 * P99, rel=1e-3)
        assert r["p50_ms"] == pytest.approx(1e3 * P50, rel=1e-3)
        assert r["mean_ms"] == pytest.approx(1e3 * MEAN_S, rel=1e-3)
        assert r["compute_ms"] == pytest.approx(1e3 * compute_s, rel=1e-3)


def test_with_the_rules_the_source_reads_recorded_windows(pair: Pair) -> None:
    rows, queries = _read(pair.ruled.url, pair.rng)
    assert "cotenant:window_latency_seconds:p99_rate2s" in queries
    assert RAW not in queries  # not one bucket read
    assert len(rows) == 3 * len(MODELS)  # every window of every pair
    _check(rows)


def test_without_the_rules_it_reads_raw_buckets_with_the_same_result(pair: Pair) -> None:
    rows, queries = _read(pair.plain.url, pair.rng)
    assert RAW in queries
    assert "cotenant:window_" in queries  # asked whether they exist: no
    assert len(rows) == 3 * len(MODELS)
    _check(rows)


def test_a_window_no_rule_records_is_read_raw(pair: Pair) -> None:
    """4 s windows need a 4 s rate: the rules record 2 s rates only."""
    until = (pair.rng.until_ns or 0) // 4_000_000_000 * 4_000_000_000  # one whole window
    rng = TimeRange(until - 4_000_000_000, until)
    rows, queries = _read(pair.ruled.url, rng, step_s=4.0)
    assert RAW in queries
    _check(rows, step_s=4.0)


def test_windows_before_the_rules_first_ran_are_read_raw(pair: Pair) -> None:
    """The recorded series start with the rules: the windows of a range that end before their
    first evaluation come from raw buckets, the rest from the recorded series."""
    q = "min_over_time(timestamp(cotenant:window_phase_requests:rate2s)[1m:])"
    first_ns = int(float(pair.ruled.query(q)[0]["value"][1]) * 1e9)
    until = first_ns // 1_000_000_000 * 1_000_000_000 + 4_000_000_000
    rows, queries = _read(pair.ruled.url, TimeRange(until - 6_000_000_000, until))
    assert RAW in queries and "cotenant:window_latency_seconds:p99_rate2s" in queries
    before = [r for r in rows if r["ts_ns"] + 1_000_000_000 < first_ns]
    after = [r for r in rows if r["ts_ns"] >= first_ns]
    assert before and all(r["count"] > 0 for r in before)  # from the buckets
    assert after
    _check(after)
