"""PrometheusSource over agents' per-process series: host CPU of the asked hosts only, GPU
process shares of the asked GPU only (a real Prometheus scraping a text exposition)."""

from __future__ import annotations

import time
from pathlib import Path

from promserver import TextExporter, needs_prometheus, start_prometheus, wait_until

from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.core.timerange import TimeRange

pytestmark = needs_prometheus

EXPOSITION = (
    """\
# TYPE cotenant_process_cpu_cores gauge
cotenant_process_cpu_cores{host="node-a",pid="10",process="etl-a",model=""} 0.5
cotenant_process_cpu_cores{host="node-b",pid="20",process="hog-b",model=""} 3.0
# TYPE cotenant_gpu_process_sm_utilization_ratio gauge
"""
    + "\n".join(
        f'cotenant_gpu_process_sm_utilization_ratio{{host="{h}",gpu="{g}",pid="{p}",'
        f'process="{n}",model="{m}"}} {v}'
        for h, g, p, n, m, v in (
            ("node-a", "GPU-a", 11, "train", "", 0.4),
            ("node-b", "GPU-b", 21, "tts", "tts", 0.1),
        )
    )
    + "\n"
)


def test_host_cpu_and_process_shares_are_selected_in_promql(tmp_path: Path) -> None:
    with (
        TextExporter(lambda: EXPOSITION) as exp,
        start_prometheus(tmp_path, [exp.target], scrape_interval_s=0.5) as prom,
    ):
        wait_until(lambda: prom.query("cotenant_process_cpu_cores"), "the first scrape")
        time.sleep(1.2)  # a few scrapes
        now = time.time_ns()
        rng = TimeRange(now - 3_000_000_000, now)
        with PrometheusSource(prom.url, scrape_interval_s=0.5) as src:
            mine = src.process_windows(rng, 1.0, hosts=["node-a"]).to_pylist()
            gpu = src.process_windows(rng, 1.0, gpu="GPU-b").to_pylist()
            every = src.process_windows(rng, 1.0).to_pylist()
    assert {(r["host"], r["process_name"]) for r in mine} == {
        ("node-a", "etl-a"),
        ("node-a", "train"),
    }
    cpu = [r for r in mine if r["process_name"] == "etl-a"]
    assert cpu and all(r["cpu_cores"] == 0.5 and r["gpu"] is None for r in cpu)
    assert {(r["process_name"], r["model"], r["sm_util"]) for r in gpu} == {("tts", "tts", 10.0)}
    assert {r["process_name"] for r in every} == {"etl-a", "hog-b", "train", "tts"}
