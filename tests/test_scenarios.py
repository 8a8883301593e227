"""Scenario files: loading, validation errors, ground truth, the bundled library and its docs."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from cotenant.core.errors import CotenantError, ScenarioError, UsageError
from cotenant.simulator.ground_truth import TruthCause, truth_cause
from cotenant.simulator.scenario import (
    CLOCK_REASON_BITS,
    GPU_TYPES,
    Batching,
    Fault,
    FaultKind,
    Scenario,
)
from cotenant.simulator.scenario_checks import MODEL_PID_BASE, PROCESS_PID_BASE
from cotenant.simulator.scenario_load import (
    SCENARIOS_DIR,
    TRACES_DIR,
    find_scenario,
    library,
    load_scenario,
    model_pid,
    parse_scenario,
    schema_keys,
)

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "scenarios.md"
CONV = "azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"

# The example: every fault kind, both kinds of process, a trace file given relative.
VALID_YAML = f"""
version: 1
name: two-tenants-burst
seed: 7
duration_s: 900
gpus:
  - {{id: gpu0, type: h100-sxm, sharing: timeslice}}
  - {{id: gpu1, type: a100-80g, sharing: mps}}
host_cpus: 16
models:
  - name: tts
    gpu: gpu0
    slo_p99_ms: 120
    arrival: {{kind: poisson, rate_rps: 40}}
    batching: {{max_batch: 8, max_wait_ms: 5}}
    preprocess_ms: 2
    locks: [{{name: tokenizer, hold_ms: 0.5}}]
    kernel: {{base_ms: 6, per_item_ms: 1.5, sm_demand: 0.3, dram_demand: 0.4, memory_bound: 0.5}}
    transfer: {{h2d_mb: 0.5, d2h_mb: 1.0}}
    memory_gib: 8
  - name: sdxl
    gpu: gpu0
    arrival: {{kind: bursty, rate_rps: 0.5, burst_rps: 4, mean_burst_s: 20, mean_gap_s: 120}}
    batching: {{max_batch: 2, max_wait_ms: 20}}
    kernel: {{base_ms: 900, per_item_ms: 300, sm_demand: 0.95, dram_demand: 0.7,
              memory_bound: 0.4}}
    memory_gib: 24
  - name: chat
    gpu: gpu1
    arrival: {{kind: trace, file: {CONV}, scale: 1.0}}
    kernel: {{base_ms: 25, per_item_ms: 2, sm_demand: 0.6, dram_demand: 0.8, memory_bound: 0.8}}
    kv_cache_gib: 40
processes:
  - {{name: train-job, gpu: gpu1, sm_demand: 0.8, dram_demand: 0.6, pcie_gbps: 0}}
  - {{name: batch-etl}}
faults:
  - {{kind: cotenant_burst, target: sdxl, start_s: 300, duration_s: 60, factor: 5}}
  - {{kind: process_active, target: train-job, start_s: 500, duration_s: 90}}
  - {{kind: bandwidth_hog, target: train-job, resource: pcie, level: 0.9, start_s: 650,
      duration_s: 60}}
  - {{kind: lock_hog, lock: tokenizer, holder: chat, hold_ms: 30, start_s: 100, duration_s: 45}}
  - {{kind: throttle, gpu: gpu0, clock_factor: 0.6, reason: hw_thermal, start_s: 700,
      duration_s: 60}}
  - {{kind: memory_pressure, target: chat, gib: 30, start_s: 800, duration_s: 60}}
  - {{kind: cpu_hog, target: batch-etl, cores: 12, start_s: 400, duration_s: 60}}
  - {{kind: load_surge, target: tts, factor: 3, start_s: 200, duration_s: 60}}
