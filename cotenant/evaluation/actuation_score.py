"""Scoring a closed-loop run (``cotenant bench --actuate``) against the issue's goals.

Per scenario (its first fault is the one acted on; the victim is the first model with an SLO
that is not the culprit):

* **recovery** — the victim's p99 over a sliding ``P99_WINDOW_S`` window, evaluated every
  second; it is *back under its SLO* at the first second after its first breach from which
  the window p99 stays at or under the SLO for ``HOLD_S`` seconds (or to the end of the run).
  Reported from the fault's start and from the diagnosis (the first incident the analysis
  loop opened for the victim after the fault started).
* **culprit loss** — the fraction of the culprit's offered requests refused while the loop's
  limit acted during the fault, against the *minimum*: the fraction refused by the largest
  constant rate limit that, applied for the whole fault, keeps the victim's p99 over the fault
  (after ``P99_WINDOW_S`` for queues to drain) at or under its SLO — found by bisection over
  rates in the simulator (:func:`minimum_limit`).
* **the limit** the loop set (its first change on the culprit), beside the minimum's rate;
* **changes per target** — applies and reverts in any 600 simulated seconds (<= 2: no
  oscillation; the later steps of one ``reroute`` are not new changes); **rollbacks** and
  **expiries** of applied changes.
* **harm to others** — for every other model with an SLO, the seconds (after the fault's
  start) its window p99 is over its SLO with the loop, less those without it; ``harm_s`` sums
  what the loop added.

Goals by the scenario's ``loop.expect``: ``recover`` — back under SLO within 60 s of the
diagnosis, and loss within 1.5x the minimum when the loop limited the culprit, or no other
model pushed over its SLO when it moved the victim's traffic (``reroute``); ``rollback`` —
the change on the culprit is rolled back; ``expire`` — it expires at its TTL and the victim
stays under its SLO afterwards; ``refrain`` — no change is kept (each one applied is rolled
back) and no other model is pushed over its SLO.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cotenant.core.errors import UsageError
from cotenant.core.slos import breach
from cotenant.evaluation.closed_loop import START_NS, ClosedLoopRun
from cotenant.simulator.engine import Simulation
from cotenant.simulator.ground_truth import truth_cause
from cotenant.simulator.output import requests_table
from cotenant.simulator.scenario import Scenario

P99_WINDOW_S = 10.0
HOLD_S = 30.0
OSCILLATION_WINDOW_S = 600.0
MAX_CHANGES = 2
RECOVER_GOAL_S = 60.0
LOSS_GOAL_RATIO = 1.5
BISECT_STEPS = 8


@dataclass
class Score:
    scenario: str
    expect: str
    victim: str
    culprit: str
    cause: str
    slo_ms: float
    fault_start_s: float
    fault_end_s: float
    diagnosed_s: float | None = None
    applied_s: float | None = None
    applied_rate_rps: float | None = None
    recovered_s: float | None = None
    recovered_without_loop_s: float | None = None
    recover_from_fault_s: float | None = None
    recover_from_diagnosis_s: float | None = None
    culprit_lost_fraction: float | None = None
    minimum_lost_fraction: float | None = None
    minimum_rate_rps: float | None = None
    loss_ratio: float | None = None
    changes: dict[str, int] = field(default_factory=dict)
    max_changes_per_10min: int = 0
    rollbacks: int = 0
    expiries: int = 0
    breach_after_expiry: bool | None = None
    rerouted: bool = False
    victim_over_slo_s: float = 0.0
    others_over_slo_s: dict[str, float] = field(default_factory=dict)
    harm_s: float | None = None
    goals: dict[str, bool] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def met(self) -> bool:
        return bool(self.goals) and all(self.goals.values())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["met"] = self.met
        return d


def roles(s: Scenario) -> tuple[str, str, str, float]:
    """(victim, culprit, cause kind, victim SLO ms) of the scenario's first fault. Raises
    UsageError when the scenario has no fault or no victim with an SLO."""
    if not s.faults:
        raise UsageError(f"scenario {s.name}: no fault to act on")
    cause = truth_cause(s.faults[0], s)
    victim = next(
        (m for m in s.models if m.slo_p99_ms is not None and m.name != cause.culprit), None
    )
    if victim is None or victim.slo_p99_ms is None:
        raise UsageError(f"scenario {s.name}: no model with an SLO besides the culprit")
    return victim.name, cause.culprit, cause.kind, float(victim.slo_p99_ms)


def rolling_p99(
    requests: pa.Table, model: str, start_ns: int, duration_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """(t seconds 1..duration, p99 ms of ``model``'s requests ending in ``[t - P99_WINDOW_S,
    t)``; NaN where that window holds fewer than 5 requests)."""
    mine = pc.equal(requests.column("model"), model)
    sub = requests.filter(mine)
    end = (sub.column("ts_end_ns").to_numpy() - start_ns) / 1e9
    lat = sub.column("latency_ms").to_numpy()
    order = np.argsort(end, kind="stable")
    end, lat = end[order], lat[order]
    ts = np.arange(1.0, math.floor(duration_s) + 1.0)
    lo = np.searchsorted(end, ts - P99_WINDOW_S, side="left")
    hi = np.searchsorted(end, ts, side="left")
    out = np.full(len(ts), np.nan)
    for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        if b - a >= 5:
            out[i] = float(np.percentile(lat[a:b], 99))
    return ts, out


def recovery(
    ts: np.ndarray, p99: np.ndarray, slo: float, after_s: float
) -> tuple[float | None, float | None]:
    """(first breach at or after ``after_s``, first second after it from which the window p99
    stays <= ``slo`` for HOLD_S seconds or to the end). None where there is none."""
    over = breach(p99, slo)
    idx = np.nonzero(over & (ts >= after_s))[0]
    if not len(idx):
        return None, None
    first = int(idx[0])
    for i in range(first + 1, len(ts)):
        hold = over[i : i + int(HOLD_S)]
        if not hold.any():
            return float(ts[first]), float(ts[i])
    return float(ts[first]), None


def over_slo_s(ts: np.ndarray, p99: np.ndarray, slo: float, after_s: float) -> float:
    """Seconds at or after ``after_s`` whose window p99 is over ``slo``."""
    return float(np.count_nonzero(breach(p99, slo) & (ts >= after_s)))


def _others_over_slo(
    requests: pa.Table, s: Scenario, victim: str, start_ns: int, after_s: float
) -> dict[str, float]:
    out = {}
    for m in s.models:
        if m.name != victim and m.slo_p99_ms is not None:
            ts, p = rolling_p99(requests, m.name, start_ns, s.duration_s)
            out[m.name] = over_slo_s(ts, p, m.slo_p99_ms, after_s)
    return out


def _changes(events: list[Any]) -> dict[str, list[float]]:
    """Times of the changes to each target: every apply and revert, except an apply right
    after another apply to the same target (a later step of one reroute)."""
    out: dict[str, list[float]] = {}
    last: dict[str, str] = {}
    for c in events:
        if not (c.op == "apply" and last.get(c.target) == "apply"):
            out.setdefault(c.target, []).append(c.t_s)
        last[c.target] = c.op
    return out


def _count_in(times: np.ndarray, lo: float, hi: float) -> int:
    return int(np.count_nonzero((times >= lo) & (times < hi)))


def _max_in_window(times: list[float], window: float) -> int:
    t = sorted(times)
    best = 0
    for i, x in enumerate(t):
        best = max(best, int(np.searchsorted(t, x + window, side="left")) - i)
    return best


def limited_run(
    s: Scenario, culprit: str, victim: str, rate_rps: float, lo_s: float, hi_s: float
) -> tuple[float, float]:
    """Simulate ``s`` up to ``hi_s`` with a constant limit of ``rate_rps`` (burst: one second
    of tokens) on ``culprit`` from ``lo_s``: (victim p99 ms over ``[lo_s + P99_WINDOW_S,
    hi_s)``, fraction of the culprit's offered requests refused in ``[lo_s, hi_s)``)."""
    sim = Simulation(s, start_ns=START_NS)
    sim.run_until(lo_s)
    sim.take_requests()
    sim.take_samples()
    sim.controls.set_rate_limit(culprit, rate_rps, max(1, math.ceil(rate_rps)))
    sim.run_until(hi_s)
    t = requests_table(sim, sim.take_requests())
    end = (t.column("ts_end_ns").to_numpy() - START_NS) / 1e9
    mine = np.asarray(t.column("model").to_pylist(), dtype=object) == victim
    sel = mine & (end >= lo_s + P99_WINDOW_S) & (end < hi_s)
    lat = t.column("latency_ms").to_numpy()[sel]
    p99 = float(np.percentile(lat, 99)) if len(lat) else float("nan")
    offered = _count_in(sim.controls.arrival_times(culprit), lo_s, hi_s)
    refused = _count_in(np.asarray(sim.controls.rejected_times(culprit)), lo_s, hi_s)
    return p99, (refused / offered if offered else 0.0)


def minimum_limit(s: Scenario) -> tuple[float, float] | None:
    """(largest constant rate limit on the culprit that keeps the victim under its SLO over
    the fault, the fraction of the culprit's requests it refuses); None when even refusing
    every request does not. Bisection over ``BISECT_STEPS`` runs of the simulator."""
    victim, culprit, _, slo = roles(s)
    f = s.faults[0]
    hi_s = min(s.duration_s, f.end_s)
    sim = Simulation(s, start_ns=START_NS)
    offered = _count_in(sim.controls.arrival_times(culprit), f.start_s, hi_s) / max(
        1e-9, hi_s - f.start_s
    )
    floor = 1e-3
    p99, lost = limited_run(s, culprit, victim, floor, f.start_s, hi_s)
    if bool(breach(p99, slo)) or math.isnan(p99):
        return None
    good_rate, good_lost = floor, lost
    lo, hi = floor, max(offered, floor * 2)
    for _ in range(BISECT_STEPS):
        mid = (lo + hi) / 2
        p99, lost = limited_run(s, culprit, victim, mid, f.start_s, hi_s)
        if not (bool(breach(p99, slo)) or math.isnan(p99)):
            good_rate, good_lost, lo = mid, lost, mid
        else:
            hi = mid
    return good_rate, good_lost


def score(
    run: ClosedLoopRun,
    *,
    without_loop: pa.Table | None = None,
    minimum: tuple[float, float] | None = None,
) -> Score:
    """Score a closed-loop run; ``without_loop`` (the same scenario's requests with no
    actions) and ``minimum`` (from :func:`minimum_limit`) add the side-by-side figures."""
    s = run.scenario
    victim, culprit, cause, slo = roles(s)
    f = s.faults[0]
    sc = Score(s.name, s.actuation.expect, victim, culprit, cause, slo, f.start_s, f.end_s)
    sc.wall_s = run.wall_s
    ts, p99 = rolling_p99(run.requests, victim, run.start_ns, s.duration_s)
    _, sc.recovered_s = recovery(ts, p99, slo, f.start_s)
    sc.victim_over_slo_s = over_slo_s(ts, p99, slo, f.start_s)
    sc.others_over_slo_s = _others_over_slo(run.requests, s, victim, run.start_ns, f.start_s)
    if without_loop is not None:
        ts0, p0 = rolling_p99(without_loop, victim, run.start_ns, s.duration_s)
        _, sc.recovered_without_loop_s = recovery(ts0, p0, slo, f.start_s)
        alone = _others_over_slo(without_loop, s, victim, run.start_ns, f.start_s)
        sc.harm_s = sum(max(0.0, v - alone.get(m, 0.0)) for m, v in sc.others_over_slo_s.items())
    diag = [
        (d.at_ns - run.start_ns) / 1e9
        for d in run.detections
        if d.model == victim and (d.at_ns - run.start_ns) / 1e9 >= f.start_s
    ]
    sc.diagnosed_s = min(diag) if diag else None
    sc.rerouted = any(c.op == "apply" and c.kind == "reroute" for c in run.changes)
    applies = [
        c
        for c in run.changes
        if c.op == "apply" and (c.target == culprit or (c.target == victim and c.kind == "reroute"))
    ]
    if applies:
        sc.applied_s = applies[0].t_s
        sc.applied_rate_rps = applies[0].after.get("rate_rps")
    if sc.recovered_s is not None:
        sc.recover_from_fault_s = sc.recovered_s - f.start_s
        if sc.diagnosed_s is not None:
            sc.recover_from_diagnosis_s = sc.recovered_s - sc.diagnosed_s
    if sc.applied_s is not None and sc.applied_s < f.end_s and culprit in run.offered_s:
        offered = _count_in(run.offered_s[culprit], sc.applied_s, f.end_s)
        refused = _count_in(run.rejected_s[culprit], sc.applied_s, f.end_s)
        sc.culprit_lost_fraction = refused / offered if offered else 0.0
    if minimum is not None:
        sc.minimum_rate_rps, sc.minimum_lost_fraction = minimum
        if sc.culprit_lost_fraction is not None:
            sc.loss_ratio = (
                sc.culprit_lost_fraction / sc.minimum_lost_fraction
                if sc.minimum_lost_fraction > 0
                else (1.0 if sc.culprit_lost_fraction == 0 else math.inf)
            )
    by_target = _changes(run.changes)
    sc.changes = {k: len(v) for k, v in by_target.items()}
    sc.max_changes_per_10min = max(
        (_max_in_window(v, OSCILLATION_WINDOW_S) for v in by_target.values()), default=0
    )
    applied = [a for a in run.actions if a.get("before") is not None]
    sc.rollbacks = sum(1 for a in applied if a["state"] == "rolled_back")
    expired = [a for a in applied if a["state"] == "expired"]
    sc.expiries = len(expired)
    if expired:
        last = max(int(a["updated_ns"]) for a in expired)
        after = (last - run.start_ns) / 1e9
        sc.breach_after_expiry = bool(breach(p99[ts > after + P99_WINDOW_S], slo).any())
    sc.goals = _goals(sc, run)
    return sc


def _goals(sc: Score, run: ClosedLoopRun) -> dict[str, bool]:
    goals = {"changes_per_target_per_10min<=2": sc.max_changes_per_10min <= MAX_CHANGES}
    on_culprit = [a for a in run.actions if a["target"] == sc.culprit and a.get("before")]
    unharmed = sc.harm_s is not None and sc.harm_s <= 0
    if sc.expect == "recover":
        goals["recovered_within_60s_of_diagnosis"] = (
            sc.recover_from_diagnosis_s is not None
            and sc.recover_from_diagnosis_s <= RECOVER_GOAL_S
        )
        if on_culprit or not sc.rerouted:
            goals["culprit_loss<=1.5x_minimum"] = (
                sc.loss_ratio is not None and sc.loss_ratio <= LOSS_GOAL_RATIO
            )
        if sc.rerouted:
            goals["no_other_model_pushed_over_slo"] = unharmed
    elif sc.expect == "refrain":
        applied = [a for a in run.actions if a.get("before") is not None]
        goals["no_change_kept"] = all(a["state"] == "rolled_back" for a in applied)
        goals["no_other_model_pushed_over_slo"] = unharmed
    elif sc.expect == "rollback":
        goals["rolled_back"] = any(a["state"] == "rolled_back" for a in on_culprit)
    else:
        goals["expired"] = any(a["state"] == "expired" for a in on_culprit)
        goals["victim_under_slo_after_expiry"] = sc.breach_after_expiry is False
    return goals


def side_by_side(
    s: Scenario, no_action: pa.Table, runs: dict[str, Score], start_ns: int = START_NS
) -> list[dict[str, Any]]:
    """One row per variant — ``no action`` (``no_action``: the scenario's requests without
    the loop) then each scored run of ``runs`` (variant name -> score): when the victim was
    back under its SLO (s from the fault's start; None: not before the run ended), its
    seconds over the SLO after the fault started, other models' seconds over theirs, and
    the changes the loop made."""
    victim, _, _, slo = roles(s)
    f = s.faults[0]
    ts, p99 = rolling_p99(no_action, victim, start_ns, s.duration_s)
    _, back = recovery(ts, p99, slo, f.start_s)
    others = _others_over_slo(no_action, s, victim, start_ns, f.start_s)
    rows = [
        {
            "variant": "no action",
            "back_from_fault_s": None if back is None else back - f.start_s,
            "victim_over_slo_s": over_slo_s(ts, p99, slo, f.start_s),
            "others_over_slo_s": sum(others.values()),
            "changes": 0,
            "rollbacks": 0,
        }
    ]
    for name, sc in runs.items():
        rows.append(
            {
                "variant": name,
                "back_from_fault_s": sc.recover_from_fault_s,
                "victim_over_slo_s": sc.victim_over_slo_s,
                "others_over_slo_s": sum(sc.others_over_slo_s.values()),
                "changes": sum(sc.changes.values()),
                "rollbacks": sc.rollbacks,
            }
        )
    return rows
