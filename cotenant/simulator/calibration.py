"""Calibration against published MPS co-location figures.

NVIDIA developer forum: DenseNet121 inference under MPS with
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps, each client in a closed loop. Latency alone vs next
to a co-runner holding the rest of the SMs:

=========  ==========  ==============  =====
SM cap     alone (ms)  co-located (ms)  ratio
=========  ==========  ==============  =====
10 %       57.6        85.1 (with 90 %)  1.48
90 %       14.1        15.1 (with 10 %)  1.07
20 %       30.8        46.5 (with 80 %)  1.51
80 %       14.3        16.3 (with 20 %)  1.14
=========  ==========  ==============  =====

The model: a capped client's SM share is fixed by its cap (demands add up to 100 %, so SMs
are not contended); the memory-bound fraction ``MEMORY_BOUND`` of its kernel stretches by
``1 + DRAM load of the co-runner``, and a client's DRAM load is proportional to its SM share
(``dram_demand = cap``). One parameter, fitted to the four pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cotenant.simulator.engine import Simulation
from cotenant.simulator.scenario import GPU_TYPES, Arrival, Gpu, Kernel, Model, Scenario

MEMORY_BOUND = 0.533

PUBLISHED: list[tuple[float, float, float, float]] = [
    # (cap, alone_ms, co-runner cap, co-located ms)
    (0.10, 57.6, 0.90, 85.1),
    (0.90, 14.1, 0.10, 15.1),
    (0.20, 30.8, 0.80, 46.5),
    (0.80, 14.3, 0.20, 16.3),
]
ALONE_MS = {cap: alone for cap, alone, _, _ in PUBLISHED}


@dataclass(frozen=True)
class CalibrationPoint:
    cap: float
    other_cap: float
    published_alone_ms: float
    published_colocated_ms: float
    simulated_alone_ms: float
    simulated_colocated_ms: float

    @property
    def error(self) -> float:
        """Relative error of the simulated co-located latency."""
        return self.simulated_colocated_ms / self.published_colocated_ms - 1.0


def _client(name: str, cap: float) -> Model:
    return Model(
        name=name,
        gpu="gpu0",
        arrival=Arrival("closed", concurrency=1),
        kernel=Kernel(
            base_ms=ALONE_MS[cap], sm_demand=cap, dram_demand=cap, memory_bound=MEMORY_BOUND
        ),
    )


def _mean_latency(models: tuple[Model, ...], name: str, duration_s: float) -> float:
    s = Scenario(
        name="calibration",
        seed=1,
        duration_s=duration_s,
        gpus=(Gpu("gpu0", GPU_TYPES["a100-80g"], "mps"),),
        models=models,
    )
    sim = Simulation(s)
    sim.run()
    cols = sim.take_requests()
    lat = np.asarray(cols["latency_ms"])[np.asarray(cols["model"]) == name]
    return float(lat.mean())


def calibrate(duration_s: float = 60.0) -> list[CalibrationPoint]:
    """Simulate every published pair (alone, then co-located) and compare."""
    out = []
    for cap, alone, other, coloc in PUBLISHED:
        a = _mean_latency((_client("victim", cap),), "victim", duration_s)
        c = _mean_latency((_client("victim", cap), _client("other", other)), "victim", duration_s)
        out.append(CalibrationPoint(cap, other, alone, coloc, a, c))
    return out
