"""The ``reroute`` action: move a victim's traffic off its contended replica, step by step.

When an incident names the slow replica of a model (``Incident.replica``) and siblings on
other GPUs that are fine (its diagnosis's ``siblings``, :mod:`analysis.replicas`), the model's
traffic can go there instead of waiting for a culprit that cannot be throttled (a training
job serves no requests) or whose throttling did not help. :func:`propose_reroute` plans the
weights: each step takes at most ``max_step`` of the model's traffic off the contended
replica (down to ``min_weight``) and gives it to the siblings that have headroom — every
model on a sibling's GPU with an SLO is at p99 <= ``headroom`` x that SLO over the last
``lookback_s``. Weights are integers 0..256 (the gateway's and HAProxy's range); the plan
scales them to a total of 256.

:func:`judge_step`, ``step_settle_s`` after each step: *verified* when the model's p99
across its replicas is back (at or under its SLO, else its baseline x (1 + margin)) and no
model on a sibling's GPU is over its SLO; *rolled back* when one is (the move hurt another
model) or when no step is left or the siblings lost their headroom before the victim
recovered (it cannot help within the guardrails); else the next *step*.

The model's p99 across replicas, per window, is the p99 of the slowest replica that still
carries at least 1 % of its requests (a replica with less cannot set the model's p99; with
more, its p99 bounds the mixture's from above): conservative, from per-(model, GPU) windows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cotenant.actuators.policy import RerouteRule, VerifyRule
from cotenant.analysis.incident_record import Incident
from cotenant.analysis.replicas import listed_siblings
from cotenant.core.readers import MetricSource
from cotenant.core.slos import breach
from cotenant.core.timerange import TimeRange

TOTAL_WEIGHT = 256
"""Planned weights sum to this (the most a replica's weight can be)."""
TAIL_SHARE = 0.01
"""A replica carrying less than this share of a window's requests cannot set its p99."""


@dataclass(frozen=True)
class Plan:
    """A planned reroute: ``steps`` of weights (replica -> weight), the contended replica
    and the siblings that take its traffic (replica -> GPU)."""

    model: str
    contended: str
    to: dict[str, str]
    steps: list[dict[str, int]]
    reason: str


@dataclass(frozen=True)
class StepVerdict:
    verdict: str  # verified | step | rolled_back | wait
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)


def plan_weights(
    weights: Mapping[str, int], contended: str, to: list[str], rule: RerouteRule
) -> list[dict[str, int]]:
    """The weights of each step, scaled to TOTAL_WEIGHT: the contended replica's share drops
    by ``max_step`` per step to ``min_weight / TOTAL_WEIGHT``; what it gives up goes to the
    replicas ``to`` in proportion to their weights (equally when all are 0); other replicas
    keep their share. At most ``max_steps`` steps; empty when there is nothing to move."""
    total = sum(weights.values())
    if total <= 0 or not to:
        return []
    share = {r: w / total for r, w in weights.items()}
    floor = min(rule.min_weight, TOTAL_WEIGHT) / TOTAL_WEIGHT
    base = sum(weights[r] for r in to)
    split = {r: (weights[r] / base if base else 1 / len(to)) for r in to}
    steps: list[dict[str, int]] = []
    current = share[contended]
    while current > floor + 1e-9 and len(steps) < rule.max_steps:
        nxt = max(floor, current - rule.max_step)
        moved = share[contended] - nxt
        s = dict(share)
        s[contended] = nxt
        for r in to:
            s[r] = share[r] + moved * split[r]
        steps.append(_integers(s))
        current = nxt
    return steps


def _integers(shares: Mapping[str, float]) -> dict[str, int]:
    """Shares as integer weights summing to about TOTAL_WEIGHT, at least one of them > 0."""
    out = {r: round(x * TOTAL_WEIGHT) for r, x in shares.items()}
    if not any(out.values()):
        out[max(shares, key=lambda r: shares[r])] = 1
    return out


