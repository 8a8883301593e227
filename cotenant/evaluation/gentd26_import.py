"""Import the Alibaba GenTD26 trace into the embedded store, as cotenant's own collectors
would have written it, so the product's readers (analysis, dashboard, weekly report) run on it.

Every mapping (docs/gentd26.md has the table and what the anonymisation means for results):

* ``container_ip`` (MD5 hash) is the identity: a request's ``replica`` and ``gpu``, a process
  row's ``process_name``; the trace names no node or GPU, so each container is its own GPU
  (``host`` is :data:`HOST`). Its ``model`` is the pool the data supports
  (:meth:`~cotenant.evaluation.gentd26.Trace.models`: ``sd-pool-a`` / ``sd-pool-b``).
* **requests**: one row per container and 57 s step with an e2e value (the mean of that step's
  requests: the trace has no single request). ``ts_end_ns`` = the step's time,
  ``latency_ms`` = e2e, ``queue_ms`` = the step's gateway queue time (``queue_rt``), ``other_ms``
  = the step's load time (base model + LoRA + ControlNet; a load is charged to the e2e row of its
  own step, else to the next step's: load rows lead the e2e rows they delay by 0–1 step), where a
  ``model.load`` span's time is booked (docs/instrumenting.md); ``compute_ms`` the rest. Queue
  and load are clipped so the phases sum to the latency.
* **model_loads**: one row per container, step and kind (``basemodel`` -> ``base``, ``lora``,
  ``controlnet``), ``duration_ms`` the step's mean load, ``loads`` 1 (a step's row may stand for
  2–4 loads: a lower bound). ``pipeline`` is the per-step sum of the others: not imported.
* **gpu_samples** and **process_samples**: one row per container and step with a duty-cycle or
  memory value: ``sm_util`` = pod GPU duty cycle (%), ``mem_used_bytes`` = pod GPU memory.
* Not imported (no store field holds them): ``qps`` (anonymised unit), ``model_predict``
  (scaled apart from e2e), the gateway's cluster-level ``queue_size`` and API QPS.

Time: ``timestamp_anon`` seconds are kept (``shift_s`` = 0), so a row can be checked against the
raw files; a store that ``cotenant serve`` will open needs them shifted near now (``--end now``),
or retention deletes them. Raises :class:`~cotenant.core.errors.TraceError` for a bad folder
(from the loader) and :class:`~cotenant.core.errors.UsageError` for a bad selection or a store
that already holds an import.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from cotenant.core.errors import UsageError
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.evaluation.gentd26 import LOAD_KINDS, STEP_S, Trace, load_trace
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance
from cotenant.store.queries import requests_from
from cotenant.store.schema import arrow_schema

HOST = "gentd26"
SOURCE = "gentd26"
KIND_NAMES = {"basemodel": "base", "lora": "lora", "controlnet": "controlnet"}
"""GenTD26 load files -> ``cotenant.load.kind`` (docs/instrumenting.md)."""
CHUNK_STEPS = 63
"""Steps appended per transaction (~1 anonymised hour): the progress display's unit."""

Progress = Callable[[int, int, int], None]
"""``progress(steps_done, steps_total, rows_written)``, called after each chunk."""


@dataclass(frozen=True)
class ImportResult:
    rows: dict[str, int]  # per store table
    containers: int
    steps: int
    start_ns: int  # first step, on the store's clock
    end_ns: int  # last step
    shift_s: int
    read_s: float
    write_s: float
    rollup_s: float


