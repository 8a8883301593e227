"""The NVML poller: per-GPU and per-process counters into ``gpu_samples`` / ``process_samples``.

:class:`NvmlCollector` takes the NVML surface as an argument (the ``pynvml`` module, or a
:class:`collectors.fake_nvml.FakeNvml`), a sink (``Writer.submit``), the
:class:`collectors.gpu_resolve.GpuResolver` and optionally
:class:`collectors.nvml_metrics.NvmlMetrics`. :meth:`~NvmlCollector.poll_once` reads every
device once; :meth:`~NvmlCollector.start` runs it on a thread every ``poll_interval_s``.

Per device and poll: ``nvmlDeviceGetUtilizationRates``, ``…GetMemoryInfo``, one
``…GetFieldValues`` call for the cumulative PCIe byte counters and the NVLink data counters
(all links), turned into bytes/s from the change since the previous poll (so the first poll
has no rate), power, GPU temperature, SM clock, and the clock-event-reason bitmask; the max SM
clock is read at discovery. Where the PCIe counters are missing (older drivers) it falls back
to ``nvmlDeviceGetPcieThroughput``, which samples a 20 ms window inside each call. Per process:
``nvmlDeviceGetComputeRunningProcesses`` (memory), ``nvmlDeviceGetProcessUtilization`` since
the newest sample already taken, read every ``process_interval_s`` (at most once per poll; NVML
makes these samples every 1/6-1 s by GPU, so reading them at 10 Hz mostly finds none, while
costing as much as the rest of the poll). Each NVML sample is counted once: a row carries the
mean of the samples new since the previous read, NULL when there are none — NVML reports only
processes that used the GPU; samples above 100 %, which some drivers report for defunct
processes, are dropped), the process name, and the model from the span resources that
named the pid (``GpuResolver.model_of``; spans without ``host.name`` count as this host's).

MIG: a GPU in MIG mode gives a row of its own (power, clocks, temperature; NVML does not give
its utilization) and each MIG instance is its own ``gpu`` (its UUID), owning its processes.

Failures never leave :meth:`~NvmlCollector.poll_once`. A query the device does not support
gives NULL and one log line. A lost GPU (``NVMLError_GpuIsLost`` …) is marked down and
re-opened with exponential backoff from ``poll_interval_s`` to ``backoff_max_s``; a driver that
went away marks every GPU down and NVML is re-initialised with the same backoff. Devices (and
MIG instances) are re-discovered every ``rediscover_interval_s``. Rows are submitted in one
Arrow batch per table every ``batch_interval_s``; a refused batch is counted and dropped.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from collectors.gpu_resolve import GpuResolver
from collectors.nvml_metrics import NvmlMetrics
from store.errors import CotenantError, NvmlUnavailable
from store.schema import arrow_schema

log = logging.getLogger(__name__)

GPU_SCHEMA = arrow_schema("gpu_samples")
PROCESS_SCHEMA = arrow_schema("process_samples")
_G = {name: i for i, name in enumerate(GPU_SCHEMA.names)}
_ALL_LINKS = 0xFFFFFFFF
_HOW_TO = (
    "install the NVIDIA driver (it provides libnvidia-ml.so.1) and run cotenant where it sees "
    "the GPUs (in a container: the NVIDIA Container Toolkit, e.g. docker run --gpus all); "
    "check with nvidia-smi; or set nvml.enabled = false"
)

_P = {name: i for i, name in enumerate(PROCESS_SCHEMA.names)}
_P_TS, _P_HOST, _P_GPU, _P_PID = _P["ts_ns"], _P["host"], _P["gpu"], _P["pid"]
_P_NAME, _P_MODEL, _P_SM, _P_MEMU = _P["process_name"], _P["model"], _P["sm_util"], _P["mem_util"]
_P_USED = _P["mem_used_bytes"]
_SM, _MEMU = _G["sm_util"], _G["mem_util"]
_USED, _TOTAL = _G["mem_used_bytes"], _G["mem_total_bytes"]
_PCIE_TX, _PCIE_RX = _G["pcie_tx_bps"], _G["pcie_rx_bps"]
_POWER, _TEMP, _CLOCK = _G["power_w"], _G["temp_c"], _G["sm_clock_mhz"]
_MAXCLOCK, _REASONS = _G["max_sm_clock_mhz"], _G["clock_event_reasons"]

# (column, feature, NVML field constant, scope id, bytes per counter unit)
_FIELD_SPECS = (
    ("pcie_tx_bps", "pcie_counters", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 0, 1.0),
    ("pcie_rx_bps", "pcie_counters", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 0, 1.0),
    ("nvlink_tx_bps", "nvlink", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", _ALL_LINKS, 1024.0),
    ("nvlink_rx_bps", "nvlink", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", _ALL_LINKS, 1024.0),
)
# NVML value type -> member of the c_nvmlValue_t union, and how to read its 8 bytes
_VALUE_TYPES = (
    ("DOUBLE", "dVal", "=d"),
    ("UNSIGNED_INT", "uiVal", "=I4x"),
    ("UNSIGNED_LONG", "ulVal", "=Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "=L4x"),
    ("UNSIGNED_LONG_LONG", "ullVal", "=Q"),
    ("SIGNED_LONG_LONG", "sllVal", "=q"),
    ("SIGNED_INT", "siVal", "=i4x"),
    ("UNSIGNED_SHORT", "usVal", "=H6x"),
)
# How an NVML error code is handled: the field is NULL from then on / the GPU is down and
# retried with backoff / NVML itself is gone and re-initialised; anything else is transient.
_UNSUPPORTED = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_PERMISSION", "INVALID_ARGUMENT")
_GPU_DOWN = ("GPU_IS_LOST", "RESET_REQUIRED", "GPU_NOT_FOUND", "UNKNOWN")
_DRIVER_GONE = (
    "DRIVER_NOT_LOADED",
    "UNINITIALIZED",
    "LIB_RM_VERSION_MISMATCH",
    "LIBRARY_NOT_FOUND",
)
_ERROR_NAMES = ("NOT_FOUND", *_UNSUPPORTED, *_GPU_DOWN, *_DRIVER_GONE)


class _CLayout:
    """A C structure pynvml declares (ctypes), read in bulk with :mod:`struct`.

    pynvml answers with ctypes arrays, or lists of structures viewing one: unpacking that
    buffer at once avoids several reads per item through pynvml's Python-level
    ``__getattribute__`` (about 0.8 µs each). Anything else is read attribute by attribute.
    """

    def __init__(self, fmt: str, offsets: dict[str, int]) -> None:
        self.struct = struct.Struct(fmt)
        self._offsets = offsets
        self._matches: dict[type, bool] = {}

    def raw(self, items: Any) -> bytes | None:
        """The bytes behind ``items`` (a non-empty sequence), or None if not laid out so."""
        first = items[0]
        if isinstance(items, ctypes.Array):
            base: Any = items
        elif isinstance(first, ctypes.Structure):  # skip pynvml's __getattribute__ override
            base = object.__getattribute__(first, "_b_base_")
        else:
            return None
        if not isinstance(base, ctypes.Array) or not self._match(type(first)):
            return None
        start = ctypes.addressof(first)
        if start != ctypes.addressof(base) or len(base) < len(items):
            return None
        return ctypes.string_at(start, len(items) * self.struct.size)

    def _match(self, cls: type) -> bool:
        ok = self._matches.get(cls)
        if ok is None:
            try:
                at = {name: getattr(cls, name).offset for name in self._offsets}
                ok = at == self._offsets and ctypes.sizeof(cls) == self.struct.size
            except (AttributeError, TypeError):
                ok = False
            self._matches[cls] = ok
        return ok


# c_nvmlProcessUtilizationSample_t: pid, timeStamp, smUtil, memUtil (encUtil, decUtil skipped)
_SAMPLE = _CLayout("=I4xQII8x", {"pid": 0, "timeStamp": 8, "smUtil": 16, "memUtil": 20})
# c_nvmlFieldValue_t: timestamp, valueType, nvmlReturn, and the value union as 8 raw bytes
_FIELD_VALUE = _CLayout(
    "=8xq8xII8s", {"timestamp": 8, "valueType": 24, "nvmlReturn": 28, "value": 32}
)


def _sample_columns(samples: Any) -> tuple[list[int], list[int], list[int], list[int]]:
    """``pid``, ``timeStamp``, ``smUtil``, ``memUtil`` of NVML process utilization samples, as
    columns (sliced out of the C array at C speed where pynvml gave one)."""
    raw = _SAMPLE.raw(samples)
    if raw is None:
        return (
            [s.pid for s in samples],
            [s.timeStamp for s in samples],
            [s.smUtil for s in samples],
            [s.memUtil for s in samples],
        )
    u32, u64 = memoryview(raw).cast("I"), memoryview(raw).cast("Q")  # 32-byte records
    return u32[0::8].tolist(), u64[1::4].tolist(), u32[4::8].tolist(), u32[5::8].tolist()


_first, _second = itemgetter(0), itemgetter(1)


def _pair(obj: Any, a: str, b: str) -> tuple[Any, Any]:
    """Two fields of an NVML structure; ctypes' own lookup skips pynvml's Python-level
    ``__getattribute__`` override (which only decodes bytes; these fields are numbers)."""
    get = object.__getattribute__ if isinstance(obj, ctypes.Structure) else getattr
    return get(obj, a), get(obj, b)


def load_pynvml() -> Any:
    """Import the official binding ``pynvml`` (package ``nvidia-ml-py``), or NvmlUnavailable."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable(
            "NVML unavailable: the Python binding is not installed (pip install nvidia-ml-py)"
        ) from exc


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
class _Device:
    index: int
    uuid: str
    name: str = ""
    handle: Any = None
    parent: _Device | None = None
    mem_total: int | None = None
    max_sm_clock: float | None = None
    mig: list[_Device] = field(default_factory=list)
    mig_enabled: bool = False
    unsupported: set[str] = field(default_factory=set)
    up: bool = True
    backoff_s: float = 0.0
    next_try_ns: int = 0
    last_sample_us: int = 0  # NVML's lastSeenTimeStamp for process utilization
    prev: dict[int, tuple[int, int]] = field(default_factory=dict)  # field id -> (value, µs)
    field_plan: tuple[list[Any], list[tuple[int, int]]] | None = None  # what to ask for


