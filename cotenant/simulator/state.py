"""Run-time state of one simulation: its GPUs, models, locks, host CPU pool and running hogs.

The engine (:mod:`simulator.engine`) moves requests through this state, the fault effects
(:mod:`simulator.faults`) change it and the counter sampling (:mod:`simulator.sampling`) reads
it. Times are seconds of virtual time; sizes are GB (transfers) or GiB (memory) as named.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from cotenant.simulator.admission import ModelAdmission
from cotenant.simulator.fluid import Fluid, GpuState, Job
from cotenant.simulator.scenario import Gpu, Model, Process

GIB = 1024**3
MB_TO_GB = 1e-3


class SimLock:
    """A named FIFO mutex: when it is next free and who took it last."""

    __slots__ = ("free_at", "holder", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.free_at = 0.0
        self.holder = ""


class SimModel:
    """One model of the scenario on one GPU while it runs (a model with replicas has one per
    replica: ``idx`` numbers these instances, ``model_idx`` is the model's index in the
    scenario, ``replica`` the replica's name or None): its batch queue (request ids), whether
    a batch is in flight, its max-wait timer (-1: none), its current priority and kernel
    weight (``2**priority``), its admission gate (one per model, shared by its replicas), the
    host CPU seconds it used this sample period and its requests routed but not finished;
    ``loads``: when ``model_load`` faults block it (no batch launches while one runs)."""

    __slots__ = (
        "adm",
        "busy",
        "cpu_s",
        "gpu",
        "idx",
        "in_flight",
        "loads",
        "locks",
        "m",
        "model_idx",
        "pid",
        "priority",
        "queue",
        "replica",
        "timer_at",
        "weight",
    )

    def __init__(
        self,
        idx: int,
        m: Model,
        gpu: int,
        locks: list[SimLock],
        pid: int,
        *,
        model_idx: int | None = None,
        replica: str | None = None,
        adm: ModelAdmission | None = None,
    ) -> None:
        self.idx = idx
        self.model_idx = idx if model_idx is None else model_idx
        self.replica = replica
        self.in_flight = 0
        self.m = m
        self.gpu = gpu
        self.locks = locks
        self.queue: deque[int] = deque()
        # model_load faults: (start, end) seconds while a load blocks this instance, in order
        self.loads: list[tuple[float, float]] = []
        self.busy = False
        self.timer_at = -1.0
        self.priority = m.priority  # changed at run time by set_priority
        self.weight = 2.0**m.priority
        self.pid = pid
        self.adm = ModelAdmission() if adm is None else adm
        self.cpu_s = 0.0


class SimGpu:
    """One GPU while it runs: the fluid server its kernels share, its fault-driven state, the
    counters accumulated over the current sample period, the background jobs of active
    non-model processes (owner ``-1 - process index`` -> job), memory added by
    ``memory_pressure`` (target -> GiB), and when each copy engine is next free."""

    __slots__ = (
        "acc",
        "bytes_rx",
        "bytes_tx",
        "d2h_free",
        "extra_mem_gib",
        "h2d_free",
        "idx",
        "kern",
        "proc_jobs",
        "spec",
        "state",
    )

    def __init__(self, idx: int, spec: Gpu) -> None:
        self.idx = idx
        self.spec = spec
        self.state = GpuState()
        self.acc = [0.0, 0.0]  # busy seconds, DRAM-busy seconds
        self.bytes_tx = 0.0  # GB device -> host in the sample period
        self.bytes_rx = 0.0  # GB host -> device
        self.proc_jobs: dict[int, Job] = {}
        self.extra_mem_gib: dict[str, float] = {}
        self.kern: Fluid  # set by the engine, which owns the event queue it schedules on
        self.h2d_free = 0.0  # copy engines: FIFO, one DMA at a time per direction
        self.d2h_free = 0.0

    def copy(self, t: float, gb: float, h2d: bool, background_gbps: float) -> float:
        """Queue a DMA of ``gb`` GB at ``t`` on the copy engine of one direction; returns when
        it ends. Bandwidth: the GPU's PCIe one way less a PCIe hog and ``background_gbps`` of
        other processes' copies (at least 2 % of it)."""
        full = self.spec.type.pcie_gbps
        bw = max(0.02 * full, full * (1 - self.state.pcie_hog) - background_gbps)
        free = self.h2d_free if h2d else self.d2h_free
        start = free if free > t else t
        end = start + gb / bw
        if h2d:
            self.h2d_free = end
            self.bytes_rx += gb
        else:
            self.d2h_free = end
            self.bytes_tx += gb
        return end


class Batch:
    """A batch of requests of one model, from launch to completion: its sequence number
    (from 1, in launch order) and the virtual times each stage ended."""

    __slots__ = ("d2h_end", "h2d_end", "kernel_end", "launch", "model", "rids", "seq")

    def __init__(self, model: int, rids: list[int], t: float, seq: int) -> None:
        self.model = model
        self.rids = rids
        self.launch = t
        self.h2d_end = t
        self.kernel_end = t
        self.d2h_end = t
        self.seq = seq


class HostCpus:
    """The host's shared CPU pool: a heap of the times each core is next free."""

    __slots__ = ("cores",)

    def __init__(self, n: int) -> None:
        self.cores = [0.0] * max(1, n)

    def run(self, t: float, seconds: float) -> float:
        """Run ``seconds`` of work arriving at ``t`` on the first free core (FIFO); returns
        when it is done."""
        core = heapq.heappop(self.cores)
        start = core if core > t else t
        done = start + seconds
        heapq.heappush(self.cores, done)
        return done

    def reserve(self, n: int, until: float) -> None:
        """Take ``n`` cores (always leaving one) until ``until``: a CPU hog."""
        cores = sorted(self.cores)
        k = min(n, len(cores) - 1)
        for i in range(k):
            cores[i] = max(cores[i], until)
        heapq.heapify(cores)
        self.cores = cores


class HogLoad:
    """What running hogs add to their own process's counters: ``cpu`` (target -> host cores
    taken by ``cpu_hog`` faults) and ``bandwidth`` (target -> (resource, level) of a
    ``bandwidth_hog``)."""

    __slots__ = ("bandwidth", "cpu")

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.bandwidth: dict[str, tuple[str, float]] = {}


def background_pcie_gbps(g: SimGpu, processes: Sequence[Process]) -> float:
    """GB/s each way that the active non-model processes on ``g`` copy."""
    return sum(processes[-1 - o].pcie_gbps for o in g.proc_jobs)


def mem_used_gib(g: SimGpu, models: Sequence[SimModel], processes: Sequence[Process]) -> float:
    """GiB committed on ``g``: its models with their KV caches, its active processes and any
    ``memory_pressure`` growth (may exceed the GPU's memory)."""
    used = sum(ms.m.memory_gib + ms.m.kv_cache_gib for ms in models if ms.gpu == g.idx)
    for o in g.proc_jobs:
        used += processes[-1 - o].memory_gib
    return used + sum(g.extra_mem_gib.values())