"""
VALID: dict[str, Any] = yaml.safe_load(VALID_YAML)


def parse(doc: Any, base_dir: Path = SCENARIOS_DIR) -> Scenario:
    return parse_scenario(doc, base_dir, source="x.yaml")


# --- loading a valid file ---------------------------------------------------------------------


def test_valid_document_loads_with_cast_values_and_resolved_trace() -> None:
    s = parse(copy.deepcopy(VALID))
    assert (s.name, s.seed, s.duration_s, s.host_cpus, s.version) == (
        "two-tenants-burst",
        7,
        900.0,
        16,
        1,
    )
    assert s.gpus[0].type is GPU_TYPES["h100-sxm"] and s.gpus[1].sharing == "mps"
    tts, sdxl, chat = s.models
    assert tts.locks[0].name == "tokenizer" and tts.locks[0].hold_ms == 0.5
    assert tts.batching == Batching(max_batch=8, max_wait_ms=5.0)
    assert isinstance(tts.batching.max_batch, int) and isinstance(tts.kernel.base_ms, float)
    assert sdxl.slo_p99_ms is None and sdxl.arrival.kind == "bursty"
    assert Path(chat.arrival.file) == (TRACES_DIR / CONV).resolve()
    assert [p.gpu for p in s.processes] == ["gpu1", None]
    assert [f.kind for f in s.faults][:2] == ["cotenant_burst", "process_active"]


def test_defaults_are_the_dataclass_defaults() -> None:
    s = parse(
        {
            "name": "min",
            "seed": 0,
            "duration_s": 60,
            "gpus": [{"id": "g", "type": "l4"}],
            "models": [
                {
                    "name": "m",
                    "gpu": "g",
                    "arrival": {"kind": "poisson", "rate_rps": 1},
                    "kernel": {"base_ms": 1},
                }
            ],
            "faults": [
                {"kind": "throttle", "gpu": "g", "clock_factor": 0.5, "start_s": 0, "duration_s": 1}
            ],
        }
    )
    assert (s.host_cpus, s.sample_period_s, s.host, s.version, s.processes) == (
        16,
        1.0,
        "sim-node",
        1,
        (),
    )
    assert s.gpus[0].sharing == "timeslice"
    m = s.models[0]
    assert m.batching == Batching() and m.locks == () and m.slo_p99_ms is None
    assert (m.kernel.per_item_ms, m.kernel.sm_demand, m.kernel.dram_demand) == (0.0, 1.0, 0.0)
    assert s.faults[0].reason == "hw_thermal"


def test_processes_get_distinct_pids_apart_from_models() -> None:
    doc = copy.deepcopy(VALID)
    doc["processes"].append({"name": "copier", "gpu": "gpu0", "pid": PROCESS_PID_BASE})
    s = parse(doc)
    pids = [p.pid for p in s.processes]
    assert pids == [PROCESS_PID_BASE + 1, PROCESS_PID_BASE + 2, PROCESS_PID_BASE]
    model_pids = [model_pid(s, m.name) for m in s.models]
    assert model_pids == [MODEL_PID_BASE, MODEL_PID_BASE + 1, MODEL_PID_BASE + 2]
    assert not set(pids) & set(model_pids)
    with pytest.raises(UsageError, match="nobody"):
        model_pid(s, "nobody")


def test_relative_trace_resolves_next_to_the_scenario_first(tmp_path: Path) -> None:
    local = tmp_path / CONV
    local.parent.mkdir(parents=True)
    local.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1,1\n")
    (tmp_path / "s.yaml").write_text(VALID_YAML)
    assert load_scenario(tmp_path / "s.yaml").models[2].arrival.file == str(local.resolve())
    local.unlink()
    bundled = (TRACES_DIR / CONV).resolve()
    assert load_scenario(tmp_path / "s.yaml").models[2].arrival.file == str(bundled)
    doc = copy.deepcopy(VALID)
    doc["models"][2]["arrival"]["file"] = str(bundled)
    assert parse(doc, tmp_path).models[2].arrival.file == str(bundled)


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    text = VALID_YAML.replace(
        "  - name: chat\n    gpu: gpu1\n",
        "  - &chat\n    name: chat\n    gpu: gpu1\n",
    ).replace(
        "processes:",
        "  - {<<: *chat, name: chat2, kv_cache_gib: 10}\nprocesses:",
    )
    (tmp_path / "merge.yaml").write_text(text)
    s = load_scenario(tmp_path / "merge.yaml")
    assert [m.name for m in s.models][-1] == "chat2" and s.models[-1].kv_cache_gib == 10


# --- errors -------------------------------------------------------------------------------


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Mutation: set the value at a dotted path (``models.1.kernel.sm_demand``)."""

    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        del node[last]

    return mutate


