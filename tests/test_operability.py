"""What an operator reads of a running process: JSON logs ([log] format), the build and process
series on /metrics, central's check that Prometheus holds the agents' series, and the labels
and namespace of the rendered PrometheusRule."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cotenant.app.build_info import register_process_series
from cotenant.app.fleet_wiring import AgentSeriesWatch
from cotenant.app.log_format import configure_logging
from cotenant.core.errors import SourceError

ROOT = Path(__file__).resolve().parent.parent


def test_json_logs_are_one_object_per_line() -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    try:
        log = logging.getLogger("cotenant.test")
        log.info("spans from %s", "chat")
        log.debug("not at info")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
    finally:
        configure_logging("warning", "text", stream=io.StringIO())
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    first, second = (json.loads(x) for x in lines)
    assert (first["level"], first["logger"], first["message"]) == (
        "info",
        "cotenant.test",
        "spans from chat",
    )
    assert first["ts"].endswith("Z") and "T" in first["ts"]
    assert second["level"] == "error" and "ValueError: boom" in second["exc_info"]


def test_a_command_logs_json_when_configured(tmp_path: Path) -> None:
    """A real process configured by the command line's own path logs JSON lines."""
    env = {
        "COTENANT_LOG_FORMAT": "json",
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_ENABLED": "false",
        "COTENANT_OTLP_GRPC_ENABLED": "false",
        "COTENANT_PROCFS_ENABLED": "false",
        "COTENANT_CONFIG": str(tmp_path / "missing.toml"),
        "PATH": "/usr/bin:/bin",
    }
    r = subprocess.run(
        [sys.executable, "-m", "cotenant", "config", "show"],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    # a bad configuration is refused before logging starts: a plain message, exit 2
    assert r.returncode == 2 and "does not exist" in r.stderr
    code = (
        "import logging, sys\n"
        "from cotenant.cli.main import _configure_logging\n"
        "from cotenant.app.config import load_config\n"
        "_configure_logging(load_config())\n"
        "logging.getLogger('cotenant.x').warning('hello %d', 1)\n"
    )
    env.pop("COTENANT_CONFIG")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stderr.strip())
    assert (rec["level"], rec["logger"], rec["message"]) == ("warning", "cotenant.x", "hello 1")


def test_build_info_and_process_series() -> None:
    reg = CollectorRegistry()
    register_process_series(reg, "agent")
    register_process_series(reg, "agent")  # once only
    text = generate_latest(reg).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    [info] = fams["cotenant_build_info"].samples
    assert info.value == 1 and info.labels["role"] == "agent"
    assert info.labels["version"] and info.labels["python"].count(".") == 2
    assert fams["process_resident_memory_bytes"].samples[0].value > 0
    assert fams["process_cpu_seconds"].samples[0].value >= 0
    assert "process_open_fds" in fams


class _Answers:
    def __init__(self, values: list[float | None]) -> None:
        self.values = values

    def __call__(self) -> float:
        v = self.values.pop(0)
        if v is None:
            raise SourceError("Prometheus is down", url="http://p")
        return v


def test_central_says_when_prometheus_holds_no_agent_series(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    answers = _Answers([0, 0, None, 0, 0, 3, 0])
    watch = AgentSeriesWatch(
        answers, missing_after_s=600, where="Prometheus at http://p", clock=lambda: now[0]
    )
    caplog.set_level(logging.INFO, logger="cotenant.app.fleet_wiring")
    for t in (60, 300):
        now[0] = t
        watch.check()
        assert watch.agents == 0 and not watch.missing  # not for long enough yet
    now[0] = 650
    watch.check()  # Prometheus down: no verdict either way
    assert not watch.missing
    now[0] = 660
    watch.check()
    assert watch.missing
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "no series of any cotenant agent for 11 min" in errors[0].message
    assert "ServiceMonitor" in errors[0].message
    now[0] = 900
    watch.check()
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1  # logged once
    now[0] = 960
    watch.check()
    assert watch.agents == 3 and not watch.missing
    now[0] = 1020
    watch.check()  # gone again: the clock restarts from the last sighting
    assert not watch.missing


def test_rules_render_sets_the_manifests_labels_and_namespace(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[rules]\nlabels = { team = "gpu" }\nnamespace = "observability"\n')
    out = tmp_path / "pr.yaml"

    def render(*more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                *(sys.executable, "-m", "cotenant", "rules", "render", "--config", str(cfg)),
                *("--out", str(tmp_path / "rules"), "--prometheus-rule", str(out), *more),
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )

    r = render("--label", "release=kube-prometheus-stack")
    assert r.returncode == 0, r.stderr
    meta = yaml.safe_load(out.read_text())["metadata"]
    assert meta["namespace"] == "observability"
    assert meta["labels"] == {
        "app.kubernetes.io/name": "cotenant",
        "team": "gpu",
        "release": "kube-prometheus-stack",
    }
    r = render("--namespace", "monitoring")
    assert r.returncode == 0 and yaml.safe_load(out.read_text())["metadata"]["namespace"] == (
        "monitoring"
    )
    for bad, said in (
        (["--label", "release"], "expected KEY=VALUE"),
        (["--label", "re lease=x"], "not a Kubernetes label name"),
        (["--label", "release=-x"], "not a Kubernetes label value"),
        (["--namespace", "Monitoring"], "not a Kubernetes namespace"),
    ):
        r = render(*bad)
        assert r.returncode == 2 and said in r.stderr, (bad, r.stderr)


def test_a_required_or_malformed_prometheus_url_is_refused_at_start() -> None:
    from cotenant.app.central import check_prometheus_url
    from cotenant.app.config import load_config
    from cotenant.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"prometheus\.url: empty, but prometheus\.required"):
        check_prometheus_url(load_config(env={"COTENANT_PROMETHEUS_REQUIRED": "true"}))
    for bad in ("prometheus-operated.monitoring:9090", "http://", "ftp://p:9090"):
        with pytest.raises(ConfigError, match=r"prometheus\.url: bad value"):
            check_prometheus_url(load_config(env={"COTENANT_PROMETHEUS_URL": bad}))
    check_prometheus_url(load_config(env={}))  # single-node mode: no URL is fine
    check_prometheus_url(load_config(env={"COTENANT_PROMETHEUS_URL": "https://p:9090"}))
