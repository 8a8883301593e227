"""An in-memory NVML with the surface of ``pynvml``, for tests, benchmarks and the simulator.

:class:`FakeNvml` has ``pynvml``'s function names and parameter names, returns the same
objects (pynvml's own ctypes structures where pynvml returns them, its ``nvmlFriendlyObject``
for running processes), and carries pynvml's constants (``NVML_*``,
``nvmlClocksEventReason*``) and exception classes (``NVMLError``, ``NVMLError_NotSupported``,
…) as attributes, so code written against ``pynvml`` runs unchanged against it. Only
``pynvml`` itself is imported, never the NVML shared library. mypy checks it against
:class:`collectors.nvml.api.NvmlApi`, the surface the collector uses (bottom of this module).
The state it answers from, and the driving API below, are its ``model``, a
:class:`collectors.nvml.fake_model.FakeNvmlModel` (composition: the NVML surface here, the
devices and processes there, one lock between them).

Driving API (the model's methods)::

    fake = FakeNvml(clock=virtual_clock_ns)         # clock() -> int ns; NVML stamps are µs
    gpu = fake.model.add_gpu(name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 << 30)
    fake.model.set_gpu(gpu, sm_util=70, mem_util=40, pcie_tx_bps=2e9, power_w=350, ...)
    fake.model.add_process(gpu, pid=4242, name="python3", used_memory_bytes=20 << 30)
    fake.model.record_process_util(4242, sm_util=65, mem_util=30)  # one sample, stamped now
    fake.model.set_unsupported(gpu, "nvlink", "power")        # NVMLError_NotSupported
    fake.model.lose_gpu(gpu); fake.model.recover_gpu(gpu)     # NVMLError_GpuIsLost
    fake.model.unload_driver(); fake.model.load_driver()      # NVMLError_DriverNotLoaded
    mig = fake.model.create_mig(gpu, memory_total_bytes=10 << 30)  # MIG on, one instance
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
import struct
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pynvml

from cotenant.collectors.nvml.fake_model import (
    ALL_LINKS,
    FIELDS,
    PCIE_RX,
    PCIE_TX,
    FakeDevice,
    FakeHandle,
    FakeNvmlModel,
    FakeProcess,
    locked,
    new_struct,
)

if TYPE_CHECKING:
    from cotenant.collectors.nvml.api import NvmlApi

_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
_SUCCESS, _NOT_SUPPORTED = pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED
_COPIED_PREFIXES = ("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottleReason")


def _error(code: int) -> pynvml.NVMLError:
    """pynvml's exception for ``code``, as pynvml raises it: ``NVMLError(code)`` is an instance
    of the code's subclass (``NVMLError_NotFound`` …, which pynvml creates at import, out of
    mypy's sight)."""
    return pynvml.NVMLError(code)  # type: ignore[no-untyped-call]  # unannotated __new__


