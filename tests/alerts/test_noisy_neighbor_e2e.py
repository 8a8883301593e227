"""NoisyNeighbor for real: ``cotenant demo`` (the whole service, spans over OTLP and GPU
counters through a FakeNvml that the real NVML collector polls) runs a co-tenant burst;
Prometheus scrapes it with the rendered rules until NoisyNeighbor fires naming the victim and
the culprit."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import ROOT
from prometheus_api_client import PrometheusConnect
from promserver import wait_until

from .harness import SCENARIOS, needs_servers, start_prometheus_with_rules
from .test_prometheus_e2e import render_rules

pytestmark = needs_servers


def test_cotenant_burst_fires_noisy_neighbor_naming_victim_and_culprit(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    env = {
        **os.environ,
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_PORT": "0",
        "COTENANT_OTLP_GRPC_PORT": "0",
        "COTENANT_DASHBOARD_ENABLED": "false",
        # 20 s of baseline: the detector judges tts after 15 windows with requests (a test
        # of the alert's wiring, not of how long a warm-up should be)
        "COTENANT_ANALYSIS_WARMUP_WINDOWS": "15",
    }
    with log.open("w") as out:
        demo = subprocess.Popen(
            [sys.executable, "-m", "cotenant", "demo", "--speed", "1.5",
             "--scenario", str(SCENARIOS / "sdxl-burst-noisy-neighbor.yaml"),
             "--store", str(tmp_path / "demo.duckdb")],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
        )  # fmt: skip
    try:

        def api() -> str | None:
            if demo.poll() is not None:
                raise AssertionError(f"cotenant demo exited: {log.read_text()}")
            m = re.search(r"^listening api=http://(\S+)", log.read_text(), re.M)
            return None if m is None else m.group(1)

        target = wait_until(api, "cotenant demo to listen", 60)
        with start_prometheus_with_rules(tmp_path / "prom", target, render_rules(tmp_path)) as prom:
            pc = PrometheusConnect(url=prom.url, disable_ssl=True)

            def firing() -> list[dict[str, Any]]:
                got: list[dict[str, Any]] = pc.custom_query(
                    'ALERTS{alertname="NoisyNeighbor",alertstate="firing"}'
                )
                return got

            try:
                alerts = wait_until(firing, "NoisyNeighbor to fire", 60)
            except AssertionError as exc:
                seen = pc.custom_query("cotenant_incident_active")
                raise AssertionError(
                    f"{exc}; incident series seen: {seen}; demo log:\n{log.read_text()}"
                ) from exc
            m = alerts[0]["metric"]
            assert (m["victim"], m["culprit"], m["gpu"], m["severity"]) == (
                "tts", "sdxl", "GPU-gpu0", "warning",
            )  # fmt: skip
            assert len(alerts) == 1
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(30)
            except subprocess.TimeoutExpired:
                demo.kill()
                demo.wait(30)
