"""Whole-run outputs: the store's tables as Arrow, and ground truth by counterfactual runs."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cotenant.core.phases import PHASE_COLUMNS
from cotenant.simulator.engine import Simulation
from cotenant.simulator.ground_truth import truth_cause
from cotenant.simulator.scenario import Fault, Scenario
from cotenant.store.schema import arrow_schema

SETTLE_S = 10.0
"""Seconds after a fault ends that still count towards its victims (queues drain)."""
VICTIM_RATIO = 1.2
VICTIM_MIN_MS = 1.0

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def stderr_progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class SimOutput:
    requests: pa.Table
    gpu_samples: pa.Table
    process_samples: pa.Table


def requests_table(sim: Simulation, cols: dict[str, list[Any]]) -> pa.Table:
    """Completed-request columns from :meth:`Simulation.take_requests` as a ``requests`` table."""
    schema = arrow_schema("requests")
    n = len(cols["rid"])
    rid = np.asarray(cols["rid"], dtype=np.int64)
    seed = sim.s.seed & 0xFFFFFFFF
    trace = [f"{seed:08x}{r:024x}" for r in rid.tolist()]
    span = [f"{r + 1:016x}" for r in rid.tolist()]
    lat = np.asarray(cols["latency_ms"], dtype=np.float64)
    known = [c for c in PHASE_COLUMNS if c != "other_ms"]
    parts = (
        np.vstack([np.asarray(cols[c], dtype=np.float64) for c in known])
        if n
        else np.zeros((len(known), 0))
    )
    other = np.maximum(0.0, lat - parts.sum(axis=0))
    data: dict[str, Any] = {k: cols[k] for k in cols if k in schema.names}
    data.update(
        trace_id=trace,
        span_id=span,
        host=[sim.s.host] * n,
        status=["ok"] * n,
        source=["sim"] * n,
        other_ms=other,
    )
    return pa.table({f.name: pa.array(data[f.name], type=f.type) for f in schema}, schema=schema)


def samples_tables(
    rows: tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]],
) -> tuple[pa.Table, pa.Table]:
    out = []
    for table, data in (("gpu_samples", rows[0]), ("process_samples", rows[1])):
        schema = arrow_schema(table)
        cols: list[Any] = list(zip(*data, strict=True)) if data else [[] for _ in schema]
        n = len(data)
        cols += [[None] * n for _ in range(len(schema) - len(cols))]  # columns it does not give
        out.append(
            pa.table(
                [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)], schema=schema
            )
        )
    return out[0], out[1]


def run(
    s: Scenario, *, start_ns: int | None = None, chunk_s: float = 60.0, progress: Progress = _quiet
) -> SimOutput:
    """Simulate the whole scenario; ``progress`` gets a line per ``chunk_s`` of virtual time."""
    sim = Simulation(s) if start_ns is None else Simulation(s, start_ns=start_ns)
    reqs: list[pa.Table] = []
    t = 0.0
    while t < s.duration_s:
        t = min(s.duration_s, t + chunk_s)
        sim.run_until(t)
        reqs.append(requests_table(sim, sim.take_requests()))
        progress(
            f"{s.name}: {t:.0f}/{s.duration_s:.0f} s simulated, "
            f"{sum(r.num_rows for r in reqs)} requests"
        )
    g, p = samples_tables(sim.take_samples())
    return SimOutput(pa.concat_tables(reqs), g, p)


def _p99_by_model(t: pa.Table, lo_ns: int, hi_ns: int) -> dict[str, float]:
    end = t.column("ts_end_ns").to_numpy()
    sel = (end >= lo_ns) & (end < hi_ns)
    models = np.asarray(t.column("model").to_pylist(), dtype=object)[sel]
    lat = t.column("latency_ms").to_numpy()[sel]
    return {m: float(np.percentile(lat[models == m], 99)) for m in set(models.tolist())}


def _tpot_p99_by_model(t: pa.Table, lo_ns: int, hi_ns: int) -> dict[str, float]:
    """p99 time per output token (ms) of the requests ending in ``[lo, hi)`` that carry a
    first-token time (LLM models), by model."""
    ttft = np.asarray(t.column("ttft_ms").to_pylist(), dtype=np.float64)
    if not np.isfinite(ttft).any():
        return {}
    end = t.column("ts_end_ns").to_numpy()
    out_tok = np.asarray(t.column("output_tokens").to_pylist(), dtype=np.float64)
    sel = (end >= lo_ns) & (end < hi_ns) & np.isfinite(ttft) & (out_tok > 1)
    tpot = (t.column("latency_ms").to_numpy()[sel] - ttft[sel]) / (out_tok[sel] - 1)
    models = np.asarray(t.column("model").to_pylist(), dtype=object)[sel]
    return {m: float(np.percentile(tpot[models == m], 99)) for m in set(models.tolist())}


def truth_entry(f: Fault, s: Scenario | None = None) -> dict[str, Any]:
    """Ground-truth cause of a fault (DESIGN.md vocabulary) in scenario ``s``, as written to
    truth.json."""
    cause = truth_cause(f, s)
    out: dict[str, Any] = {
        "fault": f.kind,
        "kind": cause.kind,
        "culprit": cause.culprit,
        "start_s": f.start_s,
        "end_s": f.end_s,
    }
    if cause.resource:
        out["resource"] = cause.resource
    if f.kind == "lock_hog":
        out["holder"] = f.holder
    return out


def truth(
    s: Scenario, full: SimOutput, *, start_ns: int | None = None, progress: Progress = _quiet
) -> list[dict[str, Any]]:
    """One entry per fault with its cause and ``victims``: the models whose p99 over the fault
    (plus SETTLE_S) is at least VICTIM_RATIO x, and VICTIM_MIN_MS above, the same scenario
    run without that fault (same seed); for LLM models, also those whose p99 time per output
    token is VICTIM_RATIO x the run without it (a decode slowdown that leaves e2e flat).
    ``victim_indicators``: model -> the indicators (``e2e``, ``tpot``) that made it one."""
    base_ns = Simulation(s).start_ns if start_ns is None else start_ns
    out = []
    for i, f in enumerate(s.faults):
        progress(f"{s.name}: counterfactual without fault {i + 1}/{len(s.faults)} ({f.kind})")
        cf = run(s.without_fault(i), start_ns=base_ns)
        lo = base_ns + int(f.start_s * 1e9)
        hi = base_ns + int(min(s.duration_s, f.end_s + SETTLE_S) * 1e9)
        with_f = _p99_by_model(full.requests, lo, hi)
        without = _p99_by_model(cf.requests, lo, hi)
        tpot_f = _tpot_p99_by_model(full.requests, lo, hi)
        tpot_cf = _tpot_p99_by_model(cf.requests, lo, hi)
        victims = []
        detail = {}
        why: dict[str, list[str]] = {}
        for m, p in sorted(with_f.items()):
            q = without.get(m)
            if q is None:
                continue
            detail[m] = {"p99_ms": round(p, 3), "p99_without_ms": round(q, 3)}
            if f.kind in ("cotenant_burst", "process_active", "bandwidth_hog") and m == f.target:
                continue
            if p >= VICTIM_RATIO * q and p - q >= VICTIM_MIN_MS:
                why.setdefault(m, []).append("e2e")
            tp, tq = tpot_f.get(m), tpot_cf.get(m)
            if tp is not None and tq is not None:
                detail[m].update(tpot_p99_ms=round(tp, 3), tpot_p99_without_ms=round(tq, 3))
                if tp >= VICTIM_RATIO * tq:
                    why.setdefault(m, []).append("tpot")
            if m in why:
                victims.append(m)
        entry = truth_entry(f, s)
        entry["victims"] = victims
        if any(ind != ["e2e"] for ind in why.values()):
            entry["victim_indicators"] = why
        entry["p99"] = detail
        out.append(entry)
    return out


def write(
    out_dir: Path, s: Scenario, result: SimOutput, truth_rows: list[dict[str, Any]]
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, table in (
        ("requests", result.requests),
        ("gpu_samples", result.gpu_samples),
        ("process_samples", result.process_samples),
    ):
        p = out_dir / f"{name}.parquet"
        pq.write_table(table, p)
        paths.append(p)
    p = out_dir / "truth.json"
    p.write_text(
        json.dumps(
            {"scenario": s.name, "seed": s.seed, "duration_s": s.duration_s, "faults": truth_rows},
            indent=2,
        )
        + "\n"
    )
    paths.append(p)
    return paths