def model_gpu_p99(
    source: MetricSource, gpu: str, lo_ns: int, hi_ns: int, step_s: float
) -> dict[str, float]:
    """Median window p99 (ms) of each model served on ``gpu`` over ``[lo, hi)``."""
    if hi_ns <= lo_ns:
        return {}
    t = source.request_windows(TimeRange(lo_ns, hi_ns), step_s, gpu=gpu)
    models = np.asarray(t.column("model").to_pylist(), dtype=object)
    p99 = t.column("p99_ms").to_numpy(zero_copy_only=False).astype(np.float64)
    count = np.nan_to_num(t.column("count").to_numpy(zero_copy_only=False).astype(np.float64))
    ok = (count > 0) & np.isfinite(p99)
    return {str(m): float(np.median(p99[ok & (models == m)])) for m in set(models[ok].tolist())}


def model_p99(
    source: MetricSource, model: str, lo_ns: int, hi_ns: int, step_s: float
) -> float | None:
    """Median over windows of ``model``'s p99 (ms) across its replicas (the module
    docstring's estimate); None without requests."""
    if hi_ns <= lo_ns:
        return None
    t = source.request_windows(TimeRange(lo_ns, hi_ns), step_s, model=model)
    if t.num_rows == 0:
        return None
    ts = t.column("ts_ns").to_numpy(zero_copy_only=False)
    p99 = t.column("p99_ms").to_numpy(zero_copy_only=False).astype(np.float64)
    count = np.nan_to_num(t.column("count").to_numpy(zero_copy_only=False).astype(np.float64))
    ok = (count > 0) & np.isfinite(p99)
    per: list[float] = []
    for w in np.unique(ts[ok]):
        sel = ok & (ts == w)
        n = count[sel]
        tail = p99[sel][n >= TAIL_SHARE * n.sum()]
        per.append(float(tail.max()))
    return float(np.median(per)) if per else None


class _Under(Mapping[str, float]):
    """``base``, and ``extra`` for the models ``base`` has no SLO for."""

    def __init__(self, base: Mapping[str, float], extra: Mapping[str, float]) -> None:
        self._base, self._extra = base, extra

    def __getitem__(self, model: str) -> float:
        return self._base[model] if model in self._base else self._extra[model]

    def __contains__(self, model: object) -> bool:
        return model in self._base or model in self._extra

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._base, *self._extra]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self._base, *self._extra]))


def _with(slo_ms: Mapping[str, float], victim: str, recorded: Any) -> Mapping[str, float]:
    """``slo_ms``, with the victim's SLO as its incident recorded it where ``slo_ms`` has
    none for it (a ``Slos.lookup()`` keeps its default for every other model)."""
    return _Under(slo_ms, {victim: float(recorded)} if recorded else {})


def _over(
    p99: Mapping[str, float], slo_ms: Mapping[str, float], ratio: float, victim: str = ""
) -> list[tuple[str, float, float]]:
    """(model, p99, SLO) of each model with an SLO whose p99 exceeds ``ratio`` x SLO; the
    ``victim``'s own replica (it is there to take load) only when over the SLO itself."""
    return [
        (m, v, slo_ms[m])
        for m, v in sorted(p99.items())
        if m in slo_ms and breach(v, (1.0 if m == victim else ratio) * slo_ms[m])
    ]


def propose_reroute(
    incident: Incident,
    rule: RerouteRule,
    weights: Mapping[str, int] | None,
    source: MetricSource,
    *,
    slo_ms: Mapping[str, float],
    now_ns: int,
    step_s: float,
) -> Plan | str:
    """A plan for ``incident``'s model, or why there is none (a sentence). ``weights``:
    the model's replica weights as the backend reports them (None: it has no routing)."""
    victim, replica = incident.model, incident.replica
    if not weights:
        return f"{victim} has no replica weights at the backend"
    if not replica or replica not in weights:
        return f"the incident names no replica of {victim} the backend routes to"
    sibs = [
        s
        for s in listed_siblings(incident.told.siblings)
        if s.get("replica") in weights and s.get("replica") != replica
    ]
    fine = [s for s in sibs if s.get("fine")]
    if not fine:
        return f"{victim} has no healthy replica elsewhere to take {replica}'s traffic"
    # the victim's SLO as the incident recorded it, where the SLOs given have none for it
    slo = _with(slo_ms, victim, incident.slo_ms)
    lo = now_ns - int(rule.lookback_s * 1e9)
    to: dict[str, str] = {}
    why: list[str] = []
    for s in fine:
        p99 = model_gpu_p99(source, str(s["gpu"]), lo, now_ns, step_s)
        busy = _over(p99, slo, rule.headroom, victim)
        if busy:
            why += [f"{m} on {s['gpu']} at {v:.1f} ms of its {lim:g} ms SLO" for m, v, lim in busy]
        else:
            to[str(s["replica"])] = str(s["gpu"])
    if not to:
        return f"no replica of {victim} has headroom: " + "; ".join(why)
    steps = plan_weights(weights, replica, list(to), rule)
    if not steps:
        return f"{replica} already carries the least traffic the policy allows"
    there = ", ".join(f"{r} on {g}" for r, g in to.items())
    reason = (
        f"{replica} on {incident.gpu} is slow while {there}"
        f" {'is' if len(to) == 1 else 'are'} fine: move {victim}'s traffic in "
        f"{len(steps)} step(s), first to weights {steps[0]}"
    )
    return Plan(victim, replica, to, steps, reason)


