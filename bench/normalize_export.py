"""CPU of normalizing one OTLP export of ``bench/agent_metrics.py``'s shape.

Run ``.venv/bin/python bench/normalize_export.py`` (``--help``). One export is what the
overhead bench's sender posts every 200 ms at 200 requests/s: ``--requests`` (40) requests of
our convention, seven spans each (a root with ``cotenant.model`` and ``cotenant.gpu`` over six
phase children, one of them a ``lock.wait`` naming its lock and holder), encoded by the
OpenTelemetry SDK's own encoder and decoded as the OTLP receivers decode it. Each repeat
normalizes a fresh copy's spans with one long-lived :class:`collectors.otlp.normalize.Normalizer`
(``time.thread_time`` around ``normalize`` alone); the figure is the median over
``--repeats``.

``--against DIR`` compares with another checkout (e.g. a ``git worktree`` of the base
revision): ``--rounds`` runs of this script alternate between this tree and ``DIR`` (each as
a subprocess importing that tree's code), and the report gives each side's median and the
paired ratios (this tree / DIR). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _export(requests: int) -> bytes:
    """One export's body, as the SDK's OTLP/HTTP exporter would post it."""
    from spans import MS, SpanFactory

    f = SpanFactory({"service.name": "m", "host.name": "bench-node"})
    phases = [
        ("preprocess", 0, 1),
        ("queue", 1, 3),
        ("lock.wait", 3, 4),
        ("transfer.h2d", 4, 5),
        ("compute", 5, 15),
        ("transfer.d2h", 15, 16),
    ]
    now = time.time_ns()
    for i in range(requests):
        f.ours(
            f"model-{i % 4}",
            now - 20 * MS,
            18.0,
            phases,
            attrs={"cotenant.gpu": f"GPU-{i % 8}"},
            lock=("kv", "batcher"),
        )
    body: bytes = f.otlp().SerializeToString()
    return body


def measure(requests: int, repeats: int) -> dict[str, Any]:
    """Median CPU (µs) of one ``normalize`` of the export; imports the code of ``sys.path``."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    from cotenant.collectors.gpu_resolve import GpuResolver
    from cotenant.collectors.otlp.normalize import Normalizer

    body = _export(requests)
    norm = Normalizer(GpuResolver())
    msgs = []
    for _ in range(repeats + 20):
        m = ExportTraceServiceRequest()
        m.ParseFromString(body)
        msgs.append(m)
    times = []
    rows = 0
    for i, m in enumerate(msgs):
        t0 = time.thread_time()
        res = norm.normalize(m)
        dt = time.thread_time() - t0
        if i >= 20:  # warm-up
            times.append(dt * 1e6)
        rows = res.requests.num_rows
    if rows != requests or norm.pending_spans:
        raise SystemExit(f"normalized {rows} rows, {norm.pending_spans} pending: not the export")
    return {"median_us": statistics.median(times), "rows": rows, "spans": requests * 7}


def _run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=f"{root}:{ROOT / 'tests'}")
    argv = ["--requests", str(args.requests), "--repeats", str(args.repeats)]
    out = subprocess.run(
        [sys.executable, __file__, *argv],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def compare(args: argparse.Namespace) -> dict[str, Any]:
    mine: list[float] = []
    theirs: list[float] = []
    for _ in range(args.rounds):
        theirs.append(_run(args.against, args)["median_us"])
        mine.append(_run(ROOT, args)["median_us"])
    ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
    return {
        "spans": args.requests * 7,
        "this_median_us": statistics.median(mine),
        "against_median_us": statistics.median(theirs),
        "paired_ratio_median": statistics.median(ratios),
        "paired_ratios": [round(r, 3) for r in ratios],
        "this_runs_us": [round(x, 1) for x in mine],
        "against_runs_us": [round(x, 1) for x in theirs],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=40, help="requests an export (7 spans each)")
    p.add_argument("--repeats", type=int, default=300, help="normalize calls timed a run")
    p.add_argument("--against", type=Path, help="another checkout to compare with")
    p.add_argument("--rounds", type=int, default=5, help="alternating runs with --against")
    args = p.parse_args()
    if args.against is not None:
        print(json.dumps(compare(args), indent=1))
        return
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p] or [
        str(ROOT),
        str(ROOT / "tests"),
    ]
    print(json.dumps(measure(args.requests, args.repeats)))


if __name__ == "__main__":
    main()
