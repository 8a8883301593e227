"""The victims the accuracy goal asks to find, for the batch and the live benches alike.

A fault's victim (:func:`simulator.output.truth`) is an **SLO victim** when its 1-s p99 (over
3 requests or more) crossed its SLO during the fault, and a **within-SLO victim** otherwise
when it was slowed as much, as long and at as high a request rate as the goal asks: 1.2x and
1 ms over its p99 without the fault (the truth's counterfactual run), for 60 s or more, at 0.5
requests a second or more. Slighter, shorter or sparser victims are "below the bar".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.analysis.windows import GpuWindows
from cotenant.core import slos

GOAL_RATIO = 1.2
GOAL_MARGIN_MS = 1.0
GOAL_RATE_RPS = 0.5
GOAL_S = 60.0


@dataclass(frozen=True)
class Slowed:
    """How one victim fared over one fault."""

    slowdown: float  # its p99 over the fault with / without the fault
    excess_ms: float  # the same, with - without
    rate_rps: float  # its requests per second during the fault
    fault_s: float  # how long the fault lasted
    breach: np.ndarray  # per window of the GPU's windows: over its SLO during the fault

    @property
    def slo_victim(self) -> bool:
        return bool(self.breach.any())

    @property
    def at_goal(self) -> bool:
        """Slowed as much, as long and at as high a request rate as the goal asks to find."""
        return at_goal(self.slowdown, self.excess_ms, self.rate_rps, self.fault_s)


def at_goal(slowdown: float, excess_ms: float, rate_rps: float, fault_s: float) -> bool:
    return (
        slowdown >= GOAL_RATIO
        and excess_ms >= GOAL_MARGIN_MS
        and rate_rps >= GOAL_RATE_RPS
        and fault_s >= GOAL_S
    )


def slowed(
    f: dict[str, Any], model: str, w: GpuWindows, lo: int, hi: int, slo_ms: float | None
) -> Slowed:
    """``model``'s lot over fault ``f`` (a truth entry), ``[lo, hi)`` with its settle time,
    read from its GPU's windows ``w``."""
    v = w.models.get(model, {})
    ts = w.ts_ns
    in_fault = (ts >= lo) & (ts < hi)
    breach = np.zeros(w.n, dtype=bool)
    if v:
        breach = in_fault & (v["count"] >= 3) & slos.breach(v["p99_ms"], slo_ms)
    got = f.get("p99", {}).get(model, {})
    with_, without = got.get("p99_ms"), got.get("p99_without_ms")
    ratio, excess = (
        (float(with_ / without), float(with_ - without))
        if with_ and without
        else (float("inf"), float("inf"))
    )
    rate = float(np.nanmean(v["count"][in_fault])) if v and in_fault.any() else 0.0
    return Slowed(ratio, excess, rate, float(f["end_s"] - f["start_s"]), breach)