def _add_model(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc["models"].append({**copy.deepcopy(doc["models"][0]), "locks": [], **changes})

    return mutate


# fmt: off
BAD: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    # (id, mutation, field path in the message, what else the message says)
    ("missing-name", _del("name"), "name", "missing required field"),
    ("missing-seed", _del("seed"), "seed", "missing required field"),
    ("missing-duration", _del("duration_s"), "duration_s", "missing required field"),
    ("missing-gpus", _del("gpus"), "gpus", "missing required field"),
    ("missing-models", _del("models"), "models", "missing required field"),
    ("missing-gpu-type", _del("gpus.0.type"), "gpus[0].type", "missing required field"),
    ("missing-model-gpu", _del("models.0.gpu"), "models[0].gpu", "missing required field"),
    ("missing-arrival", _del("models.1.arrival"), "models[1].arrival", "missing required"),
    ("missing-base-ms", _del("models.1.kernel.base_ms"), "models[1].kernel.base_ms", "missing"),
    ("missing-lock-hold", _del("models.0.locks.0.hold_ms"), "models[0].locks[0].hold_ms",
     "missing"),
    ("missing-process-name", _del("processes.1.name"), "processes[1].name", "missing"),
    ("missing-fault-kind", _del("faults.0.kind"), "faults[0].kind", "missing"),
    ("missing-factor", _del("faults.0.factor"), "faults[0].factor", "missing"),
    ("missing-start", _del("faults.1.start_s"), "faults[1].start_s", "missing"),
    ("missing-hog-hold", _del("faults.3.hold_ms"), "faults[3].hold_ms", "missing"),
    ("missing-throttle-gpu", _del("faults.4.gpu"), "faults[4].gpu", "missing"),
    ("missing-level", _del("faults.2.level"), "faults[2].level", "missing"),
    ("poisson-needs-rate", _del("models.0.arrival.rate_rps"), "models[0].arrival.rate_rps",
     "missing"),
    ("bursty-needs-gap", _del("models.1.arrival.mean_gap_s"), "models[1].arrival.mean_gap_s",
     "missing"),
    ("trace-needs-file", _del("models.2.arrival.file"), "models[2].arrival.file", "missing"),
    ("closed-needs-concurrency", _set("models.0.arrival", {"kind": "closed"}),
     "models[0].arrival.concurrency", "missing"),
    # types: a bool is never a number
    ("bool-duration", _set("duration_s", True), "duration_s", "bad value true: must be a number"),
    ("bool-rate", _set("models.0.arrival.rate_rps", False), "models[0].arrival.rate_rps",
     "bad value false: must be a number"),
    ("string-number", _set("models.0.kernel.base_ms", "6ms"), "models[0].kernel.base_ms",
     "bad value '6ms': must be a number"),
    ("float-seed", _set("seed", 7.5), "seed", "bad value 7.5: must be an integer"),
    ("float-max-batch", _set("models.0.batching.max_batch", 2.5), "models[0].batching.max_batch",
     "must be an integer"),
    ("bool-host-cpus", _set("host_cpus", True), "host_cpus", "must be an integer"),
    ("nan", _set("models.0.kernel.sm_demand", math.nan), "models[0].kernel.sm_demand", "finite"),
    ("inf", _set("duration_s", math.inf), "duration_s", "finite"),
    ("int-name", _set("name", 5), "name", "must be a non-empty string"),
    ("empty-name", _set("models.0.name", " "), "models[0].name", "non-empty string"),
    ("string-flag", _set("processes.0.always_active", "yes"), "processes[0].always_active",
     "must be true or false"),
    ("models-not-list", _set("models", {"tts": {}}), "models", "must be a non-empty list"),
    ("empty-gpus", _set("gpus", []), "gpus", "must be a non-empty list"),
    ("model-not-mapping", _set("models.0", ["tts"]), "models[0]", "must be a mapping"),
    ("kernel-not-mapping", _set("models.0.kernel", 6), "models[0].kernel", "must be a mapping"),
    ("locks-not-list", _set("models.0.locks", "tokenizer"), "models[0].locks", "must be a list"),
    # ranges
    ("fraction-high", _set("models.1.kernel.sm_demand", 1.7), "models[1].kernel.sm_demand",
     "bad value 1.7: must be between 0 and 1"),
    ("fraction-low", _set("models.0.kernel.dram_demand", -0.1), "models[0].kernel.dram_demand",
     "must be between 0 and 1"),
    ("memory-bound", _set("models.0.kernel.memory_bound", 2), "models[0].kernel.memory_bound",
     "between 0 and 1"),
    ("process-fraction", _set("processes.0.sm_demand", 1.2), "processes[0].sm_demand",
     "between 0 and 1"),
    ("zero-duration", _set("duration_s", 0), "duration_s", "bad value 0: must be > 0"),
    ("negative-duration", _set("faults.0.duration_s", -5), "faults[0].duration_s", "> 0"),
    ("negative-start", _set("faults.0.start_s", -1), "faults[0].start_s", "must be >= 0"),
    ("zero-rate", _set("models.0.arrival.rate_rps", 0), "models[0].arrival.rate_rps", "> 0"),
    ("zero-burst-length", _set("models.1.arrival.mean_burst_s", 0),
     "models[1].arrival.mean_burst_s", "> 0"),
    ("burst-below-rate", _set("models.1.arrival.burst_rps", 0.1), "models[1].arrival.burst_rps",
     "must be >= rate_rps"),
    ("zero-scale", _set("models.2.arrival.scale", 0), "models[2].arrival.scale", "> 0"),
    ("max-batch-zero", _set("models.0.batching.max_batch", 0), "models[0].batching.max_batch",
     "must be >= 1"),
    ("negative-wait", _set("models.0.batching.max_wait_ms", -1), "models[0].batching.max_wait_ms",
     ">= 0"),
    ("zero-slo", _set("models.0.slo_p99_ms", 0), "models[0].slo_p99_ms", "> 0"),
    ("negative-memory", _set("models.0.memory_gib", -8), "models[0].memory_gib", ">= 0"),
    ("negative-seed", _set("seed", -1), "seed", ">= 0"),
    ("zero-cpus", _set("host_cpus", 0), "host_cpus", ">= 1"),
    ("zero-sample-period", _set("sample_period_s", 0), "sample_period_s", "> 0"),
    ("sample-period-too-long", _set("sample_period_s", 901), "sample_period_s",
     "must be <= duration_s"),
    ("zero-factor", _set("faults.0.factor", 0), "faults[0].factor", "must be > 1"),
    ("burst-factor-one", _set("faults.0.factor", 1), "faults[0].factor", "must be > 1"),
    ("surge-factor-low", _set("faults.7.factor", 0.5), "faults[7].factor", "must be > 1"),
    ("clock-zero", _set("faults.4.clock_factor", 0), "faults[4].clock_factor",
     "must be > 0 and <= 1"),
    ("clock-above-one", _set("faults.4.clock_factor", 1.2), "faults[4].clock_factor",
     "must be > 0 and <= 1"),
    ("level-high", _set("faults.2.level", 1.5), "faults[2].level", "between 0 and 1"),
    ("zero-hold", _set("faults.3.hold_ms", 0), "faults[3].hold_ms", "> 0"),
    ("zero-gib", _set("faults.5.gib", 0), "faults[5].gib", "> 0"),
    ("zero-cores", _set("faults.6.cores", 0), "faults[6].cores", ">= 1"),
    ("too-many-cores", _set("faults.6.cores", 17), "faults[6].cores", "<= host_cpus (16)"),
    ("zero-concurrency", _set("models.0.arrival", {"kind": "closed", "concurrency": 0}),
     "models[0].arrival.concurrency", ">= 1"),
    ("pid-zero", _set("processes.0.pid", 0), "processes[0].pid", ">= 1"),
    # unknown keys: named, with the allowed ones listed
    ("unknown-top", _set("duraton_s", 900), "duraton_s", "unknown key; allowed: duration_s, "),
    ("unknown-kernel", _set("models.1.kernel.sm_demnd", 0.5), "models[1].kernel.sm_demnd",
     "unknown key; allowed: base_ms, dram_demand, memory_bound, per_item_ms, sm_demand"),
    ("unknown-gpu-key", _set("gpus.0.memory_gib", 80), "gpus[0].memory_gib",
     "allowed: id, sharing, type"),
    ("unknown-model-key", _set("models.0.colour", "red"), "models[0].colour", "unknown key"),
    ("key-of-other-arrival-kind", _set("models.0.arrival.burst_rps", 3),
     "models[0].arrival.burst_rps", "unknown key for kind poisson; allowed: kind, rate_rps"),
    ("key-of-other-fault-kind", _set("faults.0.level", 0.5), "faults[0].level",
     "unknown key for kind cotenant_burst; allowed: duration_s, factor, kind, start_s, target"),
    ("unknown-process-key", _set("processes.0.cpu", 4), "processes[0].cpu", "unknown key"),
    # choices
    ("unknown-gpu-type", _set("gpus.0.type", "v100"), "gpus[0].type",
     "bad value 'v100': must be one of: " + ", ".join(GPU_TYPES)),
    ("unknown-sharing", _set("gpus.0.sharing", "exclusive"), "gpus[0].sharing",
     "must be one of: timeslice, mps, mig"),
    ("unknown-arrival-kind", _set("models.0.arrival.kind", "weibull"), "models[0].arrival.kind",
     "must be one of: poisson, bursty, trace, closed"),
    ("unknown-fault-kind", _set("faults.0.kind", "meteor"), "faults[0].kind", "cotenant_burst"),
    ("unknown-resource", _set("faults.2.resource", "l2"), "faults[2].resource",
     "must be one of: dram, pcie, nvlink"),
    ("unknown-reason", _set("faults.4.reason", "hot"), "faults[4].reason", "hw_thermal"),
    # references
    ("model-gpu-undeclared", _set("models.0.gpu", "gpu9"), "models[0].gpu",
     "bad value 'gpu9': no such gpu; declared: gpu0, gpu1"),
    ("process-gpu-undeclared", _set("processes.0.gpu", "gpu9"), "processes[0].gpu",
     "no such gpu"),
    ("burst-targets-process", _set("faults.0.target", "train-job"), "faults[0].target",
     "a cotenant_burst targets a model; declared models: tts, sdxl, chat"),
    ("surge-targets-nobody", _set("faults.7.target", "nobody"), "faults[7].target",
     "a load_surge targets a model"),
    ("pressure-targets-process", _set("faults.5.target", "batch-etl"), "faults[5].target",
     "a memory_pressure targets a model"),
    ("active-host-process", _set("faults.1.target", "batch-etl"), "faults[1].target",
     "that process has no gpu"),
    ("hog-targets-nobody", _set("faults.2.target", "nobody"), "faults[2].target",
     "no such model or process"),
    ("cpu-hog-targets-nobody", _set("faults.6.target", "nobody"), "faults[6].target",
     "no such model or process; declared: tts, sdxl, chat, train-job, batch-etl"),
    ("load-targets-process", _set("faults.0", {"kind": "model_load", "target": "batch-etl",
     "load_s": 2, "start_s": 10, "duration_s": 30}), "faults[0].target", "targets a model"),
    ("loads-overlap", _set("faults.0", {"kind": "model_load", "target": "sdxl", "load_s": 5,
     "every_s": 3, "start_s": 10, "duration_s": 30}), "faults[0].every_s", "loads overlap"),
    ("lock-undeclared", _set("faults.3.lock", "gil"), "faults[3].lock",
     "no model declares this lock; declared locks: tokenizer"),
    ("holder-undeclared", _set("faults.3.holder", "nobody"), "faults[3].holder",
     "no such model or process"),
    ("throttle-gpu-undeclared", _set("faults.4.gpu", "gpu7"), "faults[4].gpu", "no such gpu"),
    # uniqueness
    ("duplicate-model", _set("models.1.name", "tts"), "models[1].name", "duplicate name"),
    ("duplicate-gpu", _set("gpus.1.id", "gpu0"), "gpus[1].id", "duplicate name"),
    ("duplicate-process", _set("processes.1.name", "train-job"), "processes[1].name",
     "duplicate name"),
    ("process-named-like-model", _set("processes.1.name", "chat"), "processes[1].name",
     "a model has this name"),
    ("duplicate-lock", _set("models.0.locks", [{"name": "t", "hold_ms": 1}] * 2),
     "models[0].locks[1].name", "duplicate name"),
    ("pid-of-a-model", _set("processes.0.pid", MODEL_PID_BASE + 1), "processes[0].pid",
     "already used"),
    # time, memory, MIG, files, version
    ("fault-starts-late", _set("faults.0.start_s", 900), "faults[0].start_s",
     "starts after duration_s 900"),
    ("fault-ends-late", _set("faults.0.duration_s", 601), "faults[0].duration_s",
     "the fault ends at 901 s, after duration_s 900"),
    ("host-process-with-gpu-load", _set("processes.1.sm_demand", 0.5), "processes[1].sm_demand",
     "needs a gpu"),
    ("gpu-memory-overcommitted", _set("models.0.memory_gib", 60), "gpus[0].type",
     "its 80 GiB cannot hold the 84 GiB"),
    ("mig-on-l4", _set("gpus.1", {"id": "gpu1", "type": "l4", "sharing": "mig"}),
     "gpus[1].sharing", "l4 does not support MIG"),
    ("mig-too-many", lambda d: [_set("gpus.0.sharing", "mig")(d)]
     + [_add_model(name=f"m{i}", memory_gib=1)(d) for i in range(6)],
     "gpus[0].sharing", "at most 7 MIG instances fit"),
    ("trace-missing", _set("models.2.arrival.file", "nope/missing.csv"), "models[2].arrival.file",
     "bad value 'nope/missing.csv': no such trace file"),
    ("version-2", _set("version", 2), "version",
     "bad value 2: unsupported schema version; this release reads version 1"),
    ("version-string", _set("version", "1"), "version", "must be an integer"),
    ("version-2-first", lambda d: [_set("version", 2)(d), _del("name")(d)], "version",
     "unsupported schema version"),
]
# fmt: on


