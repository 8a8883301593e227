"""A simulated week at coarse (one-minute) resolution, as the store's rollup rows.

The discrete-event engine (:mod:`simulator.engine`) runs about 3M requests per wall minute, so
a week of real traffic (tens of millions of requests per model) is far too slow for a test or
a benchmark. :func:`simulate_week` instead draws the per-minute aggregates directly — what
``store.maintenance`` would have rolled up — from a :class:`WeekSpec` with known injected
faults, vectorised over minutes with NumPy:

* ``request_rollup_1m``: per minute x model, request count (Poisson), errors, latency sum and
  max, p50/p90/p95/p99, mean of each phase, batch size and tokens;
* ``gpu_rollup_1m``: per minute x GPU, utilisations, PCIe, memory, power, clocks and the OR of
  the clock-event reason bits (NVML values, :data:`simulator.scenario.CLOCK_REASON_BITS`);
* ``process_rollup_1m``: per minute x GPU process, SM / memory utilisation and memory used
  (non-model processes only while they run, as NVML lists them).

A fault slows the models that share its GPU by the physics the analysis knows: a co-tenant's
extra SM activity stretches compute by that fraction (and the queue twice as much), DRAM
traffic likewise, PCIe traffic stretches transfers, a clock drop stretches compute by the clock
ratio, a nearly full GPU by half. Incidents are not written here: run cotenant's own analysis
on the rows (``reports.backfill``) so the report sees what the analysis would have found.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from cotenant.core.phases import PHASE_COLUMNS
from cotenant.simulator.scenario import CLOCK_REASON_BITS
from cotenant.simulator.week_spec import (
    KIND,
    TruthFault,
    WeekFault,
    WeekFaultKind,
    WeekGpu,
    WeekModel,
    WeekProcess,
    WeekSpec,
    check_week,
)
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.schema import arrow_schema

MINUTE_NS = 60_000_000_000
GIB = 1024**3


@dataclass
class Week:
    spec: WeekSpec
    request_rollup: pa.Table
    gpu_rollup: pa.Table
    process_rollup: pa.Table
    truth: list[TruthFault] = field(default_factory=list)


__all__ = [
    "TruthFault",
    "Week",
    "WeekFault",
    "WeekFaultKind",
    "WeekGpu",
    "WeekModel",
    "WeekProcess",
    "WeekSpec",
    "simulate_week",
    "write_week",
]


def _mask(spec: WeekSpec, f: WeekFault) -> np.ndarray:
    t = np.arange(spec.minutes) * 60.0
    return (t + 60.0 > f.start_s) & (t < f.start_s + f.duration_s)


def simulate_week(spec: WeekSpec) -> Week:
    """Draw the week's rollup rows. Deterministic for a given ``spec`` (``seed``).
    Raises ScenarioError naming the bad field."""
    check_week(spec)
    rng = np.random.default_rng(spec.seed)
    n = spec.minutes
    minute = spec.start_ns + np.arange(n, dtype=np.int64) * MINUTE_NS
    day = np.sin(2 * np.pi * np.arange(n) / 1440.0)
    model_gpu = {m.name: m.gpu for m in spec.models}
    proc_gpu = {p.name: p.gpu for p in spec.processes}

    # per model: arrival multiplier; per GPU process: SM / memory-controller / memory use
    rate_x = {m.name: 1.0 + m.diurnal * day for m in spec.models}
    p_sm = {p.name: np.full(n, p.sm_util if p.always_active else np.nan) for p in spec.processes}
    p_mem = {p.name: np.full(n, p.mem_util if p.always_active else np.nan) for p in spec.processes}
    p_gib = {
        p.name: np.full(n, p.memory_gib if p.always_active else np.nan) for p in spec.processes
    }
    extra_gib = {m.name: np.zeros(n) for m in spec.models}
    pcie = {g.id: np.zeros(n) for g in spec.gpus}
    clock = {g.id: np.full(n, g.max_sm_clock_mhz) for g in spec.gpus}
    reasons = {g.id: np.zeros(n, dtype=np.int64) for g in spec.gpus}
    truth: list[TruthFault] = []
    for f in spec.faults:
        mk = _mask(spec, f)
        gpu = f.gpu if f.kind == "throttle" else model_gpu.get(f.target, proc_gpu.get(f.target))
        assert gpu is not None  # check_week: every target is a model or process
        if f.kind in ("cotenant_burst", "load_surge"):
            rate_x[f.target] = np.where(mk, rate_x[f.target] * f.factor, rate_x[f.target])
        elif f.kind == "process_active":
            p_sm[f.target] = np.where(mk, f.level * 100, p_sm[f.target])
            p_mem[f.target] = np.where(
                mk, np.fmax(np.nan_to_num(p_mem[f.target]), 2.0), p_mem[f.target]
            )
        elif f.kind == "bandwidth_hog":
            if f.resource == "dram":
                p_mem[f.target] = np.where(mk, f.level * 100, p_mem[f.target])
                p_sm[f.target] = np.where(
                    mk, np.fmax(np.nan_to_num(p_sm[f.target]), 3.0), p_sm[f.target]
                )
            else:
                peak = next(g.pcie_peak_bps for g in spec.gpus if g.id == gpu)
                pcie[gpu] = pcie[gpu] + np.where(mk, f.level * peak, 0.0)
                p_sm[f.target] = np.where(
                    mk, np.fmax(np.nan_to_num(p_sm[f.target]), 2.0), p_sm[f.target]
                )
                p_mem[f.target] = np.where(
                    mk, np.fmax(np.nan_to_num(p_mem[f.target]), 2.0), p_mem[f.target]
                )
        elif f.kind == "throttle":
            clock[gpu] = np.where(mk, clock[gpu] * f.clock_factor, clock[gpu])
            reasons[gpu] = np.where(mk, reasons[gpu] | CLOCK_REASON_BITS[f.reason], reasons[gpu])
        elif f.kind == "memory_pressure":
            if f.target in extra_gib:
                extra_gib[f.target] = extra_gib[f.target] + np.where(mk, f.gib, 0.0)
            else:
                base = np.nan_to_num(p_gib[f.target])
                p_gib[f.target] = np.where(mk, base + f.gib, p_gib[f.target])
                p_sm[f.target] = np.where(
                    mk, np.fmax(np.nan_to_num(p_sm[f.target]), 1.0), p_sm[f.target]
                )
                p_mem[f.target] = np.where(
                    mk, np.fmax(np.nan_to_num(p_mem[f.target]), 1.0), p_mem[f.target]
                )
        victims = (
            (f.target,)
            if f.kind == "load_surge"
            else tuple(m.name for m in spec.models if m.gpu == gpu and m.name != f.target)
        )
        culprit = gpu if f.kind == "throttle" else f.target
        res = f.resource if f.kind == "bandwidth_hog" else None
        lo = spec.start_ns + int(f.start_s * 1e9)
        truth.append(
            TruthFault(KIND[f.kind], culprit, gpu, lo, lo + int(f.duration_s * 1e9), victims, res)
        )

    # each model's process activity follows its own arrival rate
    m_sm = {m.name: np.clip(m.sm_util * rate_x[m.name], 0, 100) for m in spec.models}
    m_mem = {m.name: np.clip(m.mem_util * rate_x[m.name], 0, 100) for m in spec.models}

    req_parts: list[dict[str, np.ndarray]] = []
    gpu_rows: list[dict[str, np.ndarray]] = []
    proc_rows: list[dict[str, np.ndarray]] = []
    for g in spec.gpus:
        models = [m for m in spec.models if m.gpu == g.id]
        procs = [p for p in spec.processes if p.gpu == g.id]
        total_gib = g.memory_gib
        used_gib = sum((m.memory_gib + extra_gib[m.name] for m in models), np.zeros(n))
        used_gib = used_gib + sum((np.nan_to_num(p_gib[p.name]) for p in procs), np.zeros(n))
        near_full = used_gib / total_gib >= 0.95
        sm_all = sum((m_sm[m.name] for m in models), np.zeros(n)) + sum(
            (np.nan_to_num(p_sm[p.name]) for p in procs), np.zeros(n)
        )
        mem_all = sum((m_mem[m.name] for m in models), np.zeros(n)) + sum(
            (np.nan_to_num(p_mem[p.name]) for p in procs), np.zeros(n)
        )
        clock_ratio = g.max_sm_clock_mhz / clock[g.id]
        pcie_frac = pcie[g.id] / g.pcie_peak_bps
        for m in models:
            # co-runners' SM and DRAM activity above their usual level stretches compute
            others_sm = sm_all - m_sm[m.name]
            others_mem = mem_all - m_mem[m.name]
            usual = [o for o in models if o is not m]
            always = [p for p in procs if p.always_active]
            rest_sm = sum(
                (np.clip(o.sm_util * (1 + o.diurnal * day), 0, 100) for o in usual), np.zeros(n)
            )
            rest_mem = sum(
                (np.clip(o.mem_util * (1 + o.diurnal * day), 0, 100) for o in usual), np.zeros(n)
            )
            rest_sm = rest_sm + sum((p.sm_util for p in always), 0.0)
            rest_mem = rest_mem + sum((p.mem_util for p in always), 0.0)
            d_sm = np.clip(others_sm - rest_sm, 0, None) / 100
            d_mem = np.clip(others_mem - rest_mem, 0, None) / 100
            stretch = clock_ratio * (1 + d_sm + d_mem) * np.where(near_full, 1.5, 1.0)
            own = rate_x[m.name] / (1 + m.diurnal * day)  # own surge beyond the daily swing
            req_parts.append(
                _model_minutes(m, rng, minute, rate_x[m.name], stretch, pcie_frac, own)
            )
            proc_rows.append(
                {
                    "minute_ns": minute,
                    "pid": np.full(n, m.pid or 1000 + spec.models.index(m)),
                    "process_name": np.full(n, f"{m.name}-server", dtype=object),
                    "model": np.full(n, m.name, dtype=object),
                    "gpu": np.full(n, g.id, dtype=object),
                    "sm_util": m_sm[m.name],
                    "sm_util_max": np.clip(m_sm[m.name] * 1.2, 0, 100),
                    "mem_util": m_mem[m.name],
                    "mem_used_bytes_max": ((m.memory_gib + extra_gib[m.name]) * GIB).astype(
                        np.int64
                    ),
                }
            )
        for p in procs:
            on = np.isfinite(p_sm[p.name])
            proc_rows.append(
                {
                    "minute_ns": minute[on],
                    "pid": np.full(int(on.sum()), p.pid or 2000 + spec.processes.index(p)),
                    "process_name": np.full(int(on.sum()), p.name, dtype=object),
                    "model": np.full(int(on.sum()), None, dtype=object),
                    "gpu": np.full(int(on.sum()), g.id, dtype=object),
                    "sm_util": p_sm[p.name][on],
                    "sm_util_max": np.clip(p_sm[p.name][on] * 1.2, 0, 100),
                    "mem_util": np.nan_to_num(p_mem[p.name][on]),
                    "mem_used_bytes_max": (np.nan_to_num(p_gib[p.name][on]) * GIB).astype(np.int64),
                }
            )
        sm = np.clip(sm_all, 0, 100)
        base_pcie = sum((m.rate_rps * rate_x[m.name] * m.h2d_ms * 2e6 for m in models), np.zeros(n))
        tx = base_pcie * 0.4 + pcie[g.id] / 2
        gpu_rows.append(
            {
                "minute_ns": minute,
                "gpu": np.full(n, g.id, dtype=object),
                "sm_util": sm,
                "sm_util_max": np.clip(sm * 1.1, 0, 100),
                "mem_util": np.clip(mem_all, 0, 100),
                "mem_util_max": np.clip(mem_all * 1.1, 0, 100),
                "dram_active": np.clip(mem_all, 0, 100) / 100,
                "pcie_tx_bps": tx,
                "pcie_rx_bps": base_pcie * 0.6 + pcie[g.id] / 2,
                "nvlink_tx_bps": np.zeros(n),
                "nvlink_rx_bps": np.zeros(n),
                "mem_used_bytes_max": (np.minimum(used_gib, total_gib) * GIB).astype(np.int64),
                "mem_total_bytes": np.full(n, int(total_gib * GIB), dtype=np.int64),
                "power_w": 80 + 5.2 * sm / clock_ratio,
                "temp_c_max": 35 + 0.45 * sm,
                "sm_clock_mhz": clock[g.id],
                "sm_clock_mhz_min": clock[g.id],
                "max_sm_clock_mhz": np.full(n, g.max_sm_clock_mhz),
                "clock_event_reasons": reasons[g.id],
            }
        )
    return Week(
        spec,
        _table("request_rollup_1m", req_parts, {"ttft_p99_ms": None, "tpot_p99_ms": None}),
        _table("gpu_rollup_1m", gpu_rows, {"host": spec.host, "samples": 60}),
        _table(
            "process_rollup_1m",
            proc_rows,
            {"host": spec.host, "samples": 60, "cpu_cores": None},
        ),
        truth,
    )


def _model_minutes(
    m: WeekModel,
    rng: np.random.Generator,
    minute: np.ndarray,
    rate_x: np.ndarray,
    stretch: np.ndarray,
    pcie_frac: np.ndarray,
    own: np.ndarray,
) -> dict[str, np.ndarray]:
    n = len(minute)
    count = rng.poisson(m.rate_rps * rate_x * 60.0)
    noise = rng.lognormal(0.0, 0.03, n)
    compute = m.compute_ms * stretch * noise
    lost = stretch - 1.0
    queue = m.queue_ms * (1 + 2 * lost + 2 * np.clip(own - 1, 0, None)) * noise
    xfer = 1 + 3 * np.clip(pcie_frac - 0.1, 0, None)
    phases = {
        "queue_ms": queue,
        "lock_wait_ms": np.zeros(n),
        "preprocess_ms": np.full(n, m.preprocess_ms) * noise,
        "h2d_ms": m.h2d_ms * xfer * noise,
        "compute_ms": compute,
        "d2h_ms": m.d2h_ms * xfer * noise,
        "postprocess_ms": np.full(n, m.postprocess_ms) * noise,
        "other_ms": np.full(n, m.other_ms),
    }
    mean = sum(phases.values(), np.zeros(n))
    tail = 2.2 + 0.6 * np.clip(lost + (own - 1) + (xfer - 1), 0, 3)  # slowdowns fatten the tail
    has = count > 0
    out: dict[str, np.ndarray] = {
        "minute_ns": minute[has],
        "model": np.full(int(has.sum()), m.name, dtype=object),
        "gpu": np.full(int(has.sum()), m.gpu, dtype=object),
        "count": count[has].astype(np.int64),
        "errors": rng.binomial(count, 0.001)[has].astype(np.int64),
        "latency_sum_ms": (mean * count)[has],
        "latency_max_ms": (mean * tail * 1.6)[has],
        "p50_ms": (mean * 0.85)[has],
        "p90_ms": (mean * (1 + 0.35 * tail))[has],
        "p95_ms": (mean * (1 + 0.5 * tail))[has],
        "p99_ms": (mean * tail)[has],
        "batch_size_mean": (np.full(n, m.batch_size) * np.clip(own, 1, None))[has],
        "prompt_tokens_sum": (count * 50)[has].astype(np.int64),
        "output_tokens_sum": (count * 20)[has].astype(np.int64),
    }
    for c in PHASE_COLUMNS:
        out[c] = phases[c][has]
    return out


def _table(name: str, parts: list[dict[str, np.ndarray]], const: dict[str, object]) -> pa.Table:
    schema = arrow_schema(name)
    cols: dict[str, pa.Array] = {}
    total = sum(len(p["minute_ns"]) for p in parts)
    for f in schema:
        if f.name in const:
            cols[f.name] = pa.array([const[f.name]] * total, type=f.type)
        elif parts:
            cols[f.name] = pa.array(
                np.concatenate([np.asarray(p[f.name]) for p in parts]),
                type=f.type,
                from_pandas=True,
            )
        else:
            cols[f.name] = pa.array([], type=f.type)
    return pa.table(cols, schema=schema).sort_by([("minute_ns", "ascending")])


def write_week(store: Store, week: Week) -> None:
    """Append the week's rollup rows to ``store`` (rows already there for the same minutes
    are kept: write into a fresh store)."""
    append_tables(
        store,
        {
            "request_rollup_1m": week.request_rollup,
            "gpu_rollup_1m": week.gpu_rollup,
            "process_rollup_1m": week.process_rollup,
        },
    )
