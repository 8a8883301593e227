"""NSigma: the classic n-sigma rule as a root-cause ranker.

Each candidate is z-scored against the mean and standard deviation (population, ``ddof=0``) of
its windows before the anomaly; its score is the largest ``|z|`` from the anomaly start on. This
is the NSigma baseline of Pham et al., "BARO: Robust Root Cause Analysis for Microservices via
Multivariate Bayesian Online Change Point Detection", FSE'24 (their ``nsigma``, a
``StandardScaler`` fitted on the normal period). As in that code, a series whose baseline does
not vary gets a standard deviation of 1 (scikit-learn's rule for a zero scale), so its score is
its raw absolute shift.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from cotenant.analysis.baselines.base import ordered, split

_ZERO = 10 * np.finfo(np.float64).eps  # scikit-learn's threshold for "zero scale"


def max_scaled(
    after: np.ndarray, centre: np.ndarray, scale: np.ndarray, two_sided: bool
) -> np.ndarray:
    """Per row of ``after`` (shape ``(k, m)``): max of ``(after - centre) / scale`` (of its
    absolute value when ``two_sided``), ignoring NaN; NaN where a row has no finite value.
    ``scale`` below ~2e-15 counts as 1, like scikit-learn's scalers."""
    scale = np.where(np.isfinite(scale) & (scale >= _ZERO), scale, 1.0)
    z = (after - centre[:, None]) / scale[:, None]
    if two_sided:
        z = np.abs(z)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows give NaN, as documented
        return np.asarray(np.nanmax(z, axis=1)) if z.shape[1] else np.full(len(z), np.nan)


class NSigma:
    """z-score against the pre-anomaly mean / std; score = max |z| after the start
    (``two_sided=False``: max z, as in the BARO authors' code)."""

    def __init__(self, *, two_sided: bool = True) -> None:
        self.two_sided = two_sided
        self.name = "nsigma" if two_sided else "nsigma-one-sided"

    def rank(self, series: Mapping[str, np.ndarray], anomaly_start: int) -> list[tuple[str, float]]:
        names, before, after = split(series, anomaly_start)
        if not names:
            return []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN baselines -> NaN
            mean = np.nanmean(before, axis=1)
            std = np.nanstd(before, axis=1)
        scores = max_scaled(after, mean, std, self.two_sided)
        scores[~np.isfinite(mean)] = np.nan
        return ordered(names, scores)