def select(
    trace: Trace, containers: Sequence[str] | None = None, hours: float | None = None
) -> tuple[Trace, list[str]]:
    """``trace`` restricted to ``containers`` (hashes, or unique prefixes of them) and its first
    ``hours`` anonymised hours, with the selected containers' models as the whole trace
    tells them (a pool-B container without a ControlNet load in the first hour is still pool
    B). Raises UsageError for an unknown or ambiguous container, or a non-positive
    ``hours``."""
    cols = np.arange(len(trace.containers))
    if containers:
        picked = []
        for want in containers:
            hits = [i for i, c in enumerate(trace.containers) if c.startswith(want)]
            if len(hits) != 1:
                what = "matches no container" if not hits else f"matches {len(hits)} containers"
                raise UsageError(f"container {want!r} {what} of {trace.folder}")
            picked.append(hits[0])
        cols = np.asarray(sorted(set(picked)))
    n = len(trace.ts)
    if hours is not None:
        if not hours > 0:
            raise UsageError(f"hours must be positive, got {hours!r}")
        n = min(n, int(hours * 3600 // STEP_S) + 1)
    models = trace.models()
    sub = Trace(
        folder=trace.folder,
        ts=trace.ts[:n],
        containers=tuple(trace.containers[i] for i in cols),
        panels={k: v[:n, cols] for k, v in trace.panels.items()},
        cluster={k: v[:n] for k, v in trace.cluster.items()},
    )
    return sub, [models[i] for i in cols]


def _strings(values: Sequence[str] | np.ndarray, idx: np.ndarray) -> pa.Array:
    return pa.array(np.asarray(values, dtype=object)[idx], type=pa.string())


def _table(name: str, cols: dict[str, pa.Array | np.ndarray], n: int) -> pa.Table:
    """An Arrow table of store table ``name``'s schema; columns not given are null."""
    schema = arrow_schema(name)
    arrays = [
        pa.array(cols[f.name], type=f.type, from_pandas=True)
        if f.name in cols
        else pa.nulls(n, type=f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def request_phases(trace: Trace) -> dict[str, np.ndarray]:
    """``(steps, containers)`` panels of ``latency_ms`` and each phase (ms, NaN where no e2e
    row): queue = queue_rt, other = the load time charged to the row (the module), compute the
    rest; they sum to the latency."""
    e2e = trace.panels["e2e"]
    has = np.isfinite(e2e)
    stack = np.stack([trace.load(k) for k in LOAD_KINDS])
    any_load = np.isfinite(stack).any(axis=0)
    load = np.where(any_load, np.nansum(stack, axis=0), 0.0)
    # a step's loads go to its own e2e row, else to the next step's
    carried = np.zeros_like(load)
    carried[1:] = np.where(has[:-1], 0.0, load[:-1])
    other = np.where(has, load + carried, np.nan)
    lat = np.where(has, np.fmax(e2e, 0.0), np.nan)
    queue = np.fmin(np.nan_to_num(trace.panels["queue_rt"], nan=0.0), lat)
    other = np.fmin(other, lat - queue)
    out = {c: np.where(has, 0.0, np.nan) for c in PHASE_COLUMNS}
    out["queue_ms"], out["other_ms"] = queue, other
    out["compute_ms"] = lat - queue - other
    out["latency_ms"] = lat
    return out


def _chunk_tables(
    trace: Trace,
    models: np.ndarray,
    phases: dict[str, np.ndarray],
    s0: int,
    s1: int,
    shift_s: int,
) -> dict[str, pa.Table]:
    """The store rows of steps ``[s0, s1)``; ``models`` per container."""
    names = np.asarray(trace.containers, dtype=object)
    t_ns = (trace.ts[s0:s1].astype(np.int64) + shift_s) * 1_000_000_000
    out: dict[str, pa.Table] = {}

    lat = phases["latency_ms"][s0:s1]
    r, c = np.nonzero(np.isfinite(lat))
    n = len(r)
    end = t_ns[r]
    out["requests"] = _table(
        "requests",
        {
            "ts_end_ns": end,
            "ts_start_ns": end - np.round(lat[r, c] * 1e6).astype(np.int64),
            "latency_ms": lat[r, c],
            "model": _strings(models, c),
            "host": pa.array([HOST] * n, pa.string()),
            "gpu": _strings(names, c),
            "replica": _strings(names, c),
            "batch_size": np.ones(n, dtype=np.int32),
            "status": pa.array(["ok"] * n, pa.string()),
            "source": pa.array([SOURCE] * n, pa.string()),
            **{p: phases[p][s0:s1][r, c] for p in PHASE_COLUMNS},
        },
        n,
    )

    parts = []
    for kind in LOAD_KINDS:
        v = trace.load(kind)[s0:s1]
        r, c = np.nonzero(np.isfinite(v))
        parts.append((KIND_NAMES[kind], r, c, v[r, c]))
    r = np.concatenate([p[1] for p in parts])
    c = np.concatenate([p[2] for p in parts])
    n = len(r)
    out["model_loads"] = _table(
        "model_loads",
        {
            "ts_ns": t_ns[r],
            "host": pa.array([HOST] * n, pa.string()),
            "gpu": _strings(names, c),
            "replica": _strings(names, c),
            "model": _strings(models, c),
            "kind": pa.array(np.repeat([p[0] for p in parts], [len(p[1]) for p in parts])),
            "loads": np.ones(n, dtype=np.int32),
            "duration_ms": np.concatenate([p[3] for p in parts]),
        },
        n,
    ).sort_by("ts_ns")

    duty = trace.panels["duty_cycle"][s0:s1]
    mem = trace.panels["gpu_memory"][s0:s1]
    r, c = np.nonzero(np.isfinite(duty) | np.isfinite(mem))
    n = len(r)
    sm = duty[r, c]
    used = mem[r, c]
    used_arr = pa.array(
        np.where(np.isfinite(used), used, 0).astype(np.int64), mask=~np.isfinite(used)
    )
    common = {
        "ts_ns": t_ns[r],
        "host": pa.array([HOST] * n, pa.string()),
        "gpu": _strings(names, c),
        "sm_util": pa.array(sm, mask=~np.isfinite(sm)),
        "mem_used_bytes": used_arr,
    }
    out["gpu_samples"] = _table("gpu_samples", common, n)
    served = models[c] != "sd-idle"
    out["process_samples"] = _table(
        "process_samples",
        {
            **common,
            "process_name": _strings(names, c),
            "model": pa.array(models[c].tolist(), pa.string(), mask=~served),
        },
        n,
    )
    return out


def check_empty(store: Store) -> None:
    """Refuse a store that already holds an import (a second one would double every row)."""
    n = requests_from(store, SOURCE)
    if n:
        raise UsageError(
            f"store {store.path} already holds {n:,} imported GenTD26 requests: "
            "import into a new file"
        )


def import_trace(
    store: Store,
    trace: Trace,
    *,
    models: Sequence[str] | None = None,
    shift_s: int = 0,
    progress: Progress | None = None,
    read_s: float = 0.0,
) -> ImportResult:
    """Append ``trace``'s rows to ``store`` (times shifted by ``shift_s`` seconds), a chunk of
    :data:`CHUNK_STEPS` steps per transaction, then refresh the per-minute rollups the report
    and long reads use. ``models``: per container (default ``trace.models()``). Raises
    UsageError for a store that already holds an import."""
    check_empty(store)
    names = np.asarray(trace.models() if models is None else list(models), dtype=object)
    if len(names) != len(trace.containers):
        raise UsageError(f"{len(names)} models for {len(trace.containers)} containers")
    t0 = time.perf_counter()
    phases = request_phases(trace)
    rows: dict[str, int] = {}
    n = len(trace.ts)
    maint = Maintenance(store, clock_ns=lambda: (int(trace.ts[-1]) + shift_s) * 1_000_000_000)
    for s0 in range(0, n, CHUNK_STEPS):
        s1 = min(n, s0 + CHUNK_STEPS)
        tables = _chunk_tables(trace, names, phases, s0, s1, shift_s)
        append_tables(store, tables)
        for name, t in tables.items():
            rows[name] = rows.get(name, 0) + t.num_rows
        if progress is not None:
            progress(s1, n, sum(rows.values()))
    t1 = time.perf_counter()
    maint.recover()
    maint.refresh_rollups()
    t2 = time.perf_counter()
    return ImportResult(
        rows=rows,
        containers=len(trace.containers),
        steps=n,
        start_ns=(int(trace.ts[0]) + shift_s) * 1_000_000_000,
        end_ns=(int(trace.ts[-1]) + shift_s) * 1_000_000_000,
        shift_s=shift_s,
        read_s=read_s,
        write_s=t1 - t0,
        rollup_s=t2 - t1,
    )


def import_folder(
    store: Store,
    folder: Path | str | None,
    *,
    containers: Sequence[str] | None = None,
    hours: float | None = None,
    end_s: int | None = None,
    progress: Progress | None = None,
) -> ImportResult:
    """Read the trace in ``folder`` (:func:`~cotenant.evaluation.gentd26.load_trace`), select
    ``containers`` / the first ``hours``, and import it; ``end_s`` (epoch seconds) shifts the
    times so the last step lands there (None: the trace's own clock). Raises TraceError or
    UsageError (see the module)."""
    check_empty(store)
    t0 = time.perf_counter()
    trace, models = select(load_trace(folder), containers, hours)
    read_s = time.perf_counter() - t0
    if not len(trace.ts):
        raise UsageError(f"{trace.folder}: the selection holds no step")
    shift = 0 if end_s is None else int(end_s) - int(trace.ts[-1])
    return import_trace(
        store, trace, models=models, shift_s=shift, progress=progress, read_s=read_s
    )
