"""Generated tabular cases whose fault is a metric *falling*, in two shapes real systems export.

These show what direction-aware evidence is for; they are generated, so their figures are
demonstrations (the rules were written knowing these shapes), not accuracy on unseen data.

**GPU serving** (:func:`gpu_serving`): an LLM engine on one GPU of one node, a row every
``step_s`` = 15 s, as a Prometheus export of DCGM, cAdvisor and the engine's own metrics gives
it. Entities: ``client`` (the end-to-end view: latency p50 / p99 in s, success %), ``vllm``
(container CPU cores and memory, running and waiting requests, KV-cache usage, TTFT p99),
``gpu0`` (SM clock and its maximum in MHz, SM and memory utilisation %, power W, temperature,
PCIe and NVLink bytes/s, framebuffer used), ``node`` (host CPU utilisation %, CPU frequency
MHz, memory, network bytes/s) and a ``batch`` container beside the engine (CPU, memory,
network). Faults from row :data:`GPU_BEFORE` on:

* ``gpu-clock-locked`` (root ``gpu0``): the SM clock locked to a fraction of its maximum with
  no throttle reason; the engine's steps slow by the inverse, its queue and latency grow, the
  GPU stays busy, power falls;
* ``cpu-freq-clamped`` (root ``node``): the host's CPU frequency capped; the engine's CPU-bound
  scheduling slows (its CPU use rises, the GPU idles a little more), latency grows;
* ``cpu-squeeze`` (root ``batch``): a cost that rises, for comparison: the batch container
  takes the host's CPU, the engine's scheduling slows.

**Component statistics** (:func:`component_stats`): the shape of a system that keeps 5-minute
statistics per component: ``<component>_latency`` (mean ms), ``<component>_requests`` (count)
and ``<component>_availability`` (% of requests that succeeded), for a call tree of
:data:`COMPONENTS`, 24 rows before the fault and 6 from it on. Faults on a random component:

* ``availability-drop``: 15-50 % of its requests fail (its callers' availability falls by the
  share of their requests that reach it; failing fast, their latency barely moves);
* ``availability-dip``: the same with 1-5 % (99.9 % to 95-99 %: how a real component's
  availability usually moves);
* ``latency-rise``: it slows (its callers slow by what their calls wait for it).

:func:`write_cases` writes case folders (``data.csv``, ``inject_time.txt``, ``label.json``) that
``cotenant bench --tabular`` reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

T0 = 1_767_225_600
GPU_BEFORE, GPU_AFTER = 40, 20
STAT_BEFORE, STAT_AFTER = 24, 6

GPU_FAULTS = ("gpu-clock-locked", "cpu-freq-clamped", "cpu-squeeze")
STAT_FAULTS = ("availability-drop", "availability-dip", "latency-rise")
DROPS = {"availability-drop": (0.15, 0.5), "availability-dip": (0.01, 0.05)}
"""Share of a component's requests that fail, by fault (drawn uniformly)."""
GPU_ROOT = {"gpu-clock-locked": "gpu0", "cpu-freq-clamped": "node", "cpu-squeeze": "batch"}

COMPONENTS: dict[str, tuple[str, ...]] = {
    "gateway": ("auth", "catalog", "orders"),
    "auth": ("userdb",),
    "catalog": ("search", "pricing"),
    "orders": ("payments", "inventory", "pricing"),
    "search": (),
    "pricing": (),
    "payments": (),
    "inventory": ("userdb",),
    "userdb": (),
}
"""Call tree of the component-statistics shape: component -> the components it calls."""


