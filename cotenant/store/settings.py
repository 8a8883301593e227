"""The ``[store]`` configuration keys: the DuckDB file, the writer queue and retention."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.core.config_key import key


@dataclass(frozen=True)
class StoreSettings:
    """``[store]``: read by :class:`store.db.Store`, :class:`store.writer.Writer` and
    :class:`store.maintenance.Maintenance` (wired in ``cotenant serve``)."""

    path: str = key("./.cotenant/cotenant.duckdb", "the embedded DuckDB file")
    queue_max_rows: int = key(
        500_000,
        "rows the writer queue holds before ingest answers 503 + Retry-After (gRPC UNAVAILABLE)",
        min=1,
    )
    queue_max_bytes: int = key(
        64 * 1024 * 1024,
        "Arrow bytes the writer queue holds before ingest answers 503 (bounds its memory)",
        min=1024,
    )
    ack: str = key(
        "durable",
        "when an export is acknowledged: 'durable' once its rows are committed to the store "
        "file (survives kill -9), 'queued' once they are in the writer's memory queue (faster; "
        "rows of the last flush_interval_s are lost if the process is killed)",
        choices=("durable", "queued"),
    )
    spool: bool = key(
        False,
        "under ack = durable, acknowledge once the export's rows are in an fsync'd append-only "
        "log beside the store file (<path>.spool/) instead of once DuckDB committed them: far "
        "less CPU per export; the rows reach the store every flush_interval_s (readers see "
        "them then), a restart loads what the log still holds",
    )
    group_commit_s: float = key(
        0.025,
        "under ack = durable, longest the writer waits for concurrent exports still being "
        "decoded to share one commit (a lone export is committed at once)",
        min=0.0,
        max=1.0,
    )
    ack_timeout_s: float = key(
        10.0,
        "under ack = durable, longest an export waits for its commit before it answers 503 "
        "(its rows may still be written: the exporter's retry can store them twice)",
        min=0.1,
        max=600.0,
    )
    batch_rows: int = key(50_000, "rows the writer appends in one Arrow batch", min=1)
    flush_interval_s: float = key(0.5, "longest time a row waits in the queue", min=0.01)
    memory_limit: str = key(
        "128MB",
        "DuckDB memory_limit: its buffer pool (queries spill to disk past it); 128MB keeps "
        "the service under 300 MB resident with 1M requests stored, see docs/performance.md",
    )
    threads: int = key(1, "DuckDB worker threads", min=1, max=256)
    raw_retention_h: float = key(24.0, "hours raw requests and samples are kept", min=0.01)
    rollup_retention_days: float = key(35.0, "days per-minute rollups are kept", min=0.01)
    incident_retention_days: float = key(
        90.0, "days incidents, actions and audit are kept", min=0.01
    )
    rollup_interval_s: float = key(10.0, "how often per-minute rollups are refreshed", min=0.1)
    retention_interval_s: float = key(300.0, "how often expired rows are deleted", min=1.0)