@pytest.mark.parametrize(("mutate", "field", "says"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_invalid_document_names_file_field_and_value(
    mutate: Callable[[dict[str, Any]], None], field: str, says: str
) -> None:
    doc = copy.deepcopy(VALID)
    mutate(doc)
    with pytest.raises(ScenarioError) as err:
        parse(doc)
    message = str(err.value)
    assert message.startswith(f"scenario x.yaml: {field}: "), message
    assert says in message, message


def test_scenario_error_is_a_cotenant_error() -> None:
    assert issubclass(ScenarioError, CotenantError)


def test_top_level_must_be_a_mapping() -> None:
    with pytest.raises(ScenarioError, match=r"scenario x.yaml: \(top level\): bad value \[1\]"):
        parse([1])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name: x\nseed: 1\n  bad: [\n", r"line 3, column 6: invalid YAML"),
        ("name: x\nseed: [1, 2\n", r"line \d+, column \d+: invalid YAML"),
        ("name: x\nseed: 1\nname: y\n", r"line 3, column 1: invalid YAML: duplicate key 'name'"),
        ("", r"\(top level\): bad value null: a scenario must be a mapping"),
    ],
    ids=["indentation", "unclosed-list", "duplicate-key", "empty"],
)
def test_yaml_problems_name_file_and_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=f"^scenario {re.escape(str(path))}: {says}"):
        load_scenario(path)


