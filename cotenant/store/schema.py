"""Table definitions of the embedded store, in one place.

Each table is a list of ``(column, duckdb_type)``; the Arrow schema used by the writer and the
DDL both derive from it. Bump :data:`SCHEMA_VERSION` on any change and say how to migrate.
Units are in the column name or SI; timestamps are integer nanoseconds UTC.
"""

from __future__ import annotations

import pyarrow as pa

from cotenant.core.phases import PHASE_COLUMNS

SCHEMA_VERSION = 9


REQUESTS: list[tuple[str, str]] = [
    ("ts_start_ns", "BIGINT"),
    ("ts_end_ns", "BIGINT"),
    ("latency_ms", "DOUBLE"),
    ("trace_id", "VARCHAR"),
    ("span_id", "VARCHAR"),
    ("model", "VARCHAR"),
    ("tenant", "VARCHAR"),
    ("host", "VARCHAR"),
    ("pid", "BIGINT"),
    ("gpu", "VARCHAR"),
    ("priority", "INTEGER"),
    ("batch_size", "INTEGER"),
    ("prompt_tokens", "INTEGER"),
    ("output_tokens", "INTEGER"),
    ("status", "VARCHAR"),
    ("source", "VARCHAR"),
    *[(c, "DOUBLE") for c in PHASE_COLUMNS],
    ("lock_name", "VARCHAR"),
    ("lock_holder", "VARCHAR"),
    ("ttft_ms", "DOUBLE"),
    ("replica", "VARCHAR"),  # which replica of the model served it; NULL: none named (schema 5)
]

