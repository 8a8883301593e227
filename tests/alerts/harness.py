"""Helpers of the alerting tests: Alertmanager webhook bodies, scenario streaming, and a real
Prometheus + Alertmanager pair on free loopback ports with temporary configs."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from promserver import PROMETHEUS, free_port, wait_until

from cotenant.simulator.scenario_load import load_scenario
from cotenant.simulator.stream import StreamStats, stream

HERE = Path(__file__).resolve().parent
SCENARIOS = HERE / "scenarios"
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
needs_servers = pytest.mark.skipif(
    not (Path(PROMETHEUS).exists() and Path(ALERTMANAGER).exists()),
    reason="Prometheus and Alertmanager are not installed (`make system-deps` installs "
    "Debian's `prometheus` and `prometheus-alertmanager`)",
)


def rfc3339(ns: int) -> str:
    """Alertmanager's time format (nanoseconds, UTC)."""
    secs, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{frac:09d}Z"


def webhook_body(*alerts: dict[str, Any], status: str = "firing") -> dict[str, Any]:
    """A version-4 webhook body as Alertmanager sends it."""
    return {
        "version": "4",
        "groupKey": '{}:{alertname="ModelLatencySLOBreach"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "cotenant",
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example:9093",
        "alerts": list(alerts),
    }


def alert(
    fingerprint: str,
    starts_ns: int,
    status: str = "firing",
    **labels: str,
) -> dict[str, Any]:
    return {
        "status": status,
        "labels": {"alertname": "ModelLatencySLOBreach", "severity": "critical", **labels},
        "annotations": {"summary": "test"},
        "startsAt": rfc3339(starts_ns),
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus.example:9090/graph",
        "fingerprint": fingerprint,
    }


def stream_scenario(
    otlp_http: str, name: str, *, start_ns: int, speed: float | None, stop: Any = None
) -> StreamStats:
    """Stream ``tests/alerts/scenarios/<name>.yaml`` to a running serve."""
    s = load_scenario(SCENARIOS / f"{name}.yaml")
    return stream(s, otlp_http, speed=speed, start_ns=start_ns, stop=stop or (lambda: False))


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    _logf: Any = field(repr=False)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._logf.close()


def _start(cmd: list[str], url: str, log: Path) -> Proc:
    logf = log.open("wb")
    p = Proc(subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT), url, log, logf)

    def ready() -> bool | None:
        if p.proc.poll() is not None:
            return True
        try:
            return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return None

    try:
        wait_until(ready, f"{cmd[0]} to be ready (log: {log})", 30)
    except BaseException:
        p.stop()
        raise
    if p.proc.poll() is not None:
        p.stop()
        raise RuntimeError(f"{cmd[0]} exited at start: {log.read_text()}")
    return p


@contextlib.contextmanager
def start_alertmanager(tmp: Path, webhook_url: str) -> Iterator[Proc]:
    """Alertmanager routing every alert to ``webhook_url`` at once (group_wait 1 s),
    clustering off."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "alertmanager.yml"
    cfg.write_text(
        "route:\n"
        "  receiver: cotenant\n"
        "  group_by: [alertname, model, gpu]\n"
        "  group_wait: 1s\n"
        "  group_interval: 1s\n"
        "  repeat_interval: 1h\n"
        "receivers:\n"
        "  - name: cotenant\n"
        "    webhook_configs:\n"
        f"      - url: {webhook_url}\n"
        "        send_resolved: true\n"
    )
    port = free_port()
    p = _start(
        [
            ALERTMANAGER,
            f"--config.file={cfg}",
            f"--storage.path={tmp / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        f"http://127.0.0.1:{port}",
        tmp / "alertmanager.log",
    )
    try:
        yield p
    finally:
        p.stop()


@contextlib.contextmanager
def start_prometheus_with_rules(
    tmp: Path, target: str, rule_files: list[Path], alertmanager: str | None = None
) -> Iterator[Proc]:
    """Prometheus scraping ``target`` (job ``cotenant``) every second, evaluating
    ``rule_files`` every second and sending alerts to ``alertmanager`` (host:port)."""
    tmp.mkdir(parents=True, exist_ok=True)
    lines = [
        "global:",
        "  scrape_interval: 1s",
        "  evaluation_interval: 1s",
        "rule_files:",
        *[f"  - {p}" for p in rule_files],
    ]
    if alertmanager:
        lines += [
            "alerting:",
            "  alertmanagers:",
            "    - static_configs:",
            f"        - targets: ['{alertmanager}']",
        ]
    lines += [
        "scrape_configs:",
        "  - job_name: cotenant",
        "    static_configs:",
        f"      - targets: ['{target}']",
    ]
    cfg = tmp / "prometheus.yml"
    cfg.write_text("\n".join(lines) + "\n")
    port = free_port()
    p = _start(
        [
            PROMETHEUS,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp / 'prom-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        f"http://127.0.0.1:{port}",
        tmp / "prometheus.log",
    )
    try:
        yield p
    finally:
        p.stop()
