"""Real engines' spans into a running ``cotenant serve``: every request the client sent has
exactly one row, of the right model, served by the right process, no slower than the client
saw it and with its phases adding up."""

from __future__ import annotations

import json
import secrets
import time

import httpx
import pytest

from tests.conftest import Served
from tests.engines.conftest import RayCluster, TritonServer, rows_for, wait_for

N = 8


def traceparent() -> tuple[str, str]:
    trace = secrets.token_hex(16)
    return trace, f"00-{trace}-{secrets.token_hex(8)}-01"


CLOCK_SLACK_NS = 1_000_000
"""Slack between a Triton parent span's times and its BLS children's (1 ms; 90 us seen)."""


def assert_like_client(row: dict, sent: tuple[int, float], tail_ms: float) -> None:
    """The engine's request is the one the client timed: the row's interval lies within the
    client's (2 ms of slack at the start for the two clocks' reads, ``tail_ms`` at the end: Ray's
    proxy span ends after the client has its answer, 0-3 ms later on idle cores, up to 8 ms
    with both engines busy on 2 cores), and its phases add up to its latency."""
    t0_ns, client_ms = sent
    t1_ns = t0_ns + client_ms * 1e6
    assert row["latency_ms"] > 0
    assert t0_ns - 2e6 <= row["ts_start_ns"] <= row["ts_end_ns"] <= t1_ns + tail_ms * 1e6, (
        (row["ts_start_ns"] - t0_ns) / 1e6,
        row["latency_ms"],
        client_ms,
    )
    phases = [c for c in row if c.endswith("_ms") and c not in ("latency_ms", "ttft_ms")]
    assert sum(row[c] or 0 for c in phases) == pytest.approx(row["latency_ms"])


def test_ray_serve_requests_become_rows_served_by_the_replica(
    ray_cluster: RayCluster, served: Served
) -> None:
    sent: dict[str, tuple[int, float, int]] = {}
    with httpx.Client(timeout=30) as client:
        for i in range(N):
            trace, header = traceparent()
            t0_ns, t0 = time.time_ns(), time.perf_counter()
            r = client.get(
                f"{ray_cluster.http}/mm",
                params={"n": 32 * (i + 1)},
                headers={"traceparent": header},
            )
            ms = (time.perf_counter() - t0) * 1e3
            assert r.status_code == 200, r.text
            sent[trace] = (t0_ns, ms, r.json()["pid"])
    rows = rows_for(served, "mm/MatMul", set(sent))
    assert len(rows) == N
    for trace, (t0_ns, client_ms, pid) in sent.items():
        row = rows[trace]
        assert_like_client(row, (t0_ns, client_ms), tail_ms=15.0)
        assert row["pid"] == pid, row  # the replica's, from the process resource detector
        assert row["replica"]
        assert row["compute_ms"] > 0


def test_triton_inferences_become_rows_with_queue_and_compute(
    triton: TritonServer, served: Served
) -> None:
    sent: dict[str, tuple[int, float]] = {}
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 256], "datatype": "FP32", "data": [1.0] * 512}]}
    )
    with httpx.Client(timeout=30) as client:
        for _ in range(N):
            trace, header = traceparent()
            t0_ns, t0 = time.time_ns(), time.perf_counter()
            r = client.post(
                f"{triton.url}/v2/models/matmul/infer",
                content=body,
                headers={"traceparent": header, "Content-Type": "application/json"},
            )
            sent[trace] = (t0_ns, (time.perf_counter() - t0) * 1e3)
            assert r.status_code == 200, r.text
    rows = rows_for(served, "matmul", set(sent))
    assert len(rows) == N
    for trace, t0_and_ms in sent.items():
        row = rows[trace]
        assert_like_client(row, t0_and_ms, tail_ms=2.0)
        assert row["queue_ms"] > 0
        assert row["compute_ms"] > 0


