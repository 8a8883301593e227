"""The state behind :class:`collectors.nvml.fake.FakeNvml`, and the API that drives it.

:class:`FakeNvmlModel` holds the devices (physical GPUs and MIG instances), the processes on
them, their counters (byte rates integrated over the clock into NVML's cumulative counters) and
the per-process utilization samples, and has the driving API tests, benchmarks and the
simulator set them with (``add_gpu``, ``set_gpu``, ``add_process``, ``record_process_util``,
``lose_gpu``, ``unload_driver``, ``create_mig`` …; see :mod:`collectors.nvml.fake`).
:class:`~collectors.nvml.fake.FakeNvml` adds pynvml's surface on top. Every method that
changes or reads more than one value holds the instance lock (:func:`locked`).
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pynvml

FEATURES: tuple[str, ...] = (
    "utilization",
    "memory",
    "pcie_counters",
    "pcie_throughput",
    "nvlink",
    "power",
    "temperature",
    "sm_clock",
    "max_sm_clock",
    "clock_event_reasons",
    "process_utilization",
    "running_processes",
    "mig",
)
"""What :meth:`FakeNvml.set_unsupported` can switch off, one NVML query (or field) each."""

_MIG_UNSUPPORTED = frozenset(FEATURES) - {"memory", "running_processes"}
ALL_LINKS = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """Opaque device handle (NVML's ``nvmlDevice_t``); code under test must not look inside."""

    uuid: str


@dataclass(slots=True)
class FakeProcess:
    """A compute process on ``device`` (a UUID); memory in bytes."""

    pid: int
    name: str
    device: str
    used_memory: int


@dataclass(slots=True)
class FakeDevice:
    """A physical GPU, or a MIG instance of ``parent``: its counters as NVML gives them."""

    uuid: str
    name: str
    index: int
    memory_total: int
    max_sm_clock: int
    parent: str | None = None
    mig_slot: int = -1
    children: list[str] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)
    lost: bool = False
    memory_used: int | None = None
    sm_util: int = 0
    mem_util: int = 0
    power_mw: int = 70_000
    temp_c: int = 35
    sm_clock: int = 1980
    reasons: int = 0
    # rates in bytes/s and their integrals (bytes) up to counters_ns
    rates: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    counters: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0, 0.0])
    counters_ns: int = 0
    util: Any = None  # the c_nvmlUtilization_t answer, rebuilt when set_gpu changes it
    sample_ts: list[int] = field(default_factory=list)
    samples: list[bytes] = field(default_factory=list)  # packed like NVML's sample struct


# rates/counters slots, and the field ids that read them with their unit in bytes
PCIE_TX, PCIE_RX, NVL_TX, NVL_RX = range(4)
FIELDS: dict[int, tuple[int, str, float]] = {
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (PCIE_TX, "pcie_counters", 1.0),
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (PCIE_RX, "pcie_counters", 1.0),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: (NVL_TX, "nvlink", 1024.0),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: (NVL_RX, "nvlink", 1024.0),
}
SAMPLE = struct.Struct("=I4xQIIII")  # c_nvmlProcessUtilizationSample_t, with encUtil, decUtil

_P = ParamSpec("_P")
_R = TypeVar("_R")


