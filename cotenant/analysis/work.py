"""What the victim's requests say about their own work: :class:`WorkSeries` (work per request
per window) and :class:`MixExcess` (what token counts explain), read by the ``mix`` explainer
(:mod:`analysis.mix`) and given to :func:`analysis.attribution.attribute`. A module of its own,
importing nothing of the analysis, so the explainers' context can name them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class WorkSeries:
    """Work per request of one model per window (shape ``(n_windows,)``, NaN where unknown):
    ``units`` (a count per request: images, steps, work units) or ``time`` (ms of the work
    itself: pure inference time), with a label and unit for the evidence."""

    per_request: np.ndarray
    kind: str  # "units" | "time"
    label: str
    unit: str


@dataclass(frozen=True)
class MixExcess:
    """What the token counts explain of an indicator's mean (ms per request), and the
    evidence: token-length distributions and per-token rates before and during."""

    ms: float
    evidence: dict[str, Any]
