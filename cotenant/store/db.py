"""The embedded DuckDB store: opening, schema version, cursors for readers."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import duckdb

from cotenant.core.errors import SchemaVersionError, StoreError
from cotenant.store.schema import SCHEMA_VERSION, ddl
from cotenant.store.settings import StoreSettings

log = logging.getLogger(__name__)


_ADDITIVE_UPGRADES = frozenset({"2", "3", "4", "5", "6", "7", "8"})
"""Older schema versions this one only adds tables and columns to (2 -> 3: ``alerts``; 3 -> 4:
``incidents.severity``; 4 -> 5: ``requests.replica``, ``incidents.replica``; 5 -> 6:
``incidents.indicator``, ``request_rollup_1m.ttft_p99_ms`` and ``tpot_p99_ms``; 6 -> 7:
``model_loads`` and ``load_rollup_1m``; 7 -> 8: ``contention``; 8 -> 9:
``process_samples.cpu_freq_mhz`` and ``cpu_max_freq_mhz``); opened for writing, such a file is
upgraded in place."""

_ADDED_COLUMNS = (
    ("incidents", "severity", "VARCHAR"),
    ("requests", "replica", "VARCHAR"),
    ("incidents", "replica", "VARCHAR"),
    ("incidents", "indicator", "VARCHAR"),
    ("request_rollup_1m", "ttft_p99_ms", "DOUBLE"),
    ("request_rollup_1m", "tpot_p99_ms", "DOUBLE"),
    ("process_samples", "cpu_freq_mhz", "DOUBLE"),
    ("process_samples", "cpu_max_freq_mhz", "DOUBLE"),
)
"""Columns added since schema 3, created on an older file (new files get them from the DDL)."""


class Store:
    """One DuckDB database file (or ``":memory:"``) with cotenant's tables.

    A DuckDB file has one writer process: opening a file another process holds raises
    :class:`StoreError` saying so. Within the process, each thread takes its own
    :meth:`cursor`; the writer thread owns appends (see :mod:`store.writer`).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        memory_limit: str = StoreSettings.memory_limit,
        threads: int = StoreSettings.threads,
        read_only: bool = False,
    ) -> None:
        self.path = str(path)
        self.read_only = read_only
        if self.path != ":memory:" and not read_only:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._con = duckdb.connect(
                self.path,
                read_only=read_only,
                config={"memory_limit": memory_limit, "threads": threads},
            )
        except duckdb.IOException as exc:
            msg = str(exc)
            if "lock" in msg.lower():
                raise StoreError(
                    f"store {self.path} is in use by another process (is 'cotenant serve' "
                    f"running? then query it with --url instead): {msg}"
                ) from exc
            raise StoreError(f"cannot open store {self.path}: {msg}") from exc
        except duckdb.Error as exc:
            raise StoreError(f"cannot open store {self.path}: {exc}") from exc
        self._lock = threading.Lock()
        self._closed = False
        try:
            if not read_only:
                self._init_schema()
            else:
                self._check_version()
        except BaseException as exc:
            # release the file (and its lock) at once, not whenever the object is collected
            self._con.close()
            if isinstance(exc, duckdb.Error):
                raise StoreError(f"cannot use store {self.path}: {exc}") from exc
            raise

    def _init_schema(self) -> None:
        con = self._con
        stmts = ddl()
        con.execute(stmts[0])  # meta only: a file of another version must not be altered
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        elif str(row[0]) in _ADDITIVE_UPGRADES:
            # versions that differ from this one only by new tables: create them below
            con.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)]
            )
        elif str(row[0]) != str(SCHEMA_VERSION):
            raise SchemaVersionError(
                f"store {self.path} has schema version {row[0]}, this cotenant uses "
                f"{SCHEMA_VERSION}: point --store at a new file or use a matching release"
            )
        for stmt in stmts[1:]:
            con.execute(stmt)
        for table, column, kind in _ADDED_COLUMNS:
            con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")

    def _check_version(self) -> None:
        try:
            row = self._con.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'"
            ).fetchone()
        except duckdb.CatalogException as exc:
            raise StoreError(f"{self.path} is not a cotenant store (no meta table)") from exc
        if row is None or str(row[0]) != str(SCHEMA_VERSION):
            got = None if row is None else row[0]
            raise SchemaVersionError(
                f"store {self.path} has schema version {got}, expected {SCHEMA_VERSION}"
            )

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection for the calling thread; close it when done (or use ``with``)."""
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self.path} is closed")
            return self._con.cursor()

    def get_meta(self, key: str) -> str | None:
        with self.cursor() as cur:
            row = cur.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self.cursor() as cur:
            cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self.read_only:
            try:
                self._con.execute("CHECKPOINT")
            except duckdb.Error as exc:  # closing must not fail the shutdown
                log.warning("checkpoint at close failed: %s", exc)
        self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