def test_a_triton_ensemble_gives_a_row_per_step_and_one_for_itself(
    triton: TritonServer, served: Served
) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [1.0] * 256}]}
    traces: dict[str, tuple[int, float]] = {}
    with httpx.Client(timeout=30) as client:
        for _ in range(3):
            trace, header = traceparent()
            t0_ns, t0 = time.time_ns(), time.perf_counter()
            r = client.post(
                f"{triton.url}/v2/models/pipeline/infer", json=body, headers={"traceparent": header}
            )
            traces[trace] = (t0_ns, (time.perf_counter() - t0) * 1e3)
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["name"] == "z"
    ensembles = rows_for(served, "pipeline", set(traces))
    steps = {m: rows_for(served, m, set(traces)) for m in ("double",)}
    for trace, sent in traces.items():
        assert_like_client(ensembles[trace], sent, tail_ms=2.0)
        assert ensembles[trace]["compute_ms"] > 0  # its steps' compute, not all "other"
        step = steps["double"][trace]
        assert ensembles[trace]["ts_start_ns"] <= step["ts_start_ns"]
        assert step["ts_end_ns"] <= ensembles[trace]["ts_end_ns"] + 1_000_000
        assert step["compute_ms"] > 0


def test_a_triton_bls_model_gives_a_row_per_child_request_and_one_for_itself(
    triton: TritonServer, served: Served
) -> None:
    """``bls_pipeline`` sends ``matmul`` then ``double`` from its ``execute``; the requests
    with ``trace=request.trace()`` (the default of the app) give a row per child, the last one
    sends them untraced (``"bls_trace": false``) and gives the BLS model's row alone."""
    body = {"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [1.0] * 256}]}
    traced: dict[str, tuple[int, float]] = {}
    with httpx.Client(timeout=30) as client:

        def infer(extra: dict, header: str) -> tuple[int, float]:
            t0_ns, t0 = time.time_ns(), time.perf_counter()
            r = client.post(
                f"{triton.url}/v2/models/bls_pipeline/infer",
                json={**body, **extra},
                headers={"traceparent": header},
            )
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["name"] == "z"
            return t0_ns, (time.perf_counter() - t0) * 1e3

        untraced, header = traceparent()
        alone = infer({"parameters": {"bls_trace": False}}, header)
        for _ in range(3):
            trace, header = traceparent()
            traced[trace] = infer({}, header)
    bls = rows_for(served, "bls_pipeline", {*traced, untraced})
    kids = {m: rows_for(served, m, set(traced)) for m in ("matmul", "double")}
    for trace, sent in traced.items():
        row = bls[trace]
        assert_like_client(row, sent, tail_ms=2.0)
        mm, dbl = kids["matmul"][trace], kids["double"][trace]
        # one after the other, inside the BLS model's request, each with its own compute (to
        # CLOCK_SLACK_NS between a parent's span and its children's: Triton turns each trace's
        # steady-clock times into wall-clock times on its own, and with both cores busy a child
        # was seen to start 90 us before its parent, 1 run in 3)
        slack = CLOCK_SLACK_NS
        assert row["ts_start_ns"] - slack <= mm["ts_start_ns"] <= mm["ts_end_ns"]
        assert mm["ts_end_ns"] - slack <= dbl["ts_start_ns"] <= dbl["ts_end_ns"]
        assert dbl["ts_end_ns"] <= row["ts_end_ns"] + slack
        assert mm["compute_ms"] > 0 and dbl["compute_ms"] > 0
        # the children's compute is in the BLS row once, beside its script's own (not other)
        assert row["compute_ms"] > mm["compute_ms"] + dbl["compute_ms"]
        assert row["queue_ms"] >= mm["queue_ms"] + dbl["queue_ms"]
        busy = sum(row[c] for c in ("queue_ms", "h2d_ms", "compute_ms", "d2h_ms"))
        assert busy <= row["latency_ms"] * (1 + 1e-9)
    assert_like_client(bls[untraced], alone, tail_ms=2.0)
    # the untraced request's children sent nothing: its trace has the BLS row alone
    every = httpx.get(f"{served.api}/api/v1/requests", params={"limit": 10000}, timeout=10)
    assert [r["model"] for r in every.json()["requests"] if r["trace_id"] == untraced] == [
        "bls_pipeline"
    ]

    def settled() -> bool | None:
        page = httpx.get(f"{served.api}/metrics", timeout=10).text
        pending = [ln for ln in page.splitlines() if ln.startswith("cotenant_otlp_pending_child")]
        return True if pending and float(pending[0].split()[-1]) == 0 else None

    wait_for("no child span left pending", settled, 30.0)
