"""Two real engines on this machine's CPUs: Triton's ``matmul`` under a steady load (the victim),
then Ray Serve's ``burst/Burner`` burning both cores (the culprit). ``cotenant serve`` sees only
what the engines emit (their spans) and procfs, and must open an incident on ``matmul`` naming
the burner (as the host CPU it takes, or as a co-tenant).

The client-side figures (victim p50 / p99 before and during the burst) and what serve opened go
to tests/artifacts/engines/contention.json (docs/performance.md quotes them).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import Served
from tests.engines.conftest import RayCluster, TritonServer, wait_for
from tests.engines.recording import RECORDINGS

VICTIM_PERIOD_S = 0.05  # 20 requests/s
CALM_S = 200.0  # the live loop judges a new series after its warm-up (3 min of baseline_s)
BURST_CLIENTS = 4
BURST_MS = 300


class Victim(threading.Thread):
    """Sends one ``matmul`` inference every ``VICTIM_PERIOD_S``; keeps (start, latency ms)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.seen: list[tuple[float, float]] = []
        self.body = json.dumps(
            {"inputs": [{"name": "x", "shape": [8, 256], "datatype": "FP32", "data": [1.0] * 2048}]}
        )

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            nxt = time.monotonic()
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    r = client.post(
                        f"{self.url}/v2/models/matmul/infer",
                        content=self.body,
                        headers={"Content-Type": "application/json"},
                    )
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code == 200:
                    self.seen.append((t0, (time.monotonic() - t0) * 1e3))
                nxt += VICTIM_PERIOD_S
                self.stop.wait(max(0.0, nxt - time.monotonic()))

    def figures(self, since: float, until: float) -> dict[str, float]:
        ms = np.array([m for t, m in self.seen if since <= t < until])
        return {
            "requests": int(ms.size),
            "p50_ms": round(float(np.percentile(ms, 50)), 2) if ms.size else -1.0,
            "p99_ms": round(float(np.percentile(ms, 99)), 2) if ms.size else -1.0,
        }


def burst(url: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            try:
                client.get(f"{url}/burst", params={"ms": BURST_MS})
            except httpx.HTTPError:
                stop.wait(0.5)


def top(incident: dict[str, Any]) -> tuple[str | None, str | None]:
    """An incident's top cause: (kind, culprit); (None, None) while it has none."""
    causes = incident.get("causes") or []
    return (causes[0]["kind"], causes[0]["culprit"]) if causes else (None, None)


def rows_figures(served: Served, since_ns: int, until_ns: int) -> dict[str, Any]:
    """What serve stored for the victim between two instants: count, p50 / p99 latency and the
    mean of each phase that is not zero (ms)."""
    r = httpx.get(
        f"{served.api}/api/v1/requests",
        params={
            "model": "matmul",
            "since": str(since_ns / 1e9),
            "until": str(until_ns / 1e9),
            "limit": 100000,
        },
        timeout=60,
    )
    rows = r.json()["requests"]
    lat = np.array([x["latency_ms"] for x in rows])
    out: dict[str, Any] = {"rows": len(rows)}
    if rows:
        out["p50_ms"] = round(float(np.percentile(lat, 50)), 2)
        out["p99_ms"] = round(float(np.percentile(lat, 99)), 2)
        for c in ("queue_ms", "h2d_ms", "compute_ms", "d2h_ms", "other_ms"):
            m = float(np.mean([x[c] or 0.0 for x in rows]))
            if m:
                out[f"mean_{c}"] = round(m, 3)
    return out


@pytest.mark.timeout(480)
def test_a_burst_on_ray_opens_an_incident_on_triton_naming_the_burner(
    served: Served, triton: TritonServer, ray_cluster: RayCluster
) -> None:
    victim = Victim(triton.url)
    victim.start()
    t_start = time.monotonic()
    time.sleep(CALM_S)  # the victim's calm history: a load phase, not a wait for a server
    t_burst = time.monotonic()
    burst_since_ns = time.time_ns()
    stop = threading.Event()
    burners = [
        threading.Thread(target=burst, args=(ray_cluster.http, stop), daemon=True)
        for _ in range(BURST_CLIENTS)
    ]
    for b in burners:
        b.start()

    def incidents_now() -> list[dict[str, Any]]:
        r = httpx.get(
            f"{served.api}/api/v1/incidents",
            params={"model": "matmul", "since": str(burst_since_ns / 1e9)},
            timeout=30,
        )
        found: list[dict[str, Any]] = r.json()["incidents"]
        return found

    def opened() -> list[dict[str, Any]] | None:
        found = incidents_now()
        return found if any(top(i)[1] for i in found) else None

    try:
        incidents = wait_for("an attributed incident on matmul", opened, 150.0)
    except AssertionError:
        incidents = incidents_now()
    t_end = time.monotonic()
    end_ns = time.time_ns()
    stop.set()
    victim.stop.set()
    for b in burners:
        b.join(70)
    victim.join(30)
    calm_ns = burst_since_ns - int((t_burst - t_start - 10) * 1e9)
    figures = {
        "calm": victim.figures(t_start + 10, t_burst),
        "burst": victim.figures(t_burst, t_end),
        "rows_calm": rows_figures(served, calm_ns, burst_since_ns),
        "rows_burst": rows_figures(served, burst_since_ns, end_ns),
        "seconds_to_attributed_incident": (
            round(t_end - t_burst, 1) if any(top(i)[1] for i in incidents) else None
        ),
        "incidents": [
            {k: i.get(k) for k in ("severity", "state", "baseline_p99_ms", "peak_p99_ms")}
            | {
                "opened_s_after_burst": round((i["start_ns"] - burst_since_ns) / 1e9, 1),
                "causes": [
                    {k: c.get(k) for k in ("kind", "culprit", "share", "confidence")}
                    for c in i.get("causes") or []
                ],
            }
            for i in incidents
        ],
    }
    RECORDINGS.mkdir(parents=True, exist_ok=True)
    (RECORDINGS / "contention.json").write_text(json.dumps(figures, indent=2) + "\n")
    assert figures["burst"]["p99_ms"] > 2 * figures["calm"]["p99_ms"], figures
    assert incidents, f"no incident on matmul: {figures}"
    # the burner takes the host's cores, not a GPU: named as a host-CPU cause (`cpu`) when
    # procfs shows the cores it took, as a co-tenant from its spans' activity otherwise; the
    # culprit is the burner either way
    assert any(
        top(i) in {("cpu", "burst/Burner"), ("cotenant", "burst/Burner")} for i in incidents
    ), figures
