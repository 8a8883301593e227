"""Host CPU culprits: the processes whose CPU use rose during a victim's incident.

Host CPU use (cores, from ``process_samples.cpu_cores``: procfs for real hosts, the simulator's
host rows) counts CPU seconds actually run, so unlike a GPU's busy time it does not inflate
when a process is merely slowed: a rise is more work. Two exceptions are left to the caller:
the victim itself, and co-tenant models whose demand did not rise (a runtime that spin-waits
on a slow GPU burns CPU as a symptom); both are passed in ``exclude``.

A rise counts when the during mean is at least :data:`MIN_RISE_CORES` over the before mean and
:data:`MIN_Z` standard errors of the difference of the two means (Welch), so the jitter of
idle processes names nobody, while a before range that straddles the start of a hog (a
re-opened incident) still shows its rise.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from cotenant.analysis.change import absent_as_zero, mean_over

MIN_RISE_CORES = 0.05
MIN_Z = 3.0
SE_FLOOR = 0.01
"""Cores: the standard error of a flat series is taken as at least this."""


@dataclass(frozen=True)
class CpuRiser:
    name: str  # process name as recorded (a model's name for processes that served spans)
    before: float  # mean cores over the before windows
    during: float  # mean cores over the during windows
    z: float  # rise over the standard error of the difference of the means

    @property
    def rise(self) -> float:
        return self.during - self.before


def cpu_risers(
    host_cpu: Mapping[str, np.ndarray] | None,
    before: np.ndarray,
    during: np.ndarray,
    exclude: Collection[str] = (),
) -> list[CpuRiser]:
    """Processes of ``host_cpu`` (name -> cores per window) whose CPU use rose, largest rise
    first; names in ``exclude`` are skipped. A process almost never sampled before the
    incident (e.g. outside a top-N) counts as idle then."""
    out = []
    series = {k: np.asarray(x, dtype=np.float64) for k, x in (host_cpu or {}).items()}
    # a window where some process was sampled is one where the sampler ran: a process missing
    # from it was below the sampler's floor (or not running), so it used ~0 cores there.
    # Averaging only over its own samples made a process that ran for the last third of a
    # 100-s incident look as busy as one that ran for all of it.
    sampled = np.zeros(len(before), dtype=bool)
    for x in series.values():
        sampled |= np.isfinite(x)
    for name, x in series.items():
        if name in exclude:
            continue
        y = absent_as_zero(np.where(sampled & ~np.isfinite(x), 0.0, x), before)
        b, d = mean_over(y, before), mean_over(y, during)
        if not (np.isfinite(b) and np.isfinite(d)) or d - b < MIN_RISE_CORES:
            continue
        yb, yd = y[before], y[during]
        nb, nd = max(int(np.isfinite(yb).sum()), 1), max(int(np.isfinite(yd).sum()), 1)
        se = float(np.sqrt(np.nanvar(yb) / nb + np.nanvar(yd) / nd))
        z = (d - b) / max(se, SE_FLOOR)
        if z < MIN_Z:
            continue
        out.append(CpuRiser(name, b, d, z))
    out.sort(key=lambda r: -r.rise)
    return out
