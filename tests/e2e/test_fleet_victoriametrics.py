"""The fleet path on a second PromQL engine: VictoriaMetrics (Debian's ``victoria-metrics``)
and a real Prometheus scrape the same ``cotenant agent`` every second, and
``PrometheusSource`` — what central serve reads through, unchanged — must read the same
windows, locks, GPU counters and owning agent from both."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fleet_rig import GPU_A, embedded_top_cause, running_fleet, top_cause
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from promserver import (
    needs_prometheus,
    needs_victoria,
    start_prometheus,
    start_victoria,
    wait_until,
)
from spans import MS, SpanFactory

from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange

pytestmark = [needs_prometheus, needs_victoria]


def test_prometheus_source_reads_the_same_fleet_from_victoriametrics(tmp_path: Path) -> None:
    fake = FakeNvml()
    gpu = fake.model.add_gpu()
    fake.model.set_gpu(gpu, sm_util=70, memory_used_bytes=10 << 30, power_w=300, sm_clock_mhz=1500)
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_ENABLED": "false",
            "COTENANT_STORE_PATH": str(tmp_path / "agent.duckdb"),
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.05",
            "COTENANT_NVML_POLL_INTERVAL_S": "0.2",
            "COTENANT_NVML_HOST": "node-a",
            "COTENANT_AGENT_NODE": "node-a",
            "COTENANT_PROCFS_ENABLED": "false",
        }
    )
    svc = Service(cfg, nvml=fake, role="agent")
    runner = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    runner.start()
    assert svc.started.wait(30) and svc.endpoints is not None and svc.endpoints.otlp_http
    target = svc.endpoints.api.removeprefix("http://")
    try:
        with (
            start_prometheus(
                tmp_path / "prom", [target], extra_args=("--enable-feature=exemplar-storage",)
            ) as prom,
            start_victoria(tmp_path / "vm", [target]) as victoria,
        ):
            f = SpanFactory({"service.name": "tts", "host.name": "node-a"})
            exporter = OTLPSpanExporter(endpoint=svc.endpoints.otlp_http, timeout=10)
            rng = np.random.default_rng(1)
            t_start = time.time_ns()
            recorded: set[str] = set()
            for k in range(24):  # 12 s: 40 req/s, slow (x8) in the last 5 s
                slow = k >= 14
                for _ in range(20):
                    lat = float(rng.uniform(15, 25)) * (8 if slow else 1)
                    wait = lat * 0.5 if slow else 0.0
                    phases = (
                        [("lock.wait", 0, wait), ("compute", wait, lat)]
                        if slow
                        else [("compute", 0, lat)]
                    )
                    f.ours("tts", time.time_ns() - int(lat * MS), lat, phases,
                           attrs={"cotenant.gpu": gpu}, lock=("kv", "batcher"))  # fmt: skip
                batch = f.take()
                recorded.update(f"{sp.context.trace_id:032x}" for sp in batch)
                assert exporter.export(batch).name == "SUCCESS"
                time.sleep(0.5)
            exporter.shutdown()
            time.sleep(2.5)  # two more scrapes of the last counts
            window = TimeRange(t_start - t_start % 10**9, time.time_ns() - 10**9)
            # Prometheus scraped the agent's OpenMetrics and kept its exemplars: trace ids
            ex = httpx.get(
                f"{prom.url}/api/v1/query_exemplars",
                params={
                    "query": "cotenant_request_duration_seconds_bucket",
                    "start": t_start / 1e9 - 60,
                    "end": time.time() + 60,
                },
                timeout=10,
            ).json()["data"]
            trace_ids = {e["labels"]["trace_id"] for s in ex for e in s["exemplars"]}
            got = {}
            for name, url in (("prometheus", prom.url), ("victoriametrics", victoria.url)):
                with PrometheusSource(url, scrape_interval_s=1.0) as src:
                    req = src.request_windows(window, 1.0, model="tts")
                    got[name] = {
                        "pairs": src.model_gpus(window),
                        "spans": src.has_spans,
                        "p99": np.nanmax(req.column("p99_ms").to_numpy(zero_copy_only=False)),
                        "rate": float(np.nanmedian(req.column("rate_rps").to_numpy())),
                        "locks": src.lock_waits(window, "tts").to_pylist(),
                        "owners": src.owners(window, "tts", gpu),
                        "gpus": src.gpu_windows(window, 1.0).to_pylist(),
                    }
    finally:
        svc.stop()
        runner.join(60)
    assert trace_ids and trace_ids <= recorded, (len(trace_ids), len(recorded))
    p, v = got["prometheus"], got["victoriametrics"]
    assert p["pairs"] == v["pairs"] == [("tts", gpu)]
    assert p["spans"] is v["spans"] is True
    for g in (p, v):
        assert 120 <= g["p99"] <= 260, got  # the slow seconds: 8 x 15-25 ms
        assert 25 <= g["rate"] <= 55, got  # 40 requests/s
        assert [(x["lock_name"], x["lock_holder"]) for x in g["locks"]] == [("kv", "batcher")]
        assert g["owners"] == [{"node": "node-a", "instance": target}]
        last = g["gpus"][-1]
        assert (last["gpu"], last["host"], last["sm_util"]) == (gpu, "node-a", 70.0)
        assert last["mem_used_bytes"] == pytest.approx(10 << 30)
    assert abs(p["p99"] - v["p99"]) / p["p99"] < 0.25, got
    # lock seconds over the range agree within the engines' rate extrapolations
    pw, vw = p["locks"][0]["wait_ms_sum"], v["locks"][0]["wait_ms_sum"]
    assert abs(pw - vw) / pw < 0.35, got


def test_central_serve_over_victoriametrics_opens_the_incident_and_drills_down(
    tmp_path: Path,
) -> None:
    """The three-node fleet of tests/e2e/test_fleet.py with VictoriaMetrics as the engine:
    the same incident, the same top cause as embedded mode, the same drill-down."""

    def victoria(folder: Path, targets: list[str]) -> Any:
        return start_victoria(folder, targets, scrape_interval_s=1.0)

    with running_fleet(tmp_path, victoria) as fleet:
        api = fleet["central"].api
        expected = embedded_top_cause(fleet["scenarios"]["a"])

        def opened() -> dict[str, Any] | None:
            rows = httpx.get(f"{api}/api/v1/incidents", params={"model": "tts"}, timeout=5)
            return next(
                (i for i in rows.json()["incidents"] if i["state"] == "open" and top_cause(i)),
                None,
            )

        inc = wait_until(opened, "central serve over VictoriaMetrics to open tts's incident", 90)
        assert top_cause(inc) == expected and inc["gpu"] == GPU_A, inc
        drill = httpx.get(f"{api}/api/v1/incidents/{inc['id']}/requests", timeout=10).json()
        assert [a["node"] for a in drill["agents"]] == ["node-a"] and drill["requests"], drill
        assert {q["host"] for q in drill["requests"]} == {"node-a"}
