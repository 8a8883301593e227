"""BARO: robust-scaler ranking after a change point.

Pham, Ha, Zhang, "BARO: Robust Root Cause Analysis for Microservices via Multivariate Bayesian
Online Change Point Detection", FSE'24. Two steps:

1. where the anomaly starts: Bayesian online change point detection on the anomaly metric
   (:func:`analysis.baselines.bocpd.anomaly_start`), unless the start is given;
2. each candidate is scaled with a RobustScaler fitted on its windows before the start (centre:
   median, scale: interquartile range, a zero range counting as 1 as in scikit-learn); its score
   is the largest ``|scaled|`` from the start on (``two_sided=False``: the largest scaled value,
   as in the authors' code).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from cotenant.analysis.baselines.base import ordered, split
from cotenant.analysis.baselines.bocpd import anomaly_start as find_start
from cotenant.analysis.baselines.nsigma import max_scaled
from cotenant.core.errors import UsageError


class Baro:
    """RobustScaler (median / IQR of the pre-anomaly windows) ranking; see the module doc."""

    def __init__(self, *, two_sided: bool = True) -> None:
        self.two_sided = two_sided
        self.name = "baro" if two_sided else "baro-one-sided"

    def rank(self, series: Mapping[str, np.ndarray], anomaly_start: int) -> list[tuple[str, float]]:
        names, before, after = split(series, anomaly_start)
        if not names:
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN baselines -> NaN
            q25, med, q75 = np.nanpercentile(before, [25, 50, 75], axis=1)
        scores = max_scaled(after, med, q75 - q25, self.two_sided)
        scores[~np.isfinite(med)] = np.nan
        return ordered(names, scores)

    def rank_detect(
        self, series: Mapping[str, np.ndarray], anomaly_metric: np.ndarray
    ) -> tuple[int, list[tuple[str, float]]]:
        """BARO end to end: the start from BOCPD on ``anomaly_metric`` (shape
        ``(n_windows,)``, e.g. the end-to-end latency), then :meth:`rank`. Raises
        :class:`UsageError` when no change point is found."""
        start = find_start(anomaly_metric)
        if start is None:
            raise UsageError("BOCPD found no change point in the anomaly metric")
        return start, self.rank(series, start)
