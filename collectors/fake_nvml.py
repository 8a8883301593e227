"""An in-memory NVML with the surface of ``pynvml``, for tests, benchmarks and the simulator.

:class:`FakeNvml` has ``pynvml``'s function names and parameter names, returns the same
objects (pynvml's own ctypes structures where pynvml returns them, its ``nvmlFriendlyObject``
for running processes), and carries pynvml's constants (``NVML_*``,
``nvmlClocksEventReason*``) and exception classes (``NVMLError``, ``NVMLError_NotSupported``,
…) as attributes, so code written against ``pynvml`` runs unchanged against it. Only
``pynvml`` itself is imported, never the NVML shared library.

Driving API (the methods without the ``nvml`` prefix)::

    fake = FakeNvml(clock=virtual_clock_ns)         # clock() -> int ns; NVML stamps are µs
    gpu = fake.add_gpu(name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 << 30)
    fake.set_gpu(gpu, sm_util=70, mem_util=40, pcie_tx_bps=2e9, power_w=350, ...)
    fake.add_process(gpu, pid=4242, name="python3", used_memory_bytes=20 << 30)
    fake.record_process_util(4242, sm_util=65, mem_util=30)   # one sample, stamped now
    fake.set_unsupported(gpu, "nvlink", "power")              # NVMLError_NotSupported
    fake.lose_gpu(gpu); fake.recover_gpu(gpu)                 # NVMLError_GpuIsLost
    fake.unload_driver(); fake.load_driver()                  # NVMLError_DriverNotLoaded
    mig = fake.create_mig(gpu, memory_total_bytes=10 << 30)   # MIG mode on, one instance
    fake = FakeNvml(library_found=False)                      # NVMLError_LibraryNotFound

A GPU is named by its index (physical GPUs) or its UUID (any device, MIG included).
Semantics follow NVML where tests depend on them:

* Functions raise ``NVMLError_Uninitialized`` before ``nvmlInit`` / after the last
  ``nvmlShutdown`` (init is reference counted, as in NVML).
* PCIe and NVLink rates set with :meth:`set_gpu` are integrated over the clock into the
  cumulative byte counters read through ``nvmlDeviceGetFieldValues``
  (``NVML_FI_DEV_PCIE_COUNT_TX_BYTES`` … bytes, ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`` …
  KiB, scope ``0xFFFFFFFF`` = all links); ``nvmlDeviceGetPcieThroughput`` returns the rate in
  KiB/s. An unsupported field comes back with ``nvmlReturn = NVML_ERROR_NOT_SUPPORTED``.
* ``nvmlDeviceGetProcessUtilization(handle, t)`` returns the samples stamped after ``t`` µs and
  not after now, oldest first (NVML keeps a bounded buffer), and raises ``NVMLError_NotFound``
  when there are none. NVML only reports processes that used the GPU: record samples for busy
  processes only. Samples may be recorded ahead of time (``ts_ns`` in the future): they appear
  when the clock reaches them.
* ``nvmlDeviceGetMemoryInfo().used`` is what :meth:`set_gpu` set, else the sum of the
  processes' memory.
* MIG: a MIG-mode GPU reports utilization and per-process utilization as unsupported; a MIG
  instance supports name, UUID, memory and running processes only (as on an A100/H100).
  The parent's running processes are those of all its instances.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

import pynvml  # type: ignore[import-untyped]

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
_ALL_LINKS = 0xFFFFFFFF
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_SUCCESS, _NOT_SUPPORTED = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED
_COPIED_PREFIXES = ("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason")


@dataclass(frozen=True, slots=True)
class FakeHandle:
    """Opaque device handle (NVML's ``nvmlDevice_t``); code under test must not look inside."""

    uuid: str


@dataclass(slots=True)
class _Proc:
    pid: int
    name: str
    device: str
    used_memory: int


@dataclass(slots=True)
class _Device:
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
_PCIE_TX, _PCIE_RX, _NVL_TX, _NVL_RX = range(4)
_FIELDS: dict[int, tuple[int, str, float]] = {
    pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (_PCIE_TX, "pcie_counters", 1.0),
    pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (_PCIE_RX, "pcie_counters", 1.0),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: (_NVL_TX, "nvlink", 1024.0),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: (_NVL_RX, "nvlink", 1024.0),
}


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Hold the instance lock: a simulator's thread may drive the fake while a poller's
    thread reads it. Simple getters of one value need no lock."""

    @functools.wraps(fn)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with args[0]._lock:  # type: ignore[attr-defined]
            return fn(*args, **kwargs)

    return call


class FakeNvml:
    """NVML in memory; see the module docstring for the driving API and the semantics."""

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
        self._devices: dict[str, _Device] = {}
        self._procs: dict[int, _Proc] = {}
        self._running: dict[str, list[Any]] = {}  # device uuid -> cached process objects
        self._lock = threading.Lock()
        self._mem: dict[str, Any] = {}  # device uuid -> cached c_nvmlMemory_t
        self._plans: dict[tuple[Any, ...], list[tuple[int, int, int, float, str]]] = {}

    @property
    def init_count(self) -> int:
        """``nvmlInit`` calls not yet matched by ``nvmlShutdown`` (0: NVML released)."""
        return self._init_count

    # ---- driving API -----------------------------------------------------------------

    @_locked
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
        dev = _Device(uuid, name, index, memory_total_bytes, max_sm_clock_mhz)
        dev.sm_clock = max_sm_clock_mhz
        dev.counters_ns = self.clock()
        if not nvlink:
            dev.unsupported.add("nvlink")
        self._gpus.append(uuid)
        self._devices[uuid] = dev
        return uuid

    @_locked
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
        dev.util = _struct(pynvml.c_nvmlUtilization_t, gpu=dev.sm_util, memory=dev.mem_util)
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

    @_locked
    def add_process(
        self, gpu: int | str, pid: int, name: str = "python3", used_memory_bytes: int = 0
    ) -> None:
        """Start a compute process on a device (a MIG instance's UUID for MIG)."""
        dev = self._device(gpu)
        self._procs[pid] = _Proc(pid, name, dev.uuid, used_memory_bytes)
        self._changed()

    @_locked
    def set_process_memory(self, pid: int, used_memory_bytes: int) -> None:
        self._procs[pid].used_memory = used_memory_bytes
        self._changed()

    @_locked
    def remove_process(self, pid: int) -> None:
        """The process exits: gone from the running list; its old samples stay buffered."""
        self._procs.pop(pid, None)
        self._changed()

    @_locked
    def record_process_util(
        self, pid: int, sm_util: float, mem_util: float = 0.0, *, ts_ns: int | None = None
    ) -> None:
        """Record one per-process utilization sample (percent), stamped ``ts_ns`` or now."""
        dev = self._devices[self._procs[pid].device]
        ts_us = (self.clock() if ts_ns is None else ts_ns) // 1000
        sample = _SAMPLE.pack(pid, ts_us, round(sm_util), round(mem_util), 0, 0)
        at = bisect.bisect_right(dev.sample_ts, ts_us)
        dev.sample_ts.insert(at, ts_us)
        dev.samples.insert(at, sample)
        if len(dev.samples) > self.sample_buffer:
            drop = len(dev.samples) - self.sample_buffer // 2
            del dev.sample_ts[:drop], dev.samples[:drop]

    @_locked
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

    @_locked
    def lose_gpu(self, gpu: int | str) -> None:
        """The GPU falls off the bus: its (and its MIG instances') calls raise GpuIsLost."""
        self._device(gpu).lost = True

    @_locked
    def recover_gpu(self, gpu: int | str) -> None:
        self._device(gpu).lost = False

    def unload_driver(self) -> None:
        """Every call, ``nvmlInit`` included, raises ``NVMLError_DriverNotLoaded``."""
        self.driver_loaded = False

    def load_driver(self) -> None:
        self.driver_loaded = True

    @_locked
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
        child = _Device(
            uuid, f"{parent.name} MIG {profile}", parent.index, memory_total_bytes, 0, parent.uuid
        )
        child.mig_slot = slot
        child.unsupported.update(_MIG_UNSUPPORTED)
        parent.children.append(uuid)
        self._devices[uuid] = child
        self._changed()
        return uuid

    @_locked
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

    def _device(self, gpu: int | str) -> _Device:
        return self._devices[self._gpus[gpu] if isinstance(gpu, int) else gpu]

    def _check(self) -> None:
        if not self.library_found or self._init_count == 0:
            raise pynvml.NVMLError_Uninitialized()
        if not self.driver_loaded:
            raise pynvml.NVMLError_DriverNotLoaded()

    def _dev(self, handle: FakeHandle, feature: str | None = None) -> _Device:
        if not self.library_found or self._init_count == 0 or not self.driver_loaded:
            self._check()
        dev = self._devices.get(handle.uuid)
        if dev is None:
            raise pynvml.NVMLError_InvalidArgument()
        top = self._devices[dev.parent] if dev.parent is not None else dev
        if top.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if feature is not None and (
            feature in dev.unsupported
            or (dev.children and feature in ("utilization", "process_utilization"))
        ):
            raise pynvml.NVMLError_NotSupported()
        return dev

    def _advance(self, dev: _Device) -> None:
        now = self.clock()
        dt = (now - dev.counters_ns) / 1e9
        if dt > 0:
            for i, rate in enumerate(dev.rates):
                dev.counters[i] += rate * dt
        dev.counters_ns = now

    # ---- pynvml surface --------------------------------------------------------------

    @_locked
    def nvmlInit(self) -> None:
        if not self.library_found:
            raise pynvml.NVMLError_LibraryNotFound()
        if not self.driver_loaded:
            raise pynvml.NVMLError_DriverNotLoaded()
        self._init_count += 1

    @_locked
    def nvmlShutdown(self) -> None:
        # works with the driver gone, so a poller can re-initialise cleanly
        if not self.library_found or self._init_count == 0:
            raise pynvml.NVMLError_Uninitialized()
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver_version

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check()
        proc = self._procs.get(pid)
        if proc is None:
            raise pynvml.NVMLError_NotFound()
        return proc.name

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check()
        if not 0 <= index < len(self._gpus):
            raise pynvml.NVMLError_InvalidArgument()
        handle = FakeHandle(self._gpus[index])
        self._dev(handle)
        return handle

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._dev(handle).uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._dev(handle).name

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        return self._dev(handle).index

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        dev = self._dev(handle, "utilization")
        if dev.util is None:
            dev.util = _struct(pynvml.c_nvmlUtilization_t, gpu=dev.sm_util, memory=dev.mem_util)
        return dev.util

    @_locked
    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        dev = self._dev(handle, "memory")
        info = self._mem.get(dev.uuid)
        if info is None:
            used = dev.memory_used
            if used is None:
                used = sum(o.usedGpuMemory for o in self._running_objects(dev))
            total, used = dev.memory_total, min(used, dev.memory_total)
            info = _struct(pynvml.c_nvmlMemory_t, total=total, free=total - used, used=used)
            self._mem[dev.uuid] = info
        return info

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        dev = self._dev(device, "pcie_throughput")
        if counter not in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
            raise pynvml.NVMLError_InvalidArgument()
        return (
            int(dev.rates[_PCIE_TX if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else _PCIE_RX])
            // 1024
        )

    @_locked
    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: Iterable[Any]) -> Any:
        dev = self._dev(handle)
        self._advance(dev)
        ts_us, counters, unsupported = dev.counters_ns // 1000, dev.counters, dev.unsupported
        args: list[int] = []
        for fid, scope, slot, unit, feature in self._field_plan(tuple(fieldIds)):
            if slot < 0 or feature in unsupported:
                args += (fid, scope, ts_us, 0, _ULL, _NOT_SUPPORTED, 0)
            else:
                value = int(counters[slot] / unit) & 0xFFFFFFFFFFFFFFFF
                args += (fid, scope, ts_us, 0, _ULL, _SUCCESS, value)
        n = len(args) // 7
        layout = _FIELD_VALUES.get(n)
        if layout is None:  # n c_nvmlFieldValue_t, each value as an unsigned 64-bit integer
            layout = _FIELD_VALUES[n] = struct.Struct("=" + "IIqqIIQ" * n)
        return (pynvml.c_nvmlFieldValue_t * n).from_buffer_copy(layout.pack(*args))

    def _field_plan(self, ids: tuple[Any, ...]) -> list[tuple[int, int, int, float, str]]:
        """Per requested field: id, scope, counter slot (-1: not modelled), unit, feature."""
        plan = self._plans.get(ids)
        if plan is None:
            plan = []
            for item in ids:
                fid, scope = item if isinstance(item, tuple) else (item, 0)
                slot, feature, unit = _FIELDS.get(fid, (-1, "", 1.0))
                if feature == "nvlink" and scope != _ALL_LINKS:
                    slot = -1  # per-link counters are not modelled
                plan.append((fid, scope, slot, unit, feature))
            self._plans[ids] = plan
        return plan

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._dev(handle, "power").power_mw

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        dev = self._dev(handle, "temperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_NotSupported()
        return dev.temp_c

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        dev = self._dev(handle, "sm_clock")
        if type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise pynvml.NVMLError_NotSupported()
        return dev.sm_clock

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, type: int) -> int:
        dev = self._dev(handle, "max_sm_clock")
        if type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise pynvml.NVMLError_NotSupported()
        return dev.max_sm_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._dev(handle, "clock_event_reasons").reasons

    @_locked
    def nvmlDeviceGetProcessUtilization(self, handle: FakeHandle, timeStamp: int) -> list[Any]:
        dev = self._dev(handle, "process_utilization")
        start = bisect.bisect_right(dev.sample_ts, timeStamp)
        end = bisect.bisect_right(dev.sample_ts, self.clock() // 1000)  # none from the future
        n = end - start
        if n == 0:
            raise pynvml.NVMLError_NotFound()
        # as pynvml: a list of structures viewing one ctypes array
        array_type = pynvml.c_nvmlProcessUtilizationSample_t * n
        samples: list[Any] = array_type.from_buffer_copy(b"".join(dev.samples[start:end]))[0:n]
        return samples

    @_locked
    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        return list(self._running_objects(self._dev(handle, "running_processes")))

    def _running_objects(self, dev: _Device) -> list[Any]:
        cached = self._running.get(dev.uuid)
        if cached is None:
            cached = []
            for p in self._processes(dev):
                owner = self._devices[p.device]
                gi = owner.mig_slot if owner.mig_slot >= 0 else 0xFFFFFFFF
                info = pynvml.c_nvmlProcessInfo_v2_t(
                    pid=p.pid, usedGpuMemory=p.used_memory, gpuInstanceId=gi, computeInstanceId=gi
                )
                cached.append(pynvml.nvmlStructToFriendlyObject(info))
            self._running[dev.uuid] = cached
        return cached

    def nvmlDeviceGetMigMode(self, device: FakeHandle) -> list[int]:
        dev = self._dev(device, "mig")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if dev.children else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeHandle) -> int:
        dev = self._dev(device, "mig")
        return 7 if dev.parent is None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeHandle, index: int) -> FakeHandle:
        dev = self._dev(device, "mig")
        if not 0 <= index < len(dev.children):
            raise pynvml.NVMLError_NotFound()
        return FakeHandle(dev.children[index])

    def nvmlDeviceIsMigDeviceHandle(self, device: FakeHandle) -> int:
        return int(self._dev(device).parent is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: FakeHandle) -> FakeHandle:
        dev = self._dev(migDevice)
        if dev.parent is None:
            raise pynvml.NVMLError_InvalidArgument()
        return FakeHandle(dev.parent)

    def _processes(self, dev: _Device) -> list[_Proc]:
        owners = {dev.uuid, *dev.children}
        return [p for p in self._procs.values() if p.device in owners]


_SAMPLE = struct.Struct("=I4xQIIII")  # c_nvmlProcessUtilizationSample_t
_FIELD_VALUES: dict[int, struct.Struct] = {}


def _fill(obj: Any, **values: Any) -> Any:
    # ctypes' own setattr: pynvml's structures override it with a Python-level str check
    for name, value in values.items():
        ctypes.Structure.__setattr__(obj, name, value)
    return obj


def _struct(cls: Any, **values: Any) -> Any:
    return _fill(cls(), **values)


# pynvml's constants and exception classes, so ``fake.NVML_CLOCK_SM`` and
# ``except fake.NVMLError_GpuIsLost`` read exactly as they do against the module.
for _name in dir(pynvml):
    if _name.startswith(_COPIED_PREFIXES):
        setattr(FakeNvml, _name, getattr(pynvml, _name))
del _name
