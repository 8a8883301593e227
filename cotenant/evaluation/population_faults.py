"""Draw the faults of a generated scenario (:mod:`.population`) and its duration.

A scenario holds 1-3 faults (``faults_per_scenario``); the first starts after
``first_fault_s`` of history, the others ``later_fault_offset_s`` after it, so faults often
overlap. Each has a kind (uniform over every kind the simulator has), a duration
(``fault_s``, log-uniform) and a *size* ``s`` (``fault_size``, log-uniform 1.1-3), the
nominal multiplier of what the fault acts on:

* ``cotenant_burst``: the culprit's arrivals rise until its GPU's offered load is ``s`` x
  (factor ``1 + (s - 1) / its share``, at most 20); the culprit is a model on a GPU with
  co-tenants when there is one;
* ``load_surge``: the target's own arrivals x ``s``;
* ``process_active``: a process on the GPU with SM demand ``s - 1`` and DRAM demand
  ``(s - 1) / 2`` (at most 1; one time in five the target is a model's own background job);
* ``bandwidth_hog``: DRAM at level ``s - 1`` (at most 1; the memory-bound part of kernels
  stretches by ``1 + level``), PCIe at ``1 - 1 / s`` (copies ``s`` x slower), or NVLink
  (counters only); by a process on the GPU, or a model one time in five;
* ``lock_hog``: a holder takes the node's shared lock for ``(s - 1)`` x the typical latency of
  the models that take it, again and again;
* ``throttle``: the clock at ``1 / s`` of its maximum;
* ``memory_pressure``: the target's GPU memory grows until KV-cache batches are preempted
  (recomputed) with probability ``s - 1`` (at most 1);
* ``cpu_hog``: ``1 - 1 / s`` of the host's cores taken, by a host process or a model;
* ``length_shift``: an LLM's prompt, output or both lengths x ``s``;
* ``model_load``: the target's replica blocked ``1 - 1 / s`` of the time by loads of 1-10 s
  (one time in five, a single load of 5-30 s).

When a kind needs what the node lacks (a lock for ``lock_hog``, pre-processing for
``cpu_hog``, a KV cache for ``memory_pressure``, PCIe copies for a PCIe hog, an LLM for
``length_shift``), one model is given it; ``drawn["adjusted"]`` lists those models (an LLM
made of a model faster than ``llm_max_rps`` gets a new rate, drawn log-uniform up to it).
Whether anyone is slowed is not decided here: the counterfactual truth says
(:func:`simulator.output.truth`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.evaluation.distributions import Distributions
from cotenant.evaluation.population_models import (
    GpuDraw,
    Node,
    Tenant,
    add_lock,
    add_preprocess,
    add_transfer,
    draw_arrival,
    llm_sections,
    log_uniform,
    r4,
    scale_locks,
)
from cotenant.simulator.scenario import GPU_TYPES
from cotenant.simulator.scenario_checks import MIG_MAX_INSTANCES

THROTTLE_REASONS = (
    "hw_thermal",
    "sw_thermal",
    "sw_power_cap",
    "hw_slowdown",
    "hw_power_brake",
    "applications_clocks_setting",
)
LOAD_KINDS = ("base", "lora", "controlnet", "pipeline", "adapter")
MAX_BURST_FACTOR = 20.0
P_MODEL_CULPRIT = 0.2


@dataclass
class FaultDraw:
    faults: list[dict[str, Any]]
    processes: list[dict[str, Any]]
    duration_s: float
    drawn: list[dict[str, Any]]
    adjusted: list[str]

    @property
    def doc_changes(self) -> dict[str, Any]:
        return {"processes": self.processes} if self.processes else {}


class _Drawer:
    def __init__(self, rng: np.random.Generator, d: Distributions, node: Node) -> None:
        self.rng = rng
        self.d = d
        self.node = node
        self.processes: list[dict[str, Any]] = []
        self.adjusted: list[str] = []

    # -- helpers ------------------------------------------------------------------------------

    def pick(self, items: list[Any]) -> Any:
        return items[int(self.rng.integers(len(items)))]

    def shared_gpu(self) -> GpuDraw:
        """A GPU with co-tenants when there is one."""
        crowded = [g for g in self.node.gpus if len(g.tenants) > 1]
        return self.pick(crowded or self.node.gpus)  # type: ignore[no-any-return]

    def gpu_process(self, g: GpuDraw, role: str, sm: float, dram: float) -> str | None:
        """A new process on ``g`` (None when a MIG GPU has no instance left)."""
        on = len(g.tenants) + sum(1 for p in self.processes if p.get("gpu") == g.id)
        if g.sharing == "mig" and on >= MIG_MAX_INSTANCES:
            return None
        name = f"{role}-{len(self.processes)}"
        room = (
            g.memory_gib
            - g.used_gib
            - sum(p.get("memory_gib", 0.0) for p in self.processes if p.get("gpu") == g.id)
        )
        gib = max(0.0, min(0.05 * g.memory_gib, room - 1.0))
        self.processes.append(
            {
                "name": name,
                "gpu": g.id,
                "sm_demand": r4(sm),
                "dram_demand": r4(dram),
                "memory_gib": r4(gib),
            }
        )
        return name

    def host_process(self, role: str) -> str:
        name = f"{role}-{len(self.processes)}"
        self.processes.append({"name": name})
        return name

    def adjust(self, t: Tenant) -> None:
        if t.name not in self.adjusted:
            self.adjusted.append(t.name)

    # -- one method per kind ------------------------------------------------------------------

    def cotenant_burst(self, s: float) -> dict[str, Any]:
        t: Tenant = self.pick(self.shared_gpu().tenants)
        factor = min(MAX_BURST_FACTOR, 1 + (s - 1) / max(t.share, 1e-6))
        return {"kind": "cotenant_burst", "target": t.name, "factor": r4(max(1.01, factor))}

    def load_surge(self, s: float) -> dict[str, Any]:
        t: Tenant = self.pick(self.node.tenants)
        return {"kind": "load_surge", "target": t.name, "factor": r4(s)}

    def process_active(self, s: float) -> dict[str, Any]:
        g = self.shared_gpu() if self.rng.random() < P_MODEL_CULPRIT else self.pick(self.node.gpus)
        name = None
        if self.rng.random() >= P_MODEL_CULPRIT:
            name = self.gpu_process(g, "train-job", min(1.0, s - 1), min(1.0, (s - 1) / 2))
        if name is None:
            name = self.pick(g.tenants).name
        return {"kind": "process_active", "target": name}

    def bandwidth_hog(self, s: float) -> dict[str, Any]:
        g: GpuDraw = self.pick(self.node.gpus)
        resource = str(self.rng.choice(["dram", "pcie", "nvlink"], p=[0.6, 0.3, 0.1]))
        level = {
            "dram": min(1.0, s - 1),
            "pcie": min(0.95, 1 - 1 / s),
            "nvlink": float(self.rng.uniform(0.3, 0.9)),
        }[resource]
        if resource == "pcie" and not any("transfer" in t.doc for t in g.tenants):
            t = self.pick(g.tenants)
            add_transfer(self.rng, t, GPU_TYPES[g.preset].pcie_gbps)
            self.adjust(t)
        name = None
        if self.rng.random() >= P_MODEL_CULPRIT:
            name = self.gpu_process(g, "copy-loop" if resource == "pcie" else "stream", 0.0, 0.0)
        if name is None:
            name = self.pick(g.tenants).name
        return {"kind": "bandwidth_hog", "target": name, "resource": resource, "level": r4(level)}

    def lock_hog(self, s: float) -> dict[str, Any]:
        takers = [t for t in self.node.tenants if "locks" in t.doc]
        if not takers:
            t = self.pick(self.node.tenants)
            add_lock(t, self.node.lock_name, log_uniform(self.rng, 0.05, 1.0))
            scale_locks(self.node.tenants)
            self.adjust(t)
            takers = [t]
        typical = float(np.median([t.latency_ms() for t in takers]))
        if self.rng.random() < 0.5:
            holder = self.host_process("rebuild")
        else:
            holder = self.pick(self.node.tenants).name
        return {
            "kind": "lock_hog",
            "lock": self.node.lock_name,
            "holder": holder,
            "hold_ms": r4(max(0.01, (s - 1) * typical)),
        }

    def throttle(self, s: float) -> dict[str, Any]:
        g: GpuDraw = self.pick(self.node.gpus)
        return {
            "kind": "throttle",
            "gpu": g.id,
            "clock_factor": r4(1 / s),
            "reason": str(self.rng.choice(list(THROTTLE_REASONS))),
        }

    def memory_pressure(self, s: float) -> dict[str, Any]:
        t: Tenant = self.pick(self.node.tenants)
        g = self.node.gpu(t.gpu)
        kv = [float(x.doc.get("kv_cache_gib", 0.0)) for x in g.tenants]
        if max(kv) <= 0:
            holder: Tenant = self.pick(g.tenants)
            gib = r4(max(0.5, min(0.1 * g.memory_gib, g.memory_gib - g.used_gib - 1)))
            holder.doc["kv_cache_gib"] = gib
            g.used_gib += gib
            self.adjust(holder)
            kv = [gib]
        p = min(1.0, s - 1)
        grow = g.memory_gib - g.used_gib + p * max(kv)
        return {"kind": "memory_pressure", "target": t.name, "gib": r4(max(0.1, grow))}

    def cpu_hog(self, s: float) -> dict[str, Any]:
        host = self.node.host_cpus
        if not any("preprocess_ms" in t.doc for t in self.node.tenants):
            t = self.pick(self.node.tenants)
            add_preprocess(t, 1000 * 0.1 * host / t.sizing_rate)
            self.adjust(t)
        cores = int(min(host, max(1, round(host * (1 - 1 / s)))))
        if self.rng.random() < 0.3:
            target = self.pick(self.node.tenants).name
        else:
            target = self.host_process("etl")
        return {"kind": "cpu_hog", "target": target, "cores": cores}

    def length_shift(self, s: float) -> dict[str, Any]:
        llms = [t for t in self.node.tenants if t.llm]
        if not llms:
            t = min(self.node.tenants, key=lambda x: x.rate)
            if t.rate > self.d.llm_max_rps:
                rate = log_uniform(self.rng, self.d.rate_rps[0], self.d.llm_max_rps)
                arrival, sizing = draw_arrival(self.rng, self.d, rate)
                t.kernel_ms = t.kernel_ms * t.sizing_rate / sizing
                t.rate, t.sizing_rate = rate, sizing
                t.doc["arrival"] = arrival
            kernel, llm = llm_sections(self.rng, t.kernel_ms, t.doc["arrival"])
            t.doc.update(kernel=kernel, llm=llm, batching={"max_batch": 8, "max_wait_ms": 2.0})
            t.llm = True
            self.adjust(t)
            llms = [t]
        t = self.pick(llms)
        lengths = str(self.rng.choice(["output", "prompt", "both"]))
        return {"kind": "length_shift", "target": t.name, "factor": r4(s), "lengths": lengths}

    def model_load(self, s: float, duration: float) -> dict[str, Any]:
        t: Tenant = self.pick(self.node.tenants)
        kind = str(self.rng.choice(list(LOAD_KINDS)))
        out: dict[str, Any] = {
            "kind": "model_load",
            "target": t.name,
            "load_kind": kind,
            "load_name": f"{kind}-{int(self.rng.integers(1, 100))}",
        }
        if self.rng.random() < 0.2:
            out.update(load_s=r4(min(duration, float(self.rng.uniform(5.0, 30.0)))), every_s=0.0)
        else:
            load = min(duration, float(self.rng.uniform(1.0, 10.0)))
            every = max(load, load / (1 - 1 / s))
            out.update(load_s=r4(load), every_s=r4(max(every, r4(load))))
        return out


def draw_faults(rng: np.random.Generator, d: Distributions, node: Node) -> FaultDraw:
    """The faults of a faulted scenario on ``node`` (adjusting its models where a kind needs
    it) and the scenario's duration (module doc)."""
    drawer = _Drawer(rng, d, node)
    p = np.asarray(d.faults_per_scenario)
    n = 1 + int(rng.choice(len(p), p=p / p.sum()))
    first = float(rng.uniform(*d.first_fault_s))
    faults: list[dict[str, Any]] = []
    drawn: list[dict[str, Any]] = []
    for k in range(n):
        kind = str(rng.choice(list(d.fault_kinds)))
        size = log_uniform(rng, *d.fault_size)
        duration = float(round(log_uniform(rng, *d.fault_s)))
        start = first if k == 0 else first + float(rng.uniform(*d.later_fault_offset_s))
        start = float(round(start))
        f = (
            drawer.model_load(size, duration)
            if kind == "model_load"
            else getattr(drawer, kind)(size)
        )
        faults.append({**f, "start_s": start, "duration_s": duration})
        drawn.append({"kind": kind, "size": size, "duration_s": duration, "start_s": start})
    end = max(f["start_s"] + f["duration_s"] for f in faults)
    duration_s = float(round(end + float(rng.uniform(*d.tail_s))))
    return FaultDraw(faults, drawer.processes, duration_s, drawn, drawer.adjusted)
