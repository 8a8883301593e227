"""evaluation/agent_series: what an agent would have exposed, as promtool-ready OpenMetrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from cotenant.evaluation.agent_series import agent_openmetrics, write_openmetrics
from cotenant.store.schema import arrow_schema

S = 1_000_000_000
T0 = 1_800_000_000 * S
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _table(name: str, n: int, **cols: object) -> pa.Table:
    schema = arrow_schema(name)
    return pa.table(
        [pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema],
        schema=schema,
    )


def _tables() -> tuple[pa.Table, pa.Table, pa.Table]:
    # 6 requests of tts ending at 1..6 s, 10 ms each, the last two 200 ms with a 150 ms lock wait
    n = 6
    lat = [10.0] * 4 + [200.0] * 2
    req = _table(
        "requests", n,
        ts_start_ns=[T0 + k * S for k in range(n)], ts_end_ns=[T0 + (k + 1) * S for k in range(n)],
        latency_ms=lat, model=["tts"] * n, gpu=["G"] * n, trace_id=["t"] * n, span_id=["s"] * n,
        status=["ok"] * n, source=["ours"] * n, compute_ms=lat,
        lock_wait_ms=[0.0] * 4 + [150.0] * 2, lock_name=[None] * 4 + ["kv"] * 2,
        lock_holder=[None] * 4 + ["batcher"] * 2,
    )  # fmt: skip
    gpu = _table(
        "gpu_samples", 3, ts_ns=[T0, T0 + 2 * S, T0 + 4 * S], host=["node-a"] * 3, gpu=["G"] * 3,
        sm_util=[10.0, 50.0, 90.0], mem_used_bytes=[1048576.0 * 100] * 3,
        mem_total_bytes=[1048576.0 * 400] * 3,
    )  # fmt: skip
    proc = _table(
        "process_samples", 2, ts_ns=[T0, T0], host=["node-a"] * 2, gpu=["G", None],
        pid=[1, 2], process_name=["train", "etl"], sm_util=[40.0, None],
        cpu_cores=[None, 1.5],
    )  # fmt: skip
    return req, gpu, proc


def test_the_series_are_what_the_agent_would_have_shown(tmp_path: Path) -> None:
    req, gpu, proc = _tables()
    fams = agent_openmetrics(req, gpu, proc, node="node-a", t0_ns=T0, t1_ns=T0 + 6 * S,
                             scrape_s=3.0)  # fmt: skip
    path = tmp_path / "a.om"
    write_openmetrics(str(path), [fams])
    samples: dict[tuple[str, str, str], float] = {}
    for line in path.read_text().splitlines():  # promtool checks the format (test below)
        m = re.match(r"(\w+)\{(.*)\} (\S+) (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            key = (m.group(1), labels.get("le", labels.get("phase", "")), m.group(4))
            samples[key] = float(m.group(3))
    at = {k: f"{T0 / S + k:.3f}" for k in (0, 3, 6)}
    count = "cotenant_request_duration_seconds_count"
    # scrapes at 0, 3 and 6 s see the requests completed by then: 0, 3, 6
    assert [samples[(count, "total", at[k])] for k in (0, 3, 6)] == [0, 3, 6]
    assert samples[("cotenant_request_duration_seconds_bucket", "0.0100794", at[6])] == 4
    assert samples[("cotenant_lock_wait_seconds_total", "", at[6])] == pytest.approx(0.3)
    # gauges: the newest sample at or before the scrape
    assert [samples[("DCGM_FI_DEV_GPU_UTIL", "", at[k])] for k in (0, 3, 6)] == [10, 50, 90]
    assert samples[("DCGM_FI_DEV_FB_FREE", "", at[3])] == 300
    assert samples[("cotenant_gpu_process_sm_utilization_ratio", "", at[6])] == 0.4
    assert samples[("cotenant_process_cpu_cores", "", at[6])] == 1.5


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool not installed")
def test_promtool_turns_them_into_blocks(tmp_path: Path) -> None:
    req, gpu, proc = _tables()
    path = tmp_path / "a.om"
    write_openmetrics(
        str(path),
        [agent_openmetrics(req, gpu, proc, node="node-a", t0_ns=T0, t1_ns=T0 + 60 * S)],
    )
    r = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(path), str(tmp_path / "b")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert any((tmp_path / "b").iterdir())
    assert np.isfinite(len(path.read_text()))
