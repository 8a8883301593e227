"""`cotenant demo` after its scenario: it says so and keeps serving the dashboard and API with
what it recorded until Ctrl-C, which stops it cleanly."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import ROOT

pytestmark = pytest.mark.timeout(240)

# 50x: the 900-s scenario in 18 s. At 100x a pass slowed by a busy machine spans a whole
# fault (0.2 s of wall time is 20 virtual seconds), and a run beside a benchmark once ended
# with no incident recorded at all.
DEMO = ("--speed", "50", "--store")
ENDED = "the scenario has ended; the dashboard and API keep serving what was recorded at"


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str | None]:
    """Every stdout line of ``proc`` as it comes, then None at its end."""
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                q.put(line)
        except (ValueError, OSError):  # closed by the test after a failure
            pass
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def _until(q: queue.Queue[str | None], seen: list[str], words: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = q.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            break
        seen.append(line)
        if words in line:
            return line
    raise AssertionError(f"no {words!r} in the demo's output:\n{''.join(seen)[-3000:]}")


def test_the_demo_keeps_serving_after_the_scenario_until_ctrl_c(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_PORT": "0",
        "COTENANT_OTLP_GRPC_PORT": "0",
    }
    store = tmp_path / "demo.duckdb"
    errf = (tmp_path / "demo.err").open("w")
    proc = subprocess.Popen(
        # -X faulthandler: a demo that does not stop is made to say where it hangs (SIGABRT)
        [sys.executable, "-X", "faulthandler", "-m", "cotenant", "demo", *DEMO, str(store)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=errf,
        text=True,
    )
    seen: list[str] = []
    try:
        q = _lines(proc)
        api_line = _until(q, seen, "API and metrics:", 90)
        api = re.search(r"(http://\S+)/api/v1/incidents", api_line)
        assert api, api_line
        url = api.group(1)
        ended = _until(q, seen, ENDED, 120)
        assert f"at {url}/ — Ctrl-C to stop" in ended, ended

        # still up well after the scenario: the API lists what the scenario recorded
        incidents: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not incidents:
            r = httpx.get(f"{url}/api/v1/incidents", timeout=10)
            assert r.status_code == 200, r.text
            incidents = r.json()["incidents"]
            if not incidents:
                time.sleep(0.5)
        assert incidents and all(i["start_ns"] < i["end_ns"] for i in incidents), incidents
        page = httpx.get(f"{url}/", timeout=30)
        assert page.status_code == 200 and "cotenant" in page.text
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        assert proc.poll() is None

        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # every thread's stack to demo.err
            proc.wait(30)
            errf.flush()
            raise AssertionError(
                "the demo did not stop within 60 s of Ctrl-C; where it was:\n"
                + "".join(seen)[-1500:]
                + (tmp_path / "demo.err").read_text()[-12000:]
            ) from None
        while (line := q.get(timeout=10)) is not None:
            seen.append(line)
        assert rc == 0, "".join(seen)[-2000:] + (tmp_path / "demo.err").read_text()[-2000:]
        assert any("incidents; store kept at" in s for s in seen), "".join(seen)[-2000:]
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/readyz", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
        errf.close()
