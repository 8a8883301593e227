"""``cotenant report`` and the weekly schedule of ``cotenant serve``."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from cotenant.cli.main import main
from cotenant.core.errors import ConfigError, ReportError
from cotenant.core.slos import Slos
from cotenant.reports.compute import ReportBuilder
from cotenant.reports.isoweek import IsoWeek, last_complete_week, parse_week
from cotenant.reports.job import ReportJob
from cotenant.reports.schedule import ReportScheduler, WeeklyTime, parse_schedule
from tests.reports.conftest import SLO, WEEK, Fortnight


def _config(tmp_path: Path, fortnight: Fortnight) -> Path:
    cfg = tmp_path / "cotenant.toml"
    slo = ", ".join(f"{k} = {v}" for k, v in SLO.items())
    cfg.write_text(
        f'[store]\npath = "{fortnight.path}"\n[analysis]\nslo_ms = {{ {slo} }}\n'
        f'[report]\ndir = "{tmp_path / "reports"}"\ndashboard_url = "http://dash:9000/"\n'
    )
    return cfg


def test_cli_writes_the_week(
    fortnight: Fortnight, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, fortnight)
    assert main(["report", "--week", "2026-W48", "--config", str(cfg), "--format", "md"]) == 0
    d = tmp_path / "reports" / "2026-W48"
    assert sorted(p.name for p in d.iterdir()) == ["report.md", "summary.json"]
    md = (d / "report.md").read_text()
    assert "](http://dash:9000/incident?id=inc-" in md
    # one incident per victim of the week's four faults
    assert json.loads((d / "summary.json").read_text())["totals"]["incidents"] == 8
    assert str(d / "report.md") in capsys.readouterr().out


def test_cli_defaults_to_the_last_complete_week(fortnight: Fortnight, tmp_path: Path) -> None:
    cfg = _config(tmp_path, fortnight)
    assert main(["report", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 0
    week = str(last_complete_week(time.time_ns()))
    assert sorted(p.name for p in (tmp_path / "o" / week).iterdir()) == [
        "report.html",
        "report.md",
        "summary.json",
    ]  # [report] formats default: html,md


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--week", "2026-W60"], "week '2026-W60' does not exist: 2026 has weeks W01 to W53"),
        (["--week", "48"], "week '48' is not an ISO week like 2026-W48"),
        (["--format", "html,docx"], "--format 'html,docx': unknown format docx"),
        (["--store", "/nonexistent/x.duckdb"], "store /nonexistent/x.duckdb does not exist"),
    ],
)
def test_cli_rejects_bad_input(
    fortnight: Fortnight,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    cfg = _config(tmp_path, fortnight)
    assert main(["report", "--config", str(cfg), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


def test_iso_weeks() -> None:
    assert str(parse_week("2026-W01").previous()) == "2025-W52"
    assert last_complete_week(WEEK.start_ns) == parse_week("2026-W47")
    assert last_complete_week(WEEK.start_ns - 1) == parse_week("2026-W46")
    with pytest.raises(ReportError, match="2025 has weeks W01 to W52"):
        parse_week("2025-W53")


def test_schedule_parsing() -> None:
    at = parse_schedule("mon 06:00")
    assert at is not None and (at.weekday, at.hour, at.minute) == (0, 6, 0)
    assert parse_schedule("") is None
    assert at.next_after(WEEK.start_ns) == WEEK.start_ns + 6 * 3600 * 10**9
    assert at.next_after(WEEK.start_ns + 6 * 3600 * 10**9) == WEEK.end_ns + 6 * 3600 * 10**9
    with pytest.raises(ConfigError, match=r"report.schedule = 'monday 25:00'"):
        parse_schedule("monday 25:00")


def test_scheduler_writes_the_last_complete_week(fortnight: Fortnight, tmp_path: Path) -> None:
    """Clock injected: it is Sunday 20:00 of 2026-W49; the scheduler sleeps until Monday 06:00
    and then writes 2026-W49, the week that just completed."""
    now = [parse_week("2026-W49").start_ns + 6 * 86_400 * 10**9 + 20 * 3600 * 10**9]
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        if len(waits) > 1:
            return True  # stop after one run
        now[0] += int(seconds * 1e9)
        return False

    store = fortnight.open()
    written: list[IsoWeek] = []
    try:
        job = ReportJob(ReportBuilder(store, slos=Slos.of_maps(SLO)), tmp_path, ("md",))

        def run(week: IsoWeek) -> None:
            written.append(week)
            job.run(week)

        sched = ReportScheduler(_at("mon 06:00"), run, clock_ns=lambda: now[0], wait=wait)
        sched.start()
        sched.stop()
    finally:
        store.close()
    assert waits[0] == pytest.approx(10 * 3600)  # Sunday 20:00 -> Monday 06:00
    assert written == [parse_week("2026-W49")] and sched.runs == 1
    assert "No requests and no incidents" in (tmp_path / "2026-W49" / "report.md").read_text()


def test_a_failing_run_does_not_stop_the_scheduler() -> None:
    now = [WEEK.start_ns]
    calls = []

    def run(week: IsoWeek) -> None:
        calls.append(week)
        # a known failure, then a bug: neither may end the schedule
        raise ReportError("disk full") if len(calls) == 1 else ValueError("a bug")

    sched = ReportScheduler(_at("mon 00:00"), run, clock_ns=lambda: now[0])
    sched.run_once()
    sched.run_once()
    assert sched.failures == 2 and len(calls) == 2


def _at(text: str) -> WeeklyTime:
    at = parse_schedule(text)
    if at is None:
        raise AssertionError(f"{text!r} did not parse")
    return at


def test_report_from_a_url_waits_its_timeout_and_says_what_to_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A serve that takes long over a report (a fleet's week is read from Prometheus first):
    ``--timeout`` bounds the wait, and the message says it may still be working."""
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        args = ["report", "--url", url, "--week", "2026-W48", "--timeout", "1s"]
        assert main(args) != 0
    err = capsys.readouterr().err
    assert f"cotenant at {url} did not answer" in err and "within 1 s" in err, err
    assert "wait longer" in err
    with pytest.raises(SystemExit) as bad:
        main(["report", "--url", url, "--timeout", "soon"])
    assert bad.value.code == 2
    assert "'soon' is not a duration" in capsys.readouterr().err
