"""FakeNvml mirrors pynvml: the same names, parameters, structures, constants and errors, and
the NVML behaviour the collector (and the simulator) depend on."""

from __future__ import annotations

import inspect
import threading

import pynvml
import pytest

from cotenant.collectors.nvml.api import NvmlApi
from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.collectors.nvml.fake_model import FEATURES

T0 = 1_764_000_000_000_000_000
GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.ns = T0

    def __call__(self) -> int:
        return self.ns


def nvml_functions() -> list[str]:
    return sorted(n for n, v in vars(FakeNvml).items() if n.startswith("nvml") and callable(v))


@pytest.mark.parametrize("name", nvml_functions())
def test_every_nvml_function_has_pynvmls_name_and_parameters(name: str) -> None:
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(FakeNvml(), name))
    assert list(fake.parameters) == list(real.parameters)


def test_constants_and_errors_are_pynvmls_own() -> None:
    fake = FakeNvml()
    for name in ("NVML_CLOCK_SM", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "NVML_DEVICE_MIG_ENABLE"):
        assert getattr(fake, name) == getattr(pynvml, name)
    assert fake.nvmlClocksEventReasonSwPowerCap == pynvml.nvmlClocksEventReasonSwPowerCap
    for name in ("NVMLError", "NVMLError_GpuIsLost", "NVMLError_NotSupported"):
        assert getattr(fake, name) is getattr(pynvml, name)


def api_members() -> list[str]:
    declared = set(NvmlApi.__annotations__) | set(vars(NvmlApi))
    return sorted(n for n in declared if n.startswith(("nvml", "NVML")))


@pytest.mark.parametrize("name", api_members())
def test_the_nvml_api_is_pynvmls_and_the_fake_has_it(name: str) -> None:
    """mypy checks that both have every member with a usable type; here, at run time, that
    the Protocol spells pynvml's parameter names and the fake holds pynvml's constants."""
    real, fake = getattr(pynvml, name), getattr(FakeNvml(), name)
    if name.startswith("nvml"):
        declared = list(inspect.signature(getattr(NvmlApi, name)).parameters)[1:]  # no self
        assert list(inspect.signature(real).parameters)[: len(declared)] == declared
        assert callable(fake)
    elif name == "NVMLError":
        assert fake is real
    else:
        assert isinstance(real, int) and fake == real


@pytest.fixture
def nvml() -> tuple[FakeNvml, Clock, object]:
    clock = Clock()
    fake = FakeNvml(clock=clock)
    fake.model.add_gpu()
    fake.nvmlInit()
    return fake, clock, fake.nvmlDeviceGetHandleByIndex(0)


def test_calls_need_init_and_shutdown_is_counted() -> None:
    fake = FakeNvml()
    fake.model.add_gpu()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    fake.nvmlInit()
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 1 and fake.model.init_count == 1
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError):
        fake.nvmlDeviceGetCount()


def test_library_missing_and_driver_gone() -> None:
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml(library_found=False).nvmlInit()
    fake = FakeNvml()
    fake.model.add_gpu()
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.model.unload_driver()
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        fake.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        fake.nvmlInit()


def test_counters_structures_and_units(nvml: tuple[FakeNvml, Clock, object]) -> None:
    fake, clock, h = nvml
    fake.model.set_gpu(0, sm_util=71, mem_util=12, power_w=301.5, temp_c=55, sm_clock_mhz=1410)
    fake.model.set_gpu(0, pcie_tx_bps=1024**3, nvlink_rx_bps=2 * 1024**3, memory_used_bytes=3 * GIB)
    util = fake.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util, pynvml.c_nvmlUtilization_t) and (util.gpu, util.memory) == (71, 12)
    mem = fake.nvmlDeviceGetMemoryInfo(h)
    assert (mem.total, mem.used, mem.free) == (80 * GIB, 3 * GIB, 77 * GIB)
    assert fake.nvmlDeviceGetPowerUsage(h) == 301_500  # mW
    assert fake.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == 55
    assert fake.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1410
    assert fake.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    assert fake.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 1024**2  # KiB/s
    ids = [
        pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),  # one link: not modelled
    ]
    before = fake.nvmlDeviceGetFieldValues(h, ids)
    clock.ns += 2_000_000_000
    after = fake.nvmlDeviceGetFieldValues(h, ids)
    assert isinstance(after[0], pynvml.c_nvmlFieldValue_t)
    assert after[0].timestamp - before[0].timestamp == 2_000_000  # µs
    assert after[0].value.ullVal - before[0].value.ullVal == 2 * 1024**3  # bytes
    assert after[1].value.ullVal - before[1].value.ullVal == 4 * 1024**2  # KiB
    assert [v.nvmlReturn for v in after] == [0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED]


