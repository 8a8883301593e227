"""The checks behind :mod:`simulator.scenario_load`: typed field checks and cross-section rules.

Field checks take ``(value, path)`` and return the value cast to its type, or raise
:class:`FieldError` naming the path and the bad value; a bool is never a number, NaN and
infinities are refused. :func:`section` checks a mapping against a table of such checks.

Cross-section rules (:func:`check_references`), checked once the sections are built: names
are unique (GPU ids; model and process names, across both kinds), every reference resolves (a
model's or process's GPU, a fault's target, lock, holder and GPU), faults lie inside
``duration_s``, each GPU can hold the memory declared on it, MIG is used only where it exists.
:func:`assign_pids` gives processes distinct fake pids (models get ``MODEL_PID_BASE + index``).
:mod:`simulator.scenario_load` turns a FieldError into ScenarioError, adding the file name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any, NoReturn

from cotenant.simulator.scenario import Fault, Gpu, Model, Process, Scenario

MODEL_PID_BASE = 1000
PROCESS_PID_BASE = 2000
REPLICA_PID_BASE = 3000  # replicas after a model's first (which has the model's pid)
MIG_MAX_INSTANCES = 7  # A100 / H100 / H200: at most seven GPU instances
MIG_CAPABLE = frozenset({"h100-sxm", "h200", "a100-80g"})  # the L4 has no MIG


class FieldError(Exception):
    """One bad field: its path and what is wrong; turned into ScenarioError at the edge."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or '(top level)'}: {problem}")


def show(value: Any) -> str:
    """A value as it looks in YAML, shortened to 60 characters."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # a YAML 600 is cast to 600.0; show what the file says
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def bad(path: str, value: Any, why: str) -> NoReturn:
    raise FieldError(path, f"bad value {show(value)}: {why}")


Check = Callable[[Any, str], Any]


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


# --- scalar checks: each takes (value, path) and returns the cast value ----------------------


def number(
    lo: float | None = None, hi: float | None = None, *, above: bool = False, integer: bool = False
) -> Check:
    """A number (int or float, never bool) in [lo, hi], or (lo, hi] when ``above``."""
    if lo == 0 and hi == 1 and not above:
        rule = "must be between 0 and 1"
    else:
        parts = [f"> {lo:g}" if above else f">= {lo:g}"] if lo is not None else []
        parts += [f"<= {hi:g}"] if hi is not None else []
        rule = "must be " + " and ".join(parts)

    def check(value: Any, path: str) -> Any:
        kind_ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not kind_ok:
            bad(path, value, "must be an integer" if integer else "must be a number")
        if not math.isfinite(value):
            bad(path, value, "must be a finite number")
        too_low = lo is not None and (value <= lo if above else value < lo)
        if too_low or (hi is not None and value > hi):
            bad(path, value, rule)
        return int(value) if integer else float(value)

    return check


def nonempty_str(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        bad(path, value, "must be a non-empty string")
    return value


def any_str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        bad(path, value, "must be a string")
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        bad(path, value, "must be true or false")
    return value


def one_of(options: Collection[str]) -> Check:
    def check(value: Any, path: str) -> str:
        if not isinstance(value, str) or value not in options:
            bad(path, value, "must be one of: " + ", ".join(options))
        return value

    return check


def nullable(inner: Check) -> Check:
    return lambda value, path: None if value is None else inner(value, path)


FRACTION = number(0, 1)
POSITIVE = number(0, above=True)
NON_NEGATIVE = number(0)
SHARING = ("timeslice", "mps", "mig")


def section(
    node: Any, path: str, keys: Mapping[str, Check], required: Collection[str] = (), what: str = ""
) -> dict[str, Any]:
    """Check a mapping against its table of keys; return the cast values of the keys present."""
    if not isinstance(node, dict):
        bad(path, node, "must be a mapping")
    for key in node:
        if key not in keys:
            allowed = ", ".join(sorted(keys))
            raise FieldError(join_path(path, str(key)), f"unknown key{what}; allowed: {allowed}")
    for key in required:
        if key not in node:
            raise FieldError(join_path(path, key), "missing required field")
    return {key: keys[key](value, join_path(path, key)) for key, value in node.items()}


def list_items(node: Any, path: str, *, non_empty: bool = False) -> list[tuple[str, Any]]:
    if not isinstance(node, list) or (non_empty and not node):
        bad(path, node, "must be a non-empty list" if non_empty else "must be a list")
    return [(f"{path}[{i}]", item) for i, item in enumerate(node)]


def section_by_kind(
    node: Any,
    path: str,
    tables: Mapping[str, tuple[dict[str, Check], tuple[str, ...]]],
    common: Mapping[str, Check] = {},
    common_required: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A mapping whose allowed and required keys depend on its ``kind``."""
    if not isinstance(node, dict):
        bad(path, node, "must be a mapping")
    if "kind" not in node:
        raise FieldError(join_path(path, "kind"), "missing required field")
    kind = one_of(tables)(node["kind"], join_path(path, "kind"))
    keys, required = tables[kind]
    table = {"kind": nonempty_str, **common, **keys}
    return section(node, path, table, common_required + required, f" for kind {kind}")


