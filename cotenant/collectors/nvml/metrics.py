"""GPU and NVML series for ``/metrics``, registered on a registry passed in.

The per-GPU and per-process gauges are built at scrape time from the rows of the latest poll
(:meth:`NvmlMetrics.observe_poll` only keeps references), so a poll costs no per-series work
and series of processes that exited or GPUs that vanished disappear with them. Values are in
base units: ratios 0-1, bytes, bytes per second, watts, degrees Celsius, hertz. A value NVML
did not give (unsupported, or no rate yet) is left out rather than exported as NaN.
``docs/metrics.md`` maps each series to its DCGM exporter field.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cotenant.store.schema import arrow_schema

_GPU_COLS = {n: i for i, n in enumerate(arrow_schema("gpu_samples").names)}
_PROC_COLS = {n: i for i, n in enumerate(arrow_schema("process_samples").names)}

GPU_SERIES: tuple[tuple[str, str, float, str], ...] = (
    # (series, gpu_samples column, scale to base unit, help)
    ("cotenant_gpu_sm_utilization_ratio", "sm_util", 0.01,
     "Fraction of the sample period a kernel ran on the GPU (NVML utilization.gpu)"),
    ("cotenant_gpu_memory_utilization_ratio", "mem_util", 0.01,
     "Fraction of the sample period device memory was read or written (NVML utilization.memory)"),
    ("cotenant_gpu_memory_used_bytes", "mem_used_bytes", 1.0, "Device memory in use"),
    ("cotenant_gpu_memory_total_bytes", "mem_total_bytes", 1.0, "Device memory in total"),
    ("cotenant_gpu_pcie_transmit_bytes_per_second", "pcie_tx_bps", 1.0,
     "PCIe bytes sent by the GPU per second since the previous poll"),
    ("cotenant_gpu_pcie_receive_bytes_per_second", "pcie_rx_bps", 1.0,
     "PCIe bytes received by the GPU per second since the previous poll"),
    ("cotenant_gpu_nvlink_transmit_bytes_per_second", "nvlink_tx_bps", 1.0,
     "NVLink data bytes sent per second over all links since the previous poll"),
    ("cotenant_gpu_nvlink_receive_bytes_per_second", "nvlink_rx_bps", 1.0,
     "NVLink data bytes received per second over all links since the previous poll"),
    ("cotenant_gpu_power_watts", "power_w", 1.0, "Board power draw"),
    ("cotenant_gpu_temperature_celsius", "temp_c", 1.0, "GPU core temperature"),
    ("cotenant_gpu_sm_clock_hertz", "sm_clock_mhz", 1e6, "Current SM clock"),
    ("cotenant_gpu_sm_clock_max_hertz", "max_sm_clock_mhz", 1e6, "Maximum SM clock"),
    ("cotenant_gpu_clock_event_reasons", "clock_event_reasons", 1.0,
     "Bitmask of NVML clock event reasons (nvmlClocksEventReason*) now active"),
)  # fmt: skip

PROCESS_SERIES: tuple[tuple[str, str, float, str], ...] = (
    ("cotenant_gpu_process_sm_utilization_ratio", "sm_util", 0.01,
     "A process's share of the period a kernel ran (mean of NVML samples new in the poll)"),
    ("cotenant_gpu_process_memory_utilization_ratio", "mem_util", 0.01,
     "A process's share of the period device memory was read or written"),
    ("cotenant_gpu_process_memory_used_bytes", "mem_used_bytes", 1.0,
     "Device memory a process holds"),
)  # fmt: skip

CLOCK_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clock_setting", 0x100),
)
"""NVML's ``nvmlClocksEventReason*`` bits, as ``reason`` label values."""

