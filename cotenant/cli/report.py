"""``cotenant report``: the weekly contention report of one ISO week."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from cotenant.cli.argtypes import seconds
from cotenant.cli.remote import call_api
from cotenant.core.errors import ReportError


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "report",
        help="write the weekly contention report (HTML, Markdown, PDF)",
        description="Write the contention report of one ISO week into "
        "DIR/YYYY-Www/ (report.html, report.md, report.pdf, summary.json). Reads the "
        "store's rollups and incidents, or a running cotenant (--url).",
    )
    p.add_argument("--week", help="ISO week, e.g. 2026-W48 (default: the last complete week)")
    p.add_argument("--out", metavar="DIR", help="output directory (default: [report] dir)")
    p.add_argument(
        "--format",
        default=None,
        help="comma-separated formats: html, md, pdf (default: [report] formats)",
    )
    p.add_argument("--config", metavar="FILE", help="TOML config (SLOs, thresholds, store)")
    p.add_argument("--store", metavar="PATH", help="DuckDB store file to read")
    p.add_argument(
        "--url", metavar="URL", help="a running cotenant's API, e.g. http://127.0.0.1:8050"
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        default=600.0,
        metavar="DURATION",
        help="with --url: how long to wait for the report (default 10m; a fleet's week is read "
        "from Prometheus first: docs/fleet-reference.md)",
    )
    p.set_defaults(func=cmd_report)


def _via_url(url: str, week: str, timeout_s: float) -> dict[str, Any]:
    return call_api(url, f"/api/v1/reports/{week}/summary", timeout_s=timeout_s)


def cmd_report(args: argparse.Namespace) -> int:
    from cotenant.app.config import load_config
    from cotenant.app.report_builder import report_builder
    from cotenant.reports.isoweek import last_complete_week, parse_week
    from cotenant.reports.job import ReportJob
    from cotenant.reports.summary import WeekSummary
    from cotenant.reports.writer import parse_formats, write_report
    from cotenant.store.db import Store

    cfg = load_config(args.config or os.environ.get("COTENANT_CONFIG"))
    week = parse_week(args.week) if args.week else last_complete_week(time.time_ns())
    formats = parse_formats(args.format if args.format is not None else cfg.report.formats)
    out = args.out or cfg.report.dir
    if args.url and args.store:
        raise ReportError("give either --store or --url, not both")
    if args.url:
        summary = WeekSummary.from_dict(_via_url(args.url, str(week), args.timeout))
        paths = write_report(summary, out, formats)
    else:
        path = args.store or cfg.store.path
        if path != ":memory:" and not os.path.exists(path):
            raise ReportError(f"store {path} does not exist: pass --store or --config")
        store = Store(path, read_only=True)
        try:
            paths = ReportJob(report_builder(cfg, store), out, formats).run(week)
        finally:
            store.close()
    for kind, p in paths.items():
        print(f"{kind}\t{p}")
    return 0
