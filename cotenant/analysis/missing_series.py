"""What an attribution could not weigh because a series is missing, said in the incident.

A cause can only be found from its series: without an SM clock no throttle, without per-process
GPU use no co-tenant that serves no requests, and so on. :func:`missing_notes` lists, for the
phases that grew, the series absent (no column, or no finite value in the windows before and
during the incident) on the victim's GPU, what each absence prevents and where the series come
from; :func:`analysis.attribution.attribute` appends them to the diagnosis' ``notes``, which
incidents keep (``Incident.told.notes``). Only what could have explained the excess is named: a
missing PCIe series matters when transfers grew, not when compute did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from cotenant.analysis.windows import GpuWindows
from cotenant.core.cause_kinds import CauseKind

CLOCK = (
    "no SM clock series on {gpu} (NVML's clocks, or DCGM_FI_DEV_SM_CLOCK): a throttle "
    "could not be weighed"
)
MAX_CLOCK = (
    "no maximum SM clock series on {gpu} (NVML's max clocks, or DCGM_FI_DEV_MAX_SM_CLOCK): a "
    "clock held low since before the incident is not seen as throttling, only a drop"
)
REASONS = (
    "no clock-event reasons on {gpu} (NVML's, or DCGM_FI_DEV_CLOCKS_EVENT_REASONS, or "
    "DCGM_EXP_CLOCK_EVENTS_COUNT): why the clock dropped (thermal, power cap, HW slowdown) "
    "is unknown"
)
PROCESSES = (
    "no per-process GPU series on {gpu} (a cotenant agent's NVML, or DCGM pod series with "
    "KUBERNETES_VIRTUAL_GPUS=true): a co-tenant that sends no spans could not be named"
)
DRAM = (
    "no memory-controller series on {gpu} (NVML's memory utilisation, or "
    "DCGM_FI_PROF_DRAM_ACTIVE / DCGM_FI_DEV_MEM_COPY_UTIL): DRAM bandwidth contention could "
    "not be weighed"
)
MEMORY = (
    "no GPU memory series on {gpu} (NVML, or DCGM_FI_DEV_FB_USED / FB_FREE): memory that grew "
    "into a full GPU could not be weighed"
)
PCIE = (
    "no PCIe throughput series on {gpu} (NVML, or DCGM_FI_PROF_PCIE_TX_BYTES / RX_BYTES): the "
    "transfers' growth could not be tied to a saturated link"
)


def _missing(w: GpuWindows, names: Iterable[str], span: np.ndarray) -> bool:
    """True when none of ``names`` has a finite value in the windows of ``span``."""
    for name in names:
        arr = w.counters.get(name)
        if arr is not None and np.isfinite(arr[span]).any():
            return False
    return True


def missing_notes(
    w: GpuWindows,
    phases: Mapping[str, float],
    span: np.ndarray,
    kinds: Iterable[str] = (),
) -> list[str]:
    """Notes on the series missing on ``w``'s GPU that could have explained the growth of
    ``phases`` (ms of excess per phase column) over ``span`` (a mask: the windows before and
    during). ``kinds``: the kinds of the causes found (a throttle found without reasons is
    said so). Empty when nothing that mattered was missing."""
    notes: list[str] = []
    gpu = w.gpu or "the GPU"
    if phases.get("compute_ms", 0.0) > 0:
        if _missing(w, ("sm_clock_mhz",), span):
            notes.append(CLOCK)
        else:
            if _missing(w, ("max_sm_clock_mhz",), span):
                notes.append(MAX_CLOCK)
            if CauseKind.THROTTLE in set(kinds) and _missing(w, ("clock_event_reasons",), span):
                notes.append(REASONS)
        seen = any(np.isfinite(s["sm_util"][span]).any() for s in w.processes.values())
        if not seen:
            notes.append(PROCESSES)
        if _missing(w, ("dram_active", "mem_util"), span) and not any(
            np.isfinite(s["mem_util"][span]).any() for s in w.processes.values()
        ):
            notes.append(DRAM)
        if _missing(w, ("mem_used_bytes",), span) or _missing(w, ("mem_total_bytes",), span):
            notes.append(MEMORY)
    if phases.get("h2d_ms", 0.0) + phases.get("d2h_ms", 0.0) > 0 and _missing(
        w, ("pcie_tx_bps", "pcie_rx_bps"), span
    ):
        notes.append(PCIE)
    return [n.format(gpu=gpu) for n in notes]
