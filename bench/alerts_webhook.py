"""Alertmanager webhook: how fast ``POST /api/v1/alerts`` answers, next to how long the
diagnosis it starts takes.

Run ``.venv/bin/python bench/alerts_webhook.py`` (``--help`` for sizes). A real ``cotenant
serve`` (subprocess, NVML off, dashboard off) is fed a bundled scenario streamed as fast as
possible, as if it had run in the last ``duration + 20`` s; then, over real HTTP:

* **diagnosis** — ``--alerts`` new alerts one at a time, each waited for: POST answer time and
  the time from POST until ``GET /api/v1/alerts/{fp}`` shows the diagnosis done;
* **repeat** — the same alert delivered again (Alertmanager's repeat notifications);
* **under load** — ``--alerts`` new alerts posted back to back, while their diagnoses queue up
  behind each other in the background worker.

Medians (and the 90th percentile of the answers) in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import httpx  # noqa: E402
from conftest import start_serve  # noqa: E402

from cotenant.simulator.scenario_load import find_scenario, load_scenario  # noqa: E402
from cotenant.simulator.stream import stream  # noqa: E402


def call(api: str, method: str, path: str, content: bytes = b"") -> tuple[int, dict[str, Any]]:
    """One HTTP request as one write on a TCP_NODELAY socket, as Go's HTTP client (so
    Alertmanager) sends it. httpx's separate header and body writes meet the server's delayed
    ACK and add ~40 ms to every call on Linux loopback (GET /healthz included), which would
    measure the client, not the receiver."""
    host, port = api.removeprefix("http://").rsplit(":", 1)
    req = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(content)}\r\nConnection: close\r\n\r\n"
    ).encode() + content
    with socket.create_connection((host, int(port))) as so:
        so.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        so.sendall(req)
        data = b""
        while chunk := so.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def body(fp: str, starts_ns: int) -> bytes:
    secs, frac = divmod(starts_ns, 1_000_000_000)
    starts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"
    alert = {
        "status": "firing",
        "labels": {"alertname": "ModelLatencySLOBreach", "model": "tts", "gpu": "gpu0"},
        "annotations": {},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "",
        "fingerprint": fp,
    }
    return json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="cotenant-burst-sdxl-slows-tts-timeslice")
    ap.add_argument("--alerts", type=int, default=20, help="alerts per measurement")
    ap.add_argument("--alert-at", type=float, default=250.0, help="startsAt, scenario seconds")
    args = ap.parse_args()
    scenario = load_scenario(find_scenario(args.scenario))
    with tempfile.TemporaryDirectory() as tmp:
        served = start_serve(
            Path(tmp),
            Path(tmp) / "store.duckdb",
            {
                "COTENANT_NVML_ENABLED": "false",
                "COTENANT_DASHBOARD_ENABLED": "false",
                "COTENANT_ANALYSIS_ENABLED": "false",
                "COTENANT_ANALYSIS_SLO_MS": "tts=100",
            },
        )
        try:
            start_ns = time.time_ns() - int((scenario.duration_s + 20) * 1e9)
            stats = stream(scenario, served.otlp_http, speed=None, start_ns=start_ns)
            print(f"{scenario.name}: {stats.requests} requests streamed in {stats.wall_s:.1f} s")
            starts = start_ns + int(args.alert_at * 1e9)
            url = f"{served.api}/api/v1/alerts"
            with httpx.Client(timeout=60) as c:
                # wait until the writer has stored every row the stream sent
                while "cotenant_store_queue_rows 0.0" not in c.get(f"{served.api}/metrics").text:
                    time.sleep(0.05)
                answer, done = [], []
                for i in range(-3, args.alerts):  # the first 3: untimed warm-up
                    fp = f"a{i:04x}" if i >= 0 else f"w{-i}"
                    t0 = time.perf_counter()
                    code, _ = call(served.api, "POST", "/api/v1/alerts", body(fp, starts))
                    answer.append(time.perf_counter() - t0)
                    assert code == 202
                    while (
                        call(served.api, "GET", f"/api/v1/alerts/{fp}")[1]["diagnosis_state"]
                        == "pending"
                    ):
                        time.sleep(0.002)
                    done.append(time.perf_counter() - t0)
                    state = c.get(f"{url}/{fp}").json()["diagnosis_state"]
                    assert state == "done", state
                answer, done = answer[3:], done[3:]
                repeat = []
                for _ in range(args.alerts):
                    t0 = time.perf_counter()
                    code, got = call(served.api, "POST", "/api/v1/alerts", body("a0000", starts))
                    repeat.append(time.perf_counter() - t0)
                    assert code == 202 and got["diagnosing"] == []
                loaded = []
                for i in range(args.alerts):
                    t0 = time.perf_counter()
                    code, _ = call(served.api, "POST", "/api/v1/alerts", body(f"b{i:04x}", starts))
                    loaded.append(time.perf_counter() - t0)
                    assert code == 202
        finally:
            served.stop()

    def ms(xs: list[float]) -> str:
        q = statistics.quantiles(xs, n=10)[-1] if len(xs) > 1 else xs[0]
        return f"median {statistics.median(xs) * 1e3:7.1f} ms, p90 {q * 1e3:7.1f} ms"

    print(f"cores: {os.cpu_count()}; {args.alerts} alerts per row")
    print(f"POST answer, worker idle      {ms(answer)}")
    print(f"POST -> diagnosis done        {ms(done)}")
    print(f"POST answer, repeat delivery  {ms(repeat)}")
    print(f"POST answer, worker busy      {ms(loaded)}")
    print(
        f"diagnosis / answer (medians)  {statistics.median(done) / statistics.median(answer):.0f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
