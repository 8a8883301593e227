"""``cotenant simulate``: run a scenario to files, or stream it into a running cotenant."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cotenant.core.errors import UsageError
from cotenant.core.timespec import parse_time_ns

if TYPE_CHECKING:
    from cotenant.simulator.nvml_feed import FeedWriter
    from cotenant.simulator.scenario import Scenario


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
        "--nvml-feed",
        type=Path,
        metavar="PATH",
        help="with --otlp: also write the simulated GPU's counter samples to PATH as JSON "
        "lines, for an agent started with --fake-nvml PATH (docs/fleet-install.md); spans "
        "then name the GPU by its NVML UUID",
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
    from cotenant.simulator import output
    from cotenant.simulator.scenario_load import find_scenario, load_scenario

    if (args.out is None) == (args.otlp is None):
        raise UsageError("give exactly one of --out DIR or --otlp URL")
    scenario = load_scenario(find_scenario(str(args.scenario)))
    speed = _speed(args.speed)
    if args.nvml_feed is not None and args.otlp is None:
        raise UsageError("--nvml-feed goes with --otlp URL (a stream in wall time)")
    if args.nvml_feed is not None and speed is None:
        raise UsageError("--nvml-feed needs a paced stream: give --speed a number, not 'max'")
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
    from cotenant.simulator.stream import stream

    start_ns = parse_time_ns(args.start, "--start") if args.start else time.time_ns()
    feed = _Feed(args.nvml_feed, scenario, start_ns, speed) if args.nvml_feed else None
    try:
        stats = stream(
            scenario,
            args.otlp,
            speed=speed,
            start_ns=start_ns,
            progress=output.stderr_progress,
            gpu_names=None if feed is None else feed.uuids,
            on_start=None if feed is None else feed.start,
            on_tick=None if feed is None else feed.tick,
        )
    finally:
        if feed is not None:
            feed.close()
    print(
        f"{scenario.name}: streamed {stats.requests} requests "
        f"({stats.spans} spans) in {stats.wall_s:.1f} s",
        file=sys.stdout,
    )
    return 0


class _Feed:
    """``--nvml-feed``: the header when the stream starts, each tick's samples after it."""

    def __init__(self, path: Path, scenario: Scenario, start_ns: int, speed: float | None) -> None:
        from cotenant.simulator.nvml_feed import gpu_uuid

        if not path.parent.is_dir():
            raise UsageError(f"--nvml-feed {path}: directory {path.parent} does not exist")
        self.path, self.scenario, self.start_ns, self.speed = path, scenario, start_ns, speed
        self.uuids = {g.id: gpu_uuid(g.id) for g in scenario.gpus}
        self.writer: FeedWriter | None = None

    def start(self, wall_start_ns: int) -> None:
        from cotenant.simulator.nvml_feed import FeedWriter, header_for

        header = header_for(
            self.scenario,
            start_ns=self.start_ns,
            wall_start_ns=wall_start_ns,
            speed=self.speed or 1.0,
        )
        self.writer = FeedWriter(self.path, header)

    def tick(self, sim: Any, _v: float) -> None:
        g, p = sim.take_samples()
        if self.writer is not None:
            self.writer.write(g, p)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