def test_unreadable_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"missing\.yaml: cannot read"):
        load_scenario(tmp_path / "missing.yaml")


# --- ground truth ---------------------------------------------------------------------------


def test_truth_cause_of_every_fault_kind() -> None:
    s = parse(copy.deepcopy(VALID))
    assert [truth_cause(f) for f in s.faults] == [
        ("cotenant", "sdxl", None),
        ("cotenant", "train-job", None),
        ("bandwidth", "train-job", "pcie"),
        ("lock", "tokenizer", None),
        ("throttle", "gpu0", None),
        ("memory", "chat", None),
        ("cpu", "batch-etl", None),
        ("load", "tts", None),
    ]
    assert truth_cause(s.faults[2]) == TruthCause(
        kind="bandwidth", culprit="train-job", resource="pcie"
    )
    # length_shift needs an LLM model (tests/test_sim_llm.py loads one)
    shift = Fault("length_shift", 10, 5, target="chat", factor=2)
    assert truth_cause(shift) == ("mix", "chat", None)
    swap = Fault("model_load", 10, 30, target="sdxl", load_s=4, every_s=10)
    assert truth_cause(swap) == ("model_load", "sdxl", None)
    assert swap.load_times() == [(10, 14), (20, 24), (30, 34)]
    kinds = {f.kind for f in s.faults} | {shift.kind, swap.kind}
    assert kinds == set(get_args(FaultKind))


