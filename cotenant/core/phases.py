"""The latency phases of a request: the decomposition every layer speaks (spans, store,
frames, analysis)."""

from __future__ import annotations

PHASES: tuple[str, ...] = (
    "queue",
    "lock_wait",
    "preprocess",
    "h2d",
    "compute",
    "d2h",
    "postprocess",
    "other",
)
"""Latency phases of a request, in critical-path order; ``<phase>_ms`` columns sum to latency."""

PHASE_COLUMNS: tuple[str, ...] = tuple(f"{p}_ms" for p in PHASES)
