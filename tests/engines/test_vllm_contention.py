"""A real vLLM (the tiny Llama on this machine's CPUs) at 1 request/s, then a silent CPU burner
on every core: processes that send no span and expose no metric, seen only by procfs. The
live loop of ``cotenant serve`` must open no incident in the quiet stretch, then one on the LLM
naming the burner as a host-CPU cause (``cpu``), and on-demand diagnosis of the same range must
name it too.

This is the held-back probe quoted in issue 41 (right in one run of three: one run opened
nothing, one opened a false incident before the burner and named the burner's time
``unknown``). The client's figures and what serve opened go to
tests/artifacts/engines/vllm-contention.json.

The probe's own burner was mild (client median 34 -> 36 ms): what the client loses to a starved
API server lies mostly outside vLLM's span, and in the span the slowdown was at the limit of a
1-req/s series (here 1.2-1.4x with burners in this test's session). The burners here take
more of the cores, so that this test checks the path (spans and procfs to a named incident,
live and on demand), not the detector's limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import Served
from tests.engines.conftest import VllmServer, wait_for
from tests.engines.recording import RECORDINGS
from tests.engines.test_contention import top
from tests.engines.test_vllm import PROMPTS, complete

PERIOD_S = 1.0  # 1 request/s: a low rate, as in the probe
MAX_TOKENS = 8
CALM_S = 300.0  # the live loop's warm-up at 1 req/s, then a quiet stretch it must not flag
ONSET_SLACK_S = 5.0
BURNER = Path(__file__).parent / "apps" / "cpu_burner.py"


class Client(threading.Thread):
    """Sends one short streamed completion every ``PERIOD_S``; keeps (start, latency ms)."""

    def __init__(self, vllm: VllmServer) -> None:
        super().__init__(daemon=True)
        self.vllm = vllm
        self.stop = threading.Event()
        self.seen: list[tuple[float, float]] = []

    def run(self) -> None:
        with httpx.Client(timeout=60) as client:
            nxt, i = time.monotonic(), 0
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    c = complete(client, self.vllm, PROMPTS[i % len(PROMPTS)], MAX_TOKENS, None)
                    self.seen.append((t0, c.ms))
                except (httpx.HTTPError, AssertionError):
                    pass
                i += 1
                nxt += PERIOD_S
                self.stop.wait(max(0.0, nxt - time.monotonic()))

    def figures(self, since: float, until: float) -> dict[str, float]:
        ms = np.array([m for t, m in self.seen if since <= t < until])
        return {
            "requests": int(ms.size),
            "p50_ms": round(float(np.percentile(ms, 50)), 2) if ms.size else -1.0,
            "p99_ms": round(float(np.percentile(ms, 99)), 2) if ms.size else -1.0,
        }


def incidents(served: Served, model: str, since_ns: int) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{served.api}/api/v1/incidents",
        params={"model": model, "since": str(since_ns / 1e9)},
        timeout=30,
    )
    found: list[dict[str, Any]] = r.json()["incidents"]
    return found


def summary(i: dict[str, Any], burner_ns: int) -> dict[str, Any]:
    return {k: i.get(k) for k in ("severity", "state", "baseline_p99_ms", "peak_p99_ms")} | {
        "opened_s_after_burner": round((i["start_ns"] - burner_ns) / 1e9, 1),
        "causes": [
            {k: c.get(k) for k in ("kind", "culprit", "share", "confidence")}
            for c in i.get("causes") or []
        ],
    }


def burns(culprit: str | None) -> bool:
    return culprit is not None and "cpu_burner" in culprit


@pytest.mark.timeout(720)
def test_a_silent_cpu_burner_beside_vllm_opens_one_incident_naming_it(
    vllm: VllmServer, vllm_served: Served
) -> None:
    client = Client(vllm)
    since_ns = time.time_ns()
    t_start = time.monotonic()
    client.start()
    time.sleep(CALM_S)
    t_burn, burner_ns = time.monotonic(), time.time_ns()
    # two burners per core, each a session of its own as a batch job's processes would be:
    # the kernel shares the cores between sessions (autogroups) before priorities, so vLLM's
    # session keeps about a third of them. Burners in this test's own session took 0.85 of 2
    # cores: 1.4x in vLLM's spans alone on this machine, 1.2x beside Ray and Triton (within
    # the noise of a 1-req/s series; the client's tail, 2.5x, lies outside vLLM's span)
    procs = [
        subprocess.Popen([sys.executable, str(BURNER)], start_new_session=True)
        for _ in range(2 * (os.cpu_count() or 2))
    ]
    model = vllm.model

    def named() -> list[dict[str, Any]] | None:
        got = incidents(vllm_served, model, burner_ns)
        return got if any(top(i)[0] is not None for i in got) else None

    try:
        with contextlib.suppress(AssertionError):
            wait_for("an attributed incident on the LLM", named, 180.0)
        time.sleep(10.0)  # what the loop says a little after it opened
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    t_end, end_ns = time.monotonic(), time.time_ns()
    client.stop.set()
    client.join(60)
    during = incidents(vllm_served, model, burner_ns)
    # an incident's start is its slowdown's onset, located to the window: a few s early is
    # the burner's, not the quiet stretch's
    quiet_until = burner_ns - int(ONSET_SLACK_S * 1e9)
    before = [i for i in incidents(vllm_served, model, since_ns) if i["start_ns"] < quiet_until]
    r = httpx.post(
        f"{vllm_served.api}/api/v1/diagnose",
        json={"model": model, "start": str(burner_ns / 1e9 - 120), "end": str(end_ns / 1e9)},
        timeout=120,
    )
    on_demand = r.json()
    figures = {
        "calm": client.figures(t_start + 30, t_burn),
        "burner": client.figures(t_burn, t_end),
        "live_during": [summary(i, burner_ns) for i in during],
        "live_before": [summary(i, burner_ns) for i in before],
        "on_demand": on_demand,
    }
    RECORDINGS.mkdir(parents=True, exist_ok=True)
    (RECORDINGS / "vllm-contention.json").write_text(json.dumps(figures, indent=2) + "\n")
    assert figures["burner"]["p99_ms"] > 1.5 * figures["calm"]["p99_ms"], figures
    assert not before, f"a false incident in the quiet stretch: {figures['live_before']}"
    assert during, f"no incident on the LLM: {figures}"
    assert any(top(i)[0] == "cpu" and burns(top(i)[1]) for i in during), figures["live_during"]
    # on-demand diagnosis of the same range names it too
    assert any(
        d["incident"] and d["causes"] and burns(d["causes"][0]["culprit"])
        for d in on_demand["diagnoses"]
    ), on_demand
