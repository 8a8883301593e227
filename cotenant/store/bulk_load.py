"""Fill a store in one go from Arrow tables, bypassing the writer's queue.

For stores that a simulation or a benchmark builds before anything reads them (an in-memory
store of a simulated run): there is no ingest to protect, so the rows
are inserted at once on the caller's thread. A running service writes through
:class:`store.writer.Writer` instead.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from cotenant.core.errors import UsageError
from cotenant.store.db import Store
from cotenant.store.schema import TABLES


def append_tables(store: Store, tables: Mapping[str, pa.Table]) -> None:
    """Append each table's rows to the store table it is keyed by, in the mapping's order;
    columns are matched by name (a column the table lacks is null). Rows already there are
    kept. Empty tables are skipped. Raises UsageError for a name that is not a store table;
    DuckDB's error (e.g. an unknown column) propagates, rows appended before it stay."""
    unknown = [name for name in tables if name not in TABLES]
    if unknown:
        raise UsageError(f"not store tables: {', '.join(unknown)}")
    with store.cursor() as cur:
        for name, table in tables.items():
            if table.num_rows == 0:
                continue
            cur.register("_cotenant_bulk", table)
            try:
                cur.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _cotenant_bulk")
            finally:
                cur.unregister("_cotenant_bulk")