# --- cross-section rules ----------------------------------------------------------------------


def unique(names: list[str], path: str, key: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            bad(f"{path}[{i}].{key}", name, "duplicate name")
        seen.add(name)


def check_references(s: Scenario) -> None:
    """Cross-section rules: names unique, references resolve, faults fit, GPUs can hold it."""
    gpu_ids = [g.id for g in s.gpus]
    unique(gpu_ids, "gpus", "id")
    unique([m.name for m in s.models], "models", "name")
    unique([p.name for p in s.processes], "processes", "name")
    models = {m.name: m for m in s.models}
    procs = {p.name: p for p in s.processes}
    declared = ", ".join(gpu_ids)
    for i, p in enumerate(s.processes):
        where = f"processes[{i}]"
        if p.name in models:
            bad(f"{where}.name", p.name, "a model has this name; names must be unique")
        if p.gpu is not None and p.gpu not in gpu_ids:
            bad(f"{where}.gpu", p.gpu, f"no such gpu; declared: {declared}")
        if p.gpu is None:
            for key in ("sm_demand", "dram_demand", "pcie_gbps", "memory_gib"):
                if getattr(p, key):
                    bad(f"{where}.{key}", getattr(p, key), "needs a gpu (a host-only process)")
    replica_names: dict[str, str] = {}
    for i, m in enumerate(s.models):
        for j, r in enumerate(m.replicas):
            if r.gpu not in gpu_ids:
                bad(f"models[{i}].replicas[{j}].gpu", r.gpu, f"no such gpu; declared: {declared}")
            if r.name in replica_names:
                why = f"model {replica_names[r.name]} has a replica of this name"
                bad(f"models[{i}].replicas[{j}].name", r.name, why + "; names must be unique")
            replica_names[r.name] = m.name
        if m.gpu not in gpu_ids:
            bad(f"models[{i}].gpu", m.gpu, f"no such gpu; declared: {declared}")
    for i, g in enumerate(s.gpus):
        _check_gpu(s, i, g)
    if s.sample_period_s > s.duration_s:
        bad("sample_period_s", s.sample_period_s, "must be <= duration_s")
    lock_names = sorted({lock.name for m in s.models for lock in m.locks})
    for i, f in enumerate(s.faults):
        _check_fault(s, f"faults[{i}]", f, models, procs, lock_names)


def _check_gpu(s: Scenario, i: int, g: Gpu) -> None:
    """MIG exists on this preset and has room for every tenant; the declared memory fits."""
    on_gpu = [m.memory_gib + m.kv_cache_gib for m in s.models for gid in gpus_of(m) if gid == g.id]
    on_gpu += [p.memory_gib for p in s.processes if p.gpu == g.id]
    if g.sharing == "mig" and g.type.name not in MIG_CAPABLE:
        why = f"{g.type.name} does not support MIG; use timeslice or mps"
        bad(f"gpus[{i}].sharing", "mig", why)
    if g.sharing == "mig" and len(on_gpu) > MIG_MAX_INSTANCES:
        why = f"{len(on_gpu)} models and processes on {g.id}, but at most {MIG_MAX_INSTANCES}"
        bad(f"gpus[{i}].sharing", "mig", why + " MIG instances fit on a GPU")
    if sum(on_gpu) > g.type.memory_gib:
        why = f"its {g.type.memory_gib:g} GiB cannot hold the {sum(on_gpu):g} GiB"
        bad(f"gpus[{i}].type", g.type.name, why + f" that models and processes on {g.id} declare")


def _check_fault(
    s: Scenario,
    where: str,
    f: Fault,
    models: Mapping[str, Model],
    procs: Mapping[str, Process],
    lock_names: list[str],
) -> None:
    if f.start_s >= s.duration_s:
        bad(f"{where}.start_s", f.start_s, f"starts after duration_s {s.duration_s:g}")
    if f.end_s > s.duration_s:
        bad(
            f"{where}.duration_s",
            f.duration_s,
            f"the fault ends at {f.end_s:g} s, after duration_s {s.duration_s:g}",
        )
    names = ", ".join([*models, *procs]) or "none"
    gpu_procs = [n for n, p in procs.items() if p.gpu is not None]
    if f.kind == "model_load":
        _check_model_load(where, f)
    if (
        f.kind in ("cotenant_burst", "load_surge", "memory_pressure", "model_load")
        and f.target not in models
    ):
        bad(
            f"{where}.target",
            f.target,
            f"a {f.kind} targets a model; declared models: " + ", ".join(models),
        )
    if f.kind in ("process_active", "bandwidth_hog") and f.target not in [*models, *gpu_procs]:
        why = "that process has no gpu" if f.target in procs else "no such model or process"
        bad(
            f"{where}.target",
            f.target,
            f"{why}; a {f.kind} targets a model or a process "
            "with a gpu: " + (", ".join([*models, *gpu_procs])),
        )
    if f.kind == "length_shift" and (f.target not in models or models[f.target].llm is None):
        llms = [n for n, m in models.items() if m.llm is not None]
        bad(
            f"{where}.target",
            f.target,
            "a length_shift targets a model with an llm section; declared: "
            + (", ".join(llms) or "none"),
        )
    if f.kind == "length_shift" and f.factor == 1:
        bad(f"{where}.factor", f.factor, "must differ from 1 (a shift of x1 changes nothing)")
    if f.kind == "cpu_hog" and f.target not in models and f.target not in procs:
        bad(f"{where}.target", f.target, f"no such model or process; declared: {names}")
    if f.kind == "cpu_hog" and f.cores > s.host_cpus:
        bad(f"{where}.cores", f.cores, f"must be <= host_cpus ({s.host_cpus})")
    if f.kind == "lock_hog" and f.lock not in lock_names:
        bad(
            f"{where}.lock",
            f.lock,
            "no model declares this lock; declared locks: " + (", ".join(lock_names) or "none"),
        )
    if f.kind == "lock_hog" and f.holder not in models and f.holder not in procs:
        bad(f"{where}.holder", f.holder, f"no such model or process; declared: {names}")
    if f.kind == "throttle" and f.gpu not in [g.id for g in s.gpus]:
        bad(f"{where}.gpu", f.gpu, "no such gpu; declared: " + ", ".join(g.id for g in s.gpus))


def _check_model_load(where: str, f: Fault) -> None:
    if f.load_s > f.duration_s:
        bad(f"{where}.load_s", f.load_s, f"must be <= duration_s ({f.duration_s:g})")
    if 0 < f.every_s < f.load_s:
        bad(f"{where}.every_s", f.every_s, f"must be 0 or >= load_s ({f.load_s:g}): loads overlap")


def gpus_of(m: Model) -> tuple[str, ...]:
    """The GPUs ``m`` runs on: one per replica, or its ``gpu``."""
    return tuple(r.gpu for r in m.replicas) if m.replicas else (m.gpu,)


def assign_replica_pids(s: Scenario) -> tuple[Model, ...]:
    """Each model's first replica gets the model's pid (``MODEL_PID_BASE + index``); later
    replicas the lowest pids from REPLICA_PID_BASE that no process uses, in order."""
    used = {p.pid for p in s.processes}
    out, next_pid = [], REPLICA_PID_BASE
    for i, m in enumerate(s.models):
        reps = []
        for j, r in enumerate(m.replicas):
            if j == 0:
                pid = MODEL_PID_BASE + i
            else:
                while next_pid in used:
                    next_pid += 1
                pid = next_pid
                used.add(pid)
            reps.append(replace(r, pid=pid))
        out.append(replace(m, replicas=tuple(reps)) if reps else m)
    return tuple(out)


def assign_pids(s: Scenario) -> tuple[Process, ...]:
    """Explicit pids must be distinct from each other and from models' pids; the rest get the
    lowest free pids from PROCESS_PID_BASE, in declaration order."""
    used = {MODEL_PID_BASE + i for i in range(len(s.models))}
    for i, p in enumerate(s.processes):
        if p.pid:
            if p.pid in used:
                bad(f"processes[{i}].pid", p.pid, "already used by a model or process")
            used.add(p.pid)
    out, next_pid = [], PROCESS_PID_BASE
    for p in s.processes:
        if not p.pid:
            while next_pid in used:
                next_pid += 1
            p = replace(p, pid=next_pid)
            used.add(next_pid)
        out.append(p)
    return tuple(out)
