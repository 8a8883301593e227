"""The two :class:`store.week_rollups.WeekRollups` give the same week: DuckDB over the store's
rollup rows (embedded mode) and PromQL over the recording rules' minute series, in a real
Prometheus and in a real VictoriaMetrics (fleet mode,
:class:`collectors.prometheus.week.PromQLWeekRollups`).

The same minutes are written both ways: as rollup rows, and as the samples the rules of
``rules/fleet.rules.yml`` record (each minute ``m`` once during the next minute, at offsets
from 0 to 59.999 s: the edges where an off-by-one-minute would show). The range asked for
starts and ends inside the data, so a minute before or after it that leaked in would change
the counts. Model names carry regex metacharacters (``a.b-1`` must not match ``axb-1``).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pytest
from promserver import (
    PROMETHEUS,
    needs_prometheus,
    needs_victoria,
    start_prometheus,
    start_victoria,
)

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.collectors.prometheus.week import PromQLWeekRollups
from cotenant.core.slos import SloTable
from cotenant.core.week_reads import GpuThresholds
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.week_rollups import StoreWeekRollups

pytestmark = needs_prometheus

S = 1_000_000_000
MIN = 60 * S
PROMTOOL = str(Path(PROMETHEUS).with_name("promtool"))
N_MIN = 24  # minutes of data; the range asked for is minutes 2 .. 21
CHUNK_NS = 7 * MIN  # minutes are counted in chunks (a day in serve): 7, 7 and 6 here
MODELS = {"a.b-1": ("GPU-0", "GPU-1"), "axb-1": ("GPU-1",), "c": ("GPU-0",)}
OFFSETS_S = (0.0, 30.0, 59.999)
Both = tuple[int, StoreWeekRollups, PromQLWeekRollups]
"""The data's first minute (ns), embedded mode's answers, fleet mode's."""
THRESHOLDS = GpuThresholds(sm=90.0, dram=0.8, pcie_bps=1e10, memory_full=0.9, throttle_bits=0x40)


def _minutes(t0: int) -> dict[str, list[dict[str, Any]]]:
    """Rollup rows of N_MIN minutes from ``t0``: requests with gaps, bursts and slow minutes,
    two GPUs on two hosts, a co-tenant process that comes and goes."""
    rng = np.random.default_rng(7)
    req, gpu, proc = [], [], []
    for i in range(N_MIN):
        m = t0 + i * MIN
        for model, gpus in MODELS.items():
            for g in gpus:
                if model == "c" and i % 3 == 0:
                    continue  # a minute without requests
                n = int(rng.integers(5, 40)) * (4 if (model == "a.b-1" and i == 9) else 1)
                req.append(
                    {
                        "minute_ns": m,
                        "model": model,
                        "gpu": g,
                        "count": n,
                        "errors": int(i % 5 == 0),
                        "p99_ms": float(rng.choice([30.0, 44.0, 48.0, 52.0, 70.0])),
                        "ttft_p99_ms": float(rng.choice([80.0, 120.0])) if model == "c" else None,
                        "latency_sum_ms": n * 25.0,
                        # a.b-1's requests waited for model loads (their other phase) at times
                        "other_ms": float(rng.choice([0.0, 3.5])) if model == "a.b-1" else 0.0,
                    }
                )
        for k, g in enumerate(("GPU-0", "GPU-1")):
            gpu.append(
                {
                    "minute_ns": m,
                    "host": f"node-{k}",
                    "gpu": g,
                    "samples": 4,
                    "sm_util": float(rng.choice([50.0, 95.0])),
                    "mem_util": float(rng.choice([40.0, 85.0])),
                    "pcie_tx_bps": float(rng.choice([1e9, 2e10])),
                    "mem_used_bytes_max": float(rng.choice([10e9, 75e9])),
                    "mem_total_bytes": 80e9,
                    "clock_event_reasons": 0x40 if i % 7 == 3 else 0,
                }
            )
        if 4 <= i < 15:
            proc.append(
                {
                    "minute_ns": m,
                    "host": "node-1",
                    "gpu": "GPU-1",
                    "pid": 77,
                    "process_name": "train-job",
                    "model": None,
                    "samples": 4,
                    "sm_util": 40.0,
                }
            )
    return {"request_rollup_1m": req, "gpu_rollup_1m": gpu, "process_rollup_1m": proc}