DCGM_SERIES: tuple[tuple[str, str, float, str], ...] = (
    # (DCGM exporter field, gpu_samples column, scale to DCGM's unit, help)
    ("DCGM_FI_DEV_GPU_UTIL", "sm_util", 1.0, "GPU utilization (%)"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_util", 1.0, "Memory utilization (%)"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active", 1.0, "Ratio of cycles the DRAM is active"),
    ("DCGM_FI_DEV_FB_USED", "mem_used_bytes", 1 / 1048576, "Framebuffer memory used (MiB)"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bps", 1.0, "PCIe bytes transmitted per second"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bps", 1.0, "PCIe bytes received per second"),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bps", 1.0, "NVLink bytes transmitted per second"),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bps", 1.0, "NVLink bytes received per second"),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1.0, "Power draw (W)"),
    ("DCGM_FI_DEV_GPU_TEMP", "temp_c", 1.0, "GPU temperature (C)"),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1.0, "SM clock frequency (MHz)"),
    ("DCGM_FI_DEV_MAX_SM_CLOCK", "max_sm_clock_mhz", 1.0, "Maximum SM clock frequency (MHz)"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clock_event_reasons", 1.0,
     "Current clock event (throttle) reasons (bitmask)"),
)  # fmt: skip
"""The GPU series an agent also exposes under the DCGM exporter's names and units (so the
central ``PrometheusSource`` reads agents and DCGM exporters with one query), labelled like
the exporter: ``gpu`` (index), ``UUID``, ``device``, ``modelName``, ``hostname`` (its name
since dcgm-exporter 4.8; earlier releases called it ``Hostname``, which central reads too)."""

Row = Sequence[Any]


