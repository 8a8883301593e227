"""Verification of an applied change, ``settle_s`` after it was applied.

Helped: the victim's p99 over the second half of the settle period (the first half lets queues
drain) is at or under its target — the SLO when one is set, otherwise the pre-incident baseline
x (1 + ``baseline_margin``). Hurt: the target (when it is a model with an SLO) now breaches its
own SLO by more, relative to that SLO, than ``culprit_hurt_ratio`` x the victim's relative gain.
A change that did not help, or hurt more than it helped, is rolled back with the numbers in
the reason. Window p99s are combined by their median (one odd window does not decide).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cotenant.actuators.policy import VerifyRule
from cotenant.core.readers import MetricSource
from cotenant.core.slos import breach
from cotenant.core.timerange import TimeRange


@dataclass(frozen=True)
class Outcome:
    verdict: str  # verified | rolled_back | wait
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)


def window_p99(
    source: MetricSource,
    model: str,
    gpu: str | None,
    spans: list[tuple[int, int]],
    step_s: float,
) -> list[float | None]:
    """Median of ``model``'s per-window p99 (ms) over each ``[lo, hi)`` of ``spans`` (read in
    one query); None for a span without requests."""
    lo = min(a for a, _ in spans)
    hi = max(b for _, b in spans)
    if hi <= lo:
        return [None] * len(spans)
    t = source.request_windows(TimeRange(lo, hi), step_s, model=model, gpu=gpu or None)
    ts = t.column("ts_ns").to_numpy(zero_copy_only=False)
    p99 = t.column("p99_ms").to_numpy(zero_copy_only=False).astype(np.float64)
    count = np.nan_to_num(t.column("count").to_numpy(zero_copy_only=False).astype(np.float64))
    ok = (count > 0) & np.isfinite(p99)
    out: list[float | None] = []
    for a, b in spans:
        v = p99[ok & (ts >= a) & (ts < b)]
        out.append(float(np.median(v)) if len(v) else None)
    return out


def verify(
    context: Mapping[str, Any],
    target: str,
    applied_ns: int,
    now_ns: int,
    source: MetricSource,
    rule: VerifyRule,
    *,
    slo_ms: Mapping[str, float],
    settle_ns: int,
    step_s: float,
) -> Outcome:
    victim = str(context["victim"])
    gpu = context.get("gpu")
    step_ns = int(step_s * 1e9)
    lo = min(applied_ns + settle_ns // 2, now_ns - step_ns)
    before_lo = max(
        int(context.get("incident_start_ns") or 0), applied_ns - max(settle_ns, 60 * step_ns)
    )
    before, after = window_p99(source, victim, gpu, [(before_lo, applied_ns), (lo, now_ns)], step_s)
    slo = context.get("slo_ms") or slo_ms.get(victim)
    baseline = context.get("baseline_p99_ms")
    if slo:
        goal, goal_name = float(slo), "its SLO"
    elif baseline:
        goal = float(baseline) * (1.0 + rule.baseline_margin)
        goal_name = f"its baseline {float(baseline):.1f} ms + {rule.baseline_margin:.0%}"
    else:
        goal, goal_name = float(context.get("peak_p99_ms") or 0.0), "its incident peak"
    numbers: dict[str, Any] = {
        "victim_p99_before_ms": None if before is None else round(before, 3),
        "victim_p99_after_ms": None if after is None else round(after, 3),
        "victim_goal_ms": round(goal, 3),
    }
    if after is None:
        return Outcome("wait", f"no requests from {victim} since the change yet", numbers)
    if after > goal:
        return Outcome(
            "rolled_back",
            f"did not help: {victim} p99 {after:.1f} ms is still above {goal_name} "
            f"({goal:.1f} ms) {(now_ns - applied_ns) / 1e9:.0f} s after the change",
            numbers,
        )
    target_slo = slo_ms.get(target) if target != victim else None
    if target_slo:
        [t_after] = window_p99(source, target, None, [(lo, now_ns)], step_s)
        numbers["target_p99_after_ms"] = None if t_after is None else round(t_after, 3)
        numbers["target_slo_ms"] = target_slo
        if t_after is not None and bool(breach(t_after, target_slo)):
            hurt = (t_after - target_slo) / target_slo
            ref = before if before is not None else float(context.get("peak_p99_ms") or after)
            gain = max(0.0, (ref - after) / goal)
            numbers.update(target_hurt=round(hurt, 4), victim_gain=round(gain, 4))
            if hurt > rule.culprit_hurt_ratio * gain:
                return Outcome(
                    "rolled_back",
                    f"hurt more than it helped: {target} p99 {t_after:.1f} ms breaches its SLO "
                    f"{target_slo:.1f} ms by {hurt:.0%} while {victim} gained {gain:.0%} of "
                    f"{goal_name}",
                    numbers,
                )
    return Outcome(
        "verified",
        f"helped: {victim} p99 {after:.1f} ms is under {goal_name} ({goal:.1f} ms)"
        + ("" if before is None else f", from {before:.1f} ms before the change"),
        numbers,
    )
