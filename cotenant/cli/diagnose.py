"""``cotenant diagnose``: why was a model slow between two times?"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cotenant.cli.remote import call_api
from cotenant.core.errors import CotenantError
from cotenant.core.timespec import format_ns, parse_time_ns


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "diagnose",
        help="diagnose a model's latency over a time range",
        description="Find a model's latency incidents in a range and rank "
        "their causes. Reads the store file, or a running cotenant (--url).",
    )
    p.add_argument("--model", required=True, help="the victim model")
    p.add_argument("--since", default="1h", help="start: 'now', '15m' (ago), ISO 8601, Unix s")
    p.add_argument("--until", default="now", help="end, same forms (default now)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--config", metavar="FILE", help="TOML config (SLOs, store path)")
    p.add_argument("--store", metavar="PATH", help="DuckDB store file to read")
    p.add_argument(
        "--url", metavar="URL", help="a running cotenant's API, e.g. http://127.0.0.1:8050"
    )
    p.set_defaults(func=cmd_diagnose)


def _via_url(url: str, body: dict[str, str]) -> dict[str, Any]:
    return call_api(url, "/api/v1/diagnose", body=dict(body))


def _local(args: argparse.Namespace, start: int, end: int) -> dict[str, Any]:
    from cotenant.analysis.analyzer import Analyzer
    from cotenant.analysis.incidents import IncidentBook
    from cotenant.app.config import load_config
    from cotenant.store.db import Store
    from cotenant.store.slo_record import recorded_slos
    from cotenant.store.source import StoreSource

    cfg = load_config(args.config or os.environ.get("COTENANT_CONFIG"))
    store = Store(args.store or cfg.store.path, read_only=True)
    try:
        a = Analyzer(
            StoreSource(store),
            IncidentBook(store),
            slos=cfg.slos(recorded_slos(store)),
            step_s=cfg.analysis.step_s,
            max_range_s=cfg.analysis.max_range_h * 3600,
            params=cfg.analysis.detector_params(),
        )
        return a.diagnose(args.model, start, end)
    finally:
        store.close()


def cmd_diagnose(args: argparse.Namespace) -> int:
    start = parse_time_ns(args.since, "--since")
    end = parse_time_ns(args.until, "--until")
    if end <= start:
        raise CotenantError("--until must be after --since")
    if args.url:
        result = _via_url(
            args.url, {"model": args.model, "start": str(start / 1e9), "end": str(end / 1e9)}
        )
    else:
        result = _local(args, start, end)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(render(result))
    return 0


def render(result: dict[str, Any]) -> str:
    """The diagnosis as text for a terminal."""
    lines = [f"{result['model']}: {format_ns(result['start_ns'])} .. {format_ns(result['end_ns'])}"]
    if not result.get("spans", True):
        lines.append("  (no spans: phases and locks unknown, causes from exporter series)")
    diags = result["diagnoses"]
    if not diags:
        lines.append("  no data")
    for d in diags:
        what = "incident" if d["incident"] else "no incident; the range as a whole"
        slo = f", SLO {d['slo_ms']:.0f} ms" if d.get("slo_ms") else ""
        lines.append(
            f"  {what} on {d['gpu']}: {format_ns(d['start_ns'])} .. "
            f"{format_ns(d['end_ns'])}{' (ongoing)' if d['open'] else ''}"
        )
        lines.append(
            f"    p99 peak {d['peak_p99_ms']} ms vs baseline {d['baseline_p99_ms']} ms{slo}"
        )
        grew = ", ".join(
            f"{k.removesuffix('_ms')} +{v:.1f} ms"
            for k, v in sorted(d["phases_ms"].items(), key=lambda kv: -kv[1])
            if v >= 0.05
        )
        if grew:
            lines.append(f"    grew: {grew}")
        for i, c in enumerate(d["causes"], 1):
            res = f" ({c['resource']})" if c.get("resource") else ""
            ev = c.get("evidence") or {}
            detail = ""
            if "before" in ev:
                detail = f" — {ev['series']}: {ev['before']} -> {ev['during']} {ev.get('unit', '')}"
            if ev.get("holder"):
                detail += f", held by {ev['holder']}"
            lines.append(
                f"    {i}. {c['kind']:9s} {c['culprit']}{res}  share "
                f"{c['share'] * 100:.0f}%  confidence {c['confidence']:.2f}{detail}"
            )
        first = next((c for c in d.get("first_causes") or [] if c["kind"] != "unknown"), None)
        if first is not None:
            lines.append(
                f"    found as: {first['kind']} {first['culprit']} (share "
                f"{first['share'] * 100:.0f}% of its first windows; the causes above are over "
                "the whole slowdown)"
            )
        for n in d.get("notes", []):
            lines.append(f"    note: {n}")
    return "\n".join(lines)
