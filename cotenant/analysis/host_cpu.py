"""Host CPU series on a window grid (per process name its cores, and the host's CPU frequency),
and a process whose CPU use rose.

What :func:`analysis.cpu_causes.read_host_cpu` returns and the attribution, its explainers'
context and the candidate series read (a module of its own, importing nothing of the analysis,
so all of them can).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HostFrequency:
    """The host's mean CPU frequency per window (MHz) and its hardware maximum (MHz), shape
    ``(n_windows,)``, NaN where not sampled."""

    mhz: np.ndarray
    max_mhz: np.ndarray

    @property
    def ratio(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            out: np.ndarray = self.mhz / self.max_mhz
        return out


class HostCpu(dict[str, np.ndarray]):
    """Host CPU use (cores) per process name, on a window grid, and the host's CPU frequency
    when it was read (``frequency``; None otherwise)."""

    def __init__(
        self,
        cores: Mapping[str, np.ndarray] | None = None,
        frequency: HostFrequency | None = None,
    ) -> None:
        super().__init__(cores or {})
        self.frequency = frequency


@dataclass(frozen=True)
class CpuRiser:
    name: str  # process name as recorded (a model's name for processes that served spans)
    before: float  # mean cores over the before windows
    during: float  # mean cores over the during windows
    z: float  # rise over the standard error of the difference of the means

    @property
    def rise(self) -> float:
        return self.during - self.before
