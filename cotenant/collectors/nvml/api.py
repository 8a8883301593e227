"""The NVML surface the collector uses, as a Protocol both ``pynvml`` and ``FakeNvml`` satisfy.

:class:`NvmlApi` lists exactly the functions, constants and the exception class that
:mod:`collectors.nvml.collector` and its helpers call, with ``pynvml``'s names (module
``pynvml`` from the package ``nvidia-ml-py``). It is generic in the device handle, which the
collector never looks into: ``pynvml`` gives ``c_nvmlDevice_t`` pointers,
:class:`collectors.nvml.fake.FakeNvml` its ``FakeHandle``.

How much mypy checks: ``pynvml`` ships no annotations. With ``follow_untyped_imports`` for
``pynvml`` (``pyproject.toml``) mypy reads its source, so :func:`load_pynvml` returning the
module as an ``NvmlApi`` checks that every function exists with an arity that accepts our
calls, and that every constant exists and is an ``int``; parameter and return types stay
``Any`` on ``pynvml``'s side. The fake is checked against the same Protocol with its own
annotations (``collectors/nvml/fake.py``), and ``tests/test_fake_nvml.py`` checks at run time
that its parameter names are ``pynvml``'s. Parameters are positional-only here because the
collector passes them so; the names are ``pynvml``'s.

The result types are small Protocols naming only the fields the collector reads; ``pynvml``
answers with its ctypes structures (whose fields ctypes resolves at run time) or, for running
processes, its ``nvmlFriendlyObject``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from cotenant.core.errors import NvmlUnavailable

HandleT = TypeVar("HandleT")


class Utilization(Protocol):
    """``c_nvmlUtilization_t``: percent of the last sample period (0-100)."""

    @property
    def gpu(self) -> int: ...
    @property
    def memory(self) -> int: ...


class MemoryInfo(Protocol):
    """``c_nvmlMemory_t``: device memory in bytes."""

    @property
    def total(self) -> int: ...
    @property
    def used(self) -> int: ...


class ProcessInfo(Protocol):
    """One of ``nvmlDeviceGetComputeRunningProcesses``: bytes, None where the driver cannot
    say (WDDM)."""

    @property
    def pid(self) -> int: ...
    @property
    def usedGpuMemory(self) -> int | None: ...


class ProcessSample(Protocol):
    """``c_nvmlProcessUtilizationSample_t``: ``timeStamp`` in µs, utilizations in percent."""

    @property
    def pid(self) -> int: ...
    @property
    def timeStamp(self) -> int: ...
    @property
    def smUtil(self) -> int: ...
    @property
    def memUtil(self) -> int: ...


class FieldValue(Protocol):
    """``c_nvmlFieldValue_t``: ``timestamp`` in µs; ``value`` is the C union ``c_nvmlValue_t``,
    read by the member ``valueType`` names; ``nvmlReturn`` 0 is success."""

    @property
    def timestamp(self) -> int: ...
    @property
    def valueType(self) -> int: ...
    @property
    def nvmlReturn(self) -> int: ...
    @property
    def value(self) -> Any: ...


class NvmlApi(Protocol[HandleT]):
    """What the NVML collector calls. Every function may raise ``NVMLError`` (its ``value`` an
    ``NVML_ERROR_*`` code); see :mod:`collectors.nvml.health` for how each code is handled."""

    @property
    def NVMLError(self) -> type[Exception]: ...

    # error codes (NVMLError.value)
    NVML_ERROR_NOT_FOUND: int
    NVML_ERROR_NOT_SUPPORTED: int
    NVML_ERROR_FUNCTION_NOT_FOUND: int
    NVML_ERROR_NO_PERMISSION: int
    NVML_ERROR_INVALID_ARGUMENT: int
    NVML_ERROR_GPU_IS_LOST: int
    NVML_ERROR_RESET_REQUIRED: int
    NVML_ERROR_GPU_NOT_FOUND: int
    NVML_ERROR_UNKNOWN: int
    NVML_ERROR_DRIVER_NOT_LOADED: int
    NVML_ERROR_UNINITIALIZED: int
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: int
    NVML_ERROR_LIBRARY_NOT_FOUND: int
    # FieldValue.valueType: which member of the value union holds the value
    NVML_VALUE_TYPE_DOUBLE: int
    NVML_VALUE_TYPE_UNSIGNED_INT: int
    NVML_VALUE_TYPE_UNSIGNED_LONG: int
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: int
    NVML_VALUE_TYPE_SIGNED_LONG_LONG: int
    NVML_VALUE_TYPE_SIGNED_INT: int
    NVML_VALUE_TYPE_UNSIGNED_SHORT: int
    # field ids: cumulative PCIe bytes, cumulative NVLink KiB
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES: int
    NVML_FI_DEV_PCIE_COUNT_RX_BYTES: int
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: int
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: int
    # arguments
    NVML_CLOCK_SM: int
    NVML_TEMPERATURE_GPU: int
    NVML_PCIE_UTIL_TX_BYTES: int
    NVML_PCIE_UTIL_RX_BYTES: int
    NVML_DEVICE_MIG_ENABLE: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetProcessName(self, pid: int, /) -> str: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> HandleT: ...
    def nvmlDeviceGetUUID(self, handle: HandleT, /) -> str: ...
    def nvmlDeviceGetName(self, handle: HandleT, /) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: HandleT, /) -> Utilization: ...
    def nvmlDeviceGetMemoryInfo(self, handle: HandleT, /) -> MemoryInfo: ...
    def nvmlDeviceGetPcieThroughput(self, device: HandleT, counter: int, /) -> int:
        """KiB/s over a 20 ms window sampled inside the call."""

    def nvmlDeviceGetFieldValues(
        self, handle: HandleT, fieldIds: Sequence[int | tuple[int, int]], /
    ) -> Sequence[FieldValue]:
        """One value per requested field id, or ``(field id, scope id)``, in order."""

    def nvmlDeviceGetPowerUsage(self, handle: HandleT, /) -> int:
        """Milliwatts."""

    def nvmlDeviceGetTemperature(self, handle: HandleT, sensor: int, /) -> int:
        """Degrees C."""

    def nvmlDeviceGetClockInfo(self, handle: HandleT, type: int, /) -> int:
        """MHz."""

    def nvmlDeviceGetMaxClockInfo(self, handle: HandleT, type: int, /) -> int:
        """MHz."""

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: HandleT, /) -> int:
        """Bitmask of ``nvmlClocksEventReason*``."""

    def nvmlDeviceGetProcessUtilization(
        self, handle: HandleT, timeStamp: int, /
    ) -> Sequence[ProcessSample]:
        """Samples stamped after ``timeStamp`` µs; ``NVML_ERROR_NOT_FOUND`` when none."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle: HandleT, /) -> Sequence[ProcessInfo]:
        """On a MIG-mode GPU: the processes of all its instances."""

    def nvmlDeviceGetMigMode(self, device: HandleT, /) -> Sequence[int]:
        """``[current, pending]`` mode."""

    def nvmlDeviceGetMaxMigDeviceCount(self, device: HandleT, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: HandleT, index: int, /) -> HandleT:
        """``NVML_ERROR_NOT_FOUND`` for an empty slot."""


def load_pynvml() -> NvmlApi[Any]:
    """The official binding ``pynvml`` (package ``nvidia-ml-py``), or NvmlUnavailable.

    Importing it loads no library yet: ``nvmlInit`` does, and fails there without a driver.
    """
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(
            "NVML unavailable: the Python binding is not installed (pip install nvidia-ml-py)"
        ) from exc
    return pynvml
