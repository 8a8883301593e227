"""The fleet loop's window rules (``cotenant-fleet-windows``, :mod:`alerts.rules.windows`) over
a backfilled history, for the fleet benchmarks (``--rules``).

``promtool tsdb create-blocks-from rules`` evaluates the group, as rendered by ``cotenant rules
render`` for the given scrape interval, over ``[start, end]`` against a Prometheus serving the
raw blocks, and the blocks it writes join the raw ones: what a Prometheus that had been running
these rules all along would hold.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from promserver import PROMETHEUS, start_prometheus

from cotenant.alerts.rules.render import to_yaml
from cotenant.alerts.rules.windows import window_group
from cotenant.app.config import load_config
from cotenant.cli.rules import settings_from

PROMTOOL = str(Path(PROMETHEUS).with_name("promtool"))


def window_rules(scrape_s: float) -> dict[str, Any]:
    """The group as ``cotenant rules render`` writes it with ``[prometheus] scrape_interval_s``
    = ``scrape_s`` (default configuration otherwise)."""
    return window_group(replace(settings_from(load_config(env={})), scrape_interval_s=scrape_s))


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def backfill_window_rules(tmp: Path, blocks: Path, scrape_s: float, start_s: int, end_s: int
                          ) -> dict[str, Any]:  # fmt: skip
    """Add the group's recorded series over ``[start_s, end_s]`` to ``blocks``; returns the
    wall time and the serving Prometheus' CPU seconds it took."""
    rules = tmp / "windows.rules.yml"
    rules.write_text(to_yaml([window_rules(scrape_s)]))
    t = time.perf_counter()
    with start_prometheus(tmp / "raw", [], blocks=blocks, ready_timeout_s=300,
                          extra_args=("--query.max-samples=500000000",)) as raw:  # fmt: skip
        p0 = proc_cpu(raw.proc.pid)
        r = subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "rules", f"--start={start_s}",
             f"--end={end_s}", f"--url={raw.url}", f"--output-dir={tmp / 'rule-blocks'}",
             str(rules)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if r.returncode:
            raise SystemExit(r.stdout[-2000:] + r.stderr[-2000:])
        cpu = proc_cpu(raw.proc.pid) - p0
    for b in (tmp / "rule-blocks").iterdir():
        shutil.copytree(b, blocks / b.name)
    return {"backfill_s": round(time.perf_counter() - t, 1),
            "backfill_prometheus_cpu_s": round(cpu, 1)}  # fmt: skip
