"""Per-process rows of the NVML poller: utilization means, pid labels, pid -> GPU tracking.

:class:`ProcessReader` reads a device's processes into ``process_samples`` columns:
``nvmlDeviceGetComputeRunningProcesses`` (memory) and ``nvmlDeviceGetProcessUtilization``
since the newest sample already taken. Each NVML sample is counted once: a row carries the
mean of the samples new since the previous read, NULL when there are none (NVML reports only
processes that used the GPU); samples above 100 %, which some drivers report for defunct
processes, are dropped. Each pid is labelled with its process name (``namespace/pod
(container)`` where ``pods`` knows its Kubernetes pod, else ``nvmlSystemGetProcessName``)
and the model the span resources that named it give (``GpuResolver.model_of``; spans
without ``host.name`` count as this host's), else the model spans from its pod name
(``GpuResolver.model_of_pod``: their ``k8s.*`` resource attributes); the resolver is told which
GPU each pid runs on, in which pod, and when it left.

Not thread-safe: the collector calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

import numpy as np

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.nvml.api import ProcessSample
from cotenant.collectors.nvml.ctypes_reads import sample_columns
from cotenant.collectors.nvml.errors import DriverDown, error_code
from cotenant.collectors.nvml.health import DeviceState, NvmlDevices
from cotenant.collectors.procfs.pod_identity import PodIdentity, PodRef
from cotenant.store.schema import arrow_schema

PROCESS_SCHEMA = arrow_schema("process_samples")
_P = {name: i for i, name in enumerate(PROCESS_SCHEMA.names)}
P_TS = _P["ts_ns"]
_P_HOST, _P_GPU, _P_PID = _P["host"], _P["gpu"], _P["pid"]
_P_NAME, _P_MODEL, _P_SM, _P_MEMU = _P["process_name"], _P["model"], _P["sm_util"], _P["mem_util"]
_P_USED = _P["mem_used_bytes"]

_first, _second = itemgetter(0), itemgetter(1)


def mean_util(d: DeviceState, samples: Sequence[ProcessSample]) -> dict[int, tuple[float, float]]:
    """pid -> mean (smUtil, memUtil) percent of the samples (non-empty) newer than any taken
    before from ``d``; advances ``d.last_sample_us`` past every sample returned."""
    pids, stamps, sm, mu = sample_columns(samples)
    last = d.last_sample_us
    d.last_sample_us = max(last, max(stamps))  # every sample returned is seen, kept or not
    # NVML sends only newer samples (a repeat is never counted twice); some drivers send
    # garbage above 100 % for defunct processes, which is dropped
    if min(stamps) <= last or max(sm) > 100 or max(mu) > 100:
        keep = [
            i for i, stamp in enumerate(stamps) if stamp > last and sm[i] <= 100 and mu[i] <= 100
        ]
        if not keep:
            return {}
        pids, sm, mu = [pids[i] for i in keep], [sm[i] for i in keep], [mu[i] for i in keep]
    util: dict[int, tuple[float, float]] = dict(zip(pids, zip(sm, mu, strict=True), strict=True))
    if len(util) == len(pids):  # one sample per process (the usual answer at 1 Hz)
        return util
    # several per process (read less often than NVML samples): the mean, vectorised
    uniq, inverse, counts = np.unique(np.asarray(pids), return_inverse=True, return_counts=True)
    sm_mean = np.bincount(inverse, weights=np.asarray(sm, dtype=np.float64)) / counts
    mu_mean = np.bincount(inverse, weights=np.asarray(mu, dtype=np.float64)) / counts
    means = zip(sm_mean.tolist(), mu_mean.tolist(), strict=True)
    return dict(zip(uniq.tolist(), means, strict=True))


class ProcessReader:
    """Reads the processes of the devices in ``devices`` on ``host``; see the module
    docstring."""

    def __init__(
        self,
        devices: NvmlDevices,
        *,
        resolver: GpuResolver,
        host: str,
        pods: PodIdentity | None = None,
    ) -> None:
        self._devs = devices
        self._pods = pods
        self._resolver = resolver
        self._host = host
        self._hosts = (host, "") if host else ("",)
        self._pid_gpu: dict[int, str] = {}
        self._names: dict[int, str | None] = {}
        self._pod_refs: dict[int, PodRef] = {}
        self._labels: dict[int, tuple[str | None, str | None]] = {}

    def read(self, d: DeviceState, ts: int, cols: list[list[Any]], seen: dict[int, str]) -> bool:
        """Append ``d``'s processes to the ``process_samples`` columns ``cols`` (stamped
        ``ts`` ns) and their pids to ``seen`` (pid -> device UUID); False if the process list
        is unknown. Column-wise, as the batch is built from columns. Raises GpuDown /
        DriverDown as :class:`NvmlDevices` does."""
        nv, get = self._devs.nv, self._devs.get
        running = get(d, "running_processes", nv.nvmlDeviceGetComputeRunningProcesses, d.handle)
        fn = nv.nvmlDeviceGetProcessUtilization
        samples = get(
            d, "process_utilization", fn, d.handle, d.last_sample_us, quiet_not_found=True
        )
        util = mean_util(d, samples) if samples else {}
        mem = {} if running is None else {p.pid: p.usedGpuMemory for p in running}
        pids = list(mem.keys() | util.keys())
        if not pids:
            return running is not None
        n = len(pids)
        labels: list[Any] = list(map(self._labels.get, pids))
        if None in labels:
            labels = [lab or self._label(pid) for lab, pid in zip(labels, pids, strict=True)]
        uses = list(map(util.get, pids, repeat((None, None), n)))
        cols[P_TS] += [ts] * n
        cols[_P_HOST] += [self._host] * n
        cols[_P_GPU] += [d.uuid] * n
        cols[_P_PID] += pids
        cols[_P_NAME] += map(_first, labels)
        cols[_P_MODEL] += map(_second, labels)
        cols[_P_SM] += map(_first, uses)
        cols[_P_MEMU] += map(_second, uses)
        cols[_P_USED] += map(mem.get, pids)
        seen.update(dict.fromkeys(pids, d.uuid))
        return running is not None

    def clear_labels(self) -> None:
        """Forget the (name, model) labels, so a model learnt from spans since shows in the
        next batch; process names stay cached while the pid runs."""
        self._labels.clear()

    def track(self, seen: dict[int, str], complete: set[str]) -> None:
        """Tell the resolver where each pid in ``seen`` runs, and which pids left the
        devices in ``complete`` (those whose whole process list was read)."""
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
            self._pod_refs.pop(pid, None)
            for h in self._hosts:
                self._resolver.forget_process(h, pid)

    def _label(self, pid: int) -> tuple[str | None, str | None]:
        """(process name, model) of ``pid``; cached until the next batch is submitted, so a
        model learnt from spans shows within ``batch_interval_s``."""
        name = self._names[pid] if pid in self._names else self._name(pid)
        label = self._labels[pid] = (name, self._model_of(pid))
        return label

    def _model_of(self, pid: int) -> str | None:
        r = self._resolver
        model = r.model_of(self._host, pid) or (r.model_of("", pid) if self._host else None)
        ref = self._pod_refs.get(pid)
        return model if model is not None or ref is None else r.model_of_pod(ref)

    def _name(self, pid: int) -> str | None:
        found = None if self._pods is None else self._pods.lookup(pid)
        if found is not None and found.ref is not None and self._pod_refs.get(pid) != found.ref:
            self._pod_refs[pid] = found.ref
            for h in self._hosts:
                self._resolver.set_process_pod(h, pid, found.ref)
        name = found.name if found is not None else None
        if name is None:
            name = self._nvml_name(pid)
        if found is None or found.final:  # else its pod is not listed yet: asked again
            self._names[pid] = name
        return name

    def _nvml_name(self, pid: int) -> str | None:
        try:
            name: str | None = self._devs.nv.nvmlSystemGetProcessName(pid)
        except self._devs.error as exc:
            if error_code(exc) in self._devs.codes.driver_gone:
                raise DriverDown(str(exc)) from exc
            name = None  # exited, or in a PID namespace NVML cannot see into
        return name
