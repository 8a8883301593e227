"""The weekly report in fleet mode: its rollups come from the recording rules of
``rules/fleet.rules.yml`` in a real Prometheus, and must agree with embedded mode's.

A scenario's agent series (``evaluation.agent_series``) are backfilled into Prometheus with
promtool; ``promtool tsdb create-blocks-from rules`` evaluates the shipped recording rules over
them (as a running Prometheus would have, once a minute); central serve's report reduces the
week in PromQL over them (``Fleet.week_rollups``), and is compared with the report embedded
mode builds from the same simulation's raw rows.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from promserver import PROMETHEUS, needs_prometheus, start_prometheus

from cotenant.app.config import load_config
from cotenant.app.fleet import Fleet
from cotenant.app.report_builder import report_builder
from cotenant.evaluation.agent_series import agent_openmetrics, write_openmetrics
from cotenant.reports.isoweek import week_of
from cotenant.simulator import output
from cotenant.simulator.scenario_load import find_scenario, load_scenario
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance

pytestmark = needs_prometheus

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = str(Path(PROMETHEUS).with_name("promtool"))
S = 1_000_000_000


def _promtool(*args: str) -> None:
    r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def _reports(tmp_path: Path, scenario: str, folder: str, env: dict[str, str]) -> tuple[Any, Any]:
    """The weekly report of ``scenario``'s week built by embedded mode from the raw rows, and
    by central serve from the recording rules over the agent series (``env``: SLO keys)."""
    s = load_scenario(find_scenario(scenario))
    now = time.time_ns()
    start = (now // (60 * S) - 120) * 60 * S  # two hours ago, on a minute
    sim = output.run(s, start_ns=start)
    end = start + int(s.duration_s * S)
    cfg = load_config(env={**env, "COTENANT_PROMETHEUS_SCRAPE_INTERVAL_S": "15"})
    week = week_of(start)

    # embedded: rollups from the raw rows
    embedded = Store(tmp_path / "embedded.duckdb")
    append_tables(
        embedded,
        {
            "requests": sim.requests,
            "gpu_samples": sim.gpu_samples,
            "process_samples": sim.process_samples,
        },
    )
    Maintenance(embedded).refresh_rollups()
    want = report_builder(cfg, embedded).build(week)
    embedded.close()

    # fleet: agent series -> Prometheus -> recording rules -> central store -> report
    om = tmp_path / "agent.om"
    write_openmetrics(
        str(om),
        [
            agent_openmetrics(
                sim.requests, sim.gpu_samples, sim.process_samples,
                node=s.host, t0_ns=start, t1_ns=end + 15 * S, scrape_s=15.0,
            )
        ],
    )  # fmt: skip
    blocks = tmp_path / "blocks"
    _promtool("tsdb", "create-blocks-from", "openmetrics", str(om), str(blocks))
    # Prometheus (and promtool's backfill) evaluates a rule group at an offset within its
    # interval set by a hash of the group and its file's path: copied under tmp_path, the
    # rules meet another offset in each run
    (tmp_path / folder).mkdir()
    rules = []
    for n in ("cotenant.rules.yml", "fleet.rules.yml"):
        shutil.copy(ROOT / "cotenant" / "rules" / n, tmp_path / folder / n)
        rules.append(str(tmp_path / folder / n))
    with start_prometheus(tmp_path / "raw", [], blocks=blocks) as raw:
        _promtool(
            "tsdb", "create-blocks-from", "rules", f"--start={start // S}",
            f"--end={end // S + 120}", f"--url={raw.url}",
            f"--output-dir={tmp_path / 'rule-blocks'}", *rules,
        )  # fmt: skip
    for b in (tmp_path / "rule-blocks").iterdir():
        shutil.copytree(b, blocks / b.name)
    central = Store(tmp_path / "central.duckdb")
    try:
        with start_prometheus(tmp_path / "served", [], blocks=blocks) as prom:
            fleet_cfg = load_config(
                env={
                    **env,
                    "COTENANT_PROMETHEUS_URL": prom.url,
                    "COTENANT_PROMETHEUS_SCRAPE_INTERVAL_S": "15",
                }
            )
            fleet = Fleet(fleet_cfg, CollectorRegistry())
            try:
                builder = report_builder(fleet_cfg, central, fleet.week_rollups)
                got = builder.build(week)
            finally:
                fleet.close()
    finally:
        central.close()
    return want, got


@pytest.mark.parametrize("folder", ["rules", "elsewhere"])
def test_the_weekly_report_from_recording_rules_matches_embedded_mode(
    tmp_path: Path, folder: str
) -> None:
    """The recorded minutes must be clock minutes whatever the rule group's offset (two
    offsets per run: the rules under two paths)."""
    want, got = _reports(
        tmp_path, "cotenant-burst-sdxl-slows-tts-timeslice", folder,
        {"COTENANT_ANALYSIS_SLO_MS": "tts=100"},
    )  # fmt: skip

    models = {m.model: m for m in got.models}
    assert set(models) == {m.model for m in want.models} == {"tts", "sdxl"}
    for m in want.models:
        g = models[m.model]
        # counts: increase() over a minute extrapolates at its edges when scrapes are not on
        # the minute (they are here: the counts agree exactly); allow a request per minute
        assert g.requests == pytest.approx(m.requests, rel=0.05, abs=m.minutes), (m, g)
        assert abs(g.minutes - m.minutes) <= 2, (m, g)
    tts_want, tts_got = next(m for m in want.models if m.model == "tts"), models["tts"]
    # minutes within the SLO: the per-minute p99 from the histogram, against the exact one
    assert tts_got.slo_attainment is not None and tts_want.slo_attainment is not None
    assert abs(tts_got.slo_attainment - tts_want.slo_attainment) <= 0.05, (tts_want, tts_got)
    gpu_got = {g.gpu: g for g in got.gpus}
    gpu_want = {g.gpu: g for g in want.gpus}
    assert set(gpu_got) == set(gpu_want)
    for gpu, w in gpu_want.items():
        assert gpu_got[gpu].hours_sampled == pytest.approx(w.hours_sampled, abs=3 / 60)
        assert gpu_got[gpu].models == w.models


def test_ttft_and_tpot_attainment_of_an_llm_from_recording_rules_match_embedded_mode(
    tmp_path: Path,
) -> None:
    """A generative model's TTFT and TPOT SLO attainment in the fleet report come from the
    agents' token histograms (``cotenant:time_*:p99_minute``)."""
    want, got = _reports(
        tmp_path, "decode-contention-training-job-shorter-answers-e2e-flat-mps", "rules",
        {"COTENANT_ANALYSIS_SLO_TTFT_MS": "chat=100", "COTENANT_ANALYSIS_SLO_TPOT_MS": "chat=12"},
    )  # fmt: skip
    w = next(m for m in want.models if m.model == "chat")
    g = next(m for m in got.models if m.model == "chat")
    # per-minute p99 of the raw rows: TTFT 73-127 ms (3 of 8 minutes within 100 ms), TPOT
    # 9.8-14.1 ms/token while the training job runs (5 of 8 within 12 ms)
    assert (w.ttft_attainment, w.tpot_attainment) == (3 / 8, 5 / 8), w
    assert (g.ttft_slo_ms, g.tpot_slo_ms) == (100.0, 12.0), g
    assert g.ttft_attainment == pytest.approx(w.ttft_attainment, abs=0.05), (w, g)
    assert g.tpot_attainment == pytest.approx(w.tpot_attainment, abs=0.05), (w, g)
    assert g.requests == pytest.approx(w.requests, rel=0.05), (w, g)
    # the GPU's co-tenants: models, and the training job that serves none (its SM share is
    # imported only for processes without a model, over 1 %)
    gpus_want = {x.gpu: x for x in want.gpus}
    gpus_got = {x.gpu: x for x in got.gpus}
    assert set(gpus_got) == set(gpus_want)
    for gpu, x in gpus_want.items():
        assert "train-job" in x.processes, x
        assert (gpus_got[gpu].models, gpus_got[gpu].processes) == (x.models, x.processes)
        assert gpus_got[gpu].cotenancy_h == pytest.approx(x.cotenancy_h, abs=2 / 60)
