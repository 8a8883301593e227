"""``cotenant rca-table CASE``: rank the entities of a wide metrics table as root causes."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from cotenant.core.timespec import parse_time_ns


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "rca-table",
        help="rank the entities of a wide CSV as root causes of an anomaly",
        description="CASE is a folder holding data.csv (a 'time' column in Unix seconds, then "
        "<entity>_<metric> columns) and optionally inject_time.txt, or a CSV file. Without an "
        "inject time (or with one outside the table) the anomaly start is a change point of "
        "the front door's latency, else its largest rise (said to be weak). See "
        "docs/tabular.md.",
    )
    p.add_argument("case", type=Path, metavar="CASE", help="case folder or CSV file")
    p.add_argument(
        "--inject-time",
        metavar="T",
        help="anomaly start: Unix seconds or ISO 8601 (overrides inject_time.txt)",
    )
    p.add_argument(
        "--json", action="store_true", help='print {"ranks": [...], "scores": {...}} only'
    )
    p.set_defaults(func=cmd_rca_table)


def cmd_rca_table(args: argparse.Namespace) -> int:
    from cotenant.analysis.tabular import rca_table

    inject = None
    if args.inject_time is not None:
        inject = parse_time_ns(args.inject_time, "--inject-time") / 1e9
    result = rca_table(args.case, inject)
    if args.json:
        json.dump(result.to_json(), sys.stdout)
        sys.stdout.write("\n")
        return 0
    when = datetime.fromtimestamp(result.anomaly_start, tz=UTC).isoformat().replace("+00:00", "Z")
    how = {
        "inject-time": "inject time",
        "change-point": f"change point in {result.anomaly_metric}",
        "largest-rise": f"largest rise of {result.anomaly_metric}: weak",
    }[result.start_from]
    out = [
        f"anomaly from {when} ({how})",
        f"{'rank':>4s}  {'entity':24s} {'score':>9s}  {'kind':10s} evidence",
    ]
    for i, entity in enumerate(result.ranks, 1):
        ev = result.evidence.get(entity)
        kind, detail = "-", "-"
        if ev is not None:
            kind = str(ev.kind)
            detail = f"{ev.metric}  {ev.before:.4g} -> {ev.during:.4g} ({ev.direction})"
            if ev.capacity:
                detail += "  capacity lost while busy"
            if ev.inherited > 0:
                detail += f"  ({ev.inherited:.0%} of it from its calls)"
        score = result.scores[entity]
        out.append(f"{i:>4d}  {entity[:24]:24s} {score:9.2f}  {kind:10s} {detail}")
    out += [f"note: {n}" for n in result.notes]
    print("\n".join(out))
    return 0
