"""One SLO value, one definition of breach: ``cotenant.core.slos.Slos`` built once from the
configuration, and the detector, the alert rules and the weekly report agreeing on which models
breach — a model without an SLO of its own pages in Prometheus exactly when its incident says
``breach``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from cotenant.alerts.rules.render import write_rules
from cotenant.app.config import load_config
from cotenant.app.report_builder import report_builder
from cotenant.cli.rules import settings_from
from cotenant.core.slos import E2E, TPOT, TTFT, Slos, SloTable
from cotenant.store.db import Store

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

CONFIG = """
[analysis]
slo_ms = { a = 100.0, e = 300.0 }
slo_ttft_ms = { a = 500.0 }
slo_tpot_ms = { a = 20.0 }
[rules]
slo_default_ms = 200.0
"""

# p99 of each model (ms) in the promtool series below: every request in one bucket, so
# histogram_quantile gives the bucket's lower bound + 0.99 of its width
P99_MS = {"a": 248.5, "b": 248.5, "d": 99.5, "e": 248.5}
BUCKET_OF = {"a": "0.25", "b": "0.25", "d": "0.1", "e": "0.25"}


def test_an_slo_per_model_and_indicator_with_a_default() -> None:
    s = Slos.of_maps({"a": 100.0, "off": 0.0}, ttft={"a": 500.0}, default_ms=200.0)
    assert s.of("a") == 100.0
    assert s.of("b") == 200.0  # the default
    assert s.of("off") is None  # named with no SLO: the default does not apply
    assert s.of("a", TTFT) == 500.0 and s.of("b", TTFT) is None  # no default for tokens
    assert s.of("a", TPOT) is None
    assert s.token_slos("a") == {TTFT: 500.0, TPOT: None}
    assert s.breached("b", 200.1) and not s.breached("b", 200.0)
    assert not s.breached("off", 1e9)
    assert s.explicit() == {"a": 100.0, "off": 0.0} and s.default_ms == 200.0
    assert Slos().of("a") is None and not Slos().breached("a", 1e9)
    with pytest.raises(ValueError, match="unknown indicator 'p50'"):
        s.of("a", "p50")


def test_groups_list_named_models_by_value() -> None:
    t = SloTable({"x": 100.0, "y": 50.0, "z": 100.0, "n": 0.0}, 10.0)
    assert t.groups() == [(50.0, ["y"]), (100.0, ["x", "z"])]


def _promtool_case(expected: set[str]) -> dict:
    series = []
    for m, le in BUCKET_OF.items():
        for bound in ("0.05", "0.1", "0.25", "0.5", "+Inf"):
            full = float(bound) >= float(le) if bound != "+Inf" else True
            series.append(
                {
                    "series": "cotenant_request_duration_seconds_bucket"
                    f'{{model="{m}",gpu="g",phase="total",le="{bound}"}}',
                    "values": "0+150x40" if full else "0x40",
                }
            )
    return {
        "rule_files": ["cotenant.rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        # the models whose SLO alert fires (ALERTS holds the rules' alerts)
                        "expr": 'count by (model) (ALERTS{alertname="ModelLatencySLOBreach",'
                        ' alertstate="firing"})',
                        "eval_time": "8m",
                        "exp_samples": [
                            {"labels": f'{{model="{m}"}}', "value": 1} for m in sorted(expected)
                        ],
                    }
                ],
            }
        ],
    }


def test_detector_rules_and_report_agree_on_who_breaches(tmp_path: Path) -> None:
    (tmp_path / "cotenant.toml").write_text(CONFIG)
    cfg = load_config(tmp_path / "cotenant.toml", env={})
    slos = cfg.slos()  # what serve hands the detector, the actuators and the dashboard
    detector = {m for m, p99 in P99_MS.items() if slos.breached(m, p99)}
    # a: over its own 100 ms; b: no SLO of its own, over the 200 ms default; d: under the
    # default; e: its own 300 ms wins over the default
    assert detector == {"a", "b"}

    store = Store(tmp_path / "s.duckdb")
    try:
        report = report_builder(cfg, store).slos
    finally:
        store.close()
    assert {m: report.of(m) for m in P99_MS} == {m: slos.of(m) for m in P99_MS}
    assert report.token_slos("a") == slos.token_slos("a") == {TTFT: 500.0, TPOT: 20.0}

    rules = settings_from(cfg)
    assert (dict(rules.slo_ms), rules.slo_default_ms) == (slos.explicit(E2E), slos.default_ms)
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool is not installed (`make system-deps` installs `prometheus`)")
    write_rules(rules, tmp_path)
    (tmp_path / "agree.test.yml").write_text(yaml.safe_dump(_promtool_case(detector)))
    r = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "agree.test.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # and the check can fail: promtool refuses a set that leaves out the default's victim
    (tmp_path / "agree.test.yml").write_text(yaml.safe_dump(_promtool_case({"a"})))
    r = subprocess.run(
        [PROMTOOL, "test", "rules", str(tmp_path / "agree.test.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0


def test_the_lookup_applies_the_default_where_a_dict_would_not() -> None:
    # what the actuators take: ``model in slo`` / ``slo[model]`` as for a dict, default included
    look = Slos.of_maps({"a": 100.0, "off": 0.0}, default_ms=200.0).lookup()
    assert "a" in look and look["a"] == 100.0
    assert "b" in look and look["b"] == 200.0 and look.get("b") == 200.0
    assert "off" not in look and look.get("off") is None
    assert sorted(look) == ["a"] and len(look) == 1  # only the named models can be listed
    none = Slos.of_maps({"a": 100.0}).lookup()
    assert "b" not in none and none.get("b") is None
    with pytest.raises(KeyError):
        none["b"]
