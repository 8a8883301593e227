"""``cotenant import-gentd26``: the Alibaba GenTD26 trace into an embedded store."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TextIO


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "import-gentd26",
        help="import the Alibaba GenTD26 trace into a store",
        description="Import the Alibaba GenTD26 trace (one .tar.gz per series) into an "
        "embedded store as cotenant's collectors would have written it: one request per "
        "container and 57 s step (its mean e2e, queue and load time), every base-model, LoRA "
        "and ControlNet load, pod GPU duty cycle and memory; the container is the replica, "
        "GPU and process. Then `cotenant report --store FILE --week ...` reads it. The "
        "mapping: docs/gentd26.md.",
    )
    p.add_argument(
        "dir",
        nargs="?",
        type=Path,
        metavar="DIR",
        help="the trace's folder (default: ../shared/data/alibaba-gentd26 beside the checkout)",
    )
    p.add_argument("--store", required=True, metavar="FILE", help="DuckDB store to write")
    p.add_argument(
        "--end",
        metavar="TIME",
        help="shift the trace so its last step is at TIME ('now', ISO 8601, Unix seconds); "
        "default: keep its own (anonymised, 2022) clock. A store `cotenant serve` will open "
        "needs 'now', or retention deletes the rows",
    )
    p.add_argument(
        "--containers",
        metavar="HASH,...",
        help="import only these containers (container_ip hashes or unique prefixes)",
    )
    p.add_argument("--hours", type=float, metavar="H", help="import only the trace's first H hours")
    p.add_argument(
        "--openmetrics",
        type=Path,
        metavar="FILE",
        help="also write the imported minutes as the series a fleet's Prometheus records "
        "(rules/fleet.rules.yml), for `promtool tsdb create-blocks-from openmetrics FILE DIR`",
    )
    p.set_defaults(func=cmd_import_gentd26)


class ProgressLine:
    """The import's progress on ``out``: a bar redrawn in place on a terminal, else a line at
    each quarter (logs stay short)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._t0 = time.perf_counter()
        self._quarter = 0

    def __call__(self, done: int, total: int, rows: int) -> None:
        frac = done / total if total else 1.0
        text = (
            f"importing: {done}/{total} steps ({100 * frac:.0f} %), {rows:,} rows, "
            f"{time.perf_counter() - self._t0:.1f} s"
        )
        if self._tty:
            bar = "#" * int(30 * frac)
            self._out.write(f"\r[{bar:<30}] {text}")
            if done >= total:
                self._out.write("\n")
        elif int(4 * frac) > self._quarter or done >= total:
            self._quarter = int(4 * frac)
            self._out.write(text + "\n")
        self._out.flush()


def cmd_import_gentd26(args: argparse.Namespace) -> int:
    from cotenant.collectors.prometheus.backfill import write_openmetrics
    from cotenant.core.timerange import TimeRange
    from cotenant.core.timespec import parse_time_ns
    from cotenant.evaluation.gentd26 import iso
    from cotenant.evaluation.gentd26_import import import_folder
    from cotenant.reports.isoweek import week_of
    from cotenant.store.db import Store

    end_s = None if args.end is None else parse_time_ns(args.end, "--end") // 1_000_000_000
    containers = [c.strip() for c in args.containers.split(",")] if args.containers else None
    print(f"reading {args.dir or 'the default GenTD26 folder'} ...", file=sys.stderr)
    with Store(os.fspath(args.store)) as store:
        r = import_folder(
            store,
            args.dir,
            containers=containers,
            hours=args.hours,
            end_s=end_s,
            progress=ProgressLine(sys.stderr),
        )
        print(
            f"imported {r.containers} containers, {r.steps} steps "
            f"({iso(r.start_ns / 1e9)} .. {iso(r.end_ns / 1e9)}, shifted {r.shift_s:+d} s) "
            f"into {args.store}"
        )
        for table, n in r.rows.items():
            print(f"  {table:16s} {n:9,d} rows")
        if args.openmetrics is not None:
            t0 = time.perf_counter()
            rng = TimeRange(r.start_ns, r.end_ns + 60_000_000_000)
            n = write_openmetrics(store, args.openmetrics, rng)
            print(
                f"wrote {n:,} samples of the fleet's recorded series to {args.openmetrics} "
                f"({time.perf_counter() - t0:.1f} s); backfill: promtool tsdb "
                f"create-blocks-from openmetrics {args.openmetrics} DATA_DIR (Prometheus keeps "
                "them only within its --storage.tsdb.retention.time: docs/gentd26.md)"
            )
    weeks = sorted({str(week_of(r.start_ns)), str(week_of(r.end_ns))})
    print(f"read {r.read_s:.1f} s, write {r.write_s:.1f} s, rollups {r.rollup_s:.1f} s")
    for w in weeks:
        print(f"report: cotenant report --store {args.store} --week {w}")
    return 0