class FakeNvml:
    """NVML in memory: pynvml's surface over a :class:`FakeNvmlModel` (``model``, the state
    and its driving API); see the module docstring for both and the semantics."""

    def __init__(
        self,
        model: FakeNvmlModel | None = None,
        *,
        clock: Callable[[], int] = time.time_ns,
        library_found: bool = True,
        sample_buffer: int = 2048,
    ) -> None:
        """``model``: the devices and processes answered from (a new one of ``clock``,
        ``library_found`` and ``sample_buffer`` when None, see :class:`FakeNvmlModel`)."""
        self.model = model or FakeNvmlModel(
            clock, library_found=library_found, sample_buffer=sample_buffer
        )
        self._lock = self.model.lock  # one lock: a driver thread and a poller share the state

    # what collectors.nvml.api.NvmlApi names, spelled out for mypy; every other NVML_*
    # constant and NVMLError_* class is copied in at import (the loop at the bottom)
    NVMLError = pynvml.NVMLError

    NVML_ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
    NVML_ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_RESET_REQUIRED = pynvml.NVML_ERROR_RESET_REQUIRED
    NVML_ERROR_GPU_NOT_FOUND = pynvml.NVML_ERROR_GPU_NOT_FOUND
    NVML_ERROR_UNKNOWN = pynvml.NVML_ERROR_UNKNOWN
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    NVML_ERROR_UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_VALUE_TYPE_DOUBLE = pynvml.NVML_VALUE_TYPE_DOUBLE
    NVML_VALUE_TYPE_UNSIGNED_INT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    NVML_VALUE_TYPE_UNSIGNED_LONG = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG
    NVML_VALUE_TYPE_SIGNED_INT = pynvml.NVML_VALUE_TYPE_SIGNED_INT
    NVML_VALUE_TYPE_UNSIGNED_SHORT = pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES = pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def _check(self) -> None:
        if not self.model.library_found or self.model._init_count == 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if not self.model.driver_loaded:
            raise _error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    def _dev(self, handle: FakeHandle, feature: str | None = None) -> FakeDevice:
        if (
            not self.model.library_found
            or self.model._init_count == 0
            or not self.model.driver_loaded
        ):
            self._check()
        dev = self.model._devices.get(handle.uuid)
        if dev is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        top = self.model._devices[dev.parent] if dev.parent is not None else dev
        if top.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if feature is not None and (
            feature in dev.unsupported
            or (dev.children and feature in ("utilization", "process_utilization"))
        ):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev

    # ---- pynvml surface --------------------------------------------------------------

    @locked
    def nvmlInit(self) -> None:
        if not self.model.library_found:
            raise _error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if not self.model.driver_loaded:
            raise _error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.model._init_count += 1

    @locked
    def nvmlShutdown(self) -> None:
        # works with the driver gone, so a poller can re-initialise cleanly
        if not self.model.library_found or self.model._init_count == 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        self.model._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.model.driver_version

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check()
        proc = self.model._procs.get(pid)
        if proc is None:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return proc.name

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.model._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check()
        if not 0 <= index < len(self.model._gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = FakeHandle(self.model._gpus[index])
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
            dev.util = new_struct(pynvml.c_nvmlUtilization_t, gpu=dev.sm_util, memory=dev.mem_util)
        return dev.util

    @locked
    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        dev = self._dev(handle, "memory")
        info = self.model._mem.get(dev.uuid)
        if info is None:
            used = dev.memory_used
            if used is None:
                used = sum(o.usedGpuMemory for o in self._running_objects(dev))
            total, used = dev.memory_total, min(used, dev.memory_total)
            info = new_struct(pynvml.c_nvmlMemory_t, total=total, free=total - used, used=used)
            self.model._mem[dev.uuid] = info
        return info

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        dev = self._dev(device, "pcie_throughput")
        if counter not in (pynvml.NVML_PCIE_UTIL_TX_BYTES, pynvml.NVML_PCIE_UTIL_RX_BYTES):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return (
            int(dev.rates[PCIE_TX if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else PCIE_RX])
            // 1024
        )

    @locked
    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: Iterable[Any]) -> Any:
        dev = self._dev(handle)
        self.model._advance(dev)
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
        plan = self.model._plans.get(ids)
        if plan is None:
            plan = []
            for item in ids:
                fid, scope = item if isinstance(item, tuple) else (item, 0)
                slot, feature, unit = FIELDS.get(fid, (-1, "", 1.0))
                if feature == "nvlink" and scope != ALL_LINKS:
                    slot = -1  # per-link counters are not modelled
                plan.append((fid, scope, slot, unit, feature))
            self.model._plans[ids] = plan
        return plan

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._dev(handle, "power").power_mw

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        dev = self._dev(handle, "temperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev.temp_c

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        dev = self._dev(handle, "sm_clock")
        if type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev.sm_clock

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, type: int) -> int:
        dev = self._dev(handle, "max_sm_clock")
        if type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return dev.max_sm_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._dev(handle, "clock_event_reasons").reasons

    @locked
    def nvmlDeviceGetProcessUtilization(self, handle: FakeHandle, timeStamp: int) -> list[Any]:
        dev = self._dev(handle, "process_utilization")
        start = bisect.bisect_right(dev.sample_ts, timeStamp)
        end = bisect.bisect_right(dev.sample_ts, self.model.clock() // 1000)  # none from the future
        n = end - start
        if n == 0:
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        # as pynvml: a list of structures viewing one ctypes array
        array_type = pynvml.c_nvmlProcessUtilizationSample_t * n
        samples: list[Any] = array_type.from_buffer_copy(b"".join(dev.samples[start:end]))[0:n]
        return samples

    @locked
    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        return list(self._running_objects(self._dev(handle, "running_processes")))

    def _running_objects(self, dev: FakeDevice) -> list[Any]:
        cached = self.model._running.get(dev.uuid)
        if cached is None:
            cached = []
            for p in self._processes(dev):
                owner = self.model._devices[p.device]
                gi = owner.mig_slot if owner.mig_slot >= 0 else 0xFFFFFFFF
                info = pynvml.c_nvmlProcessInfo_v2_t(
                    pid=p.pid, usedGpuMemory=p.used_memory, gpuInstanceId=gi, computeInstanceId=gi
                )
                # pynvml's own conversion (unannotated), so the objects are the very kind it returns
                cached.append(pynvml.nvmlStructToFriendlyObject(info))  # type: ignore[no-untyped-call]
            self.model._running[dev.uuid] = cached
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
            raise _error(pynvml.NVML_ERROR_NOT_FOUND)
        return FakeHandle(dev.children[index])

    def nvmlDeviceIsMigDeviceHandle(self, device: FakeHandle) -> int:
        return int(self._dev(device).parent is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: FakeHandle) -> FakeHandle:
        dev = self._dev(migDevice)
        if dev.parent is None:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(dev.parent)

    def _processes(self, dev: FakeDevice) -> list[FakeProcess]:
        owners = {dev.uuid, *dev.children}
        return [p for p in self.model._procs.values() if p.device in owners]


_FIELD_VALUES: dict[int, struct.Struct] = {}


# pynvml's constants and exception classes, so ``fake.NVML_CLOCK_SM`` and
# ``except fake.NVMLError_GpuIsLost`` read exactly as they do against the module.
for _name in dir(pynvml):
    if _name.startswith(_COPIED_PREFIXES):
        setattr(FakeNvml, _name, getattr(pynvml, _name))
del _name


if TYPE_CHECKING:
    # mypy checks here that the fake has the NVML surface the collector uses
    _conforms: NvmlApi[FakeHandle] = FakeNvml()
