"""Draw one node of a generated scenario: its GPUs, host and models (:mod:`.population`).

Each model's kernels are sized from its share of its GPU's offered load, so that the
unfaulted node is stable: a GPU's load ``U ~ gpu_utilisation`` is split among its tenants
(uniform shares), and a model at *sizing rate* ``r`` (its mean rate; for bursty arrivals the
mean of its burst and mean rates; for a trace, its rate over the trace's busiest minute) gets
``U_i / r`` seconds of GPU time per request alone at full clock. Batching only lowers that, so
a GPU's offered load is at most ``U``. A model at ``llm_max_rps`` or less has LLM physics with
probability ``llm_share`` (its prefill and decode split the same time). Host pre-processing,
lock holds and PCIe copies are sized the same way against the host's cores, the lock and the
link. GPU memory: 30-70 % of the GPU, split among tenants (an LLM keeps 60 % of its share as
KV cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from cotenant.evaluation.distributions import Distributions
from cotenant.simulator.arrivals import load_trace
from cotenant.simulator.scenario import GPU_TYPES
from cotenant.simulator.scenario_checks import MIG_CAPABLE
from cotenant.simulator.scenario_load import TRACES_DIR

SHARING_MODES = ("timeslice", "mps", "mig")
TRACE_PEAK_WINDOW_S = 60.0
MIN_KERNEL_MS = 0.2
MAX_KERNEL_MS = 3000.0
LOCK_BUDGET = 0.2  # seconds of lock hold per second, all models together
PCIE_BUDGET = 0.1  # fraction of the link the models' copies take


def r4(x: float) -> float:
    """``x`` to 4 significant digits (readable YAML; the loader takes it as is)."""
    return float(f"{x:.4g}")


def log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


@dataclass
class Tenant:
    """A drawn model and what the fault drawing needs to know of it."""

    doc: dict[str, Any]
    gpu: str
    rate: float  # mean requests per second
    sizing_rate: float
    llm: bool
    kernel_ms: float  # GPU time per request alone at full clock
    share: float  # its part of the GPU's offered load

    @property
    def name(self) -> str:
        return str(self.doc["name"])

    def latency_ms(self) -> float:
        """A rough unloaded latency: pre-processing, lock hold, batch wait and kernel."""
        d = self.doc
        hold = sum(lk["hold_ms"] for lk in d.get("locks", []))
        wait = d.get("batching", {}).get("max_wait_ms", 0.0)
        return float(d.get("preprocess_ms", 0.0) + hold + wait + self.kernel_ms)


@dataclass
class GpuDraw:
    id: str
    preset: str
    sharing: str
    memory_gib: float
    used_gib: float = 0.0
    tenants: list[Tenant] = field(default_factory=list)


@dataclass
class Node:
    """A drawn node: ``doc`` holds the scenario's ``gpus``, ``models`` and ``host_cpus``
    (the model dicts are the tenants' own, so a fault's adjustment shows in it);
    ``drawn``: per model, what was drawn."""

    gpus: list[GpuDraw]
    host_cpus: int
    tenants: list[Tenant]
    lock_name: str

    @property
    def doc(self) -> dict[str, Any]:
        return {
            "host_cpus": self.host_cpus,
            "gpus": [{"id": g.id, "type": g.preset, "sharing": g.sharing} for g in self.gpus],
            "models": [t.doc for t in self.tenants],
        }

    @property
    def drawn(self) -> dict[str, dict[str, Any]]:
        return {
            t.name: {
                "rate_rps": t.rate,
                "arrival": t.doc["arrival"]["kind"],
                "llm": t.llm,
                "gpu": t.gpu,
            }
            for t in self.tenants
        }

    def gpu(self, gpu_id: str) -> GpuDraw:
        return next(g for g in self.gpus if g.id == gpu_id)


@lru_cache(maxsize=8)
def trace_stats(file: str) -> tuple[float, float, float, float]:
    """(mean rate, busiest-minute rate / mean, mean prompt tokens, mean output tokens) of a
    bundled trace."""
    offs, ctx, gen = load_trace(str(TRACES_DIR / file))
    span = float(offs[-1])
    mean = len(offs) / span
    counts = np.histogram(offs, bins=np.arange(0.0, span + TRACE_PEAK_WINDOW_S, 60.0))[0]
    peak = float(counts.max()) / TRACE_PEAK_WINDOW_S / mean
    return mean, peak, float(ctx.mean()), float(gen.mean())


def draw_arrival(
    rng: np.random.Generator, d: Distributions, rate: float
) -> tuple[dict[str, Any], float]:
    """An arrival of mean ``rate`` and its sizing rate."""
    kinds = list(d.arrival_kinds)
    p = np.asarray([d.arrival_kinds[k] for k in kinds])
    kind = str(rng.choice(kinds, p=p / p.sum()))
    if kind == "poisson":
        return {"kind": "poisson", "rate_rps": r4(rate)}, rate
    if kind == "bursty":
        ratio = float(rng.uniform(*d.burst_ratio))
        burst_s = float(rng.uniform(*d.burst_s))
        gap_s = float(rng.uniform(*d.gap_s))
        on = burst_s / (burst_s + gap_s)
        base = rate / (on * ratio + 1 - on)
        doc = {
            "kind": "bursty",
            "rate_rps": r4(base),
            "burst_rps": r4(base * ratio),
            "mean_burst_s": r4(burst_s),
            "mean_gap_s": r4(gap_s),
        }
        return doc, (rate + base * ratio) / 2
    file = str(rng.choice(list(d.traces)))
    mean, peak, _, _ = trace_stats(file)
    offs, _, _ = load_trace(str(TRACES_DIR / file))
    doc = {
        "kind": "trace",
        "file": file,
        "scale": r4(rate / mean),
        "start_s": r4(float(rng.uniform(0.0, float(offs[-1])))),
    }
    return doc, rate * peak


def _kernel(rng: np.random.Generator, t_ms: float) -> dict[str, float]:
    a = float(rng.uniform(0.1, 0.5))
    return {
        "base_ms": r4(t_ms * (1 - a)),
        "per_item_ms": r4(t_ms * a),
        "sm_demand": r4(float(rng.uniform(0.2, 1.0))),
        "dram_demand": r4(float(rng.uniform(0.05, 0.8))),
        "memory_bound": r4(float(rng.uniform(0.0, 0.8))),
    }


def llm_sections(
    rng: np.random.Generator, t_ms: float, arrival: dict[str, Any]
) -> tuple[dict[str, float], dict[str, float]]:
    """(kernel, llm) sections splitting ``t_ms`` between prefill and decode (at one sequence;
    continuous batching only shares it)."""
    phi = float(rng.uniform(0.2, 0.6))
    llm: dict[str, float] = {}
    if arrival["kind"] == "trace":
        _, _, prompt, out = trace_stats(str(arrival["file"]))
    else:
        prompt = log_uniform(rng, 100, 2000)
        out = log_uniform(rng, 16, 512)
        llm.update(prompt_tokens=r4(prompt), output_tokens=r4(out))
    pre = phi * t_ms
    step = max(0.01, (1 - phi) * t_ms / out)
    kernel = _kernel(rng, 0.2 * pre)
    llm.update(
        prefill_ms_per_1k=r4(0.8 * pre / (prompt / 1000)),
        decode_step_ms=r4(step),
        decode_per_seq_ms=r4(step / 100),
        max_seqs=256,
    )
    return kernel, llm


def _role(llm: bool, t_ms: float) -> str:
    if llm:
        return "llm"
    return "embed" if t_ms < 5 else "tts" if t_ms < 50 else "vision" if t_ms < 500 else "imagegen"


def draw_node(rng: np.random.Generator, d: Distributions) -> Node:
    """The GPUs, host and models of one node (module doc)."""
    n_gpus = 1 + int(rng.choice(len(d.gpus_per_node), p=np.asarray(d.gpus_per_node)))
    gpus = []
    for i in range(n_gpus):
        preset = str(rng.choice(list(d.gpu_presets)))
        modes = [m for m in SHARING_MODES if m != "mig" or preset in MIG_CAPABLE]
        gpus.append(
            GpuDraw(f"gpu{i}", preset, str(rng.choice(modes)), GPU_TYPES[preset].memory_gib)
        )
    host_cpus = int(rng.choice(list(d.host_cpus)))
    tenants: list[Tenant] = []
    for g in gpus:
        n = int(rng.integers(d.tenants_per_gpu[0], d.tenants_per_gpu[1] + 1))
        load = float(rng.uniform(*d.gpu_utilisation))
        shares = rng.dirichlet(np.ones(n))
        mem = float(rng.uniform(0.3, 0.7)) * g.memory_gib
        mem_shares = rng.dirichlet(np.ones(n))
        for k in range(n):
            rate = log_uniform(rng, *d.rate_rps)
            arrival, sizing = draw_arrival(rng, d, rate)
            t_ms = min(MAX_KERNEL_MS, max(MIN_KERNEL_MS, 1000 * load * shares[k] / sizing))
            llm = rate <= d.llm_max_rps and bool(rng.random() < d.llm_share)
            doc: dict[str, Any] = {"name": "", "gpu": g.id, "arrival": arrival}
            gib = float(mem * mem_shares[k])
            if llm:
                kernel, llm_doc = llm_sections(rng, t_ms, arrival)
                doc["batching"] = {"max_batch": 8, "max_wait_ms": 2.0}
                doc["kernel"] = kernel
                doc["llm"] = llm_doc
                doc["memory_gib"] = r4(0.4 * gib)
                doc["kv_cache_gib"] = r4(0.6 * gib)
            else:
                max_batch = int(rng.choice([1, 2, 4, 8, 16, 32] if rate >= 1 else [1, 2]))
                wait = float(rng.uniform(0.0, 5.0)) if max_batch > 1 else 0.0
                doc["batching"] = {"max_batch": max_batch, "max_wait_ms": r4(wait)}
                doc["kernel"] = _kernel(rng, t_ms)
                doc["memory_gib"] = r4(gib)
            doc["name"] = f"{_role(llm, t_ms)}-{len(tenants)}"
            doc["tenant"] = f"team-{int(rng.integers(1, 6))}"
            t = Tenant(doc, g.id, rate, sizing, llm, t_ms, float(shares[k]))
            g.tenants.append(t)
            g.used_gib += float(doc["memory_gib"]) + float(doc.get("kv_cache_gib", 0.0))
            tenants.append(t)
    lock_name = str(rng.choice(["tokenizer", "vector-index", "feature-cache"]))
    _host_work(rng, d, tenants, host_cpus, lock_name, gpus)
    return Node(gpus, host_cpus, tenants, lock_name)


def _host_work(
    rng: np.random.Generator,
    d: Distributions,
    tenants: list[Tenant],
    host_cpus: int,
    lock_name: str,
    gpus: list[GpuDraw],
) -> None:
    """Pre-processing, a shared lock and PCIe copies, each on some models (module doc)."""
    pre = [t for t in tenants if rng.random() < d.p_preprocess]
    cpu = float(rng.uniform(*d.cpu_utilisation)) * host_cpus
    for t, share in zip(pre, rng.dirichlet(np.ones(max(1, len(pre))))[: len(pre)], strict=True):
        add_preprocess(t, 1000 * cpu * float(share) / t.sizing_rate)
    for t in tenants:
        if rng.random() < d.p_lock:
            add_lock(t, lock_name, log_uniform(rng, 0.05, 1.0))
    scale_locks(tenants)
    for t in tenants:
        if rng.random() < d.p_transfer:
            add_transfer(rng, t, GPU_TYPES[next(g.preset for g in gpus if g.id == t.gpu)].pcie_gbps)


def add_preprocess(t: Tenant, ms: float) -> None:
    """Give ``t`` host pre-processing of ``ms`` per request (kept within 0.05 ms and twice
    its kernel time, at most 100 ms)."""
    t.doc["preprocess_ms"] = r4(min(100.0, 2 * max(1.0, t.kernel_ms), max(0.05, ms)))


def add_lock(t: Tenant, name: str, hold_ms: float) -> None:
    t.doc["locks"] = [{"name": name, "hold_ms": r4(hold_ms)}]


def scale_locks(tenants: list[Tenant]) -> None:
    """Shrink every hold so that the lock is held at most LOCK_BUDGET of the time."""
    busy = sum(
        t.sizing_rate * lk["hold_ms"] / 1000 for t in tenants for lk in t.doc.get("locks", [])
    )
    if busy > LOCK_BUDGET:
        for t in tenants:
            for lk in t.doc.get("locks", []):
                lk["hold_ms"] = r4(max(0.001, lk["hold_ms"] * LOCK_BUDGET / busy))


def add_transfer(rng: np.random.Generator, t: Tenant, pcie_gbps: float) -> None:
    """PCIe copies per request, at most PCIE_BUDGET of the link at the sizing rate."""
    h2d = log_uniform(rng, 0.1, 20.0)
    cap = PCIE_BUDGET * pcie_gbps * 1000 / t.sizing_rate
    h2d = min(h2d, cap)
    t.doc["transfer"] = {"h2d_mb": r4(h2d), "d2h_mb": r4(h2d * float(rng.uniform(0.1, 1.0)))}
