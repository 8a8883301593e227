"""Model loads as a cause: the victim's own replica was busy loading a model or adapter.

A request that waits for a model, adapter or pipeline load reports the wait as a
``model.load`` span, booked as ``other`` on its critical path (docs/instrumenting.md, "Model
loads"; the store keeps no load name). So a victim's ``other_ms`` per request is its load
time, and loads are ordinary: a serverless image service loads a LoRA near most requests.
What makes them a cause is that they became **unusually slow or frequent** against the
victim's own before baseline (which holds its ordinary loads):

* **slow**: a window with a load (its requests waited :data:`LOAD_WINDOW_MS` or more on
  average) waited at least :data:`SLOW_RATIO` x as long as the before's windows with a load;
* **frequent**: the share of windows with a load (its load rate, loads per window as the
  windows can tell it) is at least :data:`FREQUENT_RATIO` x the before's, and beyond chance
  (binomial z >= :data:`FREQUENT_Z` against the before's rate, :mod:`analysis.enrichment`);
  once loads touch most windows (a usual rate above ``1 / FREQUENT_RATIO``) a rise in
  frequency cannot show in windows, and only slowness or the wait per request can;
* or the load wait per request rose :data:`SLOW_RATIO` x overall (both a little).

In every case the wait per request must have risen by :data:`MIN_LOAD_MS` or more and be a
fair part of the excess (:data:`MIN_PART`), so a jitter of time no span covers names nothing.

Share (claimed by :class:`ModelLoadExplainer`): the excess of ``other_ms``, plus the queue
excess nothing else explains (the backlog that built up behind the loads: arrivals did not
surge and no batch got slower). Evidence: which of slow / frequent, load time per request
before / during, the wait of a window with a load before / during, how often a window's
requests waited for a load (fraction of windows) and that rate's z, the longest per-window
mean wait, and where to find what was loaded (the spans' ``cotenant.load.kind`` / ``.name``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.analysis.candidates import Candidate
from cotenant.analysis.change import strength, wmean_over
from cotenant.analysis.claims import Claim, Context, Phase, Stage
from cotenant.analysis.enrichment import binomial_z
from cotenant.core.cause_kinds import CauseKind

SLOW_RATIO = 2.0
"""Wait per loaded window (slow), or per request overall, during the incident over its
baseline that counts as unusual."""
FREQUENT_RATIO = 1.5
"""Share of windows with a load during the incident over its baseline that counts as
unusually frequent (a ratio of shares, at most ``1 / usual``: hence below SLOW_RATIO)."""
FREQUENT_Z = 3.0
"""Binomial z of the windows with a load during the incident, against the usual rate."""
MIN_LOAD_MS = 5.0
"""ms per request: a smaller rise of load time is no cause, whatever its ratio."""
MIN_PART = 0.1
"""Fraction of the victim's summed phase excess the load-time rise must reach."""
LOAD_WINDOW_MS = 1.0
"""A window whose requests waited this long on average (ms) for loads had a load."""


@dataclass(frozen=True)
class LoadFinding:
    """The victim's loads during an incident against its baseline (ms per request)."""

    before_ms: float
    during_ms: float
    windows_before: float  # fraction of the before windows with a load
    windows_during: float  # fraction of the during windows with a load
    longest_ms: float  # largest per-window mean load wait during the incident
    confidence: float
    per_load_before_ms: float = 0.0  # mean wait of a window with a load, before (NaN: none)
    per_load_during_ms: float = 0.0
    rate_z: float = 0.0  # binomial z of the during windows with a load, at the before's rate
    slow: bool = False
    frequent: bool = False

    @property
    def unusual(self) -> list[str]:
        """``slow`` and / or ``frequent``; ``wait`` when only the wait per request rose."""
        got = [n for n, on in (("slow", self.slow), ("frequent", self.frequent)) if on]
        return got or ["wait"]

    def evidence(self, victim: str) -> dict[str, Any]:
        return {
            "series": f"{victim} model load wait",
            "unit": "ms",
            "unusual": self.unusual,
            "before": round(self.before_ms, 3),
            "during": round(self.during_ms, 3),
            "per_load_window_before_ms": _round(self.per_load_before_ms, 3),
            "per_load_window_during_ms": _round(self.per_load_during_ms, 3),
            "windows_with_loads_before": round(self.windows_before, 3),
            "windows_with_loads_during": round(self.windows_during, 3),
            "load_rate_z": round(self.rate_z, 2),
            "longest_window_ms": round(self.longest_ms, 1),
            "loaded": "see the requests' model.load spans (cotenant.load.kind, cotenant.load.name)",
        }


def _round(x: float, digits: int) -> float | None:
    return round(x, digits) if np.isfinite(x) else None


def load_finding(
    v: dict[str, np.ndarray], before: np.ndarray, during: np.ndarray, total_excess_ms: float
) -> LoadFinding | None:
    """``model_load`` evidence of a victim (its window series ``v``: ``other_ms`` and ``count``
    per window; ``before`` / ``during`` boolean masks over them), or None when its loads were
    not unusual. ``total_excess_ms``: the victim's summed phase excess (ms per request)."""
    other = v.get("other_ms")
    if other is None or total_excess_ms <= 0:
        return None
    cnt = v["count"]
    b, d = wmean_over(other, cnt, before), wmean_over(other, cnt, during)
    if not (np.isfinite(b) and np.isfinite(d)):
        return None
    rise = d - b
    if rise < MIN_LOAD_MS or rise < MIN_PART * total_excess_ms:
        return None
    seen = np.isfinite(other) & (np.nan_to_num(cnt) > 0)
    loaded = seen & (other >= LOAD_WINDOW_MS)
    nb, nd = int((seen & before).sum()), int((seen & during).sum())
    kb, kd = int((loaded & before).sum()), int((loaded & during).sum())
    pb, pd = (kb / nb if nb else 0.0), (kd / nd if nd else 0.0)
    per_b = wmean_over(other, cnt, loaded & before)
    per_d = wmean_over(other, cnt, loaded & during)
    # no load before: none was slow by its standard; the new loads are frequent (z)
    slow = bool(np.isfinite(per_b) and np.isfinite(per_d) and per_d >= SLOW_RATIO * per_b)
    z = binomial_z(kd, nd, pb, nb)
    frequent = pd >= FREQUENT_RATIO * pb and z >= FREQUENT_Z
    if not (slow or frequent or d >= SLOW_RATIO * b):
        return None
    during_vals = other[seen & during]
    return LoadFinding(
        before_ms=b,
        during_ms=d,
        windows_before=pb,
        windows_during=pd,
        longest_ms=float(during_vals.max()) if len(during_vals) else 0.0,
        confidence=strength(rise / max(b, MIN_LOAD_MS), half=1.0),
        per_load_before_ms=per_b,
        per_load_during_ms=per_d,
        rate_z=z,
        slow=slow,
        frequent=frequent,
    )


@dataclass(frozen=True)
class ModelLoadExplainer:
    kind: CauseKind = CauseKind.MODEL_LOAD

    def claims(self, ctx: Context) -> list[Claim]:
        if not ctx.has_phases:
            return []
        found = load_finding(ctx.v, ctx.before, ctx.during, ctx.total)
        if found is None:
            return []
        cand = Candidate(CauseKind.MODEL_LOAD, ctx.victim)
        ev = found.evidence(ctx.victim)
        return [
            Claim(cand, Phase.OTHER, Stage.FIRST, np.inf, found.confidence, ev),
            Claim(cand, Phase.QUEUE, Stage.LEFTOVER, np.inf, found.confidence, ev),
        ]
