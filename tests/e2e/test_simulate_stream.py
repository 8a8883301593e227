"""Simulator -> real OTLP exporter -> running cotenant serve -> store: nothing lost or bent."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from conftest import Served
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from cotenant.simulator.output import run
from cotenant.simulator.scenario import (
    GPU_TYPES,
    Arrival,
    Batching,
    Gpu,
    Kernel,
    Lock,
    Model,
    Scenario,
    Transfer,
)
from cotenant.simulator.stream import stream_to


def small() -> Scenario:
    return Scenario(
        name="stream-small",
        seed=5,
        duration_s=20.0,
        gpus=(Gpu("gpu0", GPU_TYPES["l4"], "timeslice"),),
        models=(
            Model(
                "tts",
                "gpu0",
                Arrival("poisson", rate_rps=40),
                Kernel(4, 1, 0.3, 0.2, 0.5),
                Batching(4, 3),
                preprocess_ms=1,
                locks=(Lock("tok", 0.3),),
                transfer=Transfer(0.5, 0.5),
            ),
            Model("sdxl", "gpu0", Arrival("poisson", rate_rps=2), Kernel(60, 10, 0.9, 0.5, 0.4)),
        ),
    )


def test_streamed_scenario_lands_complete_and_faithful(serve: Served) -> None:
    s = small()
    start_ns = time.time_ns() - 60_000_000_000
    stats = stream_to(s, OTLPSpanExporter(endpoint=serve.otlp_http), speed=None, start_ns=start_ns)
    expected = run(s, start_ns=start_ns).requests
    assert stats.requests == expected.num_rows
    deadline = time.monotonic() + 30
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = httpx.get(f"{serve.api}/api/v1/requests", params={"limit": 100000}).json()[
            "requests"
        ]
        if len(rows) >= expected.num_rows:
            break
        time.sleep(0.1)
    assert len(rows) == expected.num_rows
    got = {m: [r for r in rows if r["model"] == m] for m in ("tts", "sdxl")}
    exp_models = np.asarray(expected.column("model").to_pylist())
    for m, rs in got.items():
        sel = exp_models == m
        assert len(rs) == int(sel.sum())
        for col in ("latency_ms", "queue_ms", "compute_ms", "lock_wait_ms", "h2d_ms"):
            want = float(np.mean(expected.column(col).to_numpy()[sel]))
            assert np.mean([r[col] for r in rs]) == pytest.approx(want, rel=1e-3, abs=1e-3), col
        assert all(r["gpu"] == "gpu0" and r["source"] == "ours" for r in rs)
        assert all(r["pid"] is not None and r["host"] == "sim-node" for r in rs)
