"""How the NVML collector sorts, counts and logs NVML failures.

:class:`ErrorCodes` sorts the ``NVML_ERROR_*`` codes of an
:class:`collectors.nvml.api.NvmlApi` by how :class:`collectors.nvml.health.NvmlDevices`
handles them: a query that is **unsupported** gives NULL on that device from then on; a
**GPU down** code raises :class:`GpuDown`; a **driver gone** code raises :class:`DriverDown`;
anything else is transient. Both exceptions are signals inside a poll and never leave
:meth:`collectors.nvml.collector.NvmlCollector.poll_once`.

:class:`FailureLog` counts every failure in ``cotenant_nvml_errors_total{kind}`` and logs each
condition once until it clears, to the logger ``collectors.nvml.collector`` (the collector's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from cotenant.collectors.nvml.api import NvmlApi
from cotenant.collectors.nvml.metrics import NvmlMetrics

# the collector's logger: one name to filter every NVML message by, as before the split
log = logging.getLogger("cotenant.collectors.nvml.collector")


class GpuDown(Exception):
    """A device stopped answering (raised inside a poll, never out of the collector)."""


class DriverDown(Exception):
    """NVML or its driver went away (raised inside a poll, never out of the collector)."""


@dataclass(frozen=True)
class ErrorCodes:
    """``NVML_ERROR_*`` codes of an :class:`NvmlApi`, sorted by how they are handled."""

    not_found: int
    unsupported: frozenset[int]
    gpu_down: frozenset[int]
    driver_gone: frozenset[int]

    @classmethod
    def of(cls, nv: NvmlApi[Any]) -> ErrorCodes:
        return cls(
            not_found=nv.NVML_ERROR_NOT_FOUND,
            unsupported=frozenset(
                (
                    nv.NVML_ERROR_NOT_SUPPORTED,
                    nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                    nv.NVML_ERROR_NO_PERMISSION,
                    nv.NVML_ERROR_INVALID_ARGUMENT,
                )
            ),
            gpu_down=frozenset(
                (
                    nv.NVML_ERROR_GPU_IS_LOST,
                    nv.NVML_ERROR_RESET_REQUIRED,
                    nv.NVML_ERROR_GPU_NOT_FOUND,
                    nv.NVML_ERROR_UNKNOWN,
                )
            ),
            driver_gone=frozenset(
                (
                    nv.NVML_ERROR_DRIVER_NOT_LOADED,
                    nv.NVML_ERROR_UNINITIALIZED,
                    nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
                    nv.NVML_ERROR_LIBRARY_NOT_FOUND,
                )
            ),
        )


def error_code(exc: BaseException) -> Any:
    """The ``NVML_ERROR_*`` code of an ``NVMLError`` (its ``value``), None if it has none."""
    return getattr(exc, "value", None)


class FailureLog:
    """Counts failures by kind; logs each condition (a hashable key) the first time it is seen
    until :meth:`clear` says it is over."""

    def __init__(self, metrics: NvmlMetrics | None) -> None:
        self._metrics = metrics
        self._logged: set[tuple[Any, ...]] = set()

    def count(self, kind: str) -> None:
        if self._metrics is not None:
            self._metrics.errors.labels(kind).inc()

    def first(self, key: tuple[Any, ...]) -> bool:
        """True the first time ``key`` is seen (since it was last cleared)."""
        if key in self._logged:
            return False
        self._logged.add(key)
        return True

    def note(
        self, key: tuple[Any, ...], kind: str, level: int, msg: str, exc_info: bool = False
    ) -> None:
        """Count a failure; log it the first time its condition is seen."""
        self.count(kind)
        if self.first(key):
            log.log(level, msg, exc_info=exc_info)

    def clear(self, key: tuple[Any, ...]) -> None:
        self._logged.discard(key)
