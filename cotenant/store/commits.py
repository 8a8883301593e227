"""How the writer thread commits the batches it took off its queue (:mod:`store.writer`).

Two ways, both one transaction per call: :meth:`Commits.write` appends each table's batches in
one statement (one transaction per table) and settles their receipts; a table that fails is
logged and reported, and its receipts settled with the error, without touching the others.
:meth:`Commits.commit_loaded` appends batches a spool already acknowledged together with the
spool's loaded mark, so a restart never loads them twice; it raises, and rolls back, when that
fails (the writer then keeps the batches for the next load). Either way the rows written are
reported to the :class:`WriteObserver` and their minutes marked for the rollups to refresh.
Called from the writer's thread only; the data path never raises out of :meth:`write`.
"""

from __future__ import annotations

import logging
import time

import duckdb
import pyarrow as pa

from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance
from cotenant.store.spool import AckLog, Mark
from cotenant.store.write_batches import Receipt, WriteObserver, append_batch, touched_minutes

log = logging.getLogger(__name__)

QueuedBatch = tuple[str, pa.Table, Receipt, bool]
"""One submitted batch as queued: table, rows, receipt, durable (its producer waits)."""


class Commits:
    """Appends to ``store`` for the writer; reports to ``observer`` and ``maintenance``."""

    def __init__(
        self,
        store: Store,
        *,
        maintenance: Maintenance | None = None,
        observer: WriteObserver | None = None,
    ) -> None:
        self._store = store
        self._maintenance = maintenance
        self._observer = observer

    def write(self, items: list[QueuedBatch]) -> None:
        """Append ``items``: one statement (one transaction) per table, receipts settled
        (with the error where a table's append failed). Never raises."""
        by_table: dict[str, list[tuple[pa.Table, Receipt]]] = {}
        for table, batch, receipt, _ in items:
            by_table.setdefault(table, []).append((batch, receipt))
        try:
            cur = self._store.cursor()
        except Exception as exc:  # the data path must not kill the writer thread
            for table, entries in by_table.items():
                self.failed(table, entries, exc)
            return
        with cur:
            for table, entries in by_table.items():
                self._write_table(cur, table, entries)

    def _write_table(
        self, cur: duckdb.DuckDBPyConnection, table: str, entries: list[tuple[pa.Table, Receipt]]
    ) -> None:
        """One append (one transaction) of every batch queued for ``table``."""
        rows = sum(b.num_rows for b, _ in entries)
        t0 = time.perf_counter()
        try:
            combined = pa.concat_tables([b for b, _ in entries])
            append_batch(cur, table, combined)
        except Exception as exc:  # the data path must not kill the writer thread
            self.failed(table, entries, exc)
            return
        for _, receipt in entries:
            receipt.settle()
        if self._observer is not None:
            self._observer.rows_written(table, rows, time.perf_counter() - t0)
        if self._maintenance is not None:
            self._maintenance.mark_dirty(table, touched_minutes(table, combined))

    def failed(self, table: str, entries: list[tuple[pa.Table, Receipt]], exc: Exception) -> None:
        """Log and report a failed append of ``entries`` to ``table``; settle their receipts
        with the error (the rows are not stored)."""
        rows = sum(b.num_rows for b, _ in entries)
        log.exception("writing %d rows to %s failed: %s", rows, table, exc)
        if self._observer is not None:
            self._observer.write_failed(table, rows)
        for _, receipt in entries:
            receipt.settle(f"writing {rows} rows to {table} failed: {exc}")

    def commit_loaded(
        self, cur: duckdb.DuckDBPyConnection, items: list[QueuedBatch], mark: Mark, spool: AckLog
    ) -> None:
        """Append ``items`` (one statement per table) and ``mark`` in one transaction on
        ``cur``; receipts are left to the caller. Raises what DuckDB raises, rolled back."""
        by_table: dict[str, list[pa.Table]] = {}
        for table, batch, _, _ in items:
            by_table.setdefault(table, []).append(batch)
        t0 = time.perf_counter()
        cur.execute("BEGIN TRANSACTION")
        try:
            # one chunk: DuckDB scans 25 chunks of 40 rows ~2 ms slower than one of 1,000
            combined = {t: pa.concat_tables(bs).combine_chunks() for t, bs in by_table.items()}
            for table, data in combined.items():
                append_batch(cur, table, data)
            spool.mark_loaded(cur, mark)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        seconds = time.perf_counter() - t0
        for table, data in combined.items():
            if self._observer is not None:
                self._observer.rows_written(table, data.num_rows, seconds)
            if self._maintenance is not None:
                self._maintenance.mark_dirty(table, touched_minutes(table, data))
