"""Fleet mode end to end, with real parts on loopback: three ``cotenant agent`` processes, each
fed one node's part of a multi-node scenario by ``cotenant simulate --otlp`` (spans, and the
simulated GPU through ``--nvml-feed`` / ``--fake-nvml``, which each agent's real NVML collector
polls), scraped every second by a real Prometheus; a central ``cotenant serve`` pointed at that
Prometheus.

It must open the incident of node A's victim and name the same top cause as embedded mode on
the same scenario, back it with the culprit's per-process SM utilisation read through
Prometheus, show every node's GPU and processes, list the victim's slowest requests fetched
from node A's agent, keep its
diagnosis (with a "node unreachable" note) when that agent is gone, and keep running through a
Prometheus outage, saying so, and recover when Prometheus returns.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_rig import (
    GPU_A,
    Proc,
    dash_callback,
    dash_response,
    embedded_top_cause,
    incident_page,
    running_fleet,
    table_rows,
    top_cause,
)
from promserver import PROMETHEUS, needs_prometheus, start_prometheus, wait_until

pytestmark = needs_prometheus


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[dict[str, Any]]:
    def prometheus(folder: Path, targets: list[str]) -> Any:
        return start_prometheus(folder, targets, scrape_interval_s=1.0)

    with running_fleet(tmp_path, prometheus) as f:
        yield f


def test_central_serve_over_prometheus_diagnoses_drills_down_and_survives_outages(
    fleet: dict[str, Any],
) -> None:
    central: Proc = fleet["central"]
    api = central.api
    expected = embedded_top_cause(fleet["scenarios"]["a"])
    assert expected == ("cotenant", "sdxl")

    def opened() -> dict[str, Any] | None:
        rows = httpx.get(f"{api}/api/v1/incidents", params={"model": "tts"}, timeout=5).json()
        for inc in rows["incidents"]:
            if inc["state"] == "open" and top_cause(inc):
                return dict(inc)
        return None

    inc = wait_until(opened, "central serve to open tts's incident", timeout_s=90)
    assert top_cause(inc) == expected, inc
    assert inc["gpu"] == GPU_A
    # the culprit's evidence is its NVML per-process SM utilisation, through Prometheus: it
    # rose from near idle, and agrees with what node A's agent published
    ev = inc["causes"][0]["evidence"]
    assert (ev["series"], ev["unit"]) == ("sdxl SM utilisation", "%"), inc
    prom_url = fleet["prom"].url
    sdxl = f'cotenant_gpu_process_sm_utilization_ratio{{host="node-a",gpu="{GPU_A}",pid="1001"}}'
    peak = _query(prom_url, f"max(max_over_time({sdxl}[5m]))")
    assert len(peak) == 1, peak
    top_pct = float(peak[0]["value"][1]) * 100
    assert ev["before"] < 10.0 and 20.0 < ev["during"] <= top_pct + 1, (ev, top_pct)
    # every node's simulated GPU, under the DCGM exporter's names
    dcgm = _query(prom_url, "DCGM_FI_DEV_GPU_UTIL")
    assert {(r["metric"]["hostname"], r["metric"]["UUID"]) for r in dcgm} == {
        ("node-a", GPU_A), ("node-b", "GPU-gpu-b0"), ("node-c", "GPU-gpu-c0"),
    }, dcgm  # fmt: skip
    # the quiet nodes raised nothing
    every = httpx.get(f"{api}/api/v1/incidents", timeout=5).json()["incidents"]
    assert {i["model"] for i in every} == {"tts"}, every
    # the overview's tiles show every node's models, read through Prometheus
    tiles = dash_callback(
        api,
        "ov-models.children...ov-gpus.children...ov-range-label.children",
        [
            {"id": "ov-params", "property": "data", "value": {"range": "15m"}},
            {"id": "shell-tick", "property": "n_intervals", "value": None},
        ],
    )
    assert all(m in tiles for m in ("tts", "sdxl", "chat", "embed", "ocr")), tiles[:2000]
    assert "no spans received yet" not in tiles
    # the GPUs page: who shares each GPU, from the agents' per-process series
    gpus = dash_response(
        api,
        "gpu-heatmaps.children...gpu-sharing.children",
        [
            {"id": "gpu-params", "property": "data", "value": {"range": "15m"}},
            {"id": "shell-tick", "property": "n_intervals", "value": None},
        ],
    )
    assert "no GPU counters" not in str(gpus), str(gpus)[:2000]
    who = {(r[0], r[2]): r for r in table_rows(gpus, "gpu-who")}  # (GPU, pid) -> row
    assert who[(GPU_A, "1000")][1:4] == ["tts", "1000", "model tts"], who
    for gpu, pid in ((GPU_A, "1001"), ("GPU-gpu-b0", "1000"), ("GPU-gpu-c0", "1000")):
        assert who[(gpu, pid)][4].endswith("%"), who  # its mean SM utilisation

    # drill-down: the victim's slowest requests, from node A's agent
    r = httpx.get(f"{api}/api/v1/incidents/{inc['id']}/requests", params={"limit": 5}, timeout=10)
    assert r.status_code == 200, r.text
    drill = r.json()
    assert [a["node"] for a in drill["agents"]] == ["node-a"] and drill["note"] is None, drill
    assert drill["agents"][0]["url"] == fleet["agents"]["a"].api
    reqs = drill["requests"]
    assert 1 <= len(reqs) <= 5
    assert {(q["model"], q["host"], q["gpu"]) for q in reqs} == {("tts", "node-a", GPU_A)}
    lat = [q["latency_ms"] for q in reqs]
    assert lat == sorted(lat, reverse=True) and lat[0] > 100.0  # over the SLO: the slow ones
    bad = httpx.get(f"{api}/api/v1/incidents/{inc['id']}/requests", params={"limit": 0})
    assert bad.status_code == 400 and "limit" in bad.json()["error"]
    page = incident_page(api, inc["id"])
    assert "Slowest requests — from node-a" in page and reqs[0]["trace_id"] in page

    # node A's agent goes away: the diagnosis stands, the drill-down says why it is empty
    fleet["agents"]["a"].stop()
    drill = httpx.get(f"{api}/api/v1/incidents/{inc['id']}/requests", timeout=10).json()
    assert drill["requests"] == [] and "node node-a unreachable" in drill["note"], drill
    assert drill["agents"][0]["reachable"] is False
    page = incident_page(api, inc["id"])
    assert "node node-a unreachable" in page and "Top cause: cotenant — sdxl" in page
    again = httpx.get(f"{api}/api/v1/incidents/{inc['id']}", timeout=5).json()
    assert top_cause(again) == expected

    # Prometheus goes away: serve keeps answering, says so, and recovers when it returns
    prom = fleet["prom"]
    status = httpx.get(f"{api}/api/v1/status", timeout=5).json()
    assert status["prometheus"]["up"] is True, status
    port = prom.url.rsplit(":", 1)[1]
    data_dir = next(p for p in (fleet["tmp"] / "prom").iterdir() if p.name.startswith("data-"))
    prom.proc.terminate()
    prom.proc.wait(30)

    def down() -> dict[str, Any] | None:
        # a Prometheus shutting down may first answer 503 before its port closes: the status
        # keeps the latest error, which must come to say the server cannot be reached
        s = httpx.get(f"{api}/api/v1/status", timeout=5).json()["prometheus"]
        return s if not s["up"] and "cannot be reached" in (s["error"] or "") else None

    s = wait_until(down, "serve to notice that Prometheus is down")
    assert s["down_since_ns"] is not None
    assert httpx.get(f"{api}/healthz", timeout=5).status_code == 200
    logf = (fleet["tmp"] / "prom" / "restart.log").open("wb")
    again_prom = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={fleet['tmp'] / 'prom' / 'prometheus.yml'}",
            f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=logf,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(
            lambda: httpx.get(f"{api}/api/v1/status", timeout=5).json()["prometheus"]["up"],
            "serve to see Prometheus again",
        )
        log = central.log.read_text()
        assert log.count("is down") == 1 and log.count("answers again") == 1, log[-3000:]
    finally:
        again_prom.terminate()
        again_prom.wait(30)
        logf.close()


def _query(prom_url: str, promql: str) -> list[dict[str, Any]]:
    """An instant PromQL query's result vector."""
    r = httpx.get(f"{prom_url}/api/v1/query", params={"query": promql}, timeout=10)
    assert r.status_code == 200, r.text
    return list(r.json()["data"]["result"])
