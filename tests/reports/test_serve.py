"""Reports through a running ``cotenant serve``: ``cotenant report --url`` and the schedule
configuration."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cotenant.cli.main import main
from tests.conftest import ROOT, start_serve
from tests.reports.conftest import SLO, Fortnight


def test_report_via_a_running_server(
    fortnight: Fortnight, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "served.duckdb"
    shutil.copy(fortnight.path, store)
    env = {
        "COTENANT_ANALYSIS_SLO_MS": ",".join(f"{k}={v}" for k, v in SLO.items()),
        "COTENANT_ANALYSIS_ENABLED": "false",
        "COTENANT_NVML_ENABLED": "false",
        "COTENANT_REPORT_SCHEDULE": "mon 06:00",
        "COTENANT_REPORT_DASHBOARD_URL": "https://cotenant.example",
    }
    served = start_serve(tmp_path, store, env)
    try:
        r = httpx.get(f"{served.api}/api/v1/reports/2026-W99/summary", timeout=30)
        assert r.status_code == 400 and "2026-W99" in r.json()["error"]
        # the store file has one writer: reading it directly says what to do instead
        assert main(["report", "--store", str(store), "--week", "2026-W48"]) == 2
        assert "--url" in capsys.readouterr().err
        out = tmp_path / "out"
        args = ["report", "--url", served.api, "--week", "2026-W48", "--out", str(out)]
        assert main([*args, "--format", "html,md"]) == 0
    finally:
        assert served.stop() == 0
    md = (out / "2026-W48" / "report.md").read_text()
    assert "8 latency incident(s)" in md and "](https://cotenant.example/incident?id=" in md
    assert (out / "2026-W48" / "report.html").stat().st_size > 1_000_000  # plotly inline


def test_serve_rejects_a_bad_schedule(tmp_path: Path) -> None:
    env = {**os.environ, "COTENANT_REPORT_SCHEDULE": "someday 6am", "COTENANT_SERVER_PORT": "0"}
    p = subprocess.run(
        [sys.executable, "-m", "cotenant", "serve", "--store", str(tmp_path / "s.duckdb")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    assert "report.schedule = 'someday 6am'" in p.stderr