def gpu_serving(fault: str, seed: int) -> tuple[pd.DataFrame, str]:
    """A GPU-serving case with ``fault`` (one of :data:`GPU_FAULTS`) and its root entity."""
    rng = np.random.default_rng(seed)
    n = GPU_BEFORE + GPU_AFTER
    after = np.arange(n) >= GPU_BEFORE

    def noisy(level: float | np.ndarray, rel: float) -> np.ndarray:
        return level * np.exp(rel * rng.standard_normal(n))

    max_clock = 1980.0
    clock = np.clip(noisy(1950.0, 0.01), 0, max_clock)
    freq = noisy(3100.0, 0.02)
    batch_cpu = noisy(0.5, 0.1)
    # the engine's step time grows with the GPU clock and the host's CPU speed
    gpu_part, cpu_part = 0.8, 0.2
    slow = np.ones(n)
    severity = rng.uniform(0.35, 0.6)  # the clock or frequency kept, or the CPU left
    if fault == "gpu-clock-locked":
        clock = np.where(
            after, max_clock * severity * np.exp(0.002 * rng.standard_normal(n)), clock
        )
        slow = gpu_part * 1950.0 / clock + cpu_part
    elif fault == "cpu-freq-clamped":
        freq = np.where(after, 3100.0 * severity * np.exp(0.01 * rng.standard_normal(n)), freq)
        slow = gpu_part + cpu_part * 3100.0 / freq * 1.5
    elif fault == "cpu-squeeze":
        batch_cpu = np.where(after, noisy(14.0, 0.05), batch_cpu)
        slow = np.where(after, gpu_part + cpu_part * 3.0, 1.0)
    else:
        raise ValueError(f"unknown fault {fault!r} (known: {', '.join(GPU_FAULTS)})")
    rate = noisy(8.0, 0.05)  # requests/s
    capacity = 12.0 / slow
    load = np.clip(rate / capacity, 0, 0.98)
    waiting = np.maximum(0.0, (load / (1 - load) - 1.5) * 6 + rng.normal(0, 0.5, n)).round()
    base_latency = noisy(2.0, 0.04) * slow * (1 + load**4)
    sm_util = np.clip(noisy(100 * load, 0.03), 0, 100)
    cols: dict[str, np.ndarray] = {"time": T0 + 15 * np.arange(n)}
    cols |= {
        "client_latency-p50": base_latency * 0.8,
        "client_latency-p99": base_latency * 1.9,
        "client_success": np.clip(99.9 + rng.normal(0, 0.05, n), 0, 100),
        "vllm_cpu": noisy(1.1, 0.05) * (1 + 0.8 * (slow - 1) * (fault == "cpu-freq-clamped")),
        "vllm_mem": noisy(12.0, 0.002),
        "vllm_num-running": np.clip(noisy(24.0, 0.05) * np.minimum(slow, 2.0), 0, 256).round(),
        "vllm_num-waiting": waiting,
        "vllm_kv-cache-usage": np.clip(noisy(0.35, 0.05) * np.minimum(slow, 2.5), 0, 1),
        "vllm_ttft-p99": noisy(0.25, 0.05) * slow * (1 + waiting / 10),
        "gpu0_sm-clock": clock,
        "gpu0_max-sm-clock": np.full(n, max_clock),
        "gpu0_sm-util": sm_util,
        "gpu0_mem-util": np.clip(noisy(0.5 * 100 * load, 0.04), 0, 100),
        "gpu0_power": noisy(180.0, 0.02) + 4.5 * sm_util * clock / max_clock,
        "gpu0_temp": noisy(62.0, 0.01),
        "gpu0_pcie-tx": noisy(2.0e8, 0.1),
        "gpu0_pcie-rx": noisy(1.5e8, 0.1),
        "gpu0_nvlink-tx": noisy(1.0e6, 0.2),
        "gpu0_fb-used": noisy(7.2e10, 0.001),
        "node_cpu-util": np.clip(noisy(18.0, 0.05) + 6.0 * batch_cpu, 0, 100),
        "node_cpu-freq": freq,
        "node_mem": noisy(140.0, 0.002),
        "node_net-rx": noisy(3.0e6, 0.05) * rate / 8,
        "node_net-tx": noisy(9.0e6, 0.05) * rate / 8 / np.maximum(slow, 1) ** 0.3,
        "batch_cpu": batch_cpu,
        "batch_mem": noisy(2.0, 0.01),
        "batch_net-rx": noisy(4.0e5, 0.2),
    }
    return pd.DataFrame(cols), GPU_ROOT[fault]


