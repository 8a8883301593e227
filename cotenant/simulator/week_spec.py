"""The typed form of a simulated week (:mod:`simulator.week`): GPUs, models, GPU processes,
injected faults, and the truth of what was injected. Units: rates in requests/s, times in
seconds from the week's start unless named ``_ns``, utilisations in percent, memory in GiB."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cotenant.core.errors import ScenarioError
from cotenant.simulator.scenario import CLOCK_REASON_BITS

MINUTE_NS = 60_000_000_000

WeekFaultKind = Literal[
    "cotenant_burst", "process_active", "bandwidth_hog", "throttle", "memory_pressure", "load_surge"
]


@dataclass(frozen=True)
class WeekGpu:
    id: str
    memory_gib: float = 80.0
    max_sm_clock_mhz: float = 1980.0
    pcie_peak_bps: float = 50e9  # both directions together


@dataclass(frozen=True)
class WeekModel:
    """A served model: Poisson arrivals at ``rate_rps`` (with a +-``diurnal`` daily swing),
    per-request phase means at rest (ms), its server process's SM / memory-controller use at
    ``rate_rps`` (percent) and memory (GiB)."""

    name: str
    gpu: str
    rate_rps: float
    compute_ms: float
    queue_ms: float = 2.0
    preprocess_ms: float = 1.0
    h2d_ms: float = 0.5
    d2h_ms: float = 0.3
    postprocess_ms: float = 0.5
    other_ms: float = 0.2
    slo_ms: float | None = None
    sm_util: float = 20.0
    mem_util: float = 10.0
    memory_gib: float = 10.0
    batch_size: float = 2.0
    diurnal: float = 0.2
    pid: int = 0


@dataclass(frozen=True)
class WeekProcess:
    """A GPU process that serves no requests (training job, copy loop); it runs only while a
    fault names it, unless ``always_active``."""

    name: str
    gpu: str
    sm_util: float = 0.0
    mem_util: float = 0.0
    memory_gib: float = 0.0
    always_active: bool = False
    pid: int = 0


@dataclass(frozen=True)
class WeekFault:
    """``cotenant_burst`` / ``load_surge``: ``target`` model's arrivals x ``factor``;
    ``process_active``: ``target`` process runs at ``level`` (0-1) of the SMs;
    ``bandwidth_hog``: ``target`` process drives ``resource`` at ``level`` of its peak;
    ``throttle``: ``gpu``'s clock x ``clock_factor`` with ``reason`` set;
    ``memory_pressure``: ``target`` process allocates ``gib`` more."""

    kind: WeekFaultKind
    start_s: float
    duration_s: float
    target: str = ""
    gpu: str = ""
    factor: float = 1.0
    level: float = 0.0
    resource: Literal["dram", "pcie"] = "dram"
    clock_factor: float = 1.0
    reason: str = "hw_thermal"
    gib: float = 0.0


@dataclass(frozen=True)
class WeekSpec:
    start_ns: int
    gpus: tuple[WeekGpu, ...]
    models: tuple[WeekModel, ...]
    processes: tuple[WeekProcess, ...] = ()
    faults: tuple[WeekFault, ...] = ()
    days: float = 7.0
    seed: int = 1
    host: str = "sim-node"

    @property
    def minutes(self) -> int:
        return round(self.days * 1440)

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.minutes * MINUTE_NS


@dataclass(frozen=True)
class TruthFault:
    """What was injected: the cause, its culprit, when, and the models it slowed."""

    kind: str  # DESIGN.md cause vocabulary: cotenant, bandwidth, throttle, memory, load
    culprit: str
    gpu: str
    start_ns: int
    end_ns: int
    victims: tuple[str, ...]
    resource: str | None = None


KIND = {
    "cotenant_burst": "cotenant",
    "process_active": "cotenant",
    "bandwidth_hog": "bandwidth",
    "throttle": "throttle",
    "memory_pressure": "memory",
    "load_surge": "load",
}


# what a fault's target must be (memory_pressure may target either)
_MODEL_FAULTS = ("cotenant_burst", "load_surge")
_PROCESS_FAULTS = ("process_active", "bandwidth_hog")


def check_week(spec: WeekSpec) -> None:
    """ScenarioError naming the field (``week: faults[2].target``) of an invalid spec."""
    gpus = {g.id for g in spec.gpus}
    models = {m.name for m in spec.models}
    processes = {p.name for p in spec.processes}
    names = models | processes
    if spec.minutes < 1:
        raise ScenarioError(f"week: days {spec.days} must cover at least one minute")
    for i, m in enumerate(spec.models):
        if m.gpu not in gpus:
            raise ScenarioError(f"week: models[{i}].gpu {m.gpu!r} is not one of {sorted(gpus)}")
        if not m.rate_rps >= 0:
            raise ScenarioError(f"week: models[{i}].rate_rps {m.rate_rps} must be >= 0")
    for i, p in enumerate(spec.processes):
        if p.gpu not in gpus:
            raise ScenarioError(f"week: processes[{i}].gpu {p.gpu!r} is not one of {sorted(gpus)}")
    for i, f in enumerate(spec.faults):
        if f.kind == "throttle":
            if f.gpu not in gpus:
                raise ScenarioError(f"week: faults[{i}].gpu {f.gpu!r} is not one of {sorted(gpus)}")
            if f.reason not in CLOCK_REASON_BITS:
                raise ScenarioError(f"week: faults[{i}].reason {f.reason!r} is not a reason")
        elif f.target not in names:
            raise ScenarioError(f"week: faults[{i}].target {f.target!r} is not a model or process")
        elif f.kind in _MODEL_FAULTS and f.target not in models:
            raise ScenarioError(
                f"week: faults[{i}].target {f.target!r}: a {f.kind} fault targets a model, "
                f"one of {sorted(models)}"
            )
        elif f.kind in _PROCESS_FAULTS and f.target not in processes:
            raise ScenarioError(
                f"week: faults[{i}].target {f.target!r}: a {f.kind} fault targets a process, "
                f"one of {sorted(processes)}"
            )
        if f.duration_s <= 0:
            raise ScenarioError(f"week: faults[{i}].duration_s {f.duration_s} must be > 0")
