"""The gateway's /metrics and its spans, received by a real ``cotenant serve``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, start_serve
from tests.gateway.conftest import (
    TOKEN,
    ModelServer,
    RunningGateway,
    auth,
    free_port,
    wait_until,
)

Start = Callable[..., RunningGateway]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_count_requests_rejections_and_queue_wait(start_gateway: Start) -> None:
    gw = start_gateway()
    httpx.put(
        f"{gw.control}/control/v1/limits/llama", json={"rate_rps": 0.1, "burst": 2}, headers=auth()
    )
    codes = [
        httpx.post(f"{gw.url}/v1/completions", json={"model": "llama"}).status_code
        for _ in range(5)
    ]
    assert codes == [200, 200, 429, 429, 429]
    httpx.post(f"{gw.url}/v1/completions", content=b"{bad")
    r = httpx.get(f"{gw.control}/metrics")  # no token: Prometheus scrapes it
    assert r.status_code == 200
    m = _samples(r.text)
    assert m[("cotenant_gateway_requests_total", (("code", "200"), ("model", "llama")))] == 2
    assert m[("cotenant_gateway_requests_total", (("code", "429"), ("model", "llama")))] == 3
    key = (
        "cotenant_gateway_rejections_total",
        (("model", "llama"), ("reason", "rate_limit_model")),
    )
    assert m[key] == 3
    assert (
        m[("cotenant_gateway_rejections_total", (("model", "unknown"), ("reason", "bad_request")))]
        == 1
    )
    assert m[("cotenant_gateway_queue_wait_seconds_count", (("model", "llama"),))] == 5
    assert m[("cotenant_gateway_in_flight", ())] == 0
    assert m[("cotenant_gateway_queued", ())] == 0
    (replica,) = state_replicas = httpx.get(
        f"{gw.control}/control/v1/state", headers=auth()
    ).json()["replicas"]
    assert state_replicas[replica]["sent_total"] == 2
    assert m[("cotenant_gateway_replica_requests_total", (("replica", replica),))] == 2
    assert m[("cotenant_gateway_replica_up", (("replica", replica),))] == 1
    assert m[("cotenant_gateway_replica_in_flight", (("replica", replica),))] == 0
    assert m[("cotenant_gateway_route_weight", (("replica", replica), ("route", "*")))] == 1


@pytest.mark.parametrize("exporter", ["builtin", "sdk"])
def test_spans_with_queue_time_reach_cotenant(
    model_server: ModelServer, tmp_path: Path, exporter: str
) -> None:
    """``cotenant gateway --otlp-endpoint`` (a real subprocess; its own pre-encoded OTLP, or
    the real OTel SDK) in front of the model server, its spans received by a real
    ``cotenant serve``."""
    model_server.reset()
    served = start_serve(tmp_path, tmp_path / "store.duckdb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cotenant", "gateway", "--upstream", model_server.url,
         "--listen", f"127.0.0.1:{free_port()}", "--control", f"127.0.0.1:{free_port()}",
         "--otlp-endpoint", served.otlp_http, "--max-concurrency", "1",
         "--otlp-exporter", exporter],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "COTENANT_GATEWAY_TOKEN": TOKEN},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening proxy="), line
        urls = dict(part.split("=", 1) for part in line.split()[1:])
        httpx.put(
            f"{urls['control']}/control/v1/priority/gw-victim",
            json={"priority": 1},
            headers=auth(),
        )
        threads = [
            threading.Thread(
                target=httpx.post,
                args=(f"{urls['proxy']}/v1/completions",),
                kwargs={
                    "json": {"model": "gw-victim", "hold": True},
                    "headers": {"X-Tenant": "acme"},
                    "timeout": 20,
                },
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()

        def queued() -> int:
            st = httpx.get(f"{urls['control']}/control/v1/state", headers=auth()).json()
            return int(st["models"].get("gw-victim", {}).get("queued", 0))

        wait_until(lambda: queued() == 2, what="two requests queued")
        time.sleep(0.2)  # let the queued requests accumulate measurable queue time
        model_server.hold.set()
        for t in threads:
            t.join(20)
        proc.send_signal(signal.SIGTERM)  # shutdown flushes the spans still batched
        assert proc.wait(30) == 0

        def rows() -> list[dict[str, object]]:
            r = httpx.get(f"{served.api}/api/v1/requests", params={"model": "gw-victim"}, timeout=5)
            return list(r.json()["requests"]) if r.status_code == 200 else []

        wait_until(lambda: len(rows()) == 3, timeout=30, what="requests in cotenant")
        got = rows()
        queue_ms = sorted(float(row["queue_ms"]) for row in got)  # type: ignore[arg-type]
        assert queue_ms[0] < 50 and queue_ms[-1] >= 150, queue_ms
        assert {row["priority"] for row in got} == {1}
        assert {row["status"] for row in got} == {"ok"}
        assert {row["tenant"] for row in got} == {"acme"}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        served.stop()
