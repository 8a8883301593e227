"""Small generated GpuWindows with known answers, for the analysis unit tests."""

from __future__ import annotations

import numpy as np

from cotenant.analysis.windows import GpuWindows
from cotenant.core.phases import PHASE_COLUMNS

N = 200
FAULT = slice(120, 160)


def windows(seed: int = 0) -> GpuWindows:
    """A victim 'tts' and a co-tenant 'sdxl' on gpu0, steady for N one-second windows."""
    rng = np.random.default_rng(seed)
    w = GpuWindows("gpu0", 0, 1_000_000_000, N)

    def model(rate: float, compute: float, queue: float) -> dict[str, np.ndarray]:
        s = {c: np.zeros(N) for c in PHASE_COLUMNS}
        s["compute_ms"] = compute + rng.normal(0, 0.2, N)
        s["queue_ms"] = queue + np.abs(rng.normal(0, 0.2, N))
        s["count"] = np.full(N, rate)
        s["rate_rps"] = np.full(N, rate)
        s["arrival_rps"] = rng.poisson(rate, N).astype(float)
        s["errors"] = np.zeros(N)
        s["batch_size_mean"] = np.full(N, 2.0)
        s["mean_ms"] = sum(s[c] for c in PHASE_COLUMNS)
        s["p50_ms"] = s["mean_ms"]
        s["p95_ms"] = s["mean_ms"] * 1.5
        s["p99_ms"] = s["mean_ms"] * 2
        return s

    w.models["tts"] = model(40, 10, 2)
    w.models["sdxl"] = model(0.5, 300, 5)
    w.counters = {
        "sm_clock_mhz": np.full(N, 1980.0),
        "max_sm_clock_mhz": np.full(N, 1980.0),
        "mem_used_bytes": np.full(N, 40e9),
        "mem_total_bytes": np.full(N, 80e9),
        "pcie_tx_bps": np.full(N, 1e9),
        "pcie_rx_bps": np.full(N, 1e9),
        "clock_event_reasons": np.zeros(N),
    }
    for name in ("tts", "sdxl"):
        w.processes[name] = {
            "sm_util": np.full(N, 10.0) + rng.normal(0, 1, N),
            "mem_util": np.full(N, 5.0),
            "mem_used_bytes": np.full(N, 10e9),
        }
        w.process_model[name] = name
    return w


def slow_compute(w: GpuWindows, factor: float = 2.0) -> None:
    w.models["tts"]["compute_ms"][FAULT] *= factor
    _refresh(w)


def _refresh(w: GpuWindows) -> None:
    v = w.models["tts"]
    v["mean_ms"] = sum(v[c] for c in PHASE_COLUMNS)
    v["p99_ms"] = v["mean_ms"] * 2


def masks() -> tuple[np.ndarray, np.ndarray]:
    before = np.zeros(N, dtype=bool)
    before[60:120] = True
    during = np.zeros(N, dtype=bool)
    during[FAULT] = True
    return before, during
