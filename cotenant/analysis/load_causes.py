"""Model loads as a cause: the victim's own replica was busy loading a model or adapter.

A request that waits for a model, adapter or pipeline load reports the wait as a
``model.load`` span, booked as ``other`` on its critical path (docs/instrumenting.md, "Model
loads"; the store keeps no load name). So a victim's ``other_ms`` per request is its load
time, and loads are ordinary: a serverless image service loads a LoRA near most requests.
What makes them a cause is that they became **unusually slow or frequent**: during the
incident the victim's load time per request is at least :data:`SLOW_RATIO` x its before
baseline (which holds its ordinary loads) and at least :data:`MIN_LOAD_MS` more, and it is a
fair part of the excess (:data:`MIN_PART`), so a jitter of time no span covers names nothing.

Share (given by :func:`analysis.attribution.attribute`): the excess of ``other_ms``, plus the
queue excess nothing else explains (the backlog that built up behind the loads: arrivals did
not surge and no batch got slower). Evidence: load time per request before / during, how often
a window's requests waited for a load (fraction of windows), the longest per-window mean wait,
and where to find what was loaded (the spans' ``cotenant.load.kind`` / ``.name``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.analysis.change import strength, wmean_over

SLOW_RATIO = 2.0
"""Load time per request during the incident over its baseline that counts as unusual."""
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

    def evidence(self, victim: str) -> dict[str, Any]:
        return {
            "series": f"{victim} model load wait",
            "unit": "ms",
            "before": round(self.before_ms, 3),
            "during": round(self.during_ms, 3),
            "windows_with_loads_before": round(self.windows_before, 3),
            "windows_with_loads_during": round(self.windows_during, 3),
            "longest_window_ms": round(self.longest_ms, 1),
            "loaded": "see the requests' model.load spans (cotenant.load.kind, cotenant.load.name)",
        }


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
    if rise < MIN_LOAD_MS or d < SLOW_RATIO * b or rise < MIN_PART * total_excess_ms:
        return None
    seen = np.isfinite(other) & (np.nan_to_num(cnt) > 0)
    loaded = seen & (other >= LOAD_WINDOW_MS)
    nb, nd = int((seen & before).sum()), int((seen & during).sum())
    during_vals = other[seen & during]
    return LoadFinding(
        before_ms=b,
        during_ms=d,
        windows_before=int((loaded & before).sum()) / nb if nb else 0.0,
        windows_during=int((loaded & during).sum()) / nd if nd else 0.0,
        longest_ms=float(during_vals.max()) if len(during_vals) else 0.0,
        confidence=strength(rise / max(b, MIN_LOAD_MS), half=1.0),
    )
