"""Fluid (processor-sharing) servers: the GPU's SMs and its two PCIe directions.

Jobs on a server progress at rates that depend on who else is active; whenever the active set
or the GPU's state changes, every job is advanced to now, rates are recomputed and completion
times rescheduled (stale completion events carry an old version and are ignored).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

INF = math.inf


class Job:
    """Work on a fluid server. ``remaining`` is in the server's unit (seconds of kernel time
    alone at full clock, or GB for a transfer)."""

    __slots__ = (
        "batch",
        "dram",
        "mb",
        "owner",
        "rate",
        "remaining",
        "share",
        "sm",
        "version",
        "weight",
    )

    def __init__(
        self,
        remaining: float,
        owner: int,
        weight: float,
        batch: Any = None,
        sm: float = 1.0,
        dram: float = 0.0,
        mb: float = 0.0,
    ) -> None:
        self.remaining = remaining
        self.owner = owner  # model index, or -1 - process index for background load
        self.weight = weight
        self.batch = batch
        self.sm = sm
        self.dram = dram
        self.mb = mb
        self.rate = 0.0
        self.share = 0.0  # SM share (kernels) — for per-process counters
        self.version = 0


class GpuState:
    """Mutable per-GPU state that faults change."""

    __slots__ = ("clock_factor", "dram_hog", "nvlink_hog", "pcie_hog", "reasons")

    def __init__(self) -> None:
        self.nvlink_hog = 0.0
        self.clock_factor = 1.0
        self.dram_hog = 0.0
        self.pcie_hog = 0.0
        self.reasons = 0


Schedule = Callable[[float, "Fluid", Job], None]


class Fluid:
    """One processor-sharing server with a pluggable rate policy."""

    def __init__(
        self,
        policy: Callable[[list[Job], GpuState], None],
        state: GpuState,
        schedule: Schedule,
        on_advance: Callable[[float, list[Job]], None] | None = None,
    ) -> None:
        self.jobs: list[Job] = []
        self.t = 0.0
        self._policy = policy
        self._state = state
        self._schedule = schedule
        self._on_advance = on_advance

    def advance(self, t: float) -> None:
        dt = t - self.t
        if dt > 0:
            for j in self.jobs:
                j.remaining -= j.rate * dt
            if self._on_advance is not None:
                self._on_advance(dt, self.jobs)
        self.t = t

    def _reschedule(self, t: float) -> None:
        self._policy(self.jobs, self._state)
        for j in self.jobs:
            j.version += 1
            if j.remaining != INF:
                self._schedule(t + (max(0.0, j.remaining) / j.rate if j.rate > 0 else INF), self, j)

    def add(self, t: float, job: Job) -> None:
        self.advance(t)
        self.jobs.append(job)
        self._reschedule(t)

    def remove(self, t: float, job: Job) -> None:
        self.advance(t)
        self.jobs.remove(job)
        job.version += 1
        self._reschedule(t)

    def changed(self, t: float) -> None:
        """The GPU state changed (clock, hog): recompute rates from now."""
        self.advance(t)
        self._reschedule(t)


def kernel_policy(sharing: str) -> Callable[[list[Job], GpuState], None]:
    """Rates of concurrent kernels under ``timeslice``, ``mps`` or ``mig`` sharing.

    * timeslice: contexts take turns, weighted by priority; a kernel's progress is its share
      of time.
    * mps: SMs are shared by demand (proportionally, weighted by priority, when demand exceeds
      the GPU); the memory-bound fraction of a kernel stretches by ``1 + DRAM load of the
      co-runners`` (the calibration in docs/simulator.md).
    * mig: isolated instances; only a DRAM hog on the GPU and the clock couple them.
    In every mode the rate scales with the clock factor (throttling)."""

    def timeslice(jobs: list[Job], st: GpuState) -> None:
        total = sum(j.weight for j in jobs) or 1.0
        for j in jobs:
            share = j.weight / total
            j.share = share
            j.rate = st.clock_factor * share / ((1 - j.mb) + j.mb * (1 + st.dram_hog))

    def mps(jobs: list[Job], st: GpuState) -> None:
        demand = sum(j.sm for j in jobs)
        weighted = sum(j.sm * j.weight for j in jobs) or 1.0
        dram = sum(j.dram for j in jobs) + st.dram_hog
        for j in jobs:
            granted = j.sm if demand <= 1 else min(j.sm, j.sm * j.weight / weighted)
            c = granted / j.sm if j.sm > 0 else 1.0
            j.share = granted
            j.rate = st.clock_factor / ((1 - j.mb) / c + j.mb * (1 + dram - j.dram))

    def mig(jobs: list[Job], st: GpuState) -> None:
        for j in jobs:
            j.share = j.sm
            j.rate = st.clock_factor / ((1 - j.mb) + j.mb * (1 + st.dram_hog))

    return {"timeslice": timeslice, "mps": mps, "mig": mig}[sharing]