# --- the bundled library ----------------------------------------------------------------------

LIBRARY = library()


@pytest.mark.parametrize("path", LIBRARY, ids=[p.stem for p in LIBRARY])
def test_library_file_loads_and_says_what_to_diagnose(path: Path) -> None:
    s = load_scenario(path)
    assert s.name == path.stem
    header = path.read_text().split("\nversion:")[0]
    assert header.startswith("# ") and "diagnosed" in header
    assert 300 <= s.duration_s <= 900
    assert any(m.slo_p99_ms for m in s.models)
    for m in s.models:
        if m.arrival.kind == "trace":
            assert Path(m.arrival.file).is_relative_to(TRACES_DIR.resolve())


def _overlap(s: Scenario) -> bool:
    fs = s.faults
    return any(a.start_s < b.end_s and b.start_s < a.end_s for a in fs for b in fs if a is not b)


def test_library_covers_what_the_benchmark_needs() -> None:
    scenarios = [load_scenario(p) for p in LIBRARY]
    assert len([s for s in scenarios if s.name != "demo"]) >= 20
    assert {f.kind for s in scenarios for f in s.faults} == set(get_args(FaultKind))
    assert {g.sharing for s in scenarios for g in s.gpus} == {"timeslice", "mps", "mig"}
    assert any(_overlap(s) for s in scenarios)
    process_culprits = [
        s.name
        for s in scenarios
        for f in s.faults
        if truth_cause(f).culprit in {p.name for p in s.processes}
    ]
    assert len(process_culprits) >= 2
    controls = [
        s
        for s in scenarios
        if not s.faults and any(m.arrival.kind in ("bursty", "trace") for m in s.models)
    ]
    assert len(controls) >= 3
    assert all(s.name.startswith("control-") for s in controls)


