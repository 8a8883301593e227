"""How injected faults change the simulated physics while they run.

:class:`FaultEffects` applies a fault when it starts and undoes it when it ends (the engine
calls :meth:`FaultEffects.start` / :meth:`FaultEffects.end` at the fault's times), one method
per fault kind. ``cotenant_burst``, ``load_surge`` and ``length_shift`` change nothing here:
their extra arrivals and changed token counts are generated up front
(:mod:`simulator.arrivals`); ``model_load``'s loads are a fixed schedule the engine reads
(:attr:`simulator.state.SimModel.loads`). Memory pressure also acts on every kernel launch through
:meth:`FaultEffects.preemption_factor`. Times are seconds of virtual time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cotenant.simulator.events import EventKind, EventQueue
from cotenant.simulator.fluid import INF, Job
from cotenant.simulator.scenario import CLOCK_REASON_BITS, Fault, Scenario
from cotenant.simulator.state import HogLoad, HostCpus, SimGpu, SimLock, SimModel, mem_used_gib

Effect = Callable[[float, int, Fault, bool], None]


class FaultEffects:
    """The effects of ``scenario``'s faults (and of its always-active processes) on the run-time
    state it is given: GPUs and models (indexed as in the scenario), named locks, the host CPU
    pool and the hog load shown in per-process counters. Lock hogs re-arm themselves through
    ``queue`` (:attr:`EventKind.LOCK_HOG`)."""

    def __init__(
        self,
        scenario: Scenario,
        gpus: Sequence[SimGpu],
        models: Sequence[SimModel],
        locks: dict[str, SimLock],
        cpus: HostCpus,
        hogs: HogLoad,
        queue: EventQueue,
    ) -> None:
        self._s = scenario
        self._gpus = gpus
        self._models = models
        self._locks = locks
        self._cpus = cpus
        self._hogs = hogs
        self._queue = queue
        self._gpu_index = {g.id: i for i, g in enumerate(scenario.gpus)}
        self._proc_index = {p.name: i for i, p in enumerate(scenario.processes)}
        self._active: set[int] = set()
        self._model_bg: dict[int, Job] = {}  # model index -> its never-ending background job
        self._effects: dict[str, Effect] = {
            "process_active": self._process_active,
            "bandwidth_hog": self._bandwidth_hog,
            "throttle": self._throttle,
            "memory_pressure": self._memory_pressure,
            "cpu_hog": self._cpu_hog,
            "lock_hog": self._lock_hog,
            "cotenant_burst": _arrivals_only,
            "load_surge": _arrivals_only,
            "length_shift": _arrivals_only,
            "model_load": _arrivals_only,
        }

    def start(self, t: float, fi: int) -> None:
        """Fault ``fi`` starts at ``t``; ``fi = -1 - p`` starts always-active process ``p``."""
        self._switch(t, fi, True)

    def end(self, t: float, fi: int) -> None:
        """Fault ``fi`` ends at ``t``."""
        self._switch(t, fi, False)

    def _switch(self, t: float, fi: int, start: bool) -> None:
        if fi < 0:  # an always-active process
            self._process(t, -1 - fi, start)
            return
        f = self._s.faults[fi]
        if start:
            self._active.add(fi)
        else:
            self._active.discard(fi)
        self._effects[f.kind](t, fi, f, start)

    # -- one effect per fault kind ----------------------------------------------------------

    def _process_active(self, t: float, fi: int, f: Fault, start: bool) -> None:
        if f.target in self._proc_index:
            self._process(t, self._proc_index[f.target], start)
        else:
            self._model_background(t, f.target, start)

    def _bandwidth_hog(self, t: float, fi: int, f: Fault, start: bool) -> None:
        g = self._target_gpu(f.target)
        if g is None:
            return
        if start:
            self._hogs.bandwidth[f.target] = (f.resource, f.level)
        else:
            self._hogs.bandwidth.pop(f.target, None)
        if f.resource == "pcie":
            g.state.pcie_hog = f.level if start else 0.0
        elif f.resource == "nvlink":
            # single-GPU serving does not use NVLink: visible in counters only
            g.state.nvlink_hog = f.level if start else 0.0
        else:
            g.state.dram_hog = f.level if start else 0.0
            g.kern.changed(t)

    def _throttle(self, t: float, fi: int, f: Fault, start: bool) -> None:
        g = self._gpus[self._gpu_index[f.gpu]]
        g.state.clock_factor = f.clock_factor if start else 1.0
        g.state.reasons = CLOCK_REASON_BITS.get(f.reason, 0) if start else 0
        g.kern.changed(t)

    def _memory_pressure(self, t: float, fi: int, f: Fault, start: bool) -> None:
        g = self._target_gpu(f.target)
        if g is None:
            return
        if start:
            g.extra_mem_gib[f.target] = g.extra_mem_gib.get(f.target, 0.0) + f.gib
        else:
            g.extra_mem_gib[f.target] = g.extra_mem_gib.get(f.target, 0.0) - f.gib

    def _cpu_hog(self, t: float, fi: int, f: Fault, start: bool) -> None:
        cpu = self._hogs.cpu
        if start:
            cpu[f.target] = cpu.get(f.target, 0.0) + f.cores
            self._cpus.reserve(f.cores, f.end_s)
        else:
            cpu[f.target] = cpu.get(f.target, 0.0) - f.cores

    def _lock_hog(self, t: float, fi: int, f: Fault, start: bool) -> None:
        if start:
            self._queue.push(t, EventKind.LOCK_HOG, fi)

    def lock_hog_tick(self, t: float, fi: int) -> None:
        """Lock hog ``fi`` takes its lock again (after the lock's current holder), unless the
        fault has ended; it holds the lock 80 % of the time while the fault lasts."""
        f = self._s.faults[fi]
        if fi not in self._active:
            return
        lk = self._locks[f.lock]
        acquire = lk.free_at if lk.free_at > t else t
        lk.free_at = acquire + f.hold_ms / 1000.0
        lk.holder = f.holder
        self._queue.push(lk.free_at + f.hold_ms / 4000.0, EventKind.LOCK_HOG, fi)

    # -- GPU load of processes ----------------------------------------------------------------

    def _target_gpu(self, name: str) -> SimGpu | None:
        if name in self._proc_index:
            gid = self._s.processes[self._proc_index[name]].gpu
            return None if gid is None else self._gpus[self._gpu_index[gid]]
        for ms in self._models:
            if ms.m.name == name:
                return self._gpus[ms.gpu]
        return None

    def _process(self, t: float, pi: int, start: bool) -> None:
        """Non-model process ``pi`` loads its GPU like a kernel that never ends, or stops."""
        p = self._s.processes[pi]
        if p.gpu is None:
            return
        g = self._gpus[self._gpu_index[p.gpu]]
        owner = -1 - pi
        if start and owner not in g.proc_jobs:
            job = Job(INF, owner, 1.0, None, p.sm_demand, p.dram_demand, 0.0)
            g.proc_jobs[owner] = job
            if p.sm_demand > 0 or p.dram_demand > 0:
                g.kern.add(t, job)
        elif not start and owner in g.proc_jobs:
            job = g.proc_jobs.pop(owner)
            if job in g.kern.jobs:
                g.kern.remove(t, job)

    def _model_background(self, t: float, name: str, start: bool) -> None:
        """``process_active`` aimed at a model: its process loads the GPU like a kernel that
        never ends (e.g. a warm-up or an offline job in the same process)."""
        ms = next((x for x in self._models if x.m.name == name), None)
        if ms is None:
            return
        g = self._gpus[ms.gpu]
        if start and ms.idx not in self._model_bg:
            k = ms.m.kernel
            job = Job(INF, ms.idx, ms.weight, None, k.sm_demand, k.dram_demand, 0.0)
            self._model_bg[ms.idx] = job
            g.kern.add(t, job)
        elif not start and ms.idx in self._model_bg:
            g.kern.remove(t, self._model_bg.pop(ms.idx))

    # -- memory pressure on kernels -----------------------------------------------------------

    def preemption_factor(self, ms: SimModel, seq: int) -> float:
        """Kernel-time multiplier for batch ``seq`` of model ``ms``: a model with a KV cache
        recomputes (x2) with probability overflow / kv_cache when its GPU's memory is
        over-committed; 1 otherwise."""
        m = ms.m
        if m.kv_cache_gib <= 0:
            return 1.0
        g = self._gpus[ms.gpu]
        over = mem_used_gib(g, self._models, self._s.processes) - g.spec.type.memory_gib
        if over <= 0:
            return 1.0
        p = min(1.0, over / m.kv_cache_gib)
        # deterministic per batch so counterfactual runs stay aligned
        u = ((seq * 2654435761 + ms.idx * 40503) % 1_000_003) / 1_000_003
        return 2.0 if u < p else 1.0


def _arrivals_only(t: float, fi: int, f: Fault, start: bool) -> None:
    """``cotenant_burst``, ``load_surge``, ``length_shift``: arrivals generated up front;
    ``model_load``: its schedule is read by the engine."""
