"""``cotenant_process_cpu_cores{host,pid,process,model}``: host CPU per process for ``/metrics``,
and ``cotenant_host_cpu_frequency_hertz{host}`` / ``cotenant_host_cpu_max_frequency_hertz{host}``:
the host's mean current and maximum CPU frequency where procfs read cpufreq.

:class:`HostCpuGauge` sits between :class:`collectors.procfs.collector.ProcfsCollector` and the
store's writer (:meth:`HostCpuGauge.tee`): it keeps a reference to the latest batch of host-level
``process_samples`` rows and hands the batch on unchanged. The gauge is built at scrape time from
that batch, so a poll costs nothing more and a program that stopped using the CPU drops out of the
exposition with the next poll. ``cotenant agent`` exposes it so the central
diagnosis sees host CPU per process (the ``cpu`` cause) through Prometheus.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
from prometheus_client.core import GaugeMetricFamily, Metric

Sink = Callable[[str, pa.Table], object]


class HostCpuGauge:
    """A prometheus_client collector over the newest procfs batch (see the module docstring)."""

    name = "cotenant_process_cpu_cores"

    def __init__(self) -> None:
        self._latest: pa.Table | None = None
        self._lock = threading.Lock()

    def tee(self, sink: Sink) -> Sink:
        """A sink that remembers host-level ``process_samples`` batches, then calls ``sink``."""

        def submit(table_name: str, table: pa.Table) -> object:
            if table_name == "process_samples":
                with self._lock:
                    self._latest = table
            return sink(table_name, table)

        return submit

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            self.name,
            "Host CPU a program uses, in cores (procfs utime + stime per second of wall time)",
            labels=["host", "pid", "process", "model"],
        )
        with self._lock:
            t = self._latest
        freq = GaugeMetricFamily(
            "cotenant_host_cpu_frequency_hertz",
            "Mean current frequency of the host's CPUs (cpufreq scaling_cur_freq)",
            labels=["host"],
        )
        top = GaugeMetricFamily(
            "cotenant_host_cpu_max_frequency_hertz",
            "Mean hardware maximum frequency of the host's CPUs (cpufreq cpuinfo_max_freq)",
            labels=["host"],
        )
        if t is not None:
            cols = [t[c].to_pylist() for c in ("host", "pid", "process_name", "model", "cpu_cores")]
            for host, pid, name, model, cores in zip(*cols, strict=True):
                if cores is not None:
                    fam.add_metric([host or "", str(pid), name or "", model or ""], cores)
            hosts: dict[str, tuple[float, float]] = {}
            for host, mhz, max_mhz in zip(
                t["host"].to_pylist(),
                t["cpu_freq_mhz"].to_pylist(),
                t["cpu_max_freq_mhz"].to_pylist(),
                strict=True,
            ):
                if mhz is not None and max_mhz is not None:
                    hosts.setdefault(host or "", (mhz, max_mhz))
            for host, (mhz, max_mhz) in hosts.items():
                freq.add_metric([host], mhz * 1e6)
                top.add_metric([host], max_mhz * 1e6)
        yield fam
        yield freq
        yield top