def component_stats(fault: str, seed: int) -> tuple[pd.DataFrame, str]:
    """A component-statistics case with ``fault`` (one of :data:`STAT_FAULTS`) on a component
    drawn by ``seed`` (never the root of the tree, which only calls), and that component."""
    if fault not in STAT_FAULTS:
        raise ValueError(f"unknown fault {fault!r} (known: {', '.join(STAT_FAULTS)})")
    rng = np.random.default_rng(seed)
    n = STAT_BEFORE + STAT_AFTER
    after = np.arange(n) >= STAT_BEFORE
    root = str(rng.choice([c for c in COMPONENTS if c != "gateway"]))
    traffic = 3000.0 * np.exp(0.08 * rng.standard_normal(n))  # gateway requests per 5 min
    own_ms = {c: rng.uniform(5, 40) * np.exp(0.05 * rng.standard_normal(n)) for c in COMPONENTS}
    fail = {c: np.abs(rng.normal(0.001, 0.0005, n)) for c in COMPONENTS}
    if fault in DROPS:
        fail[root] = np.where(after, rng.uniform(*DROPS[fault]), fail[root])
    else:
        own_ms[root] = own_ms[root] * np.where(after, rng.uniform(3, 8), 1.0)
    requests: dict[str, np.ndarray] = {c: np.zeros(n) for c in COMPONENTS}
    latency: dict[str, np.ndarray] = {}
    success: dict[str, np.ndarray] = {}

    def visit(c: str, calls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Requests ``calls`` reach ``c``: its latency and success share, per row."""
        requests[c] = requests[c] + calls
        lat, ok = own_ms[c].copy(), 1.0 - fail[c]
        for callee in COMPONENTS[c]:
            cl, cok = visit(callee, calls * 0.7)
            lat = lat + 0.7 * cl * np.where(cok < 0.9, 0.6, 1.0)  # failures answer early
            ok = ok * (1 - 0.7 * (1 - cok))
        latency[c], success[c] = lat, ok
        return lat, ok

    visit("gateway", traffic)
    cols: dict[str, np.ndarray] = {"time": T0 + 300 * np.arange(n)}
    for c in COMPONENTS:
        cols[f"{c}_latency"] = latency[c] * np.exp(0.03 * rng.standard_normal(n))
        cols[f"{c}_requests"] = rng.poisson(requests[c]).astype(float)
        cols[f"{c}_availability"] = 100.0 * np.clip(success[c], 0, 1)
    return pd.DataFrame(cols), root


def write_cases(folder: Path | str, seeds: range) -> list[Path]:
    """One case folder per shape, fault and seed under ``folder``: ``gpu-<fault>-<seed>``
    and ``stats-<fault>-<seed>``. Returns the folders."""
    root = Path(folder)
    out = []
    for seed in seeds:
        for fault in GPU_FAULTS:
            frame, cause = gpu_serving(fault, seed)
            out.append(
                _write(root / f"gpu-{fault}-{seed:02d}", frame, GPU_BEFORE, 15, cause, fault)
            )
        for fault in STAT_FAULTS:
            frame, cause = component_stats(fault, seed)
            out.append(
                _write(root / f"stats-{fault}-{seed:02d}", frame, STAT_BEFORE, 300, cause, fault)
            )
    return out


def _write(
    folder: Path, frame: pd.DataFrame, start: int, step: int, cause: str, fault: str
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "data.csv", index=False)
    (folder / "inject_time.txt").write_text(str(T0 + step * start))
    label = {"root_cause": cause, "fault": fault, "source": "cotenant.evaluation.tabular_falling"}
    (folder / "label.json").write_text(json.dumps(label))
    return folder