def test_demo_is_the_documented_story() -> None:
    s = load_scenario(find_scenario("demo"))
    tts = next(m for m in s.models if m.name == "tts")
    assert tts.slo_p99_ms == 100
    sdxl = next(m for m in s.models if m.name == "sdxl")
    assert sdxl.gpu == tts.gpu and sdxl.arrival.kind == "bursty"
    chat = next(m for m in s.models if m.arrival.kind == "trace")
    assert chat.gpu != tts.gpu
    assert [truth_cause(f).kind for f in s.faults] == ["lock", "cotenant", "throttle"]


def test_find_scenario_by_name_path_or_error(tmp_path: Path) -> None:
    assert find_scenario("demo") == SCENARIOS_DIR / "demo.yaml"
    assert find_scenario("demo.yaml") == SCENARIOS_DIR / "demo.yaml"
    own = tmp_path / "mine.yaml"
    own.write_text(VALID_YAML)
    assert find_scenario(str(own)) == own
    with pytest.raises(ScenarioError, match=r"no such file or bundled scenario; bundled: .*demo"):
        find_scenario("no-such-scenario")


# --- bundled traces and docs ------------------------------------------------------------------


def test_bundled_traces_have_their_source_and_columns() -> None:
    folder = TRACES_DIR / "azure-llm-inference-2023"
    for name in ("AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv"):
        with (folder / name).open() as fh:
            assert fh.readline().strip() == "TIMESTAMP,ContextTokens,GeneratedTokens"
    readme = (folder / "README.md").read_text()
    assert "Azure/AzurePublicDataset" in readme and "CC BY 4.0" in readme
    assert "Splitwise" in readme


