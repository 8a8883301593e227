"""``cotenant import-gentd26``: the GenTD26 trace into the store, and the product's own weekly
report over what was imported (where load latency went)."""

from __future__ import annotations

import calendar
import re
from pathlib import Path

import numpy as np
import pytest

from cotenant.cli.main import main
from cotenant.core.errors import TraceError, UsageError
from cotenant.evaluation.gentd26 import load_trace
from cotenant.evaluation.gentd26_import import import_folder, request_phases, select
from cotenant.reports.compute import ReportBuilder
from cotenant.reports.isoweek import parse_week
from cotenant.reports.markdown import render_markdown
from cotenant.store.db import Store
from tests.evaluation.test_gentd26 import REAL, write_trace
from tests.evaluation.test_gentd26 import ts as step_ts

B, A, IDLE = "b" * 32, "a" * 32, "c" * 32  # pool B (ControlNet), pool A, GPU telemetry only
NS = 1_000_000_000
WEEK = parse_week("2022-W36")  # T0 is 2022-09-11 01:12 UTC, a Sunday


def small_trace(folder: Path) -> Path:
    """Three containers over six steps: B serves every step, loads ordinary then one slow
    base model at step 3; A's LoRA load at step 1 has no e2e row in its own step (it delays
    step 2's); IDLE has GPU telemetry only."""
    return write_trace(
        folder,
        {
            "e2e": [(step_ts(i), 10_000.0, B) for i in range(5)]
            + [(step_ts(3), 60_000.0, A), (step_ts(0), 5_000.0, A), (step_ts(2), 8_000.0, A)],
            "queue_rt": [(step_ts(i), 200.0, B) for i in range(5)],
            "load_lora": [(step_ts(0), 4_000.0, B), (step_ts(1), 1_000.0, A)],
            "load_controlnet": [(step_ts(i), 3_000.0, B) for i in range(5)],
            "load_basemodel": [(step_ts(3), 40_000.0, B), (step_ts(3), 2_900.0, A)],
            "duty_cycle": [(step_ts(i), 30.0 + i, c) for i in range(6) for c in (A, B, IDLE)],
            "gpu_memory": [(step_ts(i), 2.0e10, c) for i in range(6) for c in (A, B)],
        },
    )


def _rows(store: Store, sql: str) -> list[tuple[object, ...]]:
    with store.cursor() as cur:
        return cur.execute(sql).fetchall()