class _GpuDown(Exception):
    pass


class _DriverDown(Exception):
    pass


class NvmlCollector:
    """Polls NVML; see the module docstring. Thread-safe :meth:`poll_once`."""

    def __init__(
        self,
        nvml: Any,
        *,
        sink: Callable[[str, pa.Table], None],
        resolver: GpuResolver,
        host: str,
        metrics: NvmlMetrics | None = None,
        clock: Callable[[], int] = time.time_ns,
        poll_interval_s: float = 1.0,
        process_interval_s: float | None = None,
        backoff_max_s: float = 30.0,
        batch_interval_s: float = 1.0,
        rediscover_interval_s: float = 10.0,
    ) -> None:
        self._nv = nvml
        self._sink = sink
        self._resolver = resolver
        self.host = host
        self._hosts = (host, "") if host else ("",)
        self._metrics = metrics
        self._clock = clock
        self.poll_interval_s = poll_interval_s
        # processes are read at most this often (None: at every poll, however soon it comes);
        # half a poll of slack so that a poll woken a little early still reads them
        every = max(process_interval_s or 0.0, poll_interval_s)
        self.process_interval_s = every
        self._process_ns = (
            0 if process_interval_s is None else int((every - poll_interval_s / 2) * 1e9)
        )
        self._next_process_ns = 0
        self._backoff_max_s = max(backoff_max_s, poll_interval_s)
        self._batch_ns = int(batch_interval_s * 1e9)
        self._rediscover_ns = int(rediscover_interval_s * 1e9)
        self._error = nvml.NVMLError
        code = {n: getattr(nvml, f"NVML_ERROR_{n}") for n in _ERROR_NAMES}
        self._not_found = code["NOT_FOUND"]
        self._unsupported = {code[n] for n in _UNSUPPORTED}
        self._gpu_down = {code[n] for n in _GPU_DOWN}
        self._driver_gone = {code[n] for n in _DRIVER_GONE}
        self._value_attr = {getattr(nvml, f"NVML_VALUE_TYPE_{t}"): a for t, a, _ in _VALUE_TYPES}
        self._value_fmt = {
            getattr(nvml, f"NVML_VALUE_TYPE_{t}"): struct.Struct(f) for t, _, f in _VALUE_TYPES
        }
        self._fields = [
            (_G[col], feature, getattr(nvml, fid), scope, unit)
            for col, feature, fid, scope, unit in _FIELD_SPECS
        ]
        self._gpus: list[_Device] = []
        self._opened = False
        self._driver_ok = True
        self._driver_backoff_s = 0.0
        self._driver_next_try_ns = 0
        self._next_discover_ns = 0
        self._logged: set[tuple[Any, ...]] = set()
        self._new_unsupported: dict[str, list[str]] = {}
        self._pid_gpu: dict[int, str] = {}
        self._names: dict[int, str | None] = {}
        self._labels: dict[int, tuple[str | None, str | None]] = {}
        self._gpu_rows: list[tuple[Any, ...]] = []
        self._proc_cols: list[list[Any]] = [[] for _ in PROCESS_SCHEMA]
        self._last_flush_ns = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        """``nvmlInit`` and discover the devices; NvmlUnavailable (saying why) if NVML
        cannot be used. Idempotent."""
        with self._lock:
            if self._opened:
                return
            try:
                self._nv.nvmlInit()
            except self._error as exc:
                if self._metrics is not None:
                    self._metrics.available.set(0)
                raise NvmlUnavailable(f"NVML unavailable ({exc}): {_HOW_TO}") from exc
            self._opened = True
            try:
                self._discover(self._clock())
            except (_DriverDown, self._error) as exc:
                self._shutdown_nvml()
                raise NvmlUnavailable(f"NVML unavailable ({exc}): {_HOW_TO}") from exc
            if self._metrics is not None:
                self._metrics.available.set(1)
            self._log_unsupported()
            self._publish()

    def devices(self) -> list[GpuDevice]:
        """Physical GPUs, each followed by its MIG instances."""
        with self._lock:
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
                for d in self._all()
            ]

    def start(self) -> None:
        """Poll on a daemon thread every ``poll_interval_s`` until :meth:`stop`."""
        self.open()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="cotenant-nvml", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, submit the rows still buffered, ``nvmlShutdown``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        with self._lock:
            self._flush()
            if self._opened:
                self._shutdown_nvml()
                self._opened = False

    def _run(self) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.poll_once()
            next_t += self.poll_interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind: skip the missed ticks rather than poll in a burst
                next_t, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def _shutdown_nvml(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except self._error as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    # ---- polling ---------------------------------------------------------------------

    def poll_once(self) -> None:
        """Read every device once, buffer the rows, submit them when a batch is due.
        Never raises: failures are logged once per condition and counted."""
        t0 = time.perf_counter()
        with self._lock:
            if not self._opened:
                return
            now = self._clock()
            gpu_rows: list[tuple[Any, ...]] = []
            procs_due = now >= self._next_process_ns
            if procs_due:
                self._next_process_ns = now + self._process_ns
            proc_cols: list[list[Any]] | None = [[] for _ in PROCESS_SCHEMA] if procs_due else None
            try:
                self._poll(now, gpu_rows, proc_cols)
            except Exception as exc:  # a poll must never take the thread (or caller) down
                key = ("unexpected", type(exc).__name__)
                self._note(key, "unexpected", logging.ERROR, f"NVML poll failed: {exc!r}", True)
            self._log_unsupported()
            self._gpu_rows += gpu_rows
            if proc_cols is not None:
                for buffered, new in zip(self._proc_cols, proc_cols, strict=True):
                    buffered += new
            if now - self._last_flush_ns >= self._batch_ns:
                self._last_flush_ns = now
                self._flush()
            if self._metrics is not None:
                self._metrics.observe_poll(
                    self.host, gpu_rows, proc_cols, self._up(), time.perf_counter() - t0
                )

    def flush(self) -> None:
        """Submit the buffered rows now."""
        with self._lock:
            self._flush()

    def _poll(
        self, now: int, gpu_rows: list[tuple[Any, ...]], proc_cols: list[list[Any]] | None
    ) -> None:
        """Every device's row into ``gpu_rows``; with ``proc_cols``, their processes too."""
        if not self._driver_ok:
            if now < self._driver_next_try_ns or not self._reinit(now):
                return
        elif now >= self._next_discover_ns:
            try:
                self._discover(now)
            except _DriverDown as exc:
                self._driver_down(now, exc)
                return
        seen: dict[int, str] = {}
        complete: set[str] = set()
        for d in self._gpus:
            if not d.up and (now < d.next_try_ns or not self._revive(d, now)):
                continue
            try:
                self._poll_device(d, now, gpu_rows, proc_cols, seen, complete)
                for m in d.mig:
                    self._poll_device(m, now, gpu_rows, proc_cols, seen, complete)
            except _GpuDown as exc:
                self._down(d, now, exc)
            except _DriverDown as exc:
                self._driver_down(now, exc)
                return
        if proc_cols is not None:
            self._track_pids(seen, complete)

    def _poll_device(
        self,
        d: _Device,
        ts: int,
        gpu_rows: list[tuple[Any, ...]],
        proc_cols: list[list[Any]] | None,
        seen: dict[int, str],
        complete: set[str],
    ) -> None:
        nv, h, get = self._nv, d.handle, self._get
        row: list[Any] = [None] * len(_G)
        row[0], row[1], row[2] = ts, self.host, d.uuid
        u = get(d, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        if u is not None:
            sm, mem_util = _pair(u, "gpu", "memory")
            row[_SM], row[_MEMU] = float(sm), float(mem_util)
        m = get(d, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        row[_USED], row[_TOTAL] = (None, d.mem_total) if m is None else _pair(m, "used", "total")
        self._throughput(d, row, ts)
        p = get(d, "power", nv.nvmlDeviceGetPowerUsage, h)
        row[_POWER] = None if p is None else p / 1000.0
        t = get(d, "temperature", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        row[_TEMP] = None if t is None else float(t)
        c = get(d, "sm_clock", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        row[_CLOCK] = None if c is None else float(c)
        row[_MAXCLOCK] = d.max_sm_clock
        row[_REASONS] = get(d, "clock_event_reasons", nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        gpu_rows.append(tuple(row))
        if (
            proc_cols is not None
            and not d.mig_enabled
            and self._poll_processes(d, ts, proc_cols, seen)
        ):
            complete.add(d.uuid)

    def _throughput(self, d: _Device, row: list[Any], ts: int) -> None:
        """PCIe and NVLink bytes/s since the previous poll, from NVML's cumulative counters."""
        if d.field_plan is None:
            specs = [s for s in self._fields if s[1] not in d.unsupported]
            d.field_plan = (specs, [(s[2], s[3]) for s in specs])
        specs, req = d.field_plan
        if specs and "field_values" not in d.unsupported:
            values = self._get(d, "field_values", self._nv.nvmlDeviceGetFieldValues, d.handle, req)
            if values:
                self._rates(d, specs, values, row, ts // 1000)
        if "pcie_counters" in d.unsupported or "field_values" in d.unsupported:
            nv = self._nv
            for col, counter in (
                (_PCIE_TX, nv.NVML_PCIE_UTIL_TX_BYTES),
                (_PCIE_RX, nv.NVML_PCIE_UTIL_RX_BYTES),
            ):
                kib = self._get(
                    d, "pcie_throughput", nv.nvmlDeviceGetPcieThroughput, d.handle, counter
                )
                row[col] = None if kib is None else kib * 1024.0

    def _rates(
        self, d: _Device, specs: list[Any], values: Any, row: list[Any], now_us: int
    ) -> None:
        """Bytes/s since the previous reading of each cumulative counter into ``row``: none on
        the first reading, with no time passed, or when the counter wrapped or was reset."""
        raw = _FIELD_VALUE.raw(values)
        if raw is None:
            fields: Any = [(fv.timestamp, fv.valueType, fv.nvmlReturn, fv.value) for fv in values]
        else:
            fields = _FIELD_VALUE.struct.iter_unpack(raw)
        fmt, attr, prev = self._value_fmt, self._value_attr, d.prev
        for (col, feature, fid, _, unit), (stamp, vtype, ret, value) in zip(
            specs, fields, strict=False
        ):
            if ret != 0 or vtype not in fmt:
                self._failed(d, feature, ret, str(self._error(ret)))
                continue
            value = getattr(value, attr[vtype]) if raw is None else fmt[vtype].unpack(value)[0]
            stamp = stamp or now_us
            last = prev.get(fid)
            prev[fid] = (value, stamp)
            if last is not None and stamp > last[1] and value >= last[0]:
                row[col] = (value - last[0]) * unit * 1e6 / (stamp - last[1])

    def _poll_processes(
        self, d: _Device, ts: int, cols: list[list[Any]], seen: dict[int, str]
    ) -> bool:
        """Append ``d``'s processes to the ``process_samples`` columns; False if the process
        list is unknown. Column-wise, as the batch is built from columns."""
        nv, get = self._nv, self._get
        running = get(d, "running_processes", nv.nvmlDeviceGetComputeRunningProcesses, d.handle)
        fn = nv.nvmlDeviceGetProcessUtilization
        samples = get(
            d, "process_utilization", fn, d.handle, d.last_sample_us, quiet_not_found=True
        )
        util = self._mean_util(d, samples) if samples else {}
        mem = {} if running is None else {p.pid: p.usedGpuMemory for p in running}
        pids = list(mem.keys() | util.keys())
        if not pids:
            return running is not None
        n = len(pids)
        labels: list[Any] = list(map(self._labels.get, pids))
        if None in labels:
            labels = [lab or self._label(pid) for lab, pid in zip(labels, pids, strict=True)]
        uses = list(map(util.get, pids, repeat((None, None), n)))
        cols[_P_TS] += [ts] * n
        cols[_P_HOST] += [self.host] * n
        cols[_P_GPU] += [d.uuid] * n
        cols[_P_PID] += pids
        cols[_P_NAME] += map(_first, labels)
        cols[_P_MODEL] += map(_second, labels)
        cols[_P_SM] += map(_first, uses)
        cols[_P_MEMU] += map(_second, uses)
        cols[_P_USED] += map(mem.get, pids)
        seen.update(dict.fromkeys(pids, d.uuid))
        return running is not None

    @staticmethod
    def _mean_util(d: _Device, samples: Any) -> dict[int, tuple[float, float]]:
        """pid -> mean (smUtil, memUtil) of the samples newer than any taken before."""
        pids, stamps, sm, mu = _sample_columns(samples)
        last = d.last_sample_us
        d.last_sample_us = max(last, max(stamps))  # every sample returned is seen, kept or not
        # NVML sends only newer samples (a repeat is never counted twice); some drivers send
        # garbage above 100 % for defunct processes, which is dropped
        if min(stamps) <= last or max(sm) > 100 or max(mu) > 100:
            keep = [
                i
                for i, stamp in enumerate(stamps)
                if stamp > last and sm[i] <= 100 and mu[i] <= 100
            ]
            if not keep:
                return {}
            pids, sm, mu = [pids[i] for i in keep], [sm[i] for i in keep], [mu[i] for i in keep]
        util: dict[int, tuple[float, float]] = dict(
            zip(pids, zip(sm, mu, strict=True), strict=True)
        )
        if len(util) == len(pids):  # one sample per process (the usual answer at 1 Hz)
            return util
        # several per process (read less often than NVML samples): the mean, vectorised
        uniq, inverse, counts = np.unique(np.asarray(pids), return_inverse=True, return_counts=True)
        sm_mean = np.bincount(inverse, weights=np.asarray(sm, dtype=np.float64)) / counts
        mu_mean = np.bincount(inverse, weights=np.asarray(mu, dtype=np.float64)) / counts
        means = zip(sm_mean.tolist(), mu_mean.tolist(), strict=True)
        return dict(zip(uniq.tolist(), means, strict=True))

    def _label(self, pid: int) -> tuple[str | None, str | None]:
        """(process name, model) of ``pid``; cached until the next batch is submitted, so a
        model learnt from spans shows within ``batch_interval_s``."""
        name = self._names[pid] if pid in self._names else self._name(pid)
        label = self._labels[pid] = (name, self._model_of(pid))
        return label

    def _model_of(self, pid: int) -> str | None:
        r = self._resolver
        return r.model_of(self.host, pid) or (r.model_of("", pid) if self.host else None)

    def _name(self, pid: int) -> str | None:
        try:
            name: str | None = self._nv.nvmlSystemGetProcessName(pid)
        except self._error as exc:
            if getattr(exc, "value", None) in self._driver_gone:
                raise _DriverDown(str(exc)) from exc
            name = None  # exited, or in a PID namespace NVML cannot see into
        self._names[pid] = name
        return name

    def _track_pids(self, seen: dict[int, str], complete: set[str]) -> None:
        if seen == self._pid_gpu:
            return  # the usual poll: the same processes on the same GPUs
        for pid, gpu in seen.items():
            if self._pid_gpu.get(pid) != gpu:
                self._pid_gpu[pid] = gpu
                for h in self._hosts:
                    self._resolver.set_process_gpu(h, pid, gpu)
        gone = [p for p, g in self._pid_gpu.items() if g in complete and p not in seen]
        for pid in gone:
            del self._pid_gpu[pid]
            self._names.pop(pid, None)
            for h in self._hosts:
                self._resolver.forget_process(h, pid)

    # ---- NVML calls and their failures ----------------------------------------------

    def _get(
        self, d: _Device, what: str, fn: Any, *args: Any, quiet_not_found: bool = False
    ) -> Any:
        """``fn(*args)``, or None when it fails in a way that leaves the device usable."""
        if what in d.unsupported:
            return None
        try:
            return fn(*args)
        except self._error as exc:
            code = getattr(exc, "value", None)
            if quiet_not_found and code == self._not_found:
                return None  # process utilization: no sample since lastSeenTimeStamp
            self._failed(d, what, code, str(exc))
            return None

    def _failed(self, d: _Device, what: str, code: Any, text: str) -> None:
        if code in self._gpu_down:
            raise _GpuDown(text)
        if code in self._driver_gone:
            raise _DriverDown(text)
        if code in self._unsupported:
            d.unsupported.add(what)
            d.field_plan = None
            if self._metrics is not None:
                self._metrics.errors.labels("unsupported").inc()
            if ("unsupported", d.uuid, what) not in self._logged:
                self._logged.add(("unsupported", d.uuid, what))
                self._new_unsupported.setdefault(d.uuid, []).append(what)
        else:
            msg = f"GPU {d.uuid}: reading {what} failed ({text}): recorded as NULL"
            self._note(("transient", d.uuid, what, code), "transient", logging.WARNING, msg)

    def _log_unsupported(self) -> None:
        """One line per device for the queries it was first found not to support."""
        for uuid, what in self._new_unsupported.items():
            log.info("GPU %s does not support %s: recorded as NULL", uuid, ", ".join(what))
        self._new_unsupported.clear()

    def _required(self, d: _Device, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._error as exc:
            if getattr(exc, "value", None) in self._driver_gone:
                raise _DriverDown(str(exc)) from exc
            raise _GpuDown(str(exc)) from exc

    def _note(
        self, key: tuple[Any, ...], kind: str, level: int, msg: str, exc_info: bool = False
    ) -> None:
        """Count a failure; log it the first time its condition is seen."""
        if self._metrics is not None:
            self._metrics.errors.labels(kind).inc()
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, exc_info=exc_info)

    def _down(self, d: _Device, now: int, exc: Exception) -> None:
        if d.up:
            msg = f"GPU {d.uuid} (index {d.index}) is down ({exc}): retrying with backoff"
            self._note(("down", d.index), "gpu_lost", logging.WARNING, msg)
        for x in (d, *d.mig):
            x.up = False
        d.backoff_s = min(max(2 * d.backoff_s, self.poll_interval_s), self._backoff_max_s)
        d.next_try_ns = now + int(d.backoff_s * 1e9)

    def _revive(self, d: _Device, now: int) -> bool:
        try:
            d.handle = self._required(d, self._nv.nvmlDeviceGetHandleByIndex, d.index)
            self._describe(d)
        except _GpuDown as exc:
            self._down(d, now, exc)
            return False
        except _DriverDown as exc:
            self._driver_down(now, exc)
            return False
        d.up, d.backoff_s = True, 0.0
        self._logged.discard(("down", d.index))
        log.info("GPU %s (index %d) is back", d.uuid, d.index)
        self._publish()
        return True

    def _driver_down(self, now: int, exc: Exception) -> None:
        if self._driver_ok:
            msg = f"NVML driver gone ({exc}): all GPUs down, re-initialising with backoff"
            self._note(("driver",), "driver", logging.ERROR, msg)
        self._driver_ok = False
        if self._metrics is not None:
            self._metrics.available.set(0)
        for d in self._all():
            d.up = False
        b = min(max(2 * self._driver_backoff_s, self.poll_interval_s), self._backoff_max_s)
        self._driver_backoff_s = b
        self._driver_next_try_ns = now + int(b * 1e9)

    def _reinit(self, now: int) -> bool:
        self._shutdown_nvml()
        try:
            self._nv.nvmlInit()
        except self._error as exc:
            self._driver_down(now, _DriverDown(str(exc)))
            return False
        try:
            self._discover(now)
        except (_DriverDown, self._error) as exc:
            self._driver_down(now, exc)
            return False
        self._driver_ok, self._driver_backoff_s = True, 0.0
        if self._metrics is not None:
            self._metrics.available.set(1)
        self._logged.discard(("driver",))
        log.info("NVML is back: %d GPUs", len(self._gpus))
        return True

    # ---- discovery -------------------------------------------------------------------

    def _discover(self, now: int) -> None:
        try:
            count = self._nv.nvmlDeviceGetCount()
        except self._error as exc:
            raise _DriverDown(str(exc)) from exc
        old = {d.index: d for d in self._gpus}
        gpus = []
        for i in range(count):
            d = old.get(i) or _Device(i, str(i))  # the index names it until its UUID is read
            if d.up or not self._driver_ok:
                try:
                    d.handle = self._required(d, self._nv.nvmlDeviceGetHandleByIndex, i)
                    self._describe(d)
                    d.up = True
                except _GpuDown as exc:
                    self._down(d, now, exc)
            gpus.append(d)
        self._gpus = gpus
        self._next_discover_ns = now + self._rediscover_ns
        self._publish()

    def _describe(self, d: _Device) -> None:
        """Read a device's identity and static facts; re-probe what it supports."""
        nv, h = self._nv, d.handle
        uuid = self._required(d, nv.nvmlDeviceGetUUID, h)
        if uuid != d.uuid:  # a different board at this index: start its counters afresh
            d.uuid, d.prev, d.last_sample_us = uuid, {}, 0
        d.name = self._required(d, nv.nvmlDeviceGetName, h)
        d.unsupported, d.field_plan = set(), None
        mem = self._get(d, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        d.mem_total = None if mem is None else mem.total
        clock = self._get(d, "max_sm_clock", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
        d.max_sm_clock = None if clock is None else float(clock)
        if d.parent is not None:
            return
        mode = self._get(d, "mig", nv.nvmlDeviceGetMigMode, h)
        d.mig_enabled = mode is not None and mode[0] == nv.NVML_DEVICE_MIG_ENABLE
        d.mig = self._describe_mig(d) if d.mig_enabled else []

    def _describe_mig(self, d: _Device) -> list[_Device]:
        nv = self._nv
        old = {m.uuid: m for m in d.mig}
        out = []
        for slot in range(self._get(d, "mig", nv.nvmlDeviceGetMaxMigDeviceCount, d.handle) or 0):
            try:
                h = nv.nvmlDeviceGetMigDeviceHandleByIndex(d.handle, slot)
            except self._error as exc:
                if getattr(exc, "value", None) == self._not_found:
                    continue  # an empty slot
                self._failed(d, "mig", getattr(exc, "value", None), str(exc))
                continue
            m = _Device(d.index, "", handle=h, parent=d)
            try:
                uuid = self._required(m, nv.nvmlDeviceGetUUID, h)
                m = old.get(uuid, m)
                m.uuid, m.handle, m.up = uuid, h, True
                self._describe(m)
            except _GpuDown:
                continue  # destroyed while we looked; if the GPU itself is lost, polling finds out
            out.append(m)
        return out

    # ---- output ----------------------------------------------------------------------

    def _all(self) -> list[_Device]:
        return [x for d in self._gpus for x in (d, *d.mig)]

    def _up(self) -> dict[str, bool]:
        return {d.uuid: d.up and self._driver_ok for d in self._all()}

    def _publish(self) -> None:
        if self._metrics is not None:
            self._metrics.set_devices(
                self.host,
                [(d.uuid, d.index, d.name, d.parent.uuid if d.parent else "") for d in self._all()],
                self._up(),
            )

    def _flush(self) -> None:
        self._labels.clear()
        gpu, self._gpu_rows = self._gpu_rows, []
        procs, self._proc_cols = self._proc_cols, [[] for _ in PROCESS_SCHEMA]
        if gpu:
            self._submit("gpu_samples", list(zip(*gpu, strict=True)), GPU_SCHEMA)
        n = len(procs[_P_TS])
        if n:
            for col in procs:  # columns NVML does not give (host CPU use) are NULL
                if not col:
                    col += [None] * n
            self._submit("process_samples", procs, PROCESS_SCHEMA)

    def _submit(self, table: str, columns: list[Any], schema: pa.Schema) -> None:
        arrays = [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)]
        rows = len(columns[0])
        try:
            self._sink(table, pa.Table.from_arrays(arrays, schema=schema))
        except CotenantError as exc:  # writer queue full or closing: drop, count, go on
            if self._metrics is not None:
                self._metrics.dropped.labels(table).inc(rows)
            msg = f"dropping {rows} {table} rows: {exc}"
            self._note(("store", table), "store", logging.WARNING, msg)
            return
        self._logged.discard(("store", table))
