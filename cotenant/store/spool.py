"""A write-ahead spool for durable acknowledgements: Arrow batches in an fsync'd append-only log.

Under ``store.ack = "durable"`` with ``store.spool`` on, the writer acknowledges an export
once its rows are in this log (one ``write`` + ``fdatasync``, ~0.5 ms of CPU with the Arrow
serialisation) instead of once DuckDB has committed them (an append and commit of the 31-column
``requests`` table: ~3 ms of CPU per export, bench/agent_metrics.py). The writer loads the
spooled rows into DuckDB with its other appends every ``flush_interval_s`` and, in the same
DuckDB transaction, records how far the log is loaded (:meth:`Spool.mark_loaded`; the
``meta`` row ``spool_loaded``). So:

* a crash before that commit leaves the rows in the log, and the next start loads them
  (:meth:`Spool.recover`);
* a crash after it but before the loaded log file is deleted cannot load them twice: the
  mark says the file is loaded up to its end;
* a record cut short by the crash (never acknowledged: acknowledgement follows the
  ``fdatasync``) fails its length or CRC check and is dropped with everything after it.

Layout: a directory ``<store file>.spool/`` of files ``<generation>.log`` (generation: 16
decimal digits, increasing). Each file is a sequence of records ``length (u32 LE) | crc32
(u32 LE) | payload``, payload = ``len(table) (u16 LE) | table (UTF-8) | Arrow IPC stream``.
After each load the current file is deleted and the next record starts a new generation,
so the log holds at most one ``flush_interval_s`` of rows (plus what a failing store has not
taken). The mark is ``"<generation>:<offset>"``: every record of an older generation, and
those of this one before ``offset`` (bytes), are in the store.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import duckdb
import pyarrow as pa

from cotenant.core.errors import StoreError

log = logging.getLogger(__name__)

MARK_KEY = "spool_loaded"
_HEADER = struct.Struct("<II")  # payload length, crc32 of the payload
_NAME = struct.Struct("<H")

Mark = tuple[int, int]
"""(generation, byte offset): everything before it is in the store."""


class AckLog(Protocol):
    """Where the writer makes batches durable before DuckDB has them (the spool here; a
    replicated log would be another). The writer serialises the calls: :meth:`append`,
    :attr:`end` and :meth:`loaded` under its queue lock (``append`` on the producer's thread),
    :meth:`recover` before its thread starts, :meth:`mark_loaded` and :meth:`close` on its
    thread (``mark_loaded`` only writes SQL on the given cursor)."""

    def append(self, batches: Sequence[tuple[str, pa.Table]]) -> None:
        """Make ``(table, rows)`` batches durable; on return they survive ``kill -9`` and
        power loss. Raises :class:`StoreError` (nothing acknowledged) when they could not be."""
        ...

    @property
    def end(self) -> Mark:
        """The position after the last appended record."""
        ...

    def mark_loaded(self, cur: duckdb.DuckDBPyConnection, mark: Mark) -> None:
        """Record, inside the caller's open transaction on ``cur``, that everything before
        ``mark`` is in the store."""
        ...

    def loaded(self, mark: Mark) -> None:
        """After the transaction that recorded ``mark`` committed: drop what it covers."""
        ...

    def close(self) -> None:
        """Release the open file (the writer has stopped)."""
        ...

    def recover(self, cur: duckdb.DuckDBPyConnection) -> tuple[list[tuple[str, pa.Table]], Mark]:
        """At start, outside a transaction, before any :meth:`mark_loaded`: the batches past
        the stored mark (to be loaded, then :meth:`mark_loaded` with the returned mark), and
        that mark."""
        ...


class Spool:
    """The :class:`AckLog` in ``directory`` (created if missing). Not thread-safe by itself:
    its one user, :class:`store.writer.Writer`, serialises the calls (see :class:`AckLog`)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None
        self._generation = max(self._generations(), default=0)
        self._offset = 0  # of the current generation's file (0: not created yet)

    @property
    def end(self) -> Mark:
        return (self._generation, self._offset)

    def append(self, batches: Sequence[tuple[str, pa.Table]]) -> None:
        chunks: list[bytes] = []
        for table, rows in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, rows.schema) as w:
                w.write_table(rows)
            name = table.encode()
            payload = b"".join((_NAME.pack(len(name)), name, sink.getvalue().to_pybytes()))
            chunks += (_HEADER.pack(len(payload), zlib.crc32(payload)), payload)
        data = b"".join(chunks)
        try:
            if self._fd is None:
                self._open_next()
            assert self._fd is not None
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write: {written} of {len(data)} bytes")
            os.fdatasync(self._fd)
        except OSError as exc:
            # the file may now end in a partial record: start the next group on a new one.
            # (If only the fdatasync failed, the record may be whole: the writer commits these
            # rows to DuckDB instead, and a crash before the next load deletes this file would
            # load them twice; at-least-once, as an export retried after a 503.)
            self._close()
            raise StoreError(f"could not spool {len(data)} bytes: {exc}") from exc
        self._offset += len(data)

    def mark_loaded(self, cur: duckdb.DuckDBPyConnection, mark: Mark) -> None:
        cur.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [MARK_KEY, f"{mark[0]}:{mark[1]}"])

    def loaded(self, mark: Mark) -> None:
        gen, offset = mark
        if gen == self._generation and offset == self._offset:
            self._close()  # all of it is in the store: the next record starts a new file
        for g in self._generations():
            if g < gen or (g == gen and self._fd is None):
                self._path(g).unlink(missing_ok=True)

    def recover(self, cur: duckdb.DuckDBPyConnection) -> tuple[list[tuple[str, pa.Table]], Mark]:
        row = cur.execute("SELECT value FROM meta WHERE key = ?", [MARK_KEY]).fetchone()
        if row is None:
            cur.execute("INSERT INTO meta VALUES (?, '0:0')", [MARK_KEY])
        mark_gen, mark_off = _parse_mark(None if row is None else str(row[0]))
        batches: list[tuple[str, pa.Table]] = []
        end = (mark_gen, mark_off)
        for gen in sorted(self._generations()):
            if gen < mark_gen:
                continue  # loaded; deleted by loaded() below
            start = mark_off if gen == mark_gen else 0
            data = self._path(gen).read_bytes()
            got, stop = _records(data, start, self._path(gen))
            batches += got
            end = (gen, stop)
        self._close()
        self._generation = max(end[0], self._generation)
        self._offset = end[1] if end[0] == self._generation else 0
        return batches, end

    def close(self) -> None:
        self._close()

    def _open_next(self) -> None:
        self._generation += 1
        self._offset = 0
        path = self._path(self._generation)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        # the new name must survive a power loss too, not only its contents
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _path(self, generation: int) -> Path:
        return self.directory / f"{generation:016d}.log"

    def _generations(self) -> list[int]:
        out = []
        for p in self.directory.glob("*.log"):
            if p.stem.isdigit():
                out.append(int(p.stem))
        return out


def _parse_mark(value: str | None) -> Mark:
    if not value:
        return (0, 0)
    gen, _, off = value.partition(":")
    try:
        return (int(gen), int(off))
    except ValueError:
        raise StoreError(f"meta {MARK_KEY} = {value!r} is not '<generation>:<offset>'") from None


def _records(data: bytes, start: int, path: Path) -> tuple[list[tuple[str, pa.Table]], int]:
    """The whole records of ``data`` from byte ``start``, and where they end. A record cut
    short or failing its CRC ends the log: it was being written when the process died, so it
    was never acknowledged."""
    out = []
    pos = start
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        body = data[pos + _HEADER.size : pos + _HEADER.size + length]
        if len(body) < length or zlib.crc32(body) != crc:
            log.warning("%s: dropping an unacknowledged partial record at byte %d", path, pos)
            break
        (n,) = _NAME.unpack_from(body, 0)
        table = body[_NAME.size : _NAME.size + n].decode()
        with pa.ipc.open_stream(body[_NAME.size + n :]) as r:
            out.append((table, r.read_all()))
        pos += _HEADER.size + length
    return out, pos
