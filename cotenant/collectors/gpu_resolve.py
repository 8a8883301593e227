"""Which GPU served a request.

Order (DESIGN.md): the span's ``cotenant.gpu``; else the process (``host``, ``process.pid``
from the span's resource) found in NVML's per-GPU process list; else the configured
model -> GPU map; else the configured default (``""`` = unknown).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping


class GpuResolver:
    """Thread-safe map of (host, pid) -> GPU fed by the NVML collector, plus static fallbacks.

    It also records (host, pid) -> model as spans reveal it, so the NVML collector can label
    per-process samples with the model they serve.
    """

    def __init__(self, model_gpu: Mapping[str, str] | None = None, default_gpu: str = "") -> None:
        self._model_gpu = dict(model_gpu or {})
        self._default = default_gpu
        self._pid_gpu: dict[tuple[str, int], str] = {}
        self._pid_model: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def set_process_gpu(self, host: str, pid: int, gpu: str) -> None:
        """Record that ``pid`` on ``host`` runs on ``gpu`` (from NVML's process list)."""
        with self._lock:
            self._pid_gpu[(host, pid)] = gpu

    def forget_process(self, host: str, pid: int) -> None:
        with self._lock:
            self._pid_gpu.pop((host, pid), None)

    def note_model(self, host: str, pid: int, model: str) -> None:
        """Remember which model a process serves (from a span's resource)."""
        key = (host, pid)
        if self._pid_model.get(key) != model:
            with self._lock:
                self._pid_model[key] = model

    def model_of(self, host: str, pid: int) -> str | None:
        return self._pid_model.get((host, pid))

    def served_pids(self, hosts: tuple[str, ...]) -> dict[int, str]:
        """pid -> model of every process on one of ``hosts`` that spans have named (``""``
        is the host of spans without ``host.name``)."""
        with self._lock:
            items = list(self._pid_model.items())
        return {pid: model for (host, pid), model in items if host in hosts}

    def resolve(self, span_gpu: str | None, host: str, pid: int | None, model: str) -> str:
        if span_gpu:
            return span_gpu
        if pid is not None:
            gpu = self._pid_gpu.get((host, pid))
            if gpu is not None:
                return gpu
        return self._model_gpu.get(model, self._default)
