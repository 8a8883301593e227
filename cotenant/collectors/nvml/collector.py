"""The NVML poller: per-GPU and per-process counters into ``gpu_samples`` / ``process_samples``.

:class:`NvmlCollector` takes the NVML surface as an argument (an
:class:`collectors.nvml.api.NvmlApi`: the ``pynvml`` module from
:func:`collectors.nvml.api.load_pynvml`, or a :class:`collectors.nvml.fake.FakeNvml`), a sink
(``Writer.submit``), the :class:`collectors.gpu_resolve.GpuResolver` and optionally
:class:`collectors.nvml.metrics.NvmlMetrics`. :meth:`~NvmlCollector.poll_once` reads every
device once; :meth:`~NvmlCollector.start` runs it on a thread every ``poll_interval_s``.

Per device and poll: ``nvmlDeviceGetUtilizationRates``, ``…GetMemoryInfo``, one
``…GetFieldValues`` call for the cumulative PCIe byte counters and the NVLink data counters
(all links), turned into bytes/s from the change since the previous poll (so the first poll
has no rate), power, GPU temperature, SM clock, and the clock-event-reason bitmask; the max SM
clock is read at discovery. Where the PCIe counters are missing (older drivers) it falls back
to ``nvmlDeviceGetPcieThroughput``, which samples a 20 ms window inside each call. Per
process (:mod:`collectors.nvml.processes`): memory, and the mean utilization of the NVML
samples new since the previous read, read every ``process_interval_s`` (at most once per poll;
NVML makes these samples every 1/6-1 s by GPU, so reading them at 10 Hz mostly finds none,
while costing as much as the rest of the poll), the process name, and the model.

MIG: a GPU in MIG mode gives a row of its own (power, clocks, temperature; NVML does not give
its utilization) and each MIG instance is its own ``gpu`` (its UUID), owning its processes.

Failures never leave :meth:`~NvmlCollector.poll_once`. A query the device does not support
gives NULL and one log line. A lost GPU (``NVMLError_GpuIsLost`` …) is marked down and
re-opened with exponential backoff from ``poll_interval_s`` to ``backoff_max_s``; a driver that
went away marks every GPU down and NVML is re-initialised with the same backoff
(:mod:`collectors.nvml.health`). Devices (and MIG instances) are re-discovered every
``rediscover_interval_s``. Rows are submitted in one Arrow batch per table every
``batch_interval_s``; a refused batch is counted and dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.nvml.api import FieldValue, NvmlApi
from cotenant.collectors.nvml.ctypes_reads import FieldValueReader, pair
from cotenant.collectors.nvml.errors import DriverDown, FailureLog, GpuDown
from cotenant.collectors.nvml.health import DeviceState, FieldSpec, GpuDevice, NvmlDevices
from cotenant.collectors.nvml.metrics import NvmlMetrics
from cotenant.collectors.nvml.processes import P_TS, PROCESS_SCHEMA, ProcessReader
from cotenant.collectors.procfs.pod_identity import PodIdentity
from cotenant.core.errors import CotenantError, NvmlUnavailable
from cotenant.core.periodic import Periodic
from cotenant.store.schema import arrow_schema

log = logging.getLogger(__name__)

GPU_SCHEMA = arrow_schema("gpu_samples")
_G = {name: i for i, name in enumerate(GPU_SCHEMA.names)}
_ALL_LINKS = 0xFFFFFFFF
_HOW_TO = (
    "install the NVIDIA driver (it provides libnvidia-ml.so.1) and run cotenant where it sees "
    "the GPUs (in a container: the NVIDIA Container Toolkit, e.g. docker run --gpus all); "
    "check with nvidia-smi; or set nvml.enabled = false"
)

_SM, _MEMU = _G["sm_util"], _G["mem_util"]
_USED, _TOTAL = _G["mem_used_bytes"], _G["mem_total_bytes"]
_PCIE_TX, _PCIE_RX = _G["pcie_tx_bps"], _G["pcie_rx_bps"]
_POWER, _TEMP, _CLOCK = _G["power_w"], _G["temp_c"], _G["sm_clock_mhz"]
_MAXCLOCK, _REASONS = _G["max_sm_clock_mhz"], _G["clock_event_reasons"]


def _field_specs(nv: NvmlApi[Any]) -> list[FieldSpec]:
    """The cumulative counters read through ``nvmlDeviceGetFieldValues``: PCIe in bytes,
    NVLink in KiB summed over all links."""
    pcie_tx, pcie_rx = nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    nvl_tx = nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    nvl_rx = nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    return [
        (_PCIE_TX, "pcie_counters", pcie_tx, 0, 1.0),
        (_PCIE_RX, "pcie_counters", pcie_rx, 0, 1.0),
        (_G["nvlink_tx_bps"], "nvlink", nvl_tx, _ALL_LINKS, 1024.0),
        (_G["nvlink_rx_bps"], "nvlink", nvl_rx, _ALL_LINKS, 1024.0),
    ]


class NvmlCollector:
    """Polls NVML; see the module docstring. Thread-safe :meth:`poll_once`."""

    def __init__(
        self,
        nvml: NvmlApi[Any],
        *,
        sink: Callable[[str, pa.Table], object],
        resolver: GpuResolver,
        host: str,
        metrics: NvmlMetrics | None = None,
        clock: Callable[[], int] = time.time_ns,
        poll_interval_s: float = 1.0,
        process_interval_s: float | None = None,
        backoff_max_s: float = 30.0,
        batch_interval_s: float = 1.0,
        rediscover_interval_s: float = 10.0,
        pods: PodIdentity | None = None,
    ) -> None:
        """``pods``: names processes in Kubernetes pods ``namespace/pod (container)`` (None:
        by NVML's process name only)."""
        self._nv = nvml
        self._sink = sink
        self.host = host
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
        self._batch_ns = int(batch_interval_s * 1e9)
        self._error = nvml.NVMLError
        self._failures = FailureLog(metrics)
        self._devs = NvmlDevices(
            nvml,
            host=host,
            failures=self._failures,
            metrics=metrics,
            poll_interval_s=poll_interval_s,
            backoff_max_s=backoff_max_s,
            rediscover_interval_s=rediscover_interval_s,
        )
        self._procs = ProcessReader(self._devs, resolver=resolver, host=host, pods=pods)
        self._fields = _field_specs(nvml)
        self._field_values = FieldValueReader(nvml)
        self._opened = False
        self._gpu_rows: list[tuple[Any, ...]] = []
        self._proc_cols: list[list[Any]] = [[] for _ in PROCESS_SCHEMA]
        self._last_flush_ns = 0
        self._lock = threading.Lock()
        self._worker: Periodic | None = None

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
                self._devs.discover(self._clock())
            except (DriverDown, self._error) as exc:
                self._devs.shutdown_nvml()
                raise NvmlUnavailable(f"NVML unavailable ({exc}): {_HOW_TO}") from exc
            if self._metrics is not None:
                self._metrics.available.set(1)
            self._devs.log_unsupported()
            self._devs.publish()

    def devices(self) -> list[GpuDevice]:
        """Physical GPUs, each followed by its MIG instances."""
        with self._lock:
            return self._devs.devices()

    def rediscover_soon(self) -> None:
        """List the devices again at the next poll, not within ``rediscover_interval_s``
        (a GPU was just added: a simulated one, for instance). Safe from any thread."""
        self._devs.discover_at_next_poll()

    def start(self) -> None:
        """Poll on a daemon thread every ``poll_interval_s`` until :meth:`stop`."""
        self.open()
        self._worker = Periodic(
            "cotenant-nvml",
            self.poll_interval_s,
            self.poll_once,
            what="the NVML poll",
            fixed_rate=True,
        )
        self._worker.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, submit the rows still buffered, ``nvmlShutdown``."""
        if self._worker is not None:
            self._worker.stop(timeout_s)
            self._worker = None
        with self._lock:
            self._flush()
            if self._opened:
                self._devs.shutdown_nvml()
                self._opened = False

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
                msg = f"NVML poll failed: {exc!r}"
                self._failures.note(key, "unexpected", logging.ERROR, msg, True)
            self._devs.log_unsupported()
            self._gpu_rows += gpu_rows
            if proc_cols is not None:
                for buffered, new in zip(self._proc_cols, proc_cols, strict=True):
                    buffered += new
            if now - self._last_flush_ns >= self._batch_ns:
                self._last_flush_ns = now
                self._flush()
            if self._metrics is not None:
                self._metrics.observe_poll(
                    self.host, gpu_rows, proc_cols, self._devs.up(), time.perf_counter() - t0
                )

    def flush(self) -> None:
        """Submit the buffered rows now."""
        with self._lock:
            self._flush()

    def _poll(
        self, now: int, gpu_rows: list[tuple[Any, ...]], proc_cols: list[list[Any]] | None
    ) -> None:
        """Every device's row into ``gpu_rows``; with ``proc_cols``, their processes too."""
        devs = self._devs
        if not devs.refresh(now):
            return
        seen: dict[int, str] = {}
        complete: set[str] = set()
        for d in devs.gpus:
            if not devs.due(d, now):
                continue
            try:
                self._poll_device(d, now, gpu_rows, proc_cols, seen, complete)
                for m in d.mig:
                    self._poll_device(m, now, gpu_rows, proc_cols, seen, complete)
            except GpuDown as exc:
                devs.down(d, now, exc)
            except DriverDown as exc:
                devs.driver_down(now, exc)
                return
        if proc_cols is not None:
            self._procs.track(seen, complete)

    def _poll_device(
        self,
        d: DeviceState,
        ts: int,
        gpu_rows: list[tuple[Any, ...]],
        proc_cols: list[list[Any]] | None,
        seen: dict[int, str],
        complete: set[str],
    ) -> None:
        nv, h, get = self._nv, d.handle, self._devs.get
        row: list[Any] = [None] * len(_G)
        row[0], row[1], row[2] = ts, self.host, d.uuid
        u = get(d, "utilization", nv.nvmlDeviceGetUtilizationRates, h)
        if u is not None:
            sm, mem_util = pair(u, "gpu", "memory")
            row[_SM], row[_MEMU] = float(sm), float(mem_util)
        m = get(d, "memory", nv.nvmlDeviceGetMemoryInfo, h)
        row[_USED], row[_TOTAL] = (None, d.mem_total) if m is None else pair(m, "used", "total")
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
        if proc_cols is not None and not d.mig_enabled and self._procs.read(d, ts, proc_cols, seen):
            complete.add(d.uuid)

    def _throughput(self, d: DeviceState, row: list[Any], ts: int) -> None:
        """PCIe and NVLink bytes/s since the previous poll, from NVML's cumulative counters."""
        devs = self._devs
        if d.field_plan is None:
            specs = [s for s in self._fields if s[1] not in d.unsupported]
            d.field_plan = (specs, [(s[2], s[3]) for s in specs])
        specs, req = d.field_plan
        if specs and "field_values" not in d.unsupported:
            values = devs.get(d, "field_values", self._nv.nvmlDeviceGetFieldValues, d.handle, req)
            if values:
                self._rates(d, specs, values, row, ts // 1000)
        if "pcie_counters" in d.unsupported or "field_values" in d.unsupported:
            nv = self._nv
            for col, counter in (
                (_PCIE_TX, nv.NVML_PCIE_UTIL_TX_BYTES),
                (_PCIE_RX, nv.NVML_PCIE_UTIL_RX_BYTES),
            ):
                kib = devs.get(
                    d, "pcie_throughput", nv.nvmlDeviceGetPcieThroughput, d.handle, counter
                )
                row[col] = None if kib is None else kib * 1024.0

    def _rates(
        self,
        d: DeviceState,
        specs: list[FieldSpec],
        values: Sequence[FieldValue],
        row: list[Any],
        now_us: int,
    ) -> None:
        """Bytes/s since the previous reading of each cumulative counter into ``row``: none on
        the first reading, with no time passed, or when the counter wrapped or was reset."""
        prev = d.prev
        for (col, feature, fid, _, unit), (stamp, ret, value) in zip(
            specs, self._field_values.read(values), strict=False
        ):
            if value is None:
                self._devs.failed(d, feature, ret, self._devs.error_text(ret))
                continue
            stamp = stamp or now_us
            last = prev.get(fid)
            prev[fid] = (value, stamp)
            if last is not None and stamp > last[1] and value >= last[0]:
                row[col] = (value - last[0]) * unit * 1e6 / (stamp - last[1])

    # ---- output ----------------------------------------------------------------------

    def _flush(self) -> None:
        self._procs.clear_labels()
        gpu, self._gpu_rows = self._gpu_rows, []
        procs, self._proc_cols = self._proc_cols, [[] for _ in PROCESS_SCHEMA]
        if gpu:
            self._submit("gpu_samples", list(zip(*gpu, strict=True)), GPU_SCHEMA)
        n = len(procs[P_TS])
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
            self._failures.note(("store", table), "store", logging.WARNING, msg)
            return
        self._failures.clear(("store", table))