def judge_step(
    params: Mapping[str, Any],
    context: Mapping[str, Any],
    step_ns: int,
    now_ns: int,
    source: MetricSource,
    rule: RerouteRule,
    verify_rule: VerifyRule,
    *,
    slo_ms: Mapping[str, float],
    step_s: float,
) -> StepVerdict:
    """Judge the step applied at ``step_ns`` (``params``: the action's, with ``steps``,
    ``step`` (index), ``to``). Reads the second half of the settle period."""
    victim = str(context["victim"])
    settle_ns = int(rule.step_settle_s * 1e9)
    lo = min(step_ns + settle_ns // 2, now_ns - int(step_s * 1e9))
    slo = _with(slo_ms, victim, context.get("slo_ms"))
    after = model_p99(source, victim, lo, now_ns, step_s)
    goal = slo.get(victim)
    if goal is None:
        base = context.get("baseline_p99_ms")
        goal = float(base) * (1 + verify_rule.baseline_margin) if base else math.inf
    numbers: dict[str, Any] = {
        "victim_p99_after_ms": None if after is None else round(after, 3),
        "victim_goal_ms": round(goal, 3),
        "step": int(params.get("step", 0)) + 1,
    }
    if after is None:
        return StepVerdict("wait", f"no requests from {victim} since the step yet", numbers)
    hurt: list[tuple[str, float, float]] = []
    tight: list[tuple[str, float, float]] = []
    for gpu in sorted(set((params.get("to") or {}).values())):
        p99 = model_gpu_p99(source, gpu, lo, now_ns, step_s)
        numbers[f"p99_on_{gpu}_ms"] = {m: round(v, 3) for m, v in sorted(p99.items())}
        hurt += _over(p99, slo, 1.0)
        tight += _over(p99, slo, rule.headroom, victim)
    if hurt:
        m, v, lim = hurt[0]
        return StepVerdict(
            "rolled_back",
            f"hurt another replica's GPU: {m} p99 {v:.1f} ms is over its {lim:g} ms SLO after "
            f"moving {victim}'s traffic",
            numbers,
        )
    if after <= goal:
        return StepVerdict(
            "verified",
            f"helped: {victim} p99 {after:.1f} ms across its replicas is under {goal:.1f} ms "
            f"after step {numbers['step']}, no model on the receiving GPUs over its SLO",
            numbers,
        )
    steps = params.get("steps") or []
    k = int(params.get("step", 0)) + 1
    if k < len(steps) and not tight:
        return StepVerdict(
            "step",
            f"{victim} p99 {after:.1f} ms still above {goal:.1f} ms: next step to weights "
            f"{steps[k]}",
            {**numbers, "next_weights": steps[k]},
        )
    why = (
        "no step left"
        if k >= len(steps)
        else "the receiving GPUs lost their headroom ("
        + "; ".join(f"{m} at {v:.1f} ms of {lim:g} ms" for m, v, lim in tight)
        + ")"
    )
    return StepVerdict(
        "rolled_back",
        f"did not help within the guardrails: {victim} p99 {after:.1f} ms is still above "
        f"{goal:.1f} ms and {why}",
        numbers,
    )