GPU_SAMPLES: list[tuple[str, str]] = [
    ("ts_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("sm_util", "DOUBLE"),
    ("mem_util", "DOUBLE"),
    ("dram_active", "DOUBLE"),
    ("pcie_tx_bps", "DOUBLE"),
    ("pcie_rx_bps", "DOUBLE"),
    ("nvlink_tx_bps", "DOUBLE"),
    ("nvlink_rx_bps", "DOUBLE"),
    ("mem_used_bytes", "BIGINT"),
    ("mem_total_bytes", "BIGINT"),
    ("power_w", "DOUBLE"),
    ("temp_c", "DOUBLE"),
    ("sm_clock_mhz", "DOUBLE"),
    ("max_sm_clock_mhz", "DOUBLE"),
    ("clock_event_reasons", "BIGINT"),
]

PROCESS_SAMPLES: list[tuple[str, str]] = [
    ("ts_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("pid", "BIGINT"),
    ("process_name", "VARCHAR"),
    ("model", "VARCHAR"),
    ("sm_util", "DOUBLE"),
    ("mem_util", "DOUBLE"),
    ("mem_used_bytes", "BIGINT"),
    ("cpu_cores", "DOUBLE"),
    ("cpu_freq_mhz", "DOUBLE"),
    ("cpu_max_freq_mhz", "DOUBLE"),
]
"""Per-process samples: GPU processes from NVML (``sm_util``/``mem_util`` in percent, memory
used); host CPU use in cores (``cpu_cores``) where sampled. Host-only processes have no ``gpu``.
Procfs rows also carry the host's CPU frequency at the poll (``cpu_freq_mhz``: the mean of its
CPUs' current frequency; ``cpu_max_freq_mhz``: the mean of their hardware maximum) where cpufreq
is readable. Schema 2 added ``cpu_cores``, schema 9 the two frequencies."""

MODEL_LOADS: list[tuple[str, str]] = [
    ("ts_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("replica", "VARCHAR"),
    ("model", "VARCHAR"),
    ("kind", "VARCHAR"),
    ("name", "VARCHAR"),
    ("loads", "INTEGER"),
    ("duration_ms", "DOUBLE"),
]
"""Model, adapter or pipeline loads on a replica (schema 7): ``ts_ns`` when the load ended,
``kind`` one of ``base``, ``lora``, ``controlnet``, ``pipeline``, ``adapter`` (the
``cotenant.load.kind`` vocabulary of docs/instrumenting.md), ``name`` what was loaded (NULL when
not known), ``duration_ms`` the mean duration of the ``loads`` loads the row stands for (1 for one
load; an importer of per-interval means, e.g. GenTD26, writes one row per interval)."""

INCIDENTS: list[tuple[str, str]] = [
    ("id", "VARCHAR PRIMARY KEY"),
    ("model", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("state", "VARCHAR"),
    ("start_ns", "BIGINT"),
    ("end_ns", "BIGINT"),
    ("updated_ns", "BIGINT"),
    ("peak_p99_ms", "DOUBLE"),
    ("baseline_p99_ms", "DOUBLE"),
    ("slo_ms", "DOUBLE"),
    ("top_cause", "VARCHAR"),
    ("top_culprit", "VARCHAR"),
    ("top_share", "DOUBLE"),
    ("detail_json", "VARCHAR"),
    ("severity", "VARCHAR"),  # breach | degradation (schema 4)
    ("replica", "VARCHAR"),  # the slow replica, when the model has named replicas (schema 5)
    ("indicator", "VARCHAR"),  # e2e | ttft | tpot: the series that breached (schema 6)
]

CONTENTION: list[tuple[str, str]] = [
    ("id", "VARCHAR PRIMARY KEY"),
    ("model", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("indicator", "VARCHAR"),
    ("start_ns", "BIGINT"),
    ("end_ns", "BIGINT"),
    ("updated_ns", "BIGINT"),
    ("reason", "VARCHAR"),  # own_load | recurring (analysis.incident_merge.ordinary)
    ("top_cause", "VARCHAR"),
    ("top_culprit", "VARCHAR"),
    ("causes_json", "VARCHAR"),  # every cause: kind, culprit, share, evidence
]
"""Ordinary contention (schema 8): slowdowns within the SLO that opened no incident because
the model's own traffic or a co-tenant's recurring bursts explain them. The weekly report
counts them beside the incidents."""

ACTIONS: list[tuple[str, str]] = [
    ("id", "VARCHAR PRIMARY KEY"),
    ("incident_id", "VARCHAR"),
    ("kind", "VARCHAR"),
    ("target", "VARCHAR"),
    ("backend", "VARCHAR"),
    ("state", "VARCHAR"),
    ("created_ns", "BIGINT"),
    ("updated_ns", "BIGINT"),
    ("params_json", "VARCHAR"),
    ("before_json", "VARCHAR"),
    ("after_json", "VARCHAR"),
    ("reason", "VARCHAR"),
]

AUDIT: list[tuple[str, str]] = [
    ("ts_ns", "BIGINT"),
    ("actor", "VARCHAR"),
    ("action_id", "VARCHAR"),
    ("event", "VARCHAR"),
    ("detail_json", "VARCHAR"),
]

ALERTS: list[tuple[str, str]] = [
    ("fingerprint", "VARCHAR PRIMARY KEY"),
    ("alertname", "VARCHAR"),
    ("status", "VARCHAR"),
    ("model", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("starts_at_ns", "BIGINT"),
    ("received_ns", "BIGINT"),
    ("labels_json", "VARCHAR"),
    ("annotations_json", "VARCHAR"),
    ("diagnosis_state", "VARCHAR"),
    ("diagnosis_json", "VARCHAR"),
    ("incident_id", "VARCHAR"),
]
"""Alerts received from Alertmanager's webhook, one row per fingerprint, with the diagnosis
run for each (``diagnosis_state``: pending, done, failed). Schema 3 added this table."""

REQUEST_ROLLUP: list[tuple[str, str]] = [
    ("minute_ns", "BIGINT"),
    ("model", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("count", "BIGINT"),
    ("errors", "BIGINT"),
    ("latency_sum_ms", "DOUBLE"),
    ("latency_max_ms", "DOUBLE"),
    ("p50_ms", "DOUBLE"),
    ("p90_ms", "DOUBLE"),
    ("p95_ms", "DOUBLE"),
    ("p99_ms", "DOUBLE"),
    *[(c, "DOUBLE") for c in PHASE_COLUMNS],
    ("batch_size_mean", "DOUBLE"),
    ("prompt_tokens_sum", "BIGINT"),
    ("output_tokens_sum", "BIGINT"),
    ("ttft_p99_ms", "DOUBLE"),  # schema 6
    ("tpot_p99_ms", "DOUBLE"),  # schema 6: ms per output token
]
"""Per-minute per-(model, gpu) aggregates of ``requests`` by completion minute.
Phase columns hold the mean per request; ``ttft_p99_ms`` / ``tpot_p99_ms`` (generative
models: :data:`TPOT_MS_SQL`) are null where no request of the minute carried them."""

TPOT_MS_SQL = (
    "CASE WHEN ttft_ms IS NOT NULL THEN "
    "CASE WHEN output_tokens > 1 THEN (latency_ms - ttft_ms) / (output_tokens - 1) END "
    "WHEN output_tokens > 0 THEN compute_ms / output_tokens END"
)
"""A request's time per output token (ms) from its ``requests`` columns: ``(latency - TTFT) /
(output tokens - 1)``, or the compute phase over the output tokens where TTFT is not known;
null without token counts (and for a one-token answer with a TTFT)."""

GPU_ROLLUP: list[tuple[str, str]] = [
    ("minute_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("samples", "BIGINT"),
    ("sm_util", "DOUBLE"),
    ("sm_util_max", "DOUBLE"),
    ("mem_util", "DOUBLE"),
    ("mem_util_max", "DOUBLE"),
    ("dram_active", "DOUBLE"),
    ("pcie_tx_bps", "DOUBLE"),
    ("pcie_rx_bps", "DOUBLE"),
    ("nvlink_tx_bps", "DOUBLE"),
    ("nvlink_rx_bps", "DOUBLE"),
    ("mem_used_bytes_max", "BIGINT"),
    ("mem_total_bytes", "BIGINT"),
    ("power_w", "DOUBLE"),
    ("temp_c_max", "DOUBLE"),
    ("sm_clock_mhz", "DOUBLE"),
    ("sm_clock_mhz_min", "DOUBLE"),
    ("max_sm_clock_mhz", "DOUBLE"),
    ("clock_event_reasons", "BIGINT"),
]
"""Per-minute per-GPU means (and maxima where named); ``clock_event_reasons`` is the OR."""

PROCESS_ROLLUP: list[tuple[str, str]] = [
    ("minute_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("pid", "BIGINT"),
    ("process_name", "VARCHAR"),
    ("model", "VARCHAR"),
    ("samples", "BIGINT"),
    ("sm_util", "DOUBLE"),
    ("sm_util_max", "DOUBLE"),
    ("mem_util", "DOUBLE"),
    ("mem_used_bytes_max", "BIGINT"),
    ("cpu_cores", "DOUBLE"),
]

LOAD_ROLLUP: list[tuple[str, str]] = [
    ("minute_ns", "BIGINT"),
    ("host", "VARCHAR"),
    ("gpu", "VARCHAR"),
    ("replica", "VARCHAR"),
    ("model", "VARCHAR"),
    ("kind", "VARCHAR"),
    ("loads", "BIGINT"),
    ("duration_ms_sum", "DOUBLE"),
    ("duration_ms_max", "DOUBLE"),
]
"""Per-minute ``model_loads`` per (host, GPU, replica, model, kind), by the minute a load ended:
loads, their summed duration and the longest row's mean (schema 7)."""

PENDING_SPANS: list[tuple[str, str]] = [
    ("trace_id", "VARCHAR"),
    ("received_ns", "BIGINT"),
    ("payload", "BLOB"),
]
"""Child spans still waiting for their root at shutdown, restored at the next start."""

TABLES: dict[str, list[tuple[str, str]]] = {
    "requests": REQUESTS,
    "gpu_samples": GPU_SAMPLES,
    "process_samples": PROCESS_SAMPLES,
    "model_loads": MODEL_LOADS,
    "incidents": INCIDENTS,
    "contention": CONTENTION,
    "actions": ACTIONS,
    "audit": AUDIT,
    "alerts": ALERTS,
    "request_rollup_1m": REQUEST_ROLLUP,
    "gpu_rollup_1m": GPU_ROLLUP,
    "process_rollup_1m": PROCESS_ROLLUP,
    "load_rollup_1m": LOAD_ROLLUP,
    "pending_spans": PENDING_SPANS,
}

APPEND_TABLES = ("requests", "gpu_samples", "process_samples", "model_loads", "audit")
"""Tables the writer thread appends to in Arrow batches."""

_ARROW_TYPES: dict[str, pa.DataType] = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "VARCHAR": pa.string(),
    "BLOB": pa.binary(),
}


def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of ``table`` (primary-key markers stripped)."""
    return pa.schema([(c, _ARROW_TYPES[t.split()[0]]) for c, t in TABLES[table]])


def ddl() -> list[str]:
    """CREATE statements for every table and index, idempotent."""
    out = ["CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)"]
    for name, cols in TABLES.items():
        body = ", ".join(f"{c} {t}" for c, t in cols)
        out.append(f"CREATE TABLE IF NOT EXISTS {name} ({body})")
    return out
