"""The whole alerting chain for real: simulator -> OTLP -> cotenant serve -> /metrics ->
Prometheus (the rendered rules) -> Alertmanager -> cotenant's webhook -> stored diagnosis.

A fault-free control scenario streams first and must fire nothing; then a cotenant burst
must fire ModelLatencySLOBreach for the victim, which Alertmanager delivers to the webhook.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from conftest import ROOT, start_serve
from prometheus_api_client import PrometheusConnect
from promserver import wait_until

from .harness import needs_servers, start_alertmanager, start_prometheus_with_rules, stream_scenario

pytestmark = needs_servers

SLO_S = 0.1


def render_rules(tmp: Path) -> list[Path]:
    """`cotenant rules render` with a 2 s `for`, so the test does not wait a minute."""
    cfg = tmp / "rules.toml"
    cfg.write_text("[rules]\nfor_s = 2\n")
    out = tmp / "rules"
    r = subprocess.run(
        [sys.executable, "-m", "cotenant", "rules", "render", "--config", str(cfg),
         "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return sorted(out.glob("*.rules.yml"))


def test_burst_fires_slo_alert_routed_to_webhook_and_control_fires_nothing(
    tmp_path: Path,
) -> None:
    served = start_serve(
        tmp_path,
        tmp_path / "store.duckdb",
        {
            "COTENANT_ANALYSIS_SLO_MS": f"tts={SLO_S * 1000:g}",
            "COTENANT_ANALYSIS_INTERVAL_S": "1",
            "COTENANT_NVML_ENABLED": "false",
            "COTENANT_DASHBOARD_ENABLED": "false",
            "COTENANT_ALERTS_LOOKBACK_S": "60",
            "COTENANT_ALERTS_LOOKAHEAD_S": "30",
        },
    )
    stop = threading.Event()
    streamer: threading.Thread | None = None
    try:
        target = served.api.removeprefix("http://")
        with (
            start_alertmanager(tmp_path / "am", f"{served.api}/api/v1/alerts") as am,
            start_prometheus_with_rules(
                tmp_path / "prom",
                target,
                render_rules(tmp_path),
                alertmanager=am.url.removeprefix("http://"),
            ) as prom,
        ):
            pc = PrometheusConnect(url=prom.url, disable_ssl=True)

            def query(q: str) -> list[dict[str, Any]]:
                result: list[dict[str, Any]] = pc.custom_query(q)
                return result

            # control: tts alone for 8 s at real time
            t_end = time.monotonic() + 8
            stream_scenario(
                served.otlp_http,
                "control-tts-alone",
                start_ns=time.time_ns(),
                speed=1.0,
                stop=lambda: time.monotonic() > t_end,
            )
            p99 = wait_until(
                lambda: query('cotenant:request_latency_seconds:p99_1m{model="tts"}'),
                "the recording rule's tts p99",
                20,
            )
            assert float(p99[0]["value"][1]) < SLO_S
            assert query('cotenant:slo_seconds{model="tts"}')[0]["value"][1] == str(SLO_S)
            assert query("ALERTS") == [], "the fault-free control must fire nothing"

            # fault: sdxl's burst from 5 s on slows tts
            streamer = threading.Thread(
                target=stream_scenario,
                args=(served.otlp_http, "sdxl-burst-slows-tts"),
                kwargs={"start_ns": time.time_ns(), "speed": 1.0, "stop": stop.is_set},
                daemon=True,
            )
            streamer.start()
            slo = wait_until(
                lambda: query('ALERTS{alertstate="firing",alertname="ModelLatencySLOBreach"}'),
                "the SLO alert firing in Prometheus",
                40,
            )
            assert [(m["model"], m["gpu"], m["severity"]) for m in (a["metric"] for a in slo)] == [
                ("tts", "gpu0", "critical")
            ]
            # the analysis loop may also have named the culprit by now; nothing else may fire
            others = [a["metric"] for a in query('ALERTS{alertstate="firing"}')]
            others = [m for m in others if m["alertname"] != "ModelLatencySLOBreach"]
            assert [(m["alertname"], m["victim"], m["culprit"]) for m in others] in (
                [],
                [("NoisyNeighbor", "tts", "sdxl")],
            ), others

            # Alertmanager -> webhook -> diagnosis stored under the alert's fingerprint
            def am_alert() -> dict[str, Any] | None:
                got = httpx.get(f"{am.url}/api/v2/alerts", timeout=5).json()
                return next(
                    (a for a in got if a["labels"]["alertname"] == "ModelLatencySLOBreach"), None
                )

            fp = wait_until(am_alert, "the alert in Alertmanager", 20)["fingerprint"]

            def stored() -> dict[str, Any] | None:
                r = httpx.get(f"{served.api}/api/v1/alerts/{fp}", timeout=5)
                if r.status_code != 200:
                    return None
                row: dict[str, Any] = r.json()
                return row if row["diagnosis_state"] != "pending" else None

            row = wait_until(stored, "the webhook's stored diagnosis", 30)
            assert row["diagnosis_state"] == "done", row["diagnosis"]
            assert (row["model"], row["gpu"], row["status"]) == ("tts", "gpu0", "firing")
            assert row["labels"]["severity"] == "critical"
            assert row["annotations"]["runbook_url"].endswith("#modellatencyslobreach")
            assert max(d["peak_p99_ms"] for d in row["diagnosis"]["diagnoses"]) > SLO_S * 1000
    finally:
        stop.set()
        if streamer is not None:
            streamer.join(30)
        served.stop()