def test_docs_document_every_key_preset_reason_and_scenario() -> None:
    doc = DOC.read_text()
    for section, keys in schema_keys().items():
        for key in keys:
            assert f"`{key}`" in doc, f"{section}.{key} is not documented"
    for name in [*GPU_TYPES, *CLOCK_REASON_BITS, *get_args(FaultKind)]:
        assert f"`{name}`" in doc, name
    for path in LIBRARY:
        assert f"| `{path.stem}` |" in doc, f"{path.name} is not in the library table"


def test_docs_example_is_valid() -> None:
    example = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert example is not None
    s = parse(yaml.safe_load(example.group(1)))
    assert len(s.faults) == len(get_args(FaultKind))


# --- the library under the simulator ------------------------------------------------------------


def _p99_by_window(s: Scenario, table: Any, model: str, edges_s: list[float]) -> list[float]:
    """p99 latency (ms) of ``model``'s requests ending in each [edges[i], edges[i+1]),
    for the windows with at least 10 requests (a trace may pause for a minute)."""
    import numpy as np

    from cotenant.simulator.engine import Simulation

    end_s = (table.column("ts_end_ns").to_numpy() - Simulation(s).start_ns) / 1e9
    mine = np.asarray(table.column("model").to_pylist(), dtype=object) == model
    lat = table.column("latency_ms").to_numpy()[mine]
    which = np.digitize(end_s[mine], edges_s) - 1
    out = []
    for i in range(len(edges_s) - 1):
        picked = lat[which == i]
        if len(picked) >= 10:
            out.append(float(np.percentile(picked, 99)))
    return out


CONTROLS = [p for p in LIBRARY if p.stem.startswith("control-")]


@pytest.mark.parametrize("path", CONTROLS, ids=[p.stem for p in CONTROLS])
def test_controls_stay_inside_their_slos(path: Path) -> None:
    """No minute of a control exceeds any SLO: its ordinary bursts are not incidents."""
    from cotenant.simulator.output import run

    s = load_scenario(path)
    requests = run(s).requests
    edges = [float(t) for t in range(0, int(s.duration_s) + 1, 60)]
    for m in s.models:
        if m.slo_p99_ms is not None:
            worst = max(_p99_by_window(s, requests, m.name, edges))
            assert worst < m.slo_p99_ms, (m.name, worst)


def test_demo_faults_push_tts_past_its_slo() -> None:
    from cotenant.simulator.output import run

    s = load_scenario(find_scenario("demo"))
    requests = run(s).requests
    for f in s.faults:
        (p99,) = _p99_by_window(s, requests, "tts", [f.start_s, f.end_s])
        assert p99 > 100, (f.kind, p99)
