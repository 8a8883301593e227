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
from tests.engines.conftest import RayCluster, TritonServer, rows_for

N = 8


def traceparent() -> tuple[str, str]:
    trace = secrets.token_hex(16)
    return trace, f"00-{trace}-{secrets.token_hex(8)}-01"


def assert_like_client(row: dict, client_ms: float) -> None:
    """The engine's latency is the client's, within the HTTP overhead on either side (Ray's
    proxy span ends a millisecond or more after the client has its answer: measured 0-3 ms on
    2 busy cores), and the phases add up to it."""
    assert abs(row["latency_ms"] - client_ms) <= max(5.0, 0.5 * client_ms), (
        row["latency_ms"],
        client_ms,
    )
    phases = [c for c in row if c.endswith("_ms") and c not in ("latency_ms", "ttft_ms")]
    assert sum(row[c] or 0 for c in phases) == pytest.approx(row["latency_ms"])


def test_ray_serve_requests_become_rows_served_by_the_replica(
    ray_cluster: RayCluster, served: Served
) -> None:
    sent: dict[str, tuple[float, int]] = {}
    with httpx.Client(timeout=30) as client:
        for i in range(N):
            trace, header = traceparent()
            t0 = time.perf_counter()
            r = client.get(
                f"{ray_cluster.http}/mm",
                params={"n": 32 * (i + 1)},
                headers={"traceparent": header},
            )
            ms = (time.perf_counter() - t0) * 1e3
            assert r.status_code == 200, r.text
            sent[trace] = (ms, r.json()["pid"])
    rows = rows_for(served, "mm/MatMul", set(sent))
    assert len(rows) == N
    for trace, (client_ms, pid) in sent.items():
        row = rows[trace]
        assert_like_client(row, client_ms)
        assert row["pid"] == pid, row  # the replica's, from the process resource detector
        assert row["replica"]
        assert row["compute_ms"] > 0


def test_triton_inferences_become_rows_with_queue_and_compute(
    triton: TritonServer, served: Served
) -> None:
    sent: dict[str, float] = {}
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [2, 256], "datatype": "FP32", "data": [1.0] * 512}]}
    )
    with httpx.Client(timeout=30) as client:
        for _ in range(N):
            trace, header = traceparent()
            t0 = time.perf_counter()
            r = client.post(
                f"{triton.url}/v2/models/matmul/infer",
                content=body,
                headers={"traceparent": header, "Content-Type": "application/json"},
            )
            sent[trace] = (time.perf_counter() - t0) * 1e3
            assert r.status_code == 200, r.text
    rows = rows_for(served, "matmul", set(sent))
    assert len(rows) == N
    for trace, client_ms in sent.items():
        row = rows[trace]
        assert_like_client(row, client_ms)
        assert row["queue_ms"] > 0
        assert row["compute_ms"] > 0
