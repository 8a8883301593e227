"""``cotenant bench``: accuracy of the diagnosis on scenario suites and tabular cases."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from cotenant.core.errors import UsageError
from cotenant.evaluation.goal import GOAL_MARGIN_MS, GOAL_RATE_RPS, GOAL_RATIO, GOAL_S

BASELINES = ("nsigma", "baro")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench",
        help="score the diagnosis on scenarios or tabular cases",
        description="Run every scenario in a suite through the simulator and "
        "the analysis and print AC@1, AC@3, Avg@5, detection delay, false "
        "incidents per hour and analysis time, side by side with baselines.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--suite", type=Path, metavar="DIR", help="folder of scenario YAML files")
    src.add_argument(
        "--actuate",
        nargs="*",
        metavar="SCENARIO",
        help="closed-loop benchmark: run the analysis and the control loop (auto mode, "
        "simulator backend) on these scenarios (names or files; default: the bundled "
        "actuate_* scenarios) and score recovery time, culprit loss, changes, rollbacks and "
        "expiries",
    )
    src.add_argument(
        "--tabular",
        type=Path,
        metavar="DIR",
        help="folder of tabular cases (data.csv + label.json per case)",
    )
    src.add_argument(
        "--population",
        choices=("dev", "test", "library"),
        help="score a generated scenario population (dev: to tune on; test: to report on) or "
        "the bundled library, strictly per victim, through the batch path (on-demand "
        "diagnosis) or, with --live, the live loop; see docs/accuracy.md",
    )
    src.add_argument(
        "--gentd26",
        type=Path,
        nargs="?",
        const=Path(),
        metavar="DIR",
        help="the Alibaba GenTD26 trace in DIR (default: ../shared/data/alibaba-gentd26 "
        "beside the checkout) through the product (imported, then diagnosed per model), "
        "scored on the trace's second half: recall of unambiguous spikes, precision, cause "
        "enrichment over first-half base rates, share of excess explained; the trace's own "
        "spike detector beside it",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="with --suite or --population: replay each scenario through the live analysis "
        "loop (the code cotenant serve runs, on a virtual clock) and score the incident "
        "stream people see: one incident per fault and victim, coverage, premature "
        "resolutions, first and final cause, within-SLO victims, false incidents",
    )
    p.add_argument(
        "--count",
        type=int,
        default=300,
        help="with --population dev|test: faulted scenarios to run (default 300)",
    )
    p.add_argument(
        "--start",
        type=int,
        default=0,
        help="with --population dev|test: index of the first faulted scenario (default 0)",
    )
    p.add_argument(
        "--controls-hours",
        type=float,
        default=20.0,
        help="with --population dev|test: hours of fault-free controls to add (default 20)",
    )
    p.add_argument(
        "--jobs", type=int, default=2, help="with --population: worker processes (default 2)"
    )
    p.add_argument(
        "--write",
        type=Path,
        metavar="DIR",
        help="with --population dev|test: write the drawn scenarios as YAML files into DIR "
        "instead of running them",
    )
    p.add_argument(
        "--baselines",
        default=",".join(BASELINES),
        help=f"comma-separated baselines to run side by side ({', '.join(BASELINES)}; '' for none)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        metavar="FILE",
        help="with --actuate: the actuation policy (default: the bundled "
        "cotenant/rules/policy.yaml)",
    )
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the results here")
    p.set_defaults(func=cmd_bench)


def rankers(names: str) -> list[Any]:
    """The baseline rankers named in ``names`` (comma separated)."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BASELINES]
    if unknown:
        raise UsageError(
            f"unknown baseline {', '.join(unknown)}: choose from {', '.join(BASELINES)}"
        )
    from cotenant.analysis.baselines import make_ranker

    return [make_ranker(n) for n in wanted]


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def cmd_bench(args: argparse.Namespace) -> int:
    if args.actuate is not None:
        from cotenant.cli.bench_actuate import bench_actuate

        return bench_actuate(args.actuate, args.json, policy=args.policy)
    if args.policy is not None:
        raise UsageError("--policy applies only to --actuate")
    if args.gentd26 is not None:
        return _bench_gentd26(args.gentd26, args.json)
    if args.tabular is not None:
        from cotenant.evaluation.tabular_cases import bench_tabular, render_tabular

        tab = bench_tabular(args.tabular, baselines=rankers(args.baselines))
        print(render_tabular(tab))
        if args.json:
            args.json.write_text(json.dumps(tab, indent=2, default=str))
        return 0
    if args.population is not None:
        from cotenant.cli.population import bench_population

        return bench_population(args)
    if args.live and args.suite is None:
        raise UsageError("--live applies only to --suite or --population")
    from cotenant.evaluation.accuracy import run_suite, summarize

    paths = sorted(args.suite.glob("*.yaml")) if args.suite.is_dir() else [args.suite]
    if not paths:
        raise UsageError(f"no scenario files (*.yaml) in {args.suite}")
    if args.live:
        return _bench_live(paths, args.json)
    rs = rankers(args.baselines)
    methods = ["cotenant", *(r.name for r in rs)]
    t0 = time.monotonic()
    results = run_suite(paths, rs, progress=lambda m: print(m, file=sys.stderr, flush=True))
    summary = summarize(results, methods)
    head = f"{'scenario':52s} {'fault':22s} " + " ".join(f"{m:>9s}" for m in methods) + "  delay"
    print(head)
    for r in results:
        for f in r.faults:
            ranks = " ".join(
                f"{(str(f.ranks.get(m)) if f.ranks.get(m) else 'miss'):>9s}" for m in methods
            )
            print(
                f"{r.name[:52]:52s} {(f.kind + ':' + f.culprit)[:22]:22s} {ranks}  "
                f"{_fmt(f.delay_s)}"
            )
        if not r.faults:
            print(
                f"{r.name[:52]:52s} {'(no fault with victims)':22s} "
                f"{'':>9s}  false incidents: {r.false_incidents}"
            )
    print()
    for m in methods:
        s = summary[m]
        print(f"{m:>10s}: AC@1 {s['AC@1']:.3f}  AC@3 {s['AC@3']:.3f}  Avg@5 {s['Avg@5']:.3f}")
    print(
        f"faults with victims: {summary['faults']} in {summary['scenarios']} scenarios; "
        f"detected {summary['detected']}; median detection delay "
        f"{_fmt(summary['median_delay_s'])} s"
    )
    print(
        f"false incidents per simulated hour: {summary['false_per_hour']:.2f} overall, "
        f"{_fmt(summary['false_per_hour_controls'])} on fault-free controls"
    )
    print(
        f"bystanders named: {summary['bystander_named']} of {summary['fault_incidents']} "
        f"incidents during faults give a share to a model that is no fault's culprit "
        f"({summary['bystander_first']} rank it first)"
    )
    print(
        f"within-SLO victims {summary['within_slo_victims']} (slowed {GOAL_RATIO:g}x, "
        f"{GOAL_MARGIN_MS:g} ms, {GOAL_S:g} s, {GOAL_RATE_RPS:g} req/s or more): found "
        f"{_fmt(summary['within_found'])}, attributed {_fmt(summary['within_attributed'])}"
    )
    print(f"analysis time {summary['analysis_s']:.1f} s; whole bench {time.monotonic() - t0:.0f} s")
    if args.json:
        out = {
            "summary": summary,
            "scenarios": [
                {
                    "name": r.name,
                    "hours": r.hours,
                    "incidents": r.incidents,
                    "false_incidents": r.false_incidents,
                    "bystander_named": r.bystander_named,
                    "analysis_s": r.analysis_s,
                    "faults": [f.__dict__ for f in r.faults],
                    "within": [v.__dict__ for v in r.within],
                }
                for r in results
            ],
        }
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0


def _bench_live(paths: list[Path], out: Path | None) -> int:
    from cotenant.evaluation import live

    t0 = time.monotonic()
    results = live.run_suite(paths, progress=lambda m: print(m, file=sys.stderr, flush=True))
    summary = live.summarize(results)
    print(live.render(results, summary))
    print(f"whole bench {time.monotonic() - t0:.0f} s")
    if out:
        out.write_text(
            json.dumps(
                {
                    "summary": summary,
                    "scenarios": [
                        {
                            "name": r.name,
                            "hours": r.hours,
                            "incidents": r.incidents,
                            "false_incidents": r.false_incidents,
                            "victims": [v.__dict__ for v in r.victims],
                            "events": r.events,
                        }
                        for r in results
                    ],
                },
                indent=2,
                default=str,
            )
        )
    return 0


def _bench_gentd26(folder: Path, out: Path | None) -> int:
    from cotenant.evaluation.gentd26_product import bench, render

    result = bench(None if folder == Path() else folder)
    print(render(result))
    if out:
        out.write_text(json.dumps(result, indent=2, default=str))
    return 0
