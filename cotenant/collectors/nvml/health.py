"""The devices NVML shows and their health: discovery, guarded calls, backoff, re-initialisation.

:class:`NvmlDevices` holds every physical GPU and MIG instance as a :class:`DeviceState` and
makes every NVML call on behalf of the poller, sorting failures by their ``NVML_ERROR_*``
code (:class:`collectors.nvml.errors.ErrorCodes`):

* **unsupported** (``NOT_SUPPORTED``, ``FUNCTION_NOT_FOUND``, ``NO_PERMISSION``,
  ``INVALID_ARGUMENT``): that query gives None (NULL) on that device until it is described
  again; one INFO line per device lists what it lacks.
* **GPU down** (``GPU_IS_LOST``, ``RESET_REQUIRED``, ``GPU_NOT_FOUND``, ``UNKNOWN``):
  ``GpuDown`` is raised; the GPU and its MIG instances are marked down and re-opened with
  exponential backoff from ``poll_interval_s`` to ``backoff_max_s``.
* **driver gone** (``DRIVER_NOT_LOADED``, ``UNINITIALIZED``, ``LIB_RM_VERSION_MISMATCH``,
  ``LIBRARY_NOT_FOUND``): ``DriverDown`` is raised; every GPU is down and NVML is
  re-initialised with the same backoff.
* anything else is transient: None this time, one WARNING per (device, query, code).

Every failure is counted and logged once per condition through the collector's
:class:`collectors.nvml.errors.FailureLog`. Nothing here is thread-safe: the collector calls
it under its lock. Messages go to the logger ``collectors.nvml.collector``, the collector's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, TypeVarTuple

from cotenant.collectors.nvml.api import NvmlApi
from cotenant.collectors.nvml.errors import DriverDown, ErrorCodes, FailureLog, GpuDown, error_code
from cotenant.collectors.nvml.metrics import NvmlMetrics

# the collector's logger: one name to filter every NVML message by, as before the split
log = logging.getLogger("cotenant.collectors.nvml.collector")

_R = TypeVar("_R")
_Ts = TypeVarTuple("_Ts")

FieldSpec = tuple[int, str, int, int, float]
"""What to read of one NVML field: (``gpu_samples`` column index, feature name, NVML field
id, scope id, bytes per counter unit)."""


@dataclass(frozen=True)
class GpuDevice:
    """A device as discovered: a physical GPU (``parent`` None) or a MIG instance."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int | None
    parent: str | None
    mig_enabled: bool
    up: bool


@dataclass(eq=False)
class DeviceState:
    """A device as the collector tracks it: a physical GPU, or a MIG instance (``parent``)."""

    index: int
    uuid: str
    name: str = ""
    handle: Any = None
    parent: DeviceState | None = None
    mem_total: int | None = None
    max_sm_clock: float | None = None
    mig: list[DeviceState] = field(default_factory=list)
    mig_enabled: bool = False
    unsupported: set[str] = field(default_factory=set)
    up: bool = True
    backoff_s: float = 0.0
    next_try_ns: int = 0
    last_sample_us: int = 0  # NVML's lastSeenTimeStamp for process utilization
    prev: dict[int, tuple[float, int]] = field(default_factory=dict)  # field id -> (value, µs)
    field_plan: tuple[list[FieldSpec], list[tuple[int, int]]] | None = None  # what to ask for