def _openmetrics(rows: dict[str, list[dict[str, Any]]], *, ms: bool = False) -> str:
    """The recorded series the fleet rules would hold for these minutes, as OpenMetrics
    (``ms``: Prometheus text with millisecond timestamps, as VictoriaMetrics imports it)."""
    fam: dict[str, list[tuple[str, int, float]]] = {}

    def add(name: str, labels: dict[str, str], minute: int, v: float) -> None:
        off = OFFSETS_S[len(fam.get(name, [])) % len(OFFSETS_S)]
        lb = ",".join(f'{k}="{x}"' for k, x in labels.items())
        fam.setdefault(name, []).append((f"{name}{{{lb}}}", minute + MIN + int(off * 1e9), v))

    per_model: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows["request_rollup_1m"]:
        m, model, g = int(r["minute_ns"]), str(r["model"]), str(r["gpu"])
        add(
            "cotenant:requests:increase_minute",
            {"node": "n", "model": model, "gpu": g},
            m,
            float(r["count"]),
        )
        node = {"node": "n", "model": model, "gpu": g}
        add("cotenant:request_latency_seconds:sum_minute", node, m, r["latency_sum_ms"] / 1e3)
        add(
            "cotenant:request_phase_seconds:sum_minute",
            {**node, "phase": "other"},
            m,
            r["other_ms"] * r["count"] / 1e3,
        )
        add(
            "cotenant:request_latency_seconds:p99_minute",
            {"model": model, "gpu": g},
            m,
            float(r["p99_ms"]) / 1e3,
        )
        per_model.setdefault((m, model), []).append(r)
    tenants: dict[tuple[int, str], set[str]] = {}
    for (m, model), rs in per_model.items():
        lb = {"model": model}
        add("cotenant:model_requests:increase_minute", lb, m, float(sum(r["count"] for r in rs)))
        errors = sum(int(r["errors"]) for r in rs)
        if errors:
            add("cotenant:model_request_errors:increase_minute", lb, m, float(errors))
        add(
            "cotenant:model_request_latency_seconds:p99_max_minute",
            lb,
            m,
            max(float(r["p99_ms"]) for r in rs) / 1e3,
        )
        ttft = [float(r["ttft_p99_ms"]) for r in rs if r["ttft_p99_ms"] is not None]
        if ttft:
            add("cotenant:model_time_to_first_token_seconds:p99_max_minute", lb, m, max(ttft) / 1e3)
        for r in rs:
            tenants.setdefault((m, str(r["gpu"])), set()).add(model)
    for r in rows["gpu_rollup_1m"]:
        m, lb = int(r["minute_ns"]), {"host": str(r["host"]), "gpu": str(r["gpu"])}
        add("cotenant:gpu_sm_utilization:avg_minute", lb, m, float(r["sm_util"]) / 100)
        add(
            "cotenant:gpu_memory_bandwidth_utilization:avg_minute",
            lb,
            m,
            float(r["mem_util"]) / 100,
        )
        add("cotenant:gpu_pcie_bytes_per_second:avg_minute", lb, m, float(r["pcie_tx_bps"]))
        add("cotenant:gpu_memory_used_bytes:max_minute", lb, m, float(r["mem_used_bytes_max"]))
        add("cotenant:gpu_memory_total_bytes:max_minute", lb, m, float(r["mem_total_bytes"]))
        add("cotenant:gpu_throttled:max_minute", lb, m, 1.0 if r["clock_event_reasons"] else 0.0)
    for r in rows["process_rollup_1m"]:
        m = int(r["minute_ns"])
        lb = {"host": "node-1", "gpu": "GPU-1", "pid": "77", "process": "train-job", "model": ""}
        add("cotenant:process_sm_utilization:avg_minute", lb, m, float(r["sm_util"]) / 100)
        tenants.setdefault((m, "GPU-1"), set()).add("train-job")
    for (m, g), names in tenants.items():
        add("cotenant:gpu_tenants:count_minute", {"gpu": g}, m, float(len(names)))
    out = []
    for name, samples in fam.items():
        out.append(f"# TYPE {name} gauge\n")
        for series, ts, v in sorted(samples, key=lambda s: (s[0], s[1])):
            stamp = f"{ts // 1_000_000}" if ms else f"{ts // 1_000_000 / 1e3:.3f}"
            out.append(f"{series} {v!r} {stamp}\n")
    return "".join(out) + ("" if ms else "# EOF\n")


@contextlib.contextmanager
def _victoria(tmp: Path, rows: dict[str, list[dict[str, Any]]]) -> Iterator[str]:
    with start_victoria(tmp / "vm", []) as vm:
        r = httpx.post(f"{vm.url}/api/v1/import/prometheus", content=_openmetrics(rows, ms=True))
        assert r.status_code == 204, r.text
        httpx.get(f"{vm.url}/internal/force_flush", timeout=30)
        yield vm.url


