"""Scenario model: the typed form of a scenario YAML file (schema version 1).

The YAML schema is a public interface, documented in docs/scenarios.md. Loading and
validation live in :mod:`simulator.scenario_load`; the engine reads only these types.
Units: times in seconds unless the name says ``_ms``; sizes in MB / GiB as named; demands and
utilisations are fractions 0-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from cotenant.core.slos import Slos

SCHEMA_VERSION = 1

Sharing = Literal["timeslice", "mps", "mig"]
Routing = Literal["weighted", "least-loaded"]
ROUTINGS: tuple[Routing, ...] = ("weighted", "least-loaded")
MAX_REPLICA_WEIGHT = 256
"""Replica weights are integers 0..256, as the gateway's and HAProxy's."""
ArrivalKind = Literal["poisson", "bursty", "trace", "closed"]
FaultKind = Literal[
    "cotenant_burst",
    "process_active",
    "bandwidth_hog",
    "lock_hog",
    "throttle",
    "memory_pressure",
    "cpu_hog",
    "load_surge",
    "length_shift",
    "model_load",
]
TokenLengths = Literal["output", "prompt", "both"]

CLOCK_REASON_BITS: dict[str, int] = {
    # NVML nvmlClocksEventReason* bit values
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clock_setting": 0x100,
}


@dataclass(frozen=True)
class GpuType:
    """A GPU preset: memory, PCIe bandwidth each way, DRAM peak, clocks, power."""

    name: str
    memory_gib: float
    pcie_gbps: float  # GB/s each direction, effective
    dram_gbps: float  # peak DRAM bandwidth, GB/s
    max_sm_clock_mhz: float
    idle_power_w: float
    max_power_w: float


GPU_TYPES: dict[str, GpuType] = {
    "h100-sxm": GpuType("h100-sxm", 80, 50.0, 3350.0, 1980, 70, 700),
    "h200": GpuType("h200", 141, 50.0, 4800.0, 1980, 75, 700),
    "a100-80g": GpuType("a100-80g", 80, 25.0, 2039.0, 1410, 55, 400),
    "l4": GpuType("l4", 24, 25.0, 300.0, 2040, 16, 72),
}


@dataclass(frozen=True)
class Gpu:
    id: str
    type: GpuType
    sharing: Sharing = "timeslice"


@dataclass(frozen=True)
class Arrival:
    """``poisson``: rate_rps. ``bursty``: on/off — rate_rps between bursts, burst_rps during
    bursts of mean length mean_burst_s separated by gaps of mean mean_gap_s (exponential).
    ``trace``: replay inter-arrival times and token counts of a CSV (TIMESTAMP,
    ContextTokens, GeneratedTokens), ``scale`` x faster, from ``start_s`` seconds into the
    trace (wrapping round to its beginning). ``closed``: ``concurrency`` clients
    each sending the next request when the previous returns (after ``think_ms``)."""

    kind: ArrivalKind
    rate_rps: float = 0.0
    burst_rps: float = 0.0
    mean_burst_s: float = 0.0
    mean_gap_s: float = 0.0
    file: str = ""  # resolved absolute path for kind=trace
    scale: float = 1.0
    start_s: float = 0.0  # trace: where in the trace the replay starts
    concurrency: int = 1
    think_ms: float = 0.0


@dataclass(frozen=True)
class Batching:
    max_batch: int = 1
    max_wait_ms: float = 0.0


@dataclass(frozen=True)
class Kernel:
    """One batch's GPU work alone at full clock: ``base_ms + per_item_ms * batch``.
    ``sm_demand``: fraction of the SMs it keeps busy; ``dram_demand``: fraction of peak DRAM
    bandwidth it uses while running; ``memory_bound``: fraction of its time that stretches when
    co-runners load DRAM (MPS)."""

    base_ms: float
    per_item_ms: float = 0.0
    sm_demand: float = 1.0
    dram_demand: float = 0.0
    memory_bound: float = 0.0


@dataclass(frozen=True)
class Transfer:
    h2d_mb: float = 0.0  # per request (item), host -> device
    d2h_mb: float = 0.0  # per request (item), device -> host


@dataclass(frozen=True)
class Lock:
    name: str
    hold_ms: float


@dataclass(frozen=True)
class Replica:
    """One copy of a model on a GPU, with its own queue and batcher there. ``weight`` is its
    share of the model's traffic under ``weighted`` routing (0: none until an action raises
    it); ``pid`` is its fake process id (assigned by the loader when 0)."""

    name: str
    gpu: str
    weight: int = 1
    pid: int = 0


@dataclass(frozen=True)
class Llm:
    """A generative model's physics (opt in with a model's ``llm:`` section; without it a
    model keeps the batch-kernel physics above). Per batch of newly admitted requests, a
    *prefill* kernel of ``kernel.base_ms + kernel.per_item_ms x n + prefill_ms_per_1k x
    prompt tokens / 1000`` (the first token comes out at its end); then each request joins
    the model's *decode* batch (continuous batching, at most ``max_seqs`` sequences), where
    one decode step emits one token for every sequence and takes ``decode_step_ms +
    decode_per_seq_ms x sequences`` alone at full clock; co-runners, DRAM load and clock
    throttling stretch it like any kernel (the ``kernel`` demands apply). Requests without
    token counts (not trace arrivals) draw them from lognormals with these means."""

    prefill_ms_per_1k: float = 10.0
    decode_step_ms: float = 10.0
    decode_per_seq_ms: float = 0.1
    max_seqs: int = 64
    prompt_tokens: float = 512.0
    output_tokens: float = 128.0


@dataclass(frozen=True)
class Model:
    """A served model. With ``replicas``, its traffic is split among them by ``routing``
    (``weighted``: smooth weighted round robin; ``least-loaded``: power of two choices on
    requests in flight per unit of weight) and ``gpu`` is the first replica's GPU; without,
    it runs once on ``gpu`` and its requests name no replica."""

    name: str
    gpu: str
    arrival: Arrival
    kernel: Kernel
    batching: Batching = field(default_factory=Batching)
    slo_p99_ms: float | None = None
    slo_ttft_ms: float | None = None  # p99 time to first token; LLM models (``llm``) only
    slo_tpot_ms: float | None = None  # p99 time per output token; LLM models only
    preprocess_ms: float = 0.0  # host CPU time per request, on the shared pool
    postprocess_ms: float = 0.0
    locks: tuple[Lock, ...] = ()
    transfer: Transfer = field(default_factory=Transfer)
    memory_gib: float = 0.0
    kv_cache_gib: float = 0.0  # > 0: KV cache that memory pressure preempts
    priority: int = 0
    tenant: str = ""
    replicas: tuple[Replica, ...] = ()
    routing: Routing = "weighted"
    llm: Llm | None = None


@dataclass(frozen=True)
class Process:
    """A user that emits no spans: on a GPU (training job, copy loop) or host-only (no gpu).
    It loads its GPU only while a ``process_active`` or ``bandwidth_hog`` fault runs, unless
    ``always_active``."""

    name: str
    gpu: str | None = None
    sm_demand: float = 0.0
    dram_demand: float = 0.0
    pcie_gbps: float = 0.0
    memory_gib: float = 0.0
    always_active: bool = False
    pid: int = 0  # assigned by the loader when 0


@dataclass(frozen=True)
class Fault:
    """One injected fault; which fields apply depends on ``kind`` (docs/scenarios.md)."""

    kind: FaultKind
    start_s: float
    duration_s: float
    target: str = ""  # model or process
    factor: float = 1.0  # cotenant_burst, load_surge: arrival-rate x; length_shift: tokens x
    resource: Literal["dram", "pcie", "nvlink"] = "dram"  # bandwidth_hog
    level: float = 0.0  # bandwidth_hog: fraction of the resource's peak
    lock: str = ""  # lock_hog
    holder: str = ""  # lock_hog
    hold_ms: float = 0.0  # lock_hog
    gpu: str = ""  # throttle
    clock_factor: float = 1.0  # throttle
    reason: str = "hw_thermal"  # throttle: a key of CLOCK_REASON_BITS
    gib: float = 0.0  # memory_pressure
    cores: int = 0  # cpu_hog
    lengths: TokenLengths = "output"  # length_shift: which token counts ``factor`` multiplies
    load_s: float = 0.0  # model_load: seconds each load blocks the target's replicas
    every_s: float = 0.0  # model_load: a load every this many seconds (0: one load, at start)
    load_kind: str = "lora"  # model_load: base | lora | controlnet | pipeline | adapter
    load_name: str = ""  # model_load: what is loaded (evidence only)

    def load_times(self) -> list[tuple[float, float]]:
        """``model_load``: the ``(start, end)`` seconds of each load, in order (none for other
        kinds)."""
        if self.kind != "model_load" or self.load_s <= 0:
            return []
        if self.every_s <= 0:
            return [(self.start_s, self.start_s + self.load_s)]
        n = int(self.duration_s // self.every_s) + 1
        starts = [self.start_s + k * self.every_s for k in range(n)]
        return [(a, a + self.load_s) for a in starts if a < self.end_s]

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True)
class Actuation:
    """Control-loop settings for a closed-loop run of this scenario (``cotenant bench
    --actuate``); None keeps the ``[actuators]`` configuration's value. Seconds. ``expect``
    is scored by the benchmark."""

    ttl_s: float | None = None
    settle_s: float | None = None
    cooldown_s: float | None = None
    expect: Literal["recover", "rollback", "expire", "refrain"] = "recover"
    """What a correct control loop does here: the victim recovers after the change, the
    change is rolled back (it cannot help), it expires at its TTL (the culprit stops), or
    no change is kept (``refrain``: any change made is rolled back, e.g. a reroute that would
    overload the other replica) and no other model is pushed over its SLO."""


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    duration_s: float
    gpus: tuple[Gpu, ...]
    models: tuple[Model, ...]
    host_cpus: int = 16
    processes: tuple[Process, ...] = ()
    faults: tuple[Fault, ...] = ()
    sample_period_s: float = 1.0  # NVML-like counter sampling
    host: str = "sim-node"
    version: int = SCHEMA_VERSION
    actuation: Actuation = field(default_factory=Actuation)

    def gpu(self, gpu_id: str) -> Gpu:
        return next(g for g in self.gpus if g.id == gpu_id)

    def slos(self) -> Slos:
        """The models' SLOs as the analysis, rules and report take them: end to end
        (``slo_p99_ms``), and TTFT / TPOT (``slo_ttft_ms`` / ``slo_tpot_ms``) of LLM models."""
        return Slos.of_maps(
            {m.name: m.slo_p99_ms for m in self.models if m.slo_p99_ms},
            ttft={m.name: m.slo_ttft_ms for m in self.models if m.slo_ttft_ms},
            tpot={m.name: m.slo_tpot_ms for m in self.models if m.slo_tpot_ms},
        )

    def without_fault(self, index: int) -> Scenario:
        """The same scenario with fault ``index`` removed (for counterfactual runs)."""
        from dataclasses import replace

        return replace(self, faults=self.faults[:index] + self.faults[index + 1 :])