def test_process_utilization_since_a_timestamp(nvml: tuple[FakeNvml, Clock, object]) -> None:
    fake, clock, h = nvml
    fake.model.add_process(0, 7, "python3", 2 * GIB)
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(h, 0)
    fake.model.record_process_util(7, 50, 5)
    clock.ns += 100_000_000
    fake.model.record_process_util(7, 70, 9)
    samples = fake.nvmlDeviceGetProcessUtilization(h, 0)
    assert [(s.pid, s.smUtil, s.memUtil) for s in samples] == [(7, 50, 5), (7, 70, 9)]
    assert isinstance(samples[0], pynvml.c_nvmlProcessUtilizationSample_t)
    newer = fake.nvmlDeviceGetProcessUtilization(h, samples[0].timeStamp)
    assert [s.smUtil for s in newer] == [70]
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetProcessUtilization(h, samples[1].timeStamp)
    [proc] = fake.nvmlDeviceGetComputeRunningProcesses(h)
    assert (proc.pid, proc.usedGpuMemory) == (7, 2 * GIB)
    assert fake.nvmlSystemGetProcessName(7) == "python3"
    fake.model.remove_process(7)
    assert fake.nvmlDeviceGetComputeRunningProcesses(h) == []
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlSystemGetProcessName(7)


def test_unsupported_lost_and_mig(nvml: tuple[FakeNvml, Clock, object]) -> None:
    fake, _, h = nvml
    fake.model.set_unsupported(0, "power")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(ValueError, match="unknown features"):
        fake.model.set_unsupported(0, "fan_speed")
    assert "power" in FEATURES
    mig = fake.model.create_mig(0, memory_total_bytes=10 * GIB)
    assert fake.nvmlDeviceGetMigMode(h) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    mh = fake.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert fake.nvmlDeviceGetUUID(mh) == mig and fake.nvmlDeviceIsMigDeviceHandle(mh) == 1
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetUtilizationRates(h)  # a MIG-mode GPU, as on an A100/H100
    fake.model.add_process(mig, 9, "vllm", GIB)
    assert [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(h)] == [9]
    fake.model.lose_gpu(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetMemoryInfo(mh)
    fake.model.recover_gpu(0)
    fake.model.destroy_mig(mig)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetMemoryInfo(mh)


def test_driving_and_reading_from_two_threads(nvml: tuple[FakeNvml, Clock, object]) -> None:
    fake, clock, h = nvml
    fake.model.add_process(0, 1, "p", GIB)
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            for i in range(1500):  # within the sample buffer, so none is dropped
                clock.ns += 1000
                fake.model.record_process_util(1, i % 100, 0)
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=drive)
    t.start()
    last, seen = 0, 0
    while True:
        done = not t.is_alive()  # read once more after the driver finished
        try:
            samples = fake.nvmlDeviceGetProcessUtilization(h, last)
        except pynvml.NVMLError_NotFound:
            if done:
                break
            continue
        stamps = [s.timeStamp for s in samples]
        assert stamps == sorted(stamps) and stamps[0] > last
        seen += len(samples)
        last = stamps[-1]
    t.join()
    assert errors == [] and seen == 1500
