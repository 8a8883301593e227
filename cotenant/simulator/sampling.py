"""NVML-like counters sampled from the simulation's state, once per sample period.

While kernels run, :meth:`Sampler.kernel_accounting` accumulates busy and DRAM time per GPU and
per owner (model or process); :meth:`Sampler.sample` turns what accumulated since the last
sample into one ``gpu_samples`` row per GPU and ``process_samples`` rows per process, in the
store's column order (:mod:`store.schema`), and starts the next period.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cotenant.simulator.fluid import Job
from cotenant.simulator.scenario import CLOCK_REASON_BITS, Scenario
from cotenant.simulator.state import (
    GIB,
    HogLoad,
    SimGpu,
    SimModel,
    background_pcie_gbps,
    mem_used_gib,
)

NVLINK_GBPS = 450.0  # one direction, H100-class
HOST_IDLE_CORES = 0.05  # what an idle host process shows

Row = tuple[Any, ...]


class Sampler:
    """Counters of ``scenario``'s GPUs and processes. ``start_ns`` maps virtual time 0 onto
    wall-clock nanoseconds (the rows' ``ts``); ``gpus`` and ``models`` are the run-time state
    read at each sample; ``hogs`` is what running hogs add to their process's counters."""

    def __init__(
        self,
        scenario: Scenario,
        start_ns: int,
        gpus: Sequence[SimGpu],
        models: Sequence[SimModel],
        hogs: HogLoad,
    ) -> None:
        self._s = scenario
        self._start_ns = start_ns
        self._gpus = gpus
        self._models = models
        self._hogs = hogs
        # (gpu, owner) -> [SM-share seconds, DRAM seconds] in the current sample period
        self._proc_acc: dict[tuple[int, int], list[float]] = {}
        self._gpu_rows: list[Row] = []
        self._proc_rows: list[Row] = []
        self._last_sample = 0.0

    def kernel_accounting(self, g: SimGpu) -> Callable[[float, list[Job]], None]:
        """The callback for ``g``'s kernel server: ``dt`` seconds passed with ``jobs``
        running."""
        spec = g.spec

        def acc_kernel(dt: float, jobs: list[Job]) -> None:
            if jobs:
                g.acc[0] += dt
                g.acc[1] += dt * min(
                    1.0,
                    sum(j.dram * j.share if spec.sharing == "timeslice" else j.dram for j in jobs)
                    + g.state.dram_hog,
                )
                for j in jobs:
                    a = self._proc_acc.setdefault((g.idx, j.owner), [0.0, 0.0])
                    a[0] += dt * j.share
                    a[1] += dt * j.dram * (j.share if spec.sharing == "timeslice" else 1.0)
            elif g.state.dram_hog:
                g.acc[1] += dt * g.state.dram_hog

        return acc_kernel

    def sample(self, t: float) -> None:
        """Rows for the period ending at virtual time ``t``; nothing when the period is
        empty."""
        period = t - self._last_sample
        if period <= 0:
            return
        ts = self._start_ns + int(t * 1e9)
        for g in self._gpus:
            g.kern.advance(t)
            self._gpu_rows.append(self._gpu_row(g, ts, period))
            g.acc[0] = g.acc[1] = 0.0
            g.bytes_tx = g.bytes_rx = 0.0
            self._gpu_process_rows(g, ts, period)
        for ms in self._models:
            ms.cpu_s = 0.0
        host = self._s.host
        for p in self._s.processes:
            if p.gpu is None:  # host-only processes: their CPU use is all that shows
                cores = self._hogs.cpu.get(p.name, 0.0)
                self._proc_rows.append(
                    (ts, host, None, p.pid, p.name, None, None, None, None, cores + HOST_IDLE_CORES)
                )
        self._last_sample = t

    def take(self) -> tuple[list[Row], list[Row]]:
        """(gpu sample rows, process sample rows) since the last call."""
        g, p = self._gpu_rows, self._proc_rows
        self._gpu_rows, self._proc_rows = [], []
        return g, p

    def _gpu_row(self, g: SimGpu, ts: int, period: float) -> Row:
        spec = g.spec.type
        sm = min(1.0, g.acc[0] / period)
        mem = min(1.0, g.acc[1] / period)
        clock = spec.max_sm_clock_mhz * g.state.clock_factor
        bg = background_pcie_gbps(g, self._s.processes)
        hog = g.state.pcie_hog * spec.pcie_gbps
        tx = (g.bytes_tx / period + bg + hog) * 1e9
        rx = (g.bytes_rx / period + bg + hog) * 1e9
        reasons = g.state.reasons | (CLOCK_REASON_BITS["gpu_idle"] if sm == 0 else 0)
        power = (
            spec.idle_power_w + (spec.max_power_w - spec.idle_power_w) * sm * g.state.clock_factor
        )
        used = min(mem_used_gib(g, self._models, self._s.processes), spec.memory_gib) * GIB
        nvl = g.state.nvlink_hog * NVLINK_GBPS * 1e9 if g.state.nvlink_hog else None
        return (
            ts,
            self._s.host,
            g.spec.id,
            sm * 100.0,
            mem * 100.0,
            mem,
            tx,
            rx,
            nvl,
            nvl,
            int(used),
            int(spec.memory_gib * GIB),
            power,
            35.0 + 45.0 * sm,
            clock,
            spec.max_sm_clock_mhz,
            reasons,
        )

    def _gpu_process_rows(self, g: SimGpu, ts: int, period: float) -> None:
        """One row per model on ``g``; one per process on ``g`` that ran or hogged."""
        host = self._s.host
        cpu_hogs = self._hogs.cpu
        for ms in self._models:
            if ms.gpu != g.idx:
                continue
            a = self._proc_acc.pop((g.idx, ms.idx), [0.0, 0.0])
            mem_b = int(
                (ms.m.memory_gib + ms.m.kv_cache_gib + g.extra_mem_gib.get(ms.m.name, 0.0)) * GIB
            )
            self._proc_rows.append(
                (
                    ts,
                    host,
                    g.spec.id,
                    ms.pid,
                    ms.m.name,
                    ms.m.name,
                    min(100.0, a[0] / period * 100.0),
                    min(100.0, a[1] / period * 100.0 + self._hog_mem_util(ms.m.name, g)),
                    mem_b,
                    ms.cpu_s / period + cpu_hogs.get(ms.m.name, 0.0),
                )
            )
        for pi, p in enumerate(self._s.processes):
            if p.gpu != g.spec.id:
                continue
            owner = -1 - pi
            a = self._proc_acc.pop((g.idx, owner), [0.0, 0.0])
            hog = self._hog_mem_util(p.name, g)
            if owner not in g.proc_jobs and a == [0.0, 0.0] and not hog:
                continue
            self._proc_rows.append(
                (
                    ts,
                    host,
                    g.spec.id,
                    p.pid,
                    p.name,
                    None,
                    min(100.0, a[0] / period * 100.0),
                    min(100.0, a[1] / period * 100.0 + hog),
                    int(p.memory_gib * GIB),
                    cpu_hogs.get(p.name) or None,
                )
            )

    def _hog_mem_util(self, name: str, g: SimGpu) -> float:
        """Memory-controller load (percent) a bandwidth hog puts on its own process's counters:
        its DRAM level, or for a PCIe copy loop the DRAM traffic of the copies."""
        hog = self._hogs.bandwidth.get(name)
        if hog is None:
            return 0.0
        resource, level = hog
        if resource == "dram":
            return level * 100.0
        t = g.spec.type
        return min(100.0, level * 2 * t.pcie_gbps / t.dram_gbps * 100.0)
