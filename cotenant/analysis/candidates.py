"""Candidate causes of one victim's slowdown, each with the series that would show it.

Both our attribution and the published baselines (NSigma, BARO) rank these same candidates
over the same windows, so the comparison in ``cotenant bench`` is like for like.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cotenant.analysis.host_cpu import HostCpu
from cotenant.analysis.windows import GpuWindows
from cotenant.core.cause_kinds import CauseKind

NON_CULPRIT = CauseKind.UNKNOWN


@dataclass(frozen=True)
class Candidate:
    kind: str  # DESIGN.md vocabulary
    culprit: str
    resource: str | None = None  # bandwidth: dram | pcie | nvlink

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.culprit}" + (f":{self.resource}" if self.resource else "")


def busy_fraction(series: dict[str, np.ndarray]) -> np.ndarray:
    """Compute seconds in flight per second of a model: rate x mean compute time."""
    rate = np.nan_to_num(series["rate_rps"])
    comp = np.nan_to_num(series["compute_ms"]) / 1000.0
    out: np.ndarray = np.clip(rate * comp, 0.0, None)
    return out


def activity(w: GpuWindows, victim: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Co-tenant -> (SM activity 0-1, DRAM activity 0-1) on the victim's GPU.

    A model's SM activity is its per-process SM utilisation when NVML sampled its process,
    else its compute seconds in flight per second; its DRAM activity is its per-process
    memory utilisation (0 when unknown). Non-model processes come from NVML only. A window in
    which the GPU's processes were read (:func:`polled`) and a process shows no utilization
    is idle for it (NVML reports utilization only for processes that used the GPU, and lists
    none that had not started); other windows without a sample are NaN, and consumers average
    over the finite ones."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    read = polled(w)

    def util(ps: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        return _idle_where_read(ps["sm_util"], read), _idle_where_read(ps["mem_util"], read)

    by_model = {m: name for name, m in w.process_model.items() if m}
    for model, series in w.models.items():
        if model == victim:
            continue
        pname = by_model.get(model)
        if pname is not None:
            # NaN where the poller did not read the GPU: "unknown", not "idle"
            out[model] = util(w.processes[pname])
        else:
            out[model] = (busy_fraction(series), np.zeros(w.n))
    for name, ps in w.processes.items():
        owner = w.process_model.get(name)
        if owner == victim or (owner and owner in out):
            continue
        out[name] = util(ps)
    return out


def polled(w: GpuWindows) -> np.ndarray:
    """Windows in which the NVML poller read the GPU's processes: some process shows a row
    there (its memory or a utilization)."""
    out = np.zeros(w.n, dtype=bool)
    for ps in w.processes.values():
        out |= np.isfinite(ps["sm_util"]) | np.isfinite(ps["mem_used_bytes"])
    return out


def _idle_where_read(pct: np.ndarray, read: np.ndarray) -> np.ndarray:
    """A utilization in percent as 0-1, 0 where the processes were read without it."""
    x = pct / 100.0
    return np.where(read & ~np.isfinite(x), 0.0, x)


def candidate_series(
    w: GpuWindows,
    victim: str,
    host: dict[str, np.ndarray] | None = None,
) -> dict[Candidate, np.ndarray]:
    """Every candidate cause with the series whose rise would reveal it (oriented so that a
    rise hurts: a clock or frequency enters as what it lost).

    * ``cotenant:<x>`` — x's SM activity; ``bandwidth:<x>:dram`` — x's DRAM activity;
      ``bandwidth:<x>:pcie`` — x's total activity while the GPU's PCIe traffic is high;
    * ``throttle:<gpu>`` — lost clock (1 - clock / max clock);
    * ``memory:<x>`` — x's GPU memory, when the GPU is nearly full;
    * ``lock:<victim locks>`` — the victim's lock wait; ``cpu:<x>`` — host CPU use of x;
      ``cpu:host`` — the host's lost CPU frequency (1 - frequency / maximum), where read;
    * ``load:<victim>`` — the victim's own arrival rate.
    """
    v = w.models[victim]
    out: dict[Candidate, np.ndarray] = {}
    act = activity(w, victim)
    pcie = w.counters.get("pcie_tx_bps")
    pcie_total = (
        None
        if pcie is None
        else np.nan_to_num(pcie) + np.nan_to_num(w.counters.get("pcie_rx_bps", np.zeros(w.n)))
    )
    for name, (sm, dram) in act.items():
        out[Candidate(CauseKind.COTENANT, name)] = sm
        out[Candidate(CauseKind.BANDWIDTH, name, "dram")] = dram
        if pcie_total is not None:
            scale = float(np.nanmax(pcie_total)) or 1.0
            act = np.nan_to_num(sm) + np.nan_to_num(dram) + 0.01
            out[Candidate(CauseKind.BANDWIDTH, name, "pcie")] = act * pcie_total / scale
    clock = w.counters.get("sm_clock_mhz")
    max_clock = w.counters.get("max_sm_clock_mhz")
    if clock is not None and max_clock is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            out[Candidate(CauseKind.THROTTLE, w.gpu)] = np.nan_to_num(1.0 - clock / max_clock)
    used = w.counters.get("mem_used_bytes")
    total = w.counters.get("mem_total_bytes")
    if used is not None and total is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            full = np.nan_to_num(used / total)
        for name, ps in w.processes.items():
            mem = np.nan_to_num(ps["mem_used_bytes"])
            out[Candidate(CauseKind.MEMORY, w.process_model.get(name) or name)] = (
                mem / (np.nanmax(total) or 1.0) * (full >= 0.95)
            )
    out[Candidate(CauseKind.LOCK, "lock")] = np.nan_to_num(v["lock_wait_ms"])
    for name, cpu in (host or {}).items():
        out[Candidate(CauseKind.CPU, name)] = np.nan_to_num(cpu)
    if isinstance(host, HostCpu) and host.frequency is not None:
        out[Candidate(CauseKind.CPU, "host")] = np.nan_to_num(1.0 - host.frequency.ratio)
    out[Candidate(CauseKind.LOAD, victim)] = np.nan_to_num(v["arrival_rps"])
    return out
