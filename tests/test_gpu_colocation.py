"""CPU logic check of bench/gpu_colocation.py (no GPU, no NVML: counters are unavailable)."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "bench" / "gpu_colocation.py")

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")


def test_cpu_logic_check(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            SCRIPT,
            "--device",
            "cpu",
            "--duration",
            "8",
            "--bursts",
            "3:2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

    with (out / "victim_latency.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows
    assert set(rows[0]) == {"ts_start_ns", "ts_end_ns", "latency_ms", "in_burst"}
    assert all(float(r["latency_ms"]) > 0 for r in rows)
    assert {r["in_burst"] for r in rows} == {"0", "1"}  # requests both inside and outside
    with (out / "gpu_util.csv").open() as f:
        assert next(csv.reader(f))[:2] == ["ts_ns", "role"]

    s = json.loads((out / "summary.json").read_text())
    assert s["gpu_counters_available"] is False
    assert "unavailable" in s["gpu_counters_note"]
    assert s["device"] == "cpu"
    assert len(s["bursts_observed_ns"]) == 1
    v = s["victim"]
    assert v["requests"] == len(rows)
    assert v["requests_in_store"] == len(rows)  # every span reached cotenant's store
    for side in ("inside_bursts", "outside_bursts"):
        assert v[side]["n"] > 0
        assert v[side]["p50_ms"] <= v[side]["p99_ms"]
    for role in ("device", "victim", "cotenant"):
        for side in ("inside_bursts", "outside_bursts"):
            assert set(s["util"][role][side]) == {"n", "sm_util_mean", "mem_util_mean"}
            assert s["util"][role][side]["n"] == 0


def test_cuda_without_torch_says_use_cpu(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch installed: the no-GPU message is not reachable this way")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "--device cpu" in proc.stderr
