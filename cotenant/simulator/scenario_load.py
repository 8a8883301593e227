"""Read a scenario YAML file into a :class:`simulator.scenario.Scenario`, validated once, here.

The schema (version 1) is documented field by field in ``docs/scenarios.md``. Every problem
raises :class:`store.errors.ScenarioError` whose message names the file, the field path and
the bad value::

    scenario x.yaml: models[1].kernel.sm_demand: bad value 1.7: must be between 0 and 1

Checked: YAML syntax (with line and column) and duplicate keys, required fields, types (a
bool is never a number), ranges, unknown keys (the message lists the allowed ones, which for
``arrival`` and ``faults`` depend on ``kind``), GPU presets and sharing modes, references
between sections (a model's GPU, a fault's target, lock and holder), unique names, faults
inside ``duration_s``, GPU memory, and that trace files exist.

A relative trace ``file`` resolves against the scenario file's folder, then against the
traces bundled in ``simulator/traces/``; the loaded :class:`Arrival` holds the absolute path.
Processes get distinct fake pids (from 2000 upwards unless the file sets ``pid``); models get
1000 + their index (:func:`model_pid`). Field checks and cross-section rules live in
:mod:`simulator.scenario_checks`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from cotenant.core.errors import ScenarioError, UsageError
from cotenant.simulator.scenario import (
    CLOCK_REASON_BITS,
    GPU_TYPES,
    MAX_REPLICA_WEIGHT,
    ROUTINGS,
    SCHEMA_VERSION,
    Actuation,
    Arrival,
    Batching,
    Fault,
    Gpu,
    Kernel,
    Llm,
    Lock,
    Model,
    Process,
    Replica,
    Scenario,
    Transfer,
)
from cotenant.simulator.scenario_checks import (
    FRACTION,
    MODEL_PID_BASE,
    NON_NEGATIVE,
    POSITIVE,
    SHARING,
    Check,
    FieldError,
    any_str,
    assign_pids,
    assign_replica_pids,
    bad,
    boolean,
    check_references,
    join_path,
    list_items,
    nonempty_str,
    nullable,
    number,
    one_of,
    section,
    section_by_kind,
    unique,
)

TRACES_DIR = Path(__file__).resolve().parent / "traces"
SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"

# --- the tables of keys ----------------------------------------------------------------------

_ARRIVAL_KEYS: dict[str, tuple[dict[str, Check], tuple[str, ...]]] = {
    "poisson": ({"rate_rps": POSITIVE}, ("rate_rps",)),
    "bursty": (
        {
            "rate_rps": NON_NEGATIVE,
            "burst_rps": POSITIVE,
            "mean_burst_s": POSITIVE,
            "mean_gap_s": POSITIVE,
        },
        ("rate_rps", "burst_rps", "mean_burst_s", "mean_gap_s"),
    ),
    "trace": ({"file": nonempty_str, "scale": POSITIVE, "start_s": NON_NEGATIVE}, ("file",)),
    "closed": (
        {"concurrency": number(1, integer=True), "think_ms": NON_NEGATIVE},
        ("concurrency",),
    ),
}
_KERNEL_KEYS: dict[str, Check] = {
    "base_ms": POSITIVE,
    "per_item_ms": NON_NEGATIVE,
    "sm_demand": FRACTION,
    "dram_demand": FRACTION,
    "memory_bound": FRACTION,
}
_BATCHING_KEYS: dict[str, Check] = {
    "max_batch": number(1, integer=True),
    "max_wait_ms": NON_NEGATIVE,
}
_LLM_KEYS: dict[str, Check] = {
    "prefill_ms_per_1k": NON_NEGATIVE,
    "decode_step_ms": POSITIVE,
    "decode_per_seq_ms": NON_NEGATIVE,
    "max_seqs": number(1, integer=True),
    "prompt_tokens": number(1),
    "output_tokens": number(1),
}
_TOKEN_SLO_KEYS = ("slo_ttft_ms", "slo_tpot_ms")  # a model's keys that need its llm section
_TRANSFER_KEYS: dict[str, Check] = {"h2d_mb": NON_NEGATIVE, "d2h_mb": NON_NEGATIVE}
_LOCK_KEYS: dict[str, Check] = {"name": nonempty_str, "hold_ms": POSITIVE}
_REPLICA_KEYS: dict[str, Check] = {
    "name": nonempty_str,
    "gpu": nonempty_str,
    "weight": number(0, MAX_REPLICA_WEIGHT, integer=True),
}
_PROCESS_KEYS: dict[str, Check] = {
    "name": nonempty_str,
    "gpu": nullable(nonempty_str),
    "sm_demand": FRACTION,
    "dram_demand": FRACTION,
    "pcie_gbps": NON_NEGATIVE,
    "memory_gib": NON_NEGATIVE,
    "always_active": boolean,
    "pid": number(1, 2**22, integer=True),
}
_GPU_KEYS: dict[str, Check] = {
    "id": nonempty_str,
    "type": one_of(GPU_TYPES),
    "sharing": one_of(SHARING),
}
_ACTUATION_KEYS: dict[str, Check] = {
    "ttl_s": POSITIVE,
    "settle_s": NON_NEGATIVE,
    "cooldown_s": NON_NEGATIVE,
    "expect": one_of(("recover", "rollback", "expire", "refrain")),
}
_RATE_FACTOR = number(1, above=True)  # a burst or surge multiplies the rate; <= 1 changes nothing
_FAULT_COMMON: dict[str, Check] = {"start_s": NON_NEGATIVE, "duration_s": POSITIVE}
_FAULT_REQUIRED = ("start_s", "duration_s")
_FAULT_KEYS: dict[str, tuple[dict[str, Check], tuple[str, ...]]] = {
    "cotenant_burst": ({"target": nonempty_str, "factor": _RATE_FACTOR}, ("target", "factor")),
    "process_active": ({"target": nonempty_str}, ("target",)),
    "bandwidth_hog": (
        {"target": nonempty_str, "resource": one_of(("dram", "pcie", "nvlink")), "level": FRACTION},
        ("target", "level"),
    ),
    "lock_hog": (
        {"lock": nonempty_str, "holder": nonempty_str, "hold_ms": POSITIVE},
        ("lock", "holder", "hold_ms"),
    ),
    "throttle": (
        {
            "gpu": nonempty_str,
            "clock_factor": number(0, 1, above=True),
            "reason": one_of(CLOCK_REASON_BITS),
        },
        ("gpu", "clock_factor"),
    ),
    "memory_pressure": ({"target": nonempty_str, "gib": POSITIVE}, ("target", "gib")),
    "cpu_hog": ({"target": nonempty_str, "cores": number(1, integer=True)}, ("target", "cores")),
    "load_surge": ({"target": nonempty_str, "factor": _RATE_FACTOR}, ("target", "factor")),
    "length_shift": (
        {
            "target": nonempty_str,
            "factor": number(0, 100, above=True),
            "lengths": one_of(("output", "prompt", "both")),
        },
        ("target", "factor"),
    ),
    "model_load": (
        {
            "target": nonempty_str,
            "load_s": POSITIVE,
            "every_s": NON_NEGATIVE,
            "load_kind": one_of(("base", "lora", "controlnet", "pipeline", "adapter")),
            "load_name": nonempty_str,
        },
        ("target", "load_s"),
    ),
}


class _Parser:
    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self.model_keys: dict[str, Check] = {
            "name": nonempty_str,
            "gpu": nonempty_str,
            "slo_p99_ms": nullable(POSITIVE),
            "slo_ttft_ms": nullable(POSITIVE),
            "slo_tpot_ms": nullable(POSITIVE),
            "preprocess_ms": NON_NEGATIVE,
            "postprocess_ms": NON_NEGATIVE,
            "memory_gib": NON_NEGATIVE,
            "kv_cache_gib": NON_NEGATIVE,
            "priority": number(integer=True),
            "tenant": any_str,
            "replicas": self.replicas,
            "routing": one_of(ROUTINGS),
            "arrival": self.arrival,
            "locks": self.locks,
            "kernel": lambda v, p: Kernel(**section(v, p, _KERNEL_KEYS, ("base_ms",))),
            "batching": lambda v, p: Batching(**section(v, p, _BATCHING_KEYS)),
            "transfer": lambda v, p: Transfer(**section(v, p, _TRANSFER_KEYS)),
            "llm": lambda v, p: Llm(**section(v, p, _LLM_KEYS)),
        }
        self.scenario_keys: dict[str, Check] = {
            "version": _version,
            "name": nonempty_str,
            "seed": number(0, integer=True),
            "duration_s": POSITIVE,
            "host_cpus": number(1, integer=True),
            "sample_period_s": POSITIVE,
            "host": nonempty_str,
            "gpus": lambda v, p: [Gpu(**_gpu(x, q)) for q, x in list_items(v, p, non_empty=True)],
            "models": lambda v, p: [self.model(x, q) for q, x in list_items(v, p, non_empty=True)],
            "processes": lambda v, p: [
                Process(**section(x, q, _PROCESS_KEYS, ("name",))) for q, x in list_items(v, p)
            ],
            "faults": lambda v, p: [
                Fault(**section_by_kind(x, q, _FAULT_KEYS, _FAULT_COMMON, _FAULT_REQUIRED))
                for q, x in list_items(v, p)
            ],
            "loop": lambda v, p: Actuation(**section(v, p, _ACTUATION_KEYS)),
        }

    def trace_file(self, value: Any, path: str) -> str:
        name = nonempty_str(value, path)
        given = Path(name).expanduser()
        candidates = [given] if given.is_absolute() else [self.base_dir / given, TRACES_DIR / given]
        for candidate in candidates:
            if candidate.is_file():
                return str(candidate.resolve())
        looked = " or ".join(str(c) for c in candidates)
        bad(path, value, f"no such trace file (looked for {looked})")

    def arrival(self, node: Any, path: str) -> Arrival:
        fields = section_by_kind(node, path, _ARRIVAL_KEYS)
        if fields["kind"] == "trace":
            fields["file"] = self.trace_file(node["file"], join_path(path, "file"))
        if fields["kind"] == "bursty" and fields["burst_rps"] < fields["rate_rps"]:
            bad(join_path(path, "burst_rps"), node["burst_rps"], "must be >= rate_rps")
        return Arrival(**fields)

    def locks(self, node: Any, path: str) -> tuple[Lock, ...]:
        locks = [
            Lock(**section(item, p, _LOCK_KEYS, _LOCK_KEYS)) for p, item in list_items(node, path)
        ]
        unique([lock.name for lock in locks], path, "name")
        return tuple(locks)

    def replicas(self, node: Any, path: str) -> tuple[Replica, ...]:
        reps = [
            Replica(**section(item, p, _REPLICA_KEYS, ("name", "gpu")))
            for p, item in list_items(node, path, non_empty=True)
        ]
        unique([r.name for r in reps], path, "name")
        unique([r.gpu for r in reps], path, "gpu")  # a replica is a model on a GPU
        if all(r.weight == 0 for r in reps):
            bad(f"{path}[*].weight", 0, "at least one replica needs a weight > 0")
        return tuple(reps)

    def model(self, node: Any, path: str) -> Model:
        has_replicas = isinstance(node, dict) and "replicas" in node
        required = ("name", "arrival", "kernel") + (() if has_replicas else ("gpu",))
        fields = section(node, path, self.model_keys, required)
        if has_replicas:
            if "gpu" in fields:
                bad(
                    join_path(path, "gpu"),
                    fields["gpu"],
                    "a model with replicas names a gpu per replica, not one of its own",
                )
            fields["gpu"] = fields["replicas"][0].gpu
        elif "routing" in fields:
            bad(join_path(path, "routing"), fields["routing"], "only a model with replicas")
        if fields.get("llm") is None:
            for key in _TOKEN_SLO_KEYS:
                if fields.get(key) is not None:
                    bad(
                        join_path(path, key),
                        fields[key],
                        f"model {fields['name']!r} has no llm section; TTFT and TPOT SLOs "
                        "apply only to generative (llm) models",
                    )
        return Model(**fields)

    def scenario(self, doc: Any) -> Scenario:
        if not isinstance(doc, dict):
            bad("", doc, "a scenario must be a mapping")
        if "version" in doc:  # first: a newer file's other errors would only mislead
            _version(doc["version"], "version")
        required = ("name", "seed", "duration_s", "gpus", "models")
        fields = section(doc, "", self.scenario_keys, required)
        if "loop" in fields:
            fields["actuation"] = fields.pop("loop")
        for name in ("gpus", "models", "processes", "faults"):
            fields[name] = tuple(fields.get(name, ()))
        scenario = Scenario(**fields)
        check_references(scenario)
        scenario = replace(scenario, processes=assign_pids(scenario))
        return replace(scenario, models=assign_replica_pids(scenario))


def _version(value: Any, path: str) -> int:
    version: int = number(integer=True)(value, path)
    if version != SCHEMA_VERSION:
        bad(
            path,
            version,
            f"unsupported schema version; this release reads version {SCHEMA_VERSION}",
        )
    return version


def _gpu(node: Any, path: str) -> dict[str, Any]:
    fields = section(node, path, _GPU_KEYS, ("id", "type"))
    fields["type"] = GPU_TYPES[fields["type"]]
    return fields


# --- public API ------------------------------------------------------------------------------


def parse_scenario(doc: Any, base_dir: Path, *, source: str = "<document>") -> Scenario:
    """Validate a parsed YAML document; ``base_dir`` is where relative trace files are looked
    for first. Raises ScenarioError naming ``source``, the field path and the bad value."""
    try:
        return _Parser(Path(base_dir)).scenario(doc)
    except FieldError as exc:
        raise ScenarioError(f"scenario {source}: {exc}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file. Raises ScenarioError (unreadable file, YAML
    syntax with line and column, duplicate keys, or any invalid field)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"scenario {path}: cannot read: {exc}") from exc
    try:
        doc = yaml.load(raw, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(f"scenario {path}: {where}invalid YAML: {problem}") from exc
    return parse_scenario(doc, path.parent, source=str(path))


def schema_keys() -> dict[str, tuple[str, ...]]:
    """Every key the schema accepts, by section (``models[].arrival (kind: trace)``, ...), in
    the order the tables list them; docs/scenarios.md must document each one."""
    p = _Parser(Path())
    out: dict[str, tuple[str, ...]] = {
        "(top level)": tuple(p.scenario_keys),
        "gpus[]": tuple(_GPU_KEYS),
        "models[]": tuple(p.model_keys),
        "models[].batching": tuple(_BATCHING_KEYS),
        "models[].kernel": tuple(_KERNEL_KEYS),
        "models[].transfer": tuple(_TRANSFER_KEYS),
        "models[].llm": tuple(_LLM_KEYS),
        "models[].locks[]": tuple(_LOCK_KEYS),
        "models[].replicas[]": tuple(_REPLICA_KEYS),
        "processes[]": tuple(_PROCESS_KEYS),
        "loop": tuple(_ACTUATION_KEYS),
    }
    for kind, (keys, _) in _ARRIVAL_KEYS.items():
        out[f"models[].arrival (kind: {kind})"] = ("kind", *keys)
    for kind, (keys, _) in _FAULT_KEYS.items():
        out[f"faults[] (kind: {kind})"] = ("kind", *_FAULT_COMMON, *keys)
    return out


def library() -> list[Path]:
    """The scenario files bundled in ``simulator/scenarios/``, sorted by name."""
    return sorted(SCENARIOS_DIR.glob("*.yaml"))


def find_scenario(name_or_path: str) -> Path:
    """A path to an existing file, or the bundled scenario of that name (with or without
    ``.yaml``). Raises ScenarioError listing the bundled names when neither exists."""
    given = Path(name_or_path)
    if given.is_file():
        return given
    bundled = SCENARIOS_DIR / (given.name if given.suffix == ".yaml" else f"{given.name}.yaml")
    if bundled.is_file():
        return bundled
    names = ", ".join(p.stem for p in library())
    raise ScenarioError(
        f"scenario {name_or_path}: no such file or bundled scenario; bundled: {names}"
    )


def model_pid(scenario: Scenario, name: str) -> int:
    """The fake pid of model ``name``: MODEL_PID_BASE + its index in ``scenario.models``."""
    for i, m in enumerate(scenario.models):
        if m.name == name:
            return MODEL_PID_BASE + i
    raise UsageError(f"no model {name!r} in scenario {scenario.name!r}")


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping (PyYAML keeps the last).
    Keys brought in by a ``<<`` merge may still be overridden, as YAML intends."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)