def test_import_maps_each_series_to_the_store_field_with_the_container_as_identity(
    tmp_path: Path,
) -> None:
    folder = small_trace(tmp_path / "t")
    with Store(tmp_path / "s.duckdb") as store:
        r = import_folder(store, folder)
        assert r.rows == {
            "requests": 8,
            "model_loads": 9,
            "gpu_samples": 18,
            "process_samples": 18,
        }
        reqs = _rows(
            store,
            "SELECT ts_end_ns, ts_start_ns, latency_ms, queue_ms, other_ms, compute_ms, model, "
            "replica, gpu FROM requests ORDER BY replica, ts_end_ns",
        )
        b = [x for x in reqs if x[7] == B]
        # step 0: LoRA 4 s + ControlNet 3 s waited; queue_rt 200 ms; the rest is inference
        assert b[0][:6] == (step_ts(0) * NS, step_ts(0) * NS - 10 * NS, 10_000.0, 200.0,
                            7_000.0, 2_800.0)  # fmt: skip
        # step 3: the slow base model (40 s) + ControlNet: clipped to the 10 s request
        assert b[3][3:6] == (200.0, 9_800.0, 0.0)
        assert {x[6] for x in b} == {"sd-pool-b"} and {x[8] for x in b} == {B}
        a = [x for x in reqs if x[7] == A]
        # A's LoRA load at step 1 (no e2e row there) is charged to step 2's request
        assert [(x[0] // NS, x[4]) for x in a] == [
            (step_ts(0), 0.0),
            (step_ts(2), 1_000.0),
            (step_ts(3), 2_900.0),
        ]
        assert {x[6] for x in a} == {"sd-pool-a"}
        loads = _rows(
            store, "SELECT replica, kind, count(*), sum(duration_ms) FROM model_loads GROUP BY ALL"
        )
        assert sorted(loads) == [
            (A, "base", 1, 2_900.0),
            (A, "lora", 1, 1_000.0),
            (B, "base", 1, 40_000.0),
            (B, "controlnet", 5, 15_000.0),
            (B, "lora", 1, 4_000.0),
        ]
        gpu = _rows(store, f"SELECT sm_util, mem_used_bytes FROM gpu_samples WHERE gpu = '{IDLE}'")
        assert sorted(gpu)[0] == (30.0, None) and len(gpu) == 6
        procs = _rows(
            store, "SELECT process_name, any_value(model) FROM process_samples GROUP BY 1"
        )
        assert dict(procs) == {A: "sd-pool-a", B: "sd-pool-b", IDLE: None}
        # the rollups the report reads are refreshed
        assert _rows(store, "SELECT sum(loads) FROM load_rollup_1m") == [(9,)]
        assert _rows(store, "SELECT sum(count) FROM request_rollup_1m") == [(8,)]
        with pytest.raises(UsageError, match="already holds 8 imported GenTD26 requests"):
            import_folder(store, folder)


def test_phases_sum_to_the_latency_on_a_constructed_trace(tmp_path: Path) -> None:
    t = load_trace(small_trace(tmp_path / "t"))
    p = request_phases(t)
    lat = p.pop("latency_ms")
    total = sum(np.nan_to_num(v) for v in p.values())
    has = np.isfinite(lat)
    assert np.allclose(total[has], lat[has]) and all((v[has] >= 0).all() for v in p.values())


def test_selection_keeps_models_of_the_whole_trace_and_refuses_unknown_containers(
    tmp_path: Path,
) -> None:
    t = load_trace(small_trace(tmp_path / "t"))
    # in the first step B has a ControlNet load; in B's slice without it, it stays pool B
    sub, models = select(t, [B[:6], IDLE], hours=57 * 2 / 3600)
    assert sub.containers == (B, IDLE) and len(sub.ts) == 3
    assert models == ["sd-pool-b", "sd-idle"]
    with pytest.raises(UsageError, match="'zz' matches no container"):
        select(t, ["zz"])
    with pytest.raises(UsageError, match="hours must be positive"):
        select(t, None, hours=0)


def test_cli_imports_shifted_to_a_given_end_and_names_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = small_trace(tmp_path / "t")
    db = tmp_path / "s.duckdb"
    end = "2026-12-02T12:00:00Z"
    assert main(["import-gentd26", str(folder), "--store", str(db), "--end", end]) == 0
    out, err = capsys.readouterr()
    assert "imported 3 containers, 6 steps" in out and "requests                 8 rows" in out
    assert "importing: 6/6 steps (100 %)" in err  # the progress display
    with Store(db, read_only=True) as s:
        assert _rows(s, "SELECT max(ts_ns) FROM gpu_samples") == [
            (calendar.timegm((2026, 12, 2, 12, 0, 0)) * NS,)
        ]
    assert main(["import-gentd26", str(tmp_path / "absent"), "--store", str(tmp_path / "x")]) == 2
    assert "absent: no such folder" in capsys.readouterr().err
    (folder / "qps.tar.gz").unlink()
    assert main(["import-gentd26", str(folder), "--store", str(tmp_path / "y.duckdb")]) == 2
    assert "qps.tar.gz: missing" in capsys.readouterr().err
    with pytest.raises(TraceError):
        load_trace(folder)


def test_weekly_report_over_an_import_says_where_load_latency_went(tmp_path: Path) -> None:
    folder = small_trace(tmp_path / "t")
    with Store(tmp_path / "s.duckdb") as store:
        import_folder(store, folder)
        s = ReportBuilder(store).build(WEEK)
    kinds = {(k.model, k.kind): k for k in s.load_kinds}
    assert kinds[("sd-pool-b", "base")].loads == 1
    assert kinds[("sd-pool-b", "base")].max_ms == 40_000.0
    assert kinds[("sd-pool-b", "controlnet")].loads == 5
    assert kinds[("sd-pool-a", "lora")].top_replica == A
    # B spent 40 + 15 + 4 s loading: the replica that loaded most, base first
    top = s.load_replicas[0]
    assert (top.replica, list(top.by_kind_ms)) == (B, ["base", "controlnet", "lora"])
    waits = {w.model: w for w in s.load_waits}
    # B's requests waited 7 + 3 + 3 + 9.8 + 3 s of their 50 s
    assert waits["sd-pool-b"].wait_h * 3600 == pytest.approx(25.8)
    assert waits["sd-pool-b"].latency_share == pytest.approx(25.8 / 50)
    md = render_markdown(s)
    assert "## Model loads" in md and "sd-pool-b's base loads" in md
    assert "| sd-pool-b | base | 1 | 40.0 s | 40,000.0 ms |" in md


@pytest.mark.skipif(not REAL.is_dir(), reason="the GenTD26 trace is not beside the checkout")
def test_an_hour_of_the_real_trace_imports_and_the_report_renders_its_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two busy containers of the first hour: one of each pool
    pool_b, pool_a = "aa786acb8d12b35cacb997280cf4f2db", "9cd20d9c3dcebaf54796126cf30daf5e"
    db, out = tmp_path / "g.duckdb", tmp_path / "reports"
    argv = ["import-gentd26", str(REAL), "--store", str(db), "--hours", "1"]
    assert main([*argv, "--containers", f"{pool_b},{pool_a[:8]}"]) == 0
    assert "imported 2 containers, 64 steps" in capsys.readouterr().out
    assert main(["report", "--store", str(db), "--week", str(WEEK), "--out", str(out),
                 "--format", "md,html"]) == 0  # fmt: skip
    md = (out / str(WEEK) / "report.md").read_text()
    html = (out / str(WEEK) / "report.html").read_text()
    assert 'id="loads"' in html and pool_b in html
    section = md.split("## Model loads")[1].split("## GPUs")[0]
    for row in ("| sd-pool-b | base |", "| sd-pool-b | lora |", "| sd-pool-b | controlnet |",
                "| sd-pool-a | base |", "| sd-pool-a | lora |"):  # fmt: skip
        assert row in section
    assert f"- {pool_b} (sd-pool-b)" in section and f"- {pool_a} (sd-pool-a)" in section
    assert "| sd-pool-b | " in section.split("| model | kind |")[0]  # its requests' waits


def test_openmetrics_holds_the_fleet_minute_series_of_the_import(tmp_path: Path) -> None:
    om = tmp_path / "g.om"
    argv = ["import-gentd26", str(small_trace(tmp_path / "t")), "--store", str(tmp_path / "s")]
    assert main([*argv, "--openmetrics", str(om)]) == 0
    text = om.read_text()
    families = re.findall(r"^# TYPE (\S+) gauge$", text, re.MULTILINE)
    assert text.endswith("# EOF\n") and len(families) == len(set(families)) >= 10
    stamp = f"{step_ts(0) - step_ts(0) % 60 + 90:.3f}"  # minute 0's sample, 90 s into it
    # the first minute holds steps 0 and 1: B waited 7 + 3 s for loads (other), queued 2 x
    # 200 ms, served 2 requests of 10 s; duty cycles 30 and 31 %
    for line in (
        f'cotenant:request_phase_seconds:sum_minute{{model="sd-pool-b",gpu="{B}",phase="other"}}'
        f" 10.0 {stamp}",
        f'cotenant:request_phase_seconds:sum_minute{{model="sd-pool-b",gpu="{B}",phase="queue"}}'
        f" 0.4 {stamp}",
        f'cotenant:requests:increase_minute{{model="sd-pool-b",gpu="{B}"}} 2.0 {stamp}',
        f'cotenant:model_request_latency_seconds:p99_max_minute{{model="sd-pool-b"}} 10.0 {stamp}',
        f'cotenant:gpu_sm_utilization:avg_minute{{host="gentd26",gpu="{B}"}} 0.305 {stamp}',
        f'cotenant:process_sm_utilization:avg_minute{{host="gentd26",gpu="{IDLE}",'
        f'process="{IDLE}"}} 0.305 {stamp}',
        f'cotenant:gpu_tenants:count_minute{{gpu="{IDLE}"}} 1.0 {stamp}',
    ):
        assert line + "\n" in text, line