class NvmlDevices:
    """The devices of one NVML, their health, and the calls made to them; see the module
    docstring. Times are ns on the collector's clock."""

    def __init__(
        self,
        nv: NvmlApi[Any],
        *,
        host: str,
        failures: FailureLog,
        metrics: NvmlMetrics | None,
        poll_interval_s: float,
        backoff_max_s: float,
        rediscover_interval_s: float,
    ) -> None:
        self.nv = nv
        self.error = nv.NVMLError
        self.codes = ErrorCodes.of(nv)
        self.gpus: list[DeviceState] = []
        self.driver_ok = True
        self._host = host
        self._failures = failures
        self._metrics = metrics
        self._poll_interval_s = poll_interval_s
        self._backoff_max_s = max(backoff_max_s, poll_interval_s)
        self._rediscover_ns = int(rediscover_interval_s * 1e9)
        self._driver_backoff_s = 0.0
        self._driver_next_try_ns = 0
        self._next_discover_ns = 0
        self._new_unsupported: dict[str, list[str]] = {}

    # ---- NVML calls and their failures ----------------------------------------------

    def get(
        self,
        d: DeviceState,
        what: str,
        fn: Callable[[*_Ts], _R],
        *args: *_Ts,
        quiet_not_found: bool = False,
    ) -> _R | None:
        """``fn(*args)``, or None when it fails in a way that leaves the device usable.
        Raises GpuDown / DriverDown otherwise."""
        if what in d.unsupported:
            return None
        try:
            return fn(*args)
        except self.error as exc:
            code = error_code(exc)
            if quiet_not_found and code == self.codes.not_found:
                return None  # process utilization: no sample since lastSeenTimeStamp
            self.failed(d, what, code, str(exc))
            return None

    def required(self, d: DeviceState, fn: Callable[[*_Ts], _R], *args: *_Ts) -> _R:
        """``fn(*args)``; any failure is GpuDown, or DriverDown if the driver went away."""
        try:
            return fn(*args)
        except self.error as exc:
            if error_code(exc) in self.codes.driver_gone:
                raise DriverDown(str(exc)) from exc
            raise GpuDown(str(exc)) from exc

    def failed(self, d: DeviceState, what: str, code: Any, text: str) -> None:
        """Handle a failed query ``what`` of ``d`` by its code (see the module docstring)."""
        if code in self.codes.gpu_down:
            raise GpuDown(text)
        if code in self.codes.driver_gone:
            raise DriverDown(text)
        if code in self.codes.unsupported:
            d.unsupported.add(what)
            d.field_plan = None
            self._failures.count("unsupported")
            if self._failures.first(("unsupported", d.uuid, what)):
                self._new_unsupported.setdefault(d.uuid, []).append(what)
        else:
            msg = f"GPU {d.uuid}: reading {what} failed ({text}): recorded as NULL"
            self._failures.note(
                ("transient", d.uuid, what, code), "transient", logging.WARNING, msg
            )

    def error_text(self, code: int) -> str:
        """What NVML calls error ``code``."""
        return str(self.error(code))

    def log_unsupported(self) -> None:
        """One line per device for the queries it was first found not to support."""
        for uuid, what in self._new_unsupported.items():
            log.info("GPU %s does not support %s: recorded as NULL", uuid, ", ".join(what))
        self._new_unsupported.clear()

    def shutdown_nvml(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.error as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    # ---- health ----------------------------------------------------------------------

    def refresh(self, now: int) -> bool:
        """Before a poll: re-initialise NVML when it is gone and its backoff is over, or
        re-discover the devices when due. False: NVML is down, nothing to poll."""
        if not self.driver_ok:
            return now >= self._driver_next_try_ns and self._reinit(now)
        if now >= self._next_discover_ns:
            try:
                self.discover(now)
            except DriverDown as exc:
                self.driver_down(now, exc)
                return False
        return True

    def due(self, d: DeviceState, now: int) -> bool:
        """Whether ``d`` (a physical GPU) can be polled: up, or re-opened now its backoff is
        over."""
        return d.up or (now >= d.next_try_ns and self._revive(d, now))

    def down(self, d: DeviceState, now: int, exc: Exception) -> None:
        """Mark ``d`` and its MIG instances down; retry after the next backoff step."""
        if d.up:
            msg = f"GPU {d.uuid} (index {d.index}) is down ({exc}): retrying with backoff"
            self._failures.note(("down", d.index), "gpu_lost", logging.WARNING, msg)
        for x in (d, *d.mig):
            x.up = False
        d.backoff_s = min(max(2 * d.backoff_s, self._poll_interval_s), self._backoff_max_s)
        d.next_try_ns = now + int(d.backoff_s * 1e9)

    def driver_down(self, now: int, exc: Exception) -> None:
        """Mark every device down; re-initialise NVML after the next backoff step."""
        if self.driver_ok:
            msg = f"NVML driver gone ({exc}): all GPUs down, re-initialising with backoff"
            self._failures.note(("driver",), "driver", logging.ERROR, msg)
        self.driver_ok = False
        if self._metrics is not None:
            self._metrics.available.set(0)
        for d in self.all():
            d.up = False
        b = min(max(2 * self._driver_backoff_s, self._poll_interval_s), self._backoff_max_s)
        self._driver_backoff_s = b
        self._driver_next_try_ns = now + int(b * 1e9)

    def _revive(self, d: DeviceState, now: int) -> bool:
        try:
            d.handle = self.required(d, self.nv.nvmlDeviceGetHandleByIndex, d.index)
            self._describe(d)
        except GpuDown as exc:
            self.down(d, now, exc)
            return False
        except DriverDown as exc:
            self.driver_down(now, exc)
            return False
        d.up, d.backoff_s = True, 0.0
        self._failures.clear(("down", d.index))
        log.info("GPU %s (index %d) is back", d.uuid, d.index)
        self.publish()
        return True

    def _reinit(self, now: int) -> bool:
        self.shutdown_nvml()
        try:
            self.nv.nvmlInit()
        except self.error as exc:
            self.driver_down(now, DriverDown(str(exc)))
            return False
        try:
            self.discover(now)
        except (DriverDown, self.error) as exc:
            self.driver_down(now, exc)
            return False
        self.driver_ok, self._driver_backoff_s = True, 0.0
        if self._metrics is not None:
            self._metrics.available.set(1)
        self._failures.clear(("driver",))
        log.info("NVML is back: %d GPUs", len(self.gpus))
        return True

    # ---- discovery -------------------------------------------------------------------

    def discover_at_next_poll(self) -> None:
        """Make :meth:`refresh` re-list the devices next time (one int store: thread-safe)."""
        self._next_discover_ns = 0

    def discover(self, now: int) -> None:
        """(Re-)list the GPUs by index, keeping the state of those already known; a GPU
        that is down stays down (its backoff decides) unless NVML itself is re-initialising.
        Raises DriverDown (or NVMLError) if the device count cannot be read."""
        try:
            count = self.nv.nvmlDeviceGetCount()
        except self.error as exc:
            raise DriverDown(str(exc)) from exc
        old = {d.index: d for d in self.gpus}
        gpus = []
        for i in range(count):
            d = old.get(i) or DeviceState(i, str(i))  # the index names it until its UUID is read
            if d.up or not self.driver_ok:
                try:
                    d.handle = self.required(d, self.nv.nvmlDeviceGetHandleByIndex, i)
                    self._describe(d)
                    d.up = True
                except GpuDown as exc:
                    self.down(d, now, exc)
            gpus.append(d)
        self.gpus = gpus
        self._next_discover_ns = now + self._rediscover_ns
        self.publish()

    def _describe(self, d: DeviceState) -> None:
        """Read a device's identity and static facts; re-probe what it supports."""
        nv, h = self.nv, d.handle
        uuid = self.required(d, nv.nvmlDeviceGetUUID, h)
        if uuid != d.uuid:  # a different board at this index: start its counters afresh
            d.uuid, d.prev, d.last_sample_us = uuid, {}, 0
        d.name = self.required(d, nv.nvmlDeviceGetName, h)
        d.unsupported, d.field_plan = set(), None
        mem = self.get(d, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        d.mem_total = None if mem is None else mem.total
        clock = self.get(d, "max_sm_clock", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
        d.max_sm_clock = None if clock is None else float(clock)
        if d.parent is not None:
            return
        mode = self.get(d, "mig", nv.nvmlDeviceGetMigMode, h)
        d.mig_enabled = mode is not None and mode[0] == nv.NVML_DEVICE_MIG_ENABLE
        d.mig = self._describe_mig(d) if d.mig_enabled else []

    def _describe_mig(self, d: DeviceState) -> list[DeviceState]:
        nv = self.nv
        old = {m.uuid: m for m in d.mig}
        out = []
        for slot in range(self.get(d, "mig", nv.nvmlDeviceGetMaxMigDeviceCount, d.handle) or 0):
            try:
                h = nv.nvmlDeviceGetMigDeviceHandleByIndex(d.handle, slot)
            except self.error as exc:
                if error_code(exc) == self.codes.not_found:
                    continue  # an empty slot
                self.failed(d, "mig", error_code(exc), str(exc))
                continue
            m = DeviceState(d.index, "", handle=h, parent=d)
            try:
                uuid = self.required(m, nv.nvmlDeviceGetUUID, h)
                m = old.get(uuid, m)
                m.uuid, m.handle, m.up = uuid, h, True
                self._describe(m)
            except GpuDown:
                continue  # destroyed while we looked; if the GPU itself is lost, polling finds out
            out.append(m)
        return out

    # ---- what is known ---------------------------------------------------------------

    def all(self) -> list[DeviceState]:
        """Physical GPUs, each followed by its MIG instances."""
        return [x for d in self.gpus for x in (d, *d.mig)]

    def up(self) -> dict[str, bool]:
        """UUID -> whether the device answers (False for all while the driver is gone)."""
        return {d.uuid: d.up and self.driver_ok for d in self.all()}

    def devices(self) -> list[GpuDevice]:
        return [
            GpuDevice(
                d.index,
                d.uuid,
                d.name,
                d.mem_total,
                d.parent.uuid if d.parent is not None else None,
                d.mig_enabled,
                d.up,
            )
            for d in self.all()
        ]

    def publish(self) -> None:
        """The device list and their up/down state to the metrics, if any."""
        if self._metrics is not None:
            self._metrics.set_devices(
                self._host,
                [(d.uuid, d.index, d.name, d.parent.uuid if d.parent else "") for d in self.all()],
                self.up(),
            )