def locked(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Hold the instance lock: a simulator's thread may drive the fake while a poller's
    thread reads it. Simple getters of one value need no lock."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with args[0]._lock:  # type: ignore[attr-defined]
            return fn(*args, **kwargs)

    return call


class FakeNvmlModel:
    """Devices, processes, counters and samples in memory; see the module docstring."""

    def __init__(
        self,
        clock: Callable[[], int] = time.time_ns,
        *,
        library_found: bool = True,
        sample_buffer: int = 2048,
    ) -> None:
        """``clock`` gives the time in ns (NVML stamps are µs); ``sample_buffer`` is how many
        process utilization samples a device keeps (NVML's buffer is bounded too)."""
        self.clock = clock
        self.sample_buffer = sample_buffer
        self.library_found = library_found
        self.driver_loaded = True
        self.driver_version = "550.54.15"
        self._init_count = 0
        self._gpus: list[str] = []
        self._devices: dict[str, FakeDevice] = {}
        self._procs: dict[int, FakeProcess] = {}
        self._running: dict[str, list[Any]] = {}  # device uuid -> cached process objects
        self._lock = threading.Lock()
        self.lock = self._lock  # the surface over this model takes the same lock
        self._mem: dict[str, Any] = {}  # device uuid -> cached c_nvmlMemory_t
        self._plans: dict[tuple[Any, ...], list[tuple[int, int, int, float, str]]] = {}

    @property
    def init_count(self) -> int:
        """``nvmlInit`` calls not yet matched by ``nvmlShutdown`` (0: NVML released)."""
        return self._init_count

    # ---- driving API -----------------------------------------------------------------

    @locked
    def add_gpu(
        self,
        *,
        name: str = "NVIDIA H100 80GB HBM3",
        memory_total_bytes: int = 80 << 30,
        max_sm_clock_mhz: int = 1980,
        uuid: str | None = None,
        nvlink: bool = True,
    ) -> str:
        """Add a physical GPU at the next index; returns its UUID."""
        index = len(self._gpus)
        uuid = uuid or f"GPU-00000000-0000-4000-8000-{index:012x}"
        dev = FakeDevice(uuid, name, index, memory_total_bytes, max_sm_clock_mhz)
        dev.sm_clock = max_sm_clock_mhz
        dev.counters_ns = self.clock()
        if not nvlink:
            dev.unsupported.add("nvlink")
        self._gpus.append(uuid)
        self._devices[uuid] = dev
        return uuid

    @locked
    def set_gpu(
        self,
        gpu: int | str,
        *,
        sm_util: float | None = None,
        mem_util: float | None = None,
        memory_used_bytes: int | None = None,
        pcie_tx_bps: float | None = None,
        pcie_rx_bps: float | None = None,
        nvlink_tx_bps: float | None = None,
        nvlink_rx_bps: float | None = None,
        power_w: float | None = None,
        temp_c: float | None = None,
        sm_clock_mhz: float | None = None,
        clock_event_reasons: int | None = None,
    ) -> None:
        """Set a device's counters (units as named; utilization in percent 0-100).

        Only the arguments given change. Byte rates hold until set again; the cumulative
        counters NVML exposes advance by them as the clock moves.
        """
        dev = self._device(gpu)
        self._advance(dev)
        if sm_util is not None:
            dev.sm_util = round(sm_util)
        if mem_util is not None:
            dev.mem_util = round(mem_util)
        dev.util = new_struct(pynvml.c_nvmlUtilization_t, gpu=dev.sm_util, memory=dev.mem_util)
        if memory_used_bytes is not None:
            dev.memory_used = memory_used_bytes
            self._changed()
        for slot, rate in enumerate((pcie_tx_bps, pcie_rx_bps, nvlink_tx_bps, nvlink_rx_bps)):
            if rate is not None:
                dev.rates[slot] = float(rate)
        if power_w is not None:
            dev.power_mw = round(power_w * 1000)
        if temp_c is not None:
            dev.temp_c = round(temp_c)
        if sm_clock_mhz is not None:
            dev.sm_clock = round(sm_clock_mhz)
        if clock_event_reasons is not None:
            dev.reasons = clock_event_reasons

    @locked
    def add_process(
        self, gpu: int | str, pid: int, name: str = "python3", used_memory_bytes: int = 0
    ) -> None:
        """Start a compute process on a device (a MIG instance's UUID for MIG)."""
        dev = self._device(gpu)
        self._procs[pid] = FakeProcess(pid, name, dev.uuid, used_memory_bytes)
        self._changed()

    @locked
    def set_process_memory(self, pid: int, used_memory_bytes: int) -> None:
        self._procs[pid].used_memory = used_memory_bytes
        self._changed()

    @locked
    def remove_process(self, pid: int) -> None:
        """The process exits: gone from the running list; its old samples stay buffered."""
        self._procs.pop(pid, None)
        self._changed()

    @locked
    def record_process_util(
        self, pid: int, sm_util: float, mem_util: float = 0.0, *, ts_ns: int | None = None
    ) -> None:
        """Record one per-process utilization sample (percent), stamped ``ts_ns`` or now."""
        dev = self._devices[self._procs[pid].device]
        ts_us = (self.clock() if ts_ns is None else ts_ns) // 1000
        sample = SAMPLE.pack(pid, ts_us, round(sm_util), round(mem_util), 0, 0)
        at = bisect.bisect_right(dev.sample_ts, ts_us)
        dev.sample_ts.insert(at, ts_us)
        dev.samples.insert(at, sample)
        if len(dev.samples) > self.sample_buffer:
            drop = len(dev.samples) - self.sample_buffer // 2
            del dev.sample_ts[:drop], dev.samples[:drop]

    @locked
    def set_unsupported(self, gpu: int | str, *features: str, unsupported: bool = True) -> None:
        """Make NVML answer ``NVMLError_NotSupported`` for ``features`` (see FEATURES)."""
        unknown = set(features) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}; known: {FEATURES}")
        dev = self._device(gpu)
        if unsupported:
            dev.unsupported.update(features)
        else:
            dev.unsupported.difference_update(features)

    @locked
    def lose_gpu(self, gpu: int | str) -> None:
        """The GPU falls off the bus: its (and its MIG instances') calls raise GpuIsLost."""
        self._device(gpu).lost = True

    @locked
    def recover_gpu(self, gpu: int | str) -> None:
        self._device(gpu).lost = False

    def unload_driver(self) -> None:
        """Every call, ``nvmlInit`` included, raises ``NVMLError_DriverNotLoaded``."""
        self.driver_loaded = False

    def load_driver(self) -> None:
        self.driver_loaded = True

    @locked
    def create_mig(
        self,
        gpu: int | str,
        *,
        memory_total_bytes: int = 10 << 30,
        profile: str = "1g.10gb",
        uuid: str | None = None,
    ) -> str:
        """Turn MIG mode on for a physical GPU and add one instance; returns its UUID."""
        parent = self._device(gpu)
        slot = len(parent.children)
        uuid = uuid or f"MIG-00000000-0000-4000-8000-{parent.index:06x}{slot:06x}"
        child = FakeDevice(
            uuid, f"{parent.name} MIG {profile}", parent.index, memory_total_bytes, 0, parent.uuid
        )
        child.mig_slot = slot
        child.unsupported.update(_MIG_UNSUPPORTED)
        parent.children.append(uuid)
        self._devices[uuid] = child
        self._changed()
        return uuid

    @locked
    def destroy_mig(self, uuid: str) -> None:
        """Remove an instance; its old handle then raises ``NVMLError_InvalidArgument``."""
        child = self._devices[uuid]
        if child.parent is None:
            raise ValueError(f"{uuid} is not a MIG instance")
        del self._devices[uuid]
        self._devices[child.parent].children.remove(uuid)
        for pid in [p.pid for p in self._procs.values() if p.device == uuid]:
            del self._procs[pid]
        self._changed()

    # ---- internals -------------------------------------------------------------------

    def _changed(self) -> None:
        self._running.clear()
        self._mem.clear()

    def _device(self, gpu: int | str) -> FakeDevice:
        return self._devices[self._gpus[gpu] if isinstance(gpu, int) else gpu]

    def _advance(self, dev: FakeDevice) -> None:
        now = self.clock()
        dt = (now - dev.counters_ns) / 1e9
        if dt > 0:
            for i, rate in enumerate(dev.rates):
                dev.counters[i] += rate * dt
        dev.counters_ns = now


def _fill(obj: Any, **values: Any) -> Any:
    # ctypes' own setattr: pynvml's structures override it with a Python-level str check
    for name, value in values.items():
        ctypes.Structure.__setattr__(obj, name, value)
    return obj


def new_struct(cls: Any, **values: Any) -> Any:
    """An instance of the ctypes structure ``cls`` with fields set to ``values``."""
    return _fill(cls(), **values)
