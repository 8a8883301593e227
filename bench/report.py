"""Weekly report speed: a week at 4 models x 50 rps (about 120M requests) through rollups.

Goal: the report of one week in <= 30 s on one core.

    .venv/bin/python bench/report.py [--repeats 5] [--rps 50] [--pdf]

Setup (untimed): ``simulator.week`` draws two weeks (2026-W47 and W48, for week-over-week) of
four models on two GPUs at ``--rps`` each, with six faults in W48 and two in W47, into a DuckDB
file; cotenant's analysis (``reports.backfill``) finds the incidents; twenty actions are
recorded. Timed, pinned to one core with DuckDB on one thread and the default 128 MB memory
limit: building the summary (every section, both weeks) and writing HTML + Markdown +
summary.json. ``--pdf`` also times the PDF (Chromium runs as its own processes, unpinned).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotenant.core.slos import Slos
from cotenant.reports.backfill import backfill_incidents
from cotenant.reports.compute import ReportBuilder
from cotenant.reports.isoweek import parse_week
from cotenant.reports.writer import write_report
from cotenant.simulator.week import (
    WeekFault,
    WeekGpu,
    WeekModel,
    WeekProcess,
    WeekSpec,
    simulate_week,
    write_week,
)
from cotenant.store.db import Store

DAY, HOUR = 86_400.0, 3_600.0


def spec(rps: float) -> WeekSpec:
    w = 7 * DAY
    models = (
        WeekModel("chat", "gpu-0", rps, compute_ms=30, slo_ms=150, sm_util=25),
        WeekModel("embed", "gpu-0", rps, compute_ms=5, slo_ms=40, sm_util=15),
        WeekModel("tts", "gpu-1", rps, compute_ms=20, slo_ms=100, sm_util=20),
        WeekModel("rerank", "gpu-1", rps, compute_ms=8, slo_ms=50, sm_util=10),
    )
    faults = (
        WeekFault("cotenant_burst", 2 * DAY + 10 * HOUR, HOUR, target="embed", factor=4),
        WeekFault("throttle", 5 * DAY, HOUR, gpu="gpu-0", clock_factor=0.6),
        WeekFault("cotenant_burst", w + DAY + 10 * HOUR, HOUR, target="embed", factor=4),
        WeekFault("process_active", w + 2 * DAY + 14 * HOUR, 1.5 * HOUR, target="train", level=0.7),
        WeekFault("bandwidth_hog", w + 3 * DAY + 9 * HOUR, HOUR, target="copy", level=0.8),
        WeekFault("throttle", w + 4 * DAY + 3 * HOUR, 0.75 * HOUR, gpu="gpu-1", clock_factor=0.6),
        WeekFault("load_surge", w + 5 * DAY + 12 * HOUR, HOUR, target="tts", factor=3),
        WeekFault("process_active", w + 6 * DAY + 2 * HOUR, 2 * HOUR, target="train", level=0.6),
    )
    return WeekSpec(
        start_ns=parse_week("2026-W47").start_ns,
        days=14,
        gpus=(WeekGpu("gpu-0"), WeekGpu("gpu-1")),
        models=models,
        processes=(WeekProcess("train", "gpu-1", memory_gib=20), WeekProcess("copy", "gpu-0")),
        faults=faults,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rps", type=float, default=50.0)
    ap.add_argument("--pdf", action="store_true", help="also time the PDF (Chromium)")
    ap.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)))
    a = ap.parse_args()
    os.sched_setaffinity(0, {a.cpu})
    week = parse_week("2026-W48")
    s = spec(a.rps)
    slo = {m.name: float(m.slo_ms or 0) for m in s.models}
    with tempfile.TemporaryDirectory(prefix="cotenant-bench-report-") as tmp:
        path = Path(tmp) / "cotenant.duckdb"
        t0 = time.perf_counter()
        store = Store(path, threads=1)
        write_week(store, simulate_week(s))
        backfill_incidents(store, s.start_ns, s.end_ns, slo_ms=slo)
        with store.cursor() as cur:
            ids = [r[0] for r in cur.execute("SELECT id, start_ns FROM incidents").fetchall()]
            for n, iid in enumerate(ids[:20]):
                state = ("verified", "rolled_back", "proposed", "failed")[n % 4]
                created = week.start_ns + (n + 1) * 6 * 3600 * 10**9
                cur.execute(
                    f"INSERT INTO actions VALUES ({', '.join('?' * 12)})",
                    [
                        f"a{n}",
                        iid,
                        "rate_limit",
                        "embed",
                        "gateway",
                        state,
                        created,
                        created,
                        "{}",
                        "{}",
                        "{}",
                        "bench",
                    ],
                )
            (rows,) = cur.execute(
                "SELECT sum(count) FROM request_rollup_1m WHERE minute_ns >= ? AND minute_ns < ?",
                [week.start_ns, week.end_ns],
            ).fetchone() or (0,)
        store.close()
        print(
            f"setup {time.perf_counter() - t0:.1f} s; the week holds {rows:,} requests "
            f"in rollups; {len(ids)} incidents over both weeks"
        )
        store = Store(path, threads=1, read_only=True)
        times, sizes = [], {}
        for i in range(a.repeats):
            out = Path(tmp) / f"out{i}"
            t = time.perf_counter()
            summary = ReportBuilder(store, slos=Slos.of_maps(slo)).build(week)
            paths = write_report(summary, out, ("html", "md"))
            times.append(time.perf_counter() - t)
            sizes = {k: p.stat().st_size for k, p in paths.items()}
        med = statistics.median(times)
        print(
            f"report (summary + html + md), one core: median {med:.2f} s of {a.repeats} "
            f"({', '.join(f'{x:.2f}' for x in times)}); goal <= 30 s: "
            f"{'met' if med <= 30 else 'NOT met'} ({30 / med:.0f}x under)"
        )
        print("sizes:", json.dumps(sizes))
        print(
            f"W48: {summary.totals.incidents} incidents, culprits "
            + ", ".join(
                f"{c.culprit} ({c.main_kind}, {c.victim_minutes:.0f} min)" for c in summary.culprits
            )
            + f"; {len(summary.recommendations)} recommendations"
        )
        if a.pdf:
            t = time.perf_counter()
            write_report(summary, Path(tmp) / "pdf", ("pdf",))
            print(f"pdf (Chromium): {time.perf_counter() - t:.2f} s")
        store.close()


if __name__ == "__main__":
    main()
