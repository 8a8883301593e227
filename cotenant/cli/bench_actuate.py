"""``cotenant bench --actuate``: the closed-loop benchmark (:mod:`evaluation.closed_loop`)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from cotenant.core.errors import UsageError


def _f(x: float | None, fmt: str = "{:.0f}") -> str:
    return "—" if x is None else fmt.format(x)


def bench_actuate(names: list[str], json_out: Path | None, *, policy: Path | None = None) -> int:
    """Run and score each scenario; print a table and the goals; 0 even when goals are not
    met (the figures are the result). ``policy``: the actuation policy file (default: the
    bundled one). Raises UsageError for a scenario that is not found or has no fault and victim
    to act on, ConfigError for a bad policy."""
    from dataclasses import replace

    from cotenant.actuators.policy import load_policy
    from cotenant.evaluation.actuation_score import minimum_limit, roles, score, side_by_side
    from cotenant.evaluation.closed_loop import START_NS, run_closed_loop
    from cotenant.simulator.output import run as simulate
    from cotenant.simulator.scenario_load import SCENARIOS_DIR, find_scenario, load_scenario

    paths = (
        [find_scenario(n) for n in names] if names else sorted(SCENARIOS_DIR.glob("actuate_*.yaml"))
    )
    if not paths:
        raise UsageError("no actuate_*.yaml scenarios bundled")
    pol = load_policy(policy)
    t0 = time.monotonic()
    scores = []
    compared: dict[str, list[dict[str, Any]]] = {}
    for p in paths:
        s = load_scenario(p)
        victim, culprit, _, _ = roles(s)  # fail early when it has nothing to act on

        def progress(msg: str) -> None:
            print(msg, file=sys.stderr, flush=True)

        run = run_closed_loop(s, policy=pol, progress=progress)
        baseline = simulate(s, start_ns=START_NS).requests
        limitable = any(m.name == culprit for m in s.models)
        minimum = minimum_limit(s) if s.actuation.expect == "recover" and limitable else None
        sc = score(run, without_loop=baseline, minimum=minimum)
        scores.append(sc)
        if pol.reroute is not None and any(m.replicas for m in s.models if m.name == victim):
            # side by side: the same loop without reroute (throttling only) and no loop
            only = run_closed_loop(s, policy=replace(pol, reroute=None), progress=progress)
            runs = {"throttling only": score(only, without_loop=baseline), "with reroute": sc}
            compared[s.name] = side_by_side(s, baseline, runs)
        progress(f"{s.name}: scored in {run.wall_s:.1f} s (closed loop)")
    head = (
        f"{'scenario':26s} {'expect':8s} {'diag':>5s} {'apply':>5s} {'back':>5s} "
        f"{'fault->':>7s} {'diag->':>6s} {'no-loop':>7s} {'limit':>6s} {'minrate':>7s} "
        f"{'lost':>6s} {'min':>6s} "
        f"{'ratio':>5s} {'chg/10m':>7s} {'rb':>3s} {'exp':>3s}  goals"
    )
    print(head)
    for sc in scores:
        print(
            f"{sc.scenario[:26]:26s} {sc.expect:8s} {_f(sc.diagnosed_s):>5s} "
            f"{_f(sc.applied_s):>5s} {_f(sc.recovered_s):>5s} "
            f"{_f(sc.recover_from_fault_s):>7s} {_f(sc.recover_from_diagnosis_s):>6s} "
            f"{_f(sc.recovered_without_loop_s):>7s} "
            f"{_f(sc.applied_rate_rps, '{:.1f}'):>6s} {_f(sc.minimum_rate_rps, '{:.1f}'):>7s} "
            f"{_f(sc.culprit_lost_fraction, '{:.3f}'):>6s} "
            f"{_f(sc.minimum_lost_fraction, '{:.3f}'):>6s} {_f(sc.loss_ratio, '{:.2f}'):>5s} "
            f"{sc.max_changes_per_10min:>7d} {sc.rollbacks:>3d} {sc.expiries:>3d}  "
            + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in sc.goals.items())
        )
    print(
        "diag/apply/back: victim diagnosed, change applied, victim back under its SLO (s); "
        "fault->/diag->: s from the fault's start / the diagnosis to back; no-loop: back "
        "without the loop; limit/minrate: rate the loop set / largest constant rate that "
        "restores the SLO (rps); lost/min: share of the culprit's requests refused by the "
        "loop / by that minimum; ratio: lost/min; chg/10m: most changes to one target in 10 "
        "simulated minutes; rb/exp: rollbacks/expiries"
    )
    if compared:
        print(
            f"\n{'scenario':26s} {'variant':16s} {'back':>5s} {'victim>SLO':>10s} "
            f"{'others>SLO':>10s} {'changes':>7s} {'rb':>3s}"
        )
        for name, rows in compared.items():
            for r in rows:
                print(
                    f"{name[:26]:26s} {r['variant']!s:16s} "
                    f"{_f(r['back_from_fault_s']):>5s} {_f(r['victim_over_slo_s']):>10s} "
                    f"{_f(r['others_over_slo_s']):>10s} {r['changes']!s:>7s} {r['rollbacks']!s:>3s}"
                )
        print(
            "back: s from the fault's start to the victim back under its SLO (— not before "
            "the run ended); victim>SLO, others>SLO: seconds their 10-s p99 was over their "
            "SLO after the fault started; changes: applies and reverts; rb: rollbacks"
        )
    met = sum(1 for sc in scores if sc.met)
    print(
        f"\n{met}/{len(scores)} scenarios meet every goal; times in simulated seconds from "
        f"the run's start; whole bench {time.monotonic() - t0:.0f} s"
    )
    if json_out is not None:
        out = [{**sc.to_dict(), "side_by_side": compared.get(sc.scenario)} for sc in scores]
        json_out.write_text(json.dumps(out, indent=2, default=str))
    return 0
