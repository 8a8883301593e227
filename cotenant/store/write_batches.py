"""What :class:`store.writer.Writer` hands back and how it appends: a batch's
:class:`Receipt`, the :class:`WriteObserver` it reports to, and the three steps of an append —
:func:`conform` a batch to its table's schema, :func:`append_batch` it in one statement,
:func:`touched_minutes` for the rollups to refresh."""

from __future__ import annotations

import threading
from typing import Protocol

import duckdb
import numpy as np
import pyarrow as pa

from cotenant.core.errors import StoreError

MINUTE_NS = 60_000_000_000


class WriteObserver(Protocol):
    """What the writer reports, for /metrics."""

    def rows_written(self, table: str, rows: int, seconds: float) -> None: ...

    def write_failed(self, table: str, rows: int) -> None: ...


class Receipt:
    """What became of one submitted batch: :meth:`wait` for its commit."""

    __slots__ = ("_done", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: str | None = None

    def settle(self, error: str | None = None) -> None:
        """Called by the writer: committed (``error`` None), or the append failed."""
        self._error = error
        self._done.set()

    @property
    def settled(self) -> bool:
        """Whether the append is over (committed or failed)."""
        return self._done.is_set()

    @property
    def committed(self) -> bool:
        return self._done.is_set() and self._error is None

    def wait(self, timeout_s: float) -> bool:
        """True once the rows are committed; False if that did not happen within
        ``timeout_s`` (they may still be). Raises :class:`StoreError` (with the append's error)
        when the append failed: the rows are not stored."""
        if not self._done.wait(timeout_s):
            return False
        if self._error is not None:
            raise StoreError(self._error)
        return True


def append_batch(cur: duckdb.DuckDBPyConnection, table: str, data: pa.Table) -> None:
    """Append ``data`` (conformed to ``table``'s schema) in one statement.

    DuckDB finds ``_cotenant_batch`` among this frame's locals (a replacement scan) instead of
    through ``register``/``unregister``, which cost about 1 ms of CPU per append, a third of
    a small append (bench/agent_metrics.py, ``--part overhead``).
    """
    _cotenant_batch = data  # read by DuckDB's replacement scan
    cur.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _cotenant_batch")


def conform(table: str, batch: pa.Table, schema: pa.Schema) -> pa.Table:
    """``batch`` with exactly ``schema``'s columns and types, or :class:`StoreError`."""
    if batch.schema.equals(schema):
        return batch
    missing = [c for c in schema.names if c not in batch.column_names]
    extra = [c for c in batch.column_names if c not in schema.names]
    if missing or extra:
        raise StoreError(
            f"batch for {table} does not match its schema (missing columns: "
            f"{', '.join(missing) or 'none'}; unknown columns: {', '.join(extra) or 'none'})"
        )
    try:
        return batch.select(schema.names).cast(schema)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise StoreError(f"batch for {table} has values of the wrong type: {exc}") from exc


def touched_minutes(table: str, data: pa.Table) -> np.ndarray:
    """Distinct minute starts (ns) touched by ``data``, for rollup refresh."""
    col = {"requests": "ts_end_ns"}.get(table, "ts_ns")
    if col not in data.column_names:
        return np.empty(0, dtype=np.int64)
    column = data.column(col)
    # nulls would turn the column into float64 (NaN, and ns rounded to the wrong minute)
    ts = (column.drop_null() if column.null_count else column).to_numpy(zero_copy_only=False)
    if ts.size == 0:
        return np.empty(0, dtype=np.int64)
    lo, hi = int(ts.min()) // MINUTE_NS, int(ts.max()) // MINUTE_NS
    if lo == hi:  # the usual batch (a fraction of a second of rows): no sort
        return np.array([lo * MINUTE_NS], dtype=np.int64)
    return np.unique(ts // MINUTE_NS) * MINUTE_NS
