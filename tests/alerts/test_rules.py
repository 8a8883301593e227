"""The rule files: rendered from the configuration, checked and unit-tested by promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from cotenant.alerts.rules.blocks import RuleSettings
from cotenant.alerts.rules.render import RULE_FILES, render_rules, write_rules
from cotenant.app.config import Config, load_config
from cotenant.cli.rules import settings_from
from cotenant.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "cotenant" / "rules"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(),
    reason="promtool is not installed (`make system-deps` installs Debian's `prometheus`)",
)
HERE = Path(__file__).resolve().parent


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


def alert_names(path: Path) -> set[str]:
    doc = yaml.safe_load(path.read_text())
    return {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_committed_rules_are_the_default_rendering() -> None:
    rendered = render_rules(settings_from(Config()))
    assert sorted(rendered) == sorted(RULE_FILES)
    for name, text in rendered.items():
        assert (RULES / name).read_text() == text, (
            f"rules/{name} differs from `cotenant rules render` with the defaults: re-render it"
        )


def test_cli_renders_configured_slos_and_thresholds(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[analysis]\nslo_ms = { tts = 100, "chat-7b" = 400 }\n'
        "[rules]\nfor_s = 30\ndram_saturated = 0.8\nslo_default_ms = 250\n"
        'runbook_base_url = "https://wiki.example/runbooks"\n'
    )
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "cotenant", "rules", "render", "--config", str(cfg), "--out",
         str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    text = (out / "cotenant.rules.yml").read_text()
    assert 'label_replace(vector(0.1), "model", "tts", "", "")' in text
    assert 'label_replace(vector(0.4), "model", "chat-7b", "", "")' in text
    assert "cotenant:gpu_memory_bandwidth_utilization:avg_1m > 0.8" in text
    assert "for: 30s" in text
    assert "https://wiki.example/runbooks#modellatencyslobreach" in text
    assert "(cotenant:request_latency_seconds:p99_1m > 0.25" in text
    assert "unless on (model) cotenant:slo_seconds)" in text


def test_cli_names_a_bad_config_value(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[rules]\ndram_saturated = 1.5\n")
    r = subprocess.run(
        [sys.executable, "-m", "cotenant", "rules", "render", "--config", str(cfg), "--out",
         str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 2
    assert "rules.dram_saturated" in r.stderr
    assert not (tmp_path / "out").exists()


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {h.strip().lower() for h in re.findall(r"^## (\S+)\s*$", runbooks, re.M)}
    for name in RULE_FILES:
        doc = yaml.safe_load((RULES / name).read_text())
        for g in doc["groups"]:
            for rule in g["rules"]:
                if "alert" not in rule:
                    continue
                where = f"{name}: {rule['alert']}"
                assert rule["labels"]["severity"] in ("warning", "critical"), where
                ann = rule["annotations"]
                assert ann["summary"] and "{{" in ann["description"], where
                url = ann["runbook_url"]
                assert url.endswith("docs/runbooks.md#" + rule["alert"].lower()), where
                assert rule["alert"].lower() in anchors, f"{where}: no runbook section"


@needs_promtool
def test_promtool_checks_every_rule_file() -> None:
    r = promtool("check", "rules", *(RULES / n for n in RULE_FILES))
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_unit_tests_cover_every_alert() -> None:
    tests = sorted((RULES / "tests").glob("*.test.yml"))
    r = promtool("test", "rules", *tests)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in RULE_FILES:
        test = RULES / "tests" / name.replace(".rules.yml", ".test.yml")
        doc = yaml.safe_load(test.read_text())
        fires: set[str] = set()
        silent: set[str] = set()
        for t in doc["tests"]:
            for a in t.get("alert_rule_test", []):
                (fires if a.get("exp_alerts") else silent).add(a["alertname"])
        missing = alert_names(RULES / name) - (fires & silent)
        assert not missing, f"{test.name} lacks a firing and a silent case for {missing}"


@needs_promtool
def test_promtool_unit_tests_fail_when_a_threshold_moves(tmp_path: Path) -> None:
    """The unit tests pin the thresholds: rules rendered with another one fail them."""
    moved = settings_from(load_config(None, env={"COTENANT_RULES_MEMORY_PRESSURE": "0.97"}))
    write_rules(moved, tmp_path)
    (tmp_path / "tests").mkdir()
    shutil.copy(RULES / "tests" / "cotenant.test.yml", tmp_path / "tests")
    r = promtool("test", "rules", tmp_path / "tests" / "cotenant.test.yml")
    assert r.returncode != 0
    assert "GPUMemoryPressure" in r.stdout + r.stderr


@needs_promtool
def test_configured_and_default_slos_alert_in_promtool(tmp_path: Path) -> None:
    """Rendered SLOs are constants in the rules (no gauge needed); slo_default_ms covers the
    models without one, and a gauge value does not override a rendered SLO."""
    s = RuleSettings(
        slo_ms={"tts": 100.0},
        slo_default_ms=200.0,
        dram_saturated=0.9,
        pcie_saturated_bps=20e9,
        lock_wait_share=0.3,
        memory_pressure=0.95,
        for_s=60.0,
        runbook_base_url="http://runbooks",
    )
    write_rules(s, tmp_path)
    shutil.copy(HERE / "slo_rendered.test.yml", tmp_path)
    r = promtool("test", "rules", tmp_path / "slo_rendered.test.yml")
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_ttft_and_tpot_slos_render_recording_rules_and_alerts_in_promtool(
    tmp_path: Path,
) -> None:
    """TTFT / TPOT SLOs become constants and alerts over cotenant's own histograms and
    vLLM's; without them, only the quantile recording rules are rendered."""
    base = settings_from(Config())
    plain = render_rules(base)
    assert "ModelTTFTSLOBreach" not in "".join(plain.values())
    assert "cotenant:time_per_output_token_seconds:p99_1m" in plain["cotenant.rules.yml"]
    assert "exporter:time_to_first_token_seconds:p99_1m" in plain["exporters.rules.yml"]
    s = replace(
        base,
        slo_ttft_ms={"chat": 500.0},
        slo_tpot_ms={"chat": 50.0},
        runbook_base_url="http://runbooks",
    )
    write_rules(s, tmp_path)
    r = promtool("check", "rules", *(tmp_path / n for n in RULE_FILES))
    assert r.returncode == 0, r.stdout + r.stderr
    shutil.copy(HERE / "token_slo_rendered.test.yml", tmp_path)
    r = promtool("test", "rules", tmp_path / "token_slo_rendered.test.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_bad_ttft_slo_is_refused_naming_the_key() -> None:
    base = settings_from(Config())
    with pytest.raises(UsageError, match=r"slo_tpot_ms\['chat'\] = -1"):
        replace(base, slo_tpot_ms={"chat": -1.0})
