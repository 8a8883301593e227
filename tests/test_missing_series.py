"""analysis/missing_series.py: the incident says what a missing series kept it from weighing."""

from __future__ import annotations

import numpy as np
import pytest
from analysis_frames import FAULT, N, _refresh, masks, slow_compute, windows

from cotenant.analysis.attribution import attribute
from cotenant.analysis.missing_series import (
    CLOCK,
    DRAM,
    MAX_CLOCK,
    MEMORY,
    PCIE,
    PROCESSES,
    REASONS,
    missing_notes,
)


def said(template: str) -> str:
    return template.format(gpu="gpu0")


ALL = {said(t) for t in (CLOCK, DRAM, MAX_CLOCK, MEMORY, PCIE, PROCESSES, REASONS)}


def missing(notes: list[str]) -> list[str]:
    """The notes of missing series (attribution adds others, e.g. on unexplained compute)."""
    return [n for n in notes if n in ALL]


def test_a_complete_gpu_gives_no_note() -> None:
    w = windows()
    w.counters["dram_active"] = np.full(N, 0.2)
    slow_compute(w)
    assert missing(attribute(w, "tts", *masks()).notes) == []


@pytest.mark.parametrize(
    ("gone", "note"),
    [
        (("sm_clock_mhz",), CLOCK),
        (("max_sm_clock_mhz",), MAX_CLOCK),
        (("mem_total_bytes",), MEMORY),
    ],
)
def test_a_compute_slowdown_says_which_gpu_series_it_lacked(
    gone: tuple[str, ...], note: str
) -> None:
    w = windows()
    w.counters["dram_active"] = np.full(N, 0.2)
    for name in gone:
        w.counters[name] = np.full(N, np.nan)  # the column is there, never a value
    slow_compute(w)
    att = attribute(w, "tts", *masks())
    assert missing(att.notes) == [said(note)]


def test_no_process_series_and_no_memory_controller_series_are_said() -> None:
    w = windows()
    w.processes.clear()
    w.process_model.clear()
    slow_compute(w)
    notes = attribute(w, "tts", *masks()).notes
    assert said(PROCESSES) in notes and said(DRAM) in notes


def test_a_throttle_found_without_reasons_says_its_cause_is_unknown() -> None:
    w = windows()
    w.counters["dram_active"] = np.full(N, 0.2)
    del w.counters["clock_event_reasons"]
    w.counters["sm_clock_mhz"][FAULT] = 990.0  # half clock: the throttle
    slow_compute(w)
    att = attribute(w, "tts", *masks())
    assert att.causes[0].kind == "throttle"
    assert missing(att.notes) == [said(REASONS)]


def test_only_what_could_explain_the_growth_is_named() -> None:
    w = windows()
    for name in ("pcie_tx_bps", "pcie_rx_bps", "sm_clock_mhz"):
        del w.counters[name]
    before, during = masks()
    span = before | during
    # transfers grew, compute did not: the PCIe series matters, the clock does not
    assert missing_notes(w, {"h2d_ms": 3.0, "compute_ms": 0.0}, span) == [said(PCIE)]
    w.models["tts"]["h2d_ms"][FAULT] = 5.0
    _refresh(w)
    assert said(PCIE) in attribute(w, "tts", before, during).notes
    # nothing grew: nothing to say
    assert missing_notes(w, {}, span) == []
