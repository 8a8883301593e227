"""``cotenant bench --population dev|test|library [--live]``: a scenario population, scored
strictly per victim (:mod:`evaluation.population_bench`); the figures on stdout, progress on
stderr, everything with ``--json``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cotenant.core.errors import UsageError


def bench_population(args: argparse.Namespace) -> int:
    from cotenant.evaluation.distributions import GENERATOR_VERSION
    from cotenant.evaluation.population_bench import machine, plan, run_jobs
    from cotenant.evaluation.population_summary import render, score_json, summarize

    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be 1 or more")
    if args.controls_hours < 0:
        raise UsageError(f"--controls-hours {args.controls_hours}: must be 0 or more")
    if args.write is not None:
        return _write(args)
    jobs = plan(
        args.population,
        count=args.count,
        controls_hours=args.controls_hours,
        start=args.start,
        live=args.live,
    )
    print(
        f"{len(jobs)} scenarios of the {args.population} population, "
        f"{'live loop' if args.live else 'batch path'}, {args.jobs} jobs",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    scores = run_jobs(jobs, args.jobs, progress=lambda m: print(m, file=sys.stderr, flush=True))
    wall = time.perf_counter() - t0
    summary = summarize(scores)
    print(render(summary, live=args.live))
    where = machine()
    print(
        f"\n{len(scores)} scenarios in {wall:.0f} s wall ({summary['cpu_s_sum']:.0f} CPU s) "
        f"with {args.jobs} jobs on {where['nproc']} CPUs"
    )
    if args.json:
        doc = {
            "command": " ".join(["cotenant", *sys.argv[1:]]),
            "population": args.population,
            "generator_version": GENERATOR_VERSION,
            "path": "live" if args.live else "batch",
            "count": args.count,
            "start": args.start,
            "controls_hours": args.controls_hours,
            "jobs": args.jobs,
            "machine": where,
            "wall_s": wall,
            "summary": summary,
            "scenarios": [score_json(s) for s in scores],
        }
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    return 1 if summary["scenarios"]["errors"] else 0


def _write(args: argparse.Namespace) -> int:
    from cotenant.evaluation.population import (
        controls_for_hours,
        draw_spec,
        materialise,
        population_indices,
        scenario_yaml,
    )

    if args.population == "library":
        raise UsageError("--write applies to --population dev or test")
    out: Path = args.write
    out.mkdir(parents=True, exist_ok=True)
    todo = [("faulted", i) for i in population_indices(args.count, args.start)]
    todo += [("control", i) for i in controls_for_hours(args.population, args.controls_hours)]
    for kind, i in todo:
        spec = draw_spec(args.population, i, kind)  # type: ignore[arg-type]
        path = out / f"{spec.name}.yaml"
        path.write_text(scenario_yaml(materialise(spec), spec))
        print(path)
    return 0