class NvmlMetrics:
    """Everything the NVML collector exposes; pass it to ``NvmlCollector(metrics=…)``."""

    def __init__(self, registry: CollectorRegistry, *, dcgm_names: bool = False) -> None:
        """``dcgm_names``: also expose :data:`DCGM_SERIES` (``cotenant agent`` does)."""
        self._dcgm = dcgm_names
        self.available = Gauge(
            "cotenant_nvml_available",
            "1 while NVML is initialised and GPU counters are collected, else 0",
            registry=registry,
        )
        self.errors = Counter(
            "cotenant_nvml_errors",
            "Failed NVML reads by kind: unsupported, transient, gpu_lost, driver, store, "
            "unexpected",
            ["kind"],
            registry=registry,
        )
        self.dropped = Counter(
            "cotenant_nvml_dropped_rows",
            "Sample rows the store refused (writer queue full or closing)",
            ["table"],
            registry=registry,
        )
        self._lock = threading.Lock()
        self._host = ""
        self._devices: list[tuple[str, int, str, str]] = []
        self._up: dict[str, bool] = {}
        self._gpu_rows: Sequence[Row] = ()
        self._proc_cols: Sequence[Sequence[Any]] = [[] for _ in _PROC_COLS]
        self._polls = 0
        self._poll_seconds = 0.0  # plain sums: a poll updates no prometheus_client object
        registry.register(self)

    def set_devices(
        self, host: str, devices: list[tuple[str, int, str, str]], up: dict[str, bool]
    ) -> None:
        """The discovered devices as ``(uuid, index, name, parent uuid or "")``."""
        with self._lock:
            self._host, self._devices, self._up = host, devices, up

    def observe_poll(
        self,
        host: str,
        gpu_rows: Sequence[Row],
        proc_cols: Sequence[Sequence[Any]] | None,
        up: dict[str, bool],
        seconds: float,
    ) -> None:
        """Keep the latest poll for the next scrape: its ``gpu_samples`` rows and its
        ``process_samples`` columns (schema order; None: processes were not read this poll,
        the previous ones stand)."""
        with self._lock:
            self._host, self._gpu_rows, self._up = host, gpu_rows, up
            if proc_cols is not None:
                self._proc_cols = proc_cols
            self._polls += 1
            self._poll_seconds += seconds

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            host, devices, up = self._host, self._devices, self._up
            gpu_rows, proc_cols = self._gpu_rows, self._proc_cols
            polls, poll_seconds = self._polls, self._poll_seconds
        yield CounterMetricFamily("cotenant_nvml_polls", "NVML polls run", value=polls)
        yield CounterMetricFamily(
            "cotenant_nvml_poll_seconds",
            "Wall time spent polling NVML (rate() of it: the share of a core at most)",
            value=poll_seconds,
        )
        fam = GaugeMetricFamily(
            "cotenant_gpu_up", "1 while the GPU answers NVML, 0 while it is lost or the "
            "driver is gone", labels=["host", "gpu"],
        )  # fmt: skip
        for gpu, is_up in up.items():
            fam.add_metric([host, gpu], 1.0 if is_up else 0.0)
        yield fam
        fam = GaugeMetricFamily(
            "cotenant_gpu_info", "Discovered GPUs and MIG instances (parent = the MIG "
            "instance's GPU)", labels=["host", "gpu", "index", "name", "parent"],
        )  # fmt: skip
        for uuid, index, name, parent in devices:
            fam.add_metric([host, uuid, str(index), name, parent], 1.0)
        yield fam
        labels = ["host", "gpu"]
        live = [r for r in gpu_rows if up.get(r[2], False)]
        for name, col, scale, doc in GPU_SERIES:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            i = _GPU_COLS[col]
            for r in live:
                if r[i] is not None:
                    fam.add_metric([r[1], r[2]], r[i] * scale)
            yield fam
        if self._dcgm:
            yield from _dcgm_families(devices, live)
        fam = GaugeMetricFamily(
            "cotenant_gpu_clock_event_active",
            "1 while NVML reports this clock event reason (throttling, idle, …)",
            labels=["host", "gpu", "reason"],
        )
        i = _GPU_COLS["clock_event_reasons"]
        for r in live:
            if r[i] is not None:
                for reason, bit in CLOCK_EVENT_REASONS:
                    fam.add_metric([r[1], r[2], reason], 1.0 if r[i] & bit else 0.0)
        yield fam
        labels = ["host", "gpu", "pid", "process", "model"]
        keys = [
            [h, g, str(p), n or "", m or ""]
            for h, g, p, n, m in zip(
                *(
                    proc_cols[_PROC_COLS[c]]
                    for c in ("host", "gpu", "pid", "process_name", "model")
                ),
                strict=True,
            )
        ]
        for name, col, scale, doc in PROCESS_SERIES:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            for key, v in zip(keys, proc_cols[_PROC_COLS[col]], strict=True):
                if v is not None:
                    fam.add_metric(key, v * scale)
            yield fam


def _dcgm_families(
    devices: list[tuple[str, int, str, str]], rows: Sequence[Row]
) -> Iterator[Metric]:
    """:data:`DCGM_SERIES` of the live GPUs' latest rows, with ``DCGM_FI_DEV_FB_FREE``."""
    info = {uuid: (str(index), name) for uuid, index, name, _ in devices}
    labels = ["gpu", "UUID", "device", "modelName", "hostname"]
    keys = []
    for r in rows:
        index, name = info.get(r[_GPU_COLS["gpu"]], ("", ""))
        keys.append([index, r[_GPU_COLS["gpu"]], f"nvidia{index}", name, r[_GPU_COLS["host"]]])
    for name, col, scale, doc in DCGM_SERIES:
        fam = GaugeMetricFamily(name, doc, labels=labels)
        i = _GPU_COLS[col]
        for key, r in zip(keys, rows, strict=True):
            if r[i] is not None:
                fam.add_metric(key, r[i] * scale)
        yield fam
    fam = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (MiB)", labels=labels)
    used, total = _GPU_COLS["mem_used_bytes"], _GPU_COLS["mem_total_bytes"]
    for key, r in zip(keys, rows, strict=True):
        if r[used] is not None and r[total] is not None:
            fam.add_metric(key, (r[total] - r[used]) / 1048576)
    yield fam
