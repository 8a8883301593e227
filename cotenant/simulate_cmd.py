"""``cotenant simulate``: run a scenario to files, or stream it into a running cotenant."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from store.errors import UsageError
from store.timespec import parse_time_ns


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "simulate",
        help="run a simulator scenario (files or live OTLP)",
        description="Simulate a multi-tenant GPU serving scenario. With --out, "
        "write requests.parquet, gpu_samples.parquet, process_samples.parquet and "
        "truth.json; with --otlp, stream spans to a running cotenant.",
    )
    p.add_argument(
        "scenario",
        type=Path,
        help="scenario YAML, or the name of a bundled one (see docs/scenarios.md)",
    )
    p.add_argument("--out", type=Path, metavar="DIR", help="write the outputs to DIR")
    p.add_argument(
        "--otlp",
        metavar="URL",
        help="stream spans to this OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318",
    )
    p.add_argument(
        "--speed",
        default="1",
        help="virtual seconds per wall second when streaming, or 'max' (default 1)",
    )
    p.add_argument(
        "--start",
        default=None,
        help="wall-clock time of virtual 0 (ISO 8601, Unix s; default: now, or "
        "2026-01-01T00:00Z with --out)",
    )
    p.add_argument(
        "--no-truth",
        action="store_true",
        help="skip the counterfactual runs that decide each fault's victims",
    )
    p.set_defaults(func=cmd_simulate)


def _speed(text: str) -> float | None:
    if text == "max":
        return None
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0:
        raise UsageError(f"--speed {text!r}: give a positive number or 'max'")
    return v


def cmd_simulate(args: argparse.Namespace) -> int:
    from simulator import output
    from simulator.scenario_load import find_scenario, load_scenario

    if (args.out is None) == (args.otlp is None):
        raise UsageError("give exactly one of --out DIR or --otlp URL")
    scenario = load_scenario(find_scenario(str(args.scenario)))
    speed = _speed(args.speed)
    if args.out is not None:
        start_ns = parse_time_ns(args.start, "--start") if args.start else None
        t0 = time.monotonic()
        result = output.run(scenario, start_ns=start_ns, progress=output.stderr_progress)
        truth = (
            []
            if args.no_truth
            else output.truth(scenario, result, start_ns=start_ns, progress=output.stderr_progress)
        )
        paths = output.write(args.out, scenario, result, truth)
        print(
            f"{scenario.name}: {result.requests.num_rows} requests, "
            f"{result.gpu_samples.num_rows} GPU samples in {time.monotonic() - t0:.1f} s"
        )
        for p in paths:
            print(f"  wrote {p}")
        return 0
    from simulator.stream import stream

    start_ns = parse_time_ns(args.start, "--start") if args.start else time.time_ns()
    stats = stream(
        scenario, args.otlp, speed=speed, start_ns=start_ns, progress=output.stderr_progress
    )
    print(
        f"{scenario.name}: streamed {stats.requests} requests "
        f"({stats.spans} spans) in {stats.wall_s:.1f} s",
        file=sys.stdout,
    )
    return 0