@pytest.fixture(
    scope="module", params=["prometheus", pytest.param("victoriametrics", marks=needs_victoria)]
)
def both(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Both]:
    tmp = tmp_path_factory.mktemp("week-contract")
    t0 = (time.time_ns() // MIN - 6 * 60) * MIN  # six hours ago, on a minute
    rows = _minutes(t0)
    store = Store(tmp / "embedded.duckdb")
    append_tables(store, {k: pa.Table.from_pylist(v) for k, v in rows.items()})
    if request.param == "victoriametrics":
        with _victoria(tmp, rows) as url:
            source = PrometheusSource(url, 30.0)
            try:
                yield t0, StoreWeekRollups(store), PromQLWeekRollups(source, chunk_ns=CHUNK_NS)
            finally:
                source.close()
                store.close()
        return
    om = tmp / "minutes.om"
    om.write_text(_openmetrics(rows))
    r = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp / "blocks")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with start_prometheus(tmp / "prom", [], blocks=tmp / "blocks") as prom:
        source = PrometheusSource(prom.url, 30.0)
        try:
            yield t0, StoreWeekRollups(store), PromQLWeekRollups(source, chunk_ns=CHUNK_NS)
        finally:
            source.close()
            store.close()


def test_models_minutes_slos_and_bursts_agree(both: Both) -> None:
    t0, embedded, fleet = both
    lo, hi = t0 + 2 * MIN, t0 + 22 * MIN
    # an explicit SLO for a.b-1, none for c (explicit 0 beats the default), the default for axb-1
    slos = SloTable({"a.b-1": 50.0, "c": 0.0}, default=45.0)
    want = embedded.model_weeks(lo, hi, slos)
    got = fleet.model_weeks(lo, hi, slos)
    assert set(want) == set(got) == set(MODELS)
    for model, w in want.items():
        g = got[model]
        assert (w["minutes"] < N_MIN and w["met"] < w["minutes"]) or model == "c", w
        assert (g["requests"], g["errors"], g["minutes"], g["met"]) == (
            w["requests"], w["errors"], w["minutes"], w["met"]
        ), (model, w, g)  # fmt: skip
        assert g["burst"] == pytest.approx(w["burst"]), (model, w, g)
    assert want["c"]["met"] == 0
    # the week before's totals: the same, without the details
    brief = fleet.model_weeks(lo, hi, slos, detail=False)
    assert {m: (r["requests"], r["minutes"], r["met"]) for m, r in brief.items()} == {
        m: (r["requests"], r["minutes"], r["met"]) for m, r in want.items()
    }


def test_ttft_attainment_agrees(both: Both) -> None:
    t0, embedded, fleet = both
    lo, hi = t0 + 2 * MIN, t0 + 22 * MIN
    slo = {"ttft": {"c": 100.0}}
    want = embedded.token_slo_weeks(lo, hi, slo)
    assert want and 0 < want[0]["ttft_met"] < want[0]["ttft_minutes"], want
    assert fleet.token_slo_weeks(lo, hi, slo) == want


def test_gpu_hours_tenants_and_cotenancy_agree(both: Both) -> None:
    t0, embedded, fleet = both
    lo, hi = t0 + 2 * MIN, t0 + 22 * MIN
    want = embedded.gpu_weeks(lo, hi, THRESHOLDS)
    got = fleet.gpu_weeks(lo, hi, THRESHOLDS)
    assert [(r["gpu"], r["host"]) for r in got] == [(r["gpu"], r["host"]) for r in want]
    for w, g in zip(want, got, strict=True):
        for k in ("hours_sampled", "sm_h", "dram_h", "pcie_h", "throttled_h", "memory_full_h"):
            assert g[k] == pytest.approx(w[k]), (k, w, g)
        assert (g["models"], g["processes"]) == (list(w["models"]), list(w["processes"]))
        assert g["cotenancy_h"] == pytest.approx(w["cotenancy_h"]), (w, g)
    assert any(w["processes"] == ["train-job"] and w["cotenancy_h"] > 0 for w in want)


def test_the_p99_around_an_action_agrees(both: Both) -> None:
    t0, embedded, fleet = both
    # a window that is not on minutes (an action created mid-minute)
    lo, hi = t0 + 5 * MIN + 17 * S, t0 + 12 * MIN + 17 * S
    want = embedded.p99_estimate("a.b-1", lo, hi)
    assert want is not None
    assert fleet.p99_estimate("a.b-1", lo, hi) == pytest.approx(want)
    assert fleet.p99_estimate("no-such-model", lo, hi) is None


def test_load_waits_agree_and_only_the_store_keeps_each_load(both: Both) -> None:
    t0, embedded, fleet = both
    lo, hi = t0 + 2 * MIN, t0 + 22 * MIN
    want = embedded.load_wait_weeks(lo, hi)
    got = fleet.load_wait_weeks(lo, hi)
    assert [r["model"] for r in want] == [r["model"] for r in got] == ["a.b-1"]
    for k in ("requests", "latency_ms", "wait_ms"):
        assert got[0][k] == pytest.approx(want[0][k]), (k, want, got)
    assert fleet.load_weeks(lo, hi) == []
