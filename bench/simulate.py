"""Simulator speed: simulated requests per minute of wall time on one core.

Goal: >= 1,000,000 simulated requests per wall minute on one core.

    .venv/bin/python bench/simulate.py [--duration 600] [--repeats 5] [--scenario FILE]

Without ``--scenario`` it runs a built-in mix: four models on two GPUs (timeslice and MPS),
Poisson and bursty arrivals, dynamic batching, locks, transfers and three faults. The process
is pinned to one core; the figure is the median over repeats of requests / wall seconds x 60.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotenant.simulator.engine import Simulation
from cotenant.simulator.scenario import (
    GPU_TYPES,
    Arrival,
    Batching,
    Fault,
    Gpu,
    Kernel,
    Lock,
    Model,
    Scenario,
    Transfer,
)


def builtin(duration: float) -> Scenario:
    gpus = (
        Gpu("gpu0", GPU_TYPES["h100-sxm"], "timeslice"),
        Gpu("gpu1", GPU_TYPES["a100-80g"], "mps"),
    )
    models = (
        Model(
            "tts",
            "gpu0",
            Arrival("poisson", rate_rps=400),
            Kernel(4, 0.4, 0.3, 0.3, 0.5),
            Batching(16, 4),
            preprocess_ms=0.5,
            locks=(Lock("tokenizer", 0.02),),
            transfer=Transfer(0.2, 0.5),
            slo_p99_ms=100,
        ),
        Model(
            "embed",
            "gpu0",
            Arrival("poisson", rate_rps=600),
            Kernel(2, 0.1, 0.4, 0.4, 0.6),
            Batching(32, 5),
            transfer=Transfer(0.05, 0.01),
        ),
        Model(
            "sdxl",
            "gpu1",
            Arrival("bursty", rate_rps=1, burst_rps=6, mean_burst_s=10, mean_gap_s=60),
            Kernel(80, 30, 0.9, 0.6, 0.4),
            Batching(4, 20),
        ),
        Model(
            "chat",
            "gpu1",
            Arrival("poisson", rate_rps=300),
            Kernel(8, 0.5, 0.5, 0.7, 0.8),
            Batching(32, 8),
            kv_cache_gib=30,
            memory_gib=20,
        ),
    )
    faults = (
        Fault("cotenant_burst", duration * 0.2, duration * 0.1, target="sdxl", factor=4),
        Fault("throttle", duration * 0.5, duration * 0.1, gpu="gpu0", clock_factor=0.7),
        Fault(
            "lock_hog",
            duration * 0.7,
            duration * 0.05,
            lock="tokenizer",
            holder="embed",
            hold_ms=20,
        ),
    )
    return Scenario("bench-mix", 11, duration, gpus, models, host_cpus=16, faults=faults)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="virtual seconds per run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scenario", type=Path, help="a scenario YAML instead of the built-in mix")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    if args.scenario:
        from cotenant.simulator.scenario_load import load_scenario

        s = load_scenario(args.scenario)
    else:
        s = builtin(args.duration)
    rates = []
    n = 0
    for i in range(args.repeats):
        sim = Simulation(s)
        t0 = time.perf_counter()
        sim.run()
        wall = time.perf_counter() - t0
        n = len(sim.take_requests()["rid"])
        rates.append(n / wall * 60)
        print(
            f"run {i + 1}/{args.repeats}: {n} requests in {wall:.2f} s wall "
            f"-> {n / wall * 60:,.0f} requests/min",
            file=sys.stderr,
        )
    med = statistics.median(rates)
    result = {
        "scenario": s.name,
        "virtual_s": s.duration_s,
        "requests": n,
        "requests_per_wall_min_median": med,
        "runs": rates,
        "cores": os.cpu_count(),
        "goal": 1_000_000,
    }
    print(
        f"{s.name}: median {med:,.0f} simulated requests per wall minute on one core "
        f"({n} requests per run; goal 1,000,000)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
