"""The one contract every reference ranker of the benchmark follows.

A ranker scores candidate series (one per metric, all on one window grid) by how much each
changed from the windows before ``anomaly_start`` to the windows from it on, and returns them
best first. The benchmark feeds every ranker, and cotenant's own attribution, the same
candidates over the same windows, so their accuracies can be compared side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from cotenant.core.errors import UsageError


class Ranker(Protocol):
    """Ranks candidate series as root-cause suspects of an anomaly.

    ``series``: candidate name -> values, each of shape ``(n_windows,)`` on the same grid (any
    unit; NaN for a missing window). ``anomaly_start``: index of the first anomalous window.
    Returns ``(name, score)`` by decreasing score; a candidate with no finite value before or
    after the start is left out. Raises :class:`store.errors.UsageError` when the series differ
    in length or ``anomaly_start`` leaves no window on one side."""

    name: str

    def rank(
        self, series: Mapping[str, np.ndarray], anomaly_start: int
    ) -> list[tuple[str, float]]: ...


def split(
    series: Mapping[str, np.ndarray], anomaly_start: int
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(names, before, after): the series stacked as float arrays of shape
    ``(n_series, anomaly_start)`` and ``(n_series, n_windows - anomaly_start)``."""
    names = list(series)
    if not names:
        return names, np.empty((0, 0)), np.empty((0, 0))
    lengths = {len(v) for v in series.values()}
    if len(lengths) != 1:
        raise UsageError(f"series differ in length: {sorted(lengths)}")
    n = lengths.pop()
    if not 1 <= anomaly_start < n:
        raise UsageError(
            f"anomaly_start {anomaly_start} leaves no window before or after it "
            f"(series have {n} windows)"
        )
    x = np.vstack([np.asarray(series[k], dtype=np.float64) for k in names])
    return names, x[:, :anomaly_start], x[:, anomaly_start:]


def ordered(names: list[str], scores: np.ndarray) -> list[tuple[str, float]]:
    """Finite scores by decreasing value, ties by name (so the order is reproducible)."""
    keep = [(n, float(s)) for n, s in zip(names, scores, strict=True) if np.isfinite(s)]
    keep.sort(key=lambda ns: (-ns[1], ns[0]))
    return keep
