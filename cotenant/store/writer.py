"""The writer thread: a bounded queue of Arrow batches appended to the store.

Producers (the OTLP receivers, the NVML poller) call :meth:`Writer.submit` with an Arrow table;
the queue is bounded by rows and by bytes (Arrow buffers), and a full queue raises
:class:`Overloaded` at once so the receiver can answer 503/UNAVAILABLE with a retry hint
instead of blocking. One thread drains the queue, concatenates batches per table and appends
each with one ``INSERT … SELECT`` over Arrow: one transaction, in DuckDB's write-ahead log
when it returns, so a ``kill -9`` after it loses nothing (the appends: :mod:`store.commits`).
The same thread refreshes rollups and applies retention (:mod:`store.maintenance`).
:meth:`close` drains everything still queued before it returns.

**Group commit.** :meth:`submit` returns a :class:`Receipt`; a producer that must not answer
before its rows are committed (``store.ack = "durable"``) passes ``durable=True`` and waits on
it. The writer then stops waiting for a full batch: while other producers are still at work
(:meth:`producing`: they will submit in a moment) it gathers what they submit, for at most
``group_commit_s``; as soon as none is, it commits everything in one append per table and
settles every receipt of that append at once. A lone exporter is committed at once; concurrent
ones share commits (an append costs DuckDB a few ms of CPU whatever its size). Such a commit
takes only the durable batches: rows nobody waits for (NVML and procfs samples, exports under
``ack = "queued"``) stay queued until the oldest of them has waited ``flush_interval_s``, so a
commit per export does not also cost an append per sample table.

**Spooled acknowledgement.** With a ``spool`` (:mod:`store.spool`; ``store.spool``), a durable
:meth:`submit` appends its batch to the fsync'd log on the caller's thread (under the queue's
lock) and settles the receipt at once: the rows are then queued like samples, and loaded with
everything else every ``flush_interval_s`` (or at :meth:`flush` / :meth:`close`), in one
transaction per load that also records how far the log is loaded. An export thus costs a
``write`` + ``fdatasync`` (~0.2 ms of CPU) instead of a DuckDB commit (~3 ms), and readers of
the store see its rows up to ``flush_interval_s`` later (the agent's drill-down flushes
first). If the log cannot take a batch, it waits for a commit as without a spool; if a load
fails, its spooled batches stay queued (and in the log) for the next.

**Who else writes, and why that is safe.** This thread is the only one that writes the
high-volume tables (``requests``, ``gpu_samples``, ``process_samples``), the rollups and
``meta``, and the only one that expires old rows. It is not the only writer: in ``cotenant
serve`` three record books upsert small rows from their own threads, each statement on that
thread's own :meth:`Store.cursor` (a separate DuckDB connection to the one database, with its
own transactions; a statement outside ``BEGIN … COMMIT`` is a transaction of its own):

* ``incidents`` — the analysis loop's thread, through ``analysis.incidents.IncidentBook``,
  whose lock serialises its read-merge-write (``cotenant serve`` has one book);
* ``actions`` + ``audit`` — the actuators' control-loop thread and the API / dashboard threads
  that approve or roll back, all under the controller's lock; each step rewrites the action
  and appends its audit row in one transaction (:func:`store.action_rows.write_action`);
* ``alerts`` — the webhook's request threads (a delivery is claimed under
  ``alerts.records.AlertBook``'s lock), the request thread that links an alert to its incident
  on a read, and the alert-diagnosis thread that stores the outcome;

and at shutdown, after this thread has stopped, the main thread replaces ``pending_spans``.

DuckDB runs concurrent transactions of one process under MVCC with optimistic concurrency
control: readers see a snapshot and never block or conflict; appends never conflict, even on
one table; writes to different rows or tables do not conflict. Two overlapping transactions
that update or delete the *same* row conflict: the later statement fails with
``duckdb.TransactionException`` ("Conflict on update") and its transaction is rolled back.
Here that can happen only to one ``alerts`` row (a re-delivery, a link and a diagnosis outcome
at the same moment); the loser's work is retried — Alertmanager re-sends a delivery that got an
error, a link is attempted again at the next read — except a lost diagnosis outcome, which is
logged and leaves the alert ``pending`` until the next start diagnoses it again. A failed write
on the other threads is logged by their loop (:class:`store.periodic.Periodic`) and redone at
its next pass, which rewrites the same rows; a failed rollup refresh here re-marks its minutes.

Retention's deletes are safe by construction, not by conflict detection: they remove rows past
their retention age, which no other thread rewrites (the loop rewrites incidents within its
horizon, the controller stamps an action ``updated_ns = now``; the one exception, an alert
still re-delivered after its retention, expires either way and the next delivery stores it
afresh). DuckDB does not flag every overlap of a delete with an upsert of the same row — an
``INSERT OR REPLACE`` racing a ``DELETE`` can be lost without an error — so that
disjointness is what keeps them apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa

from cotenant.core.errors import Overloaded, StoreError
from cotenant.store.commits import Commits, QueuedBatch
from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance
from cotenant.store.schema import APPEND_TABLES, arrow_schema
from cotenant.store.settings import StoreSettings
from cotenant.store.spool import AckLog, Mark
from cotenant.store.write_batches import (
    Receipt,
    WriteObserver,
    conform,
)

log = logging.getLogger(__name__)


class Writer:
    """Owns the appends to ``store``'s high-volume tables, its rollups and retention (the
    record books write their own rows; see the module docstring). Thread-safe
    :meth:`submit`; one background thread."""

    def __init__(
        self,
        store: Store,
        *,
        max_rows: int = StoreSettings.queue_max_rows,
        max_bytes: int = StoreSettings.queue_max_bytes,
        batch_rows: int = StoreSettings.batch_rows,
        flush_interval_s: float = StoreSettings.flush_interval_s,
        group_commit_s: float = StoreSettings.group_commit_s,
        retry_after_s: float = 1.0,
        maintenance: Maintenance | None = None,
        observer: WriteObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
        spool: AckLog | None = None,
    ) -> None:
        """``spool``: acknowledge durable batches once they are in this log, and load them
        into the store with the other appends (module docstring, "Spooled acknowledgement");
        what a previous process spooled but did not load is loaded here, before this returns
        (:class:`StoreError` if that fails)."""
        self._store = store
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._batch_rows = batch_rows
        self._flush_interval_s = flush_interval_s
        self._group_commit_s = group_commit_s
        self._retry_after_s = retry_after_s
        self._maintenance = maintenance
        self._clock = clock
        self._queue: deque[QueuedBatch] = deque()
        self._queued_rows = 0
        self._in_flight = 0
        self._queued_bytes = 0
        self._in_flight_bytes = 0
        self._durable_since: float | None = None  # first waiting submit since the last take
        self._flush_due: float | None = None  # when the oldest queued non-durable row is due
        self._producers = 0  # callers inside producing(): about to submit
        self._cond = threading.Condition()
        self._closing = False
        self._flushers = 0
        self._schemas = {t: arrow_schema(t) for t in APPEND_TABLES}
        self._spool = spool
        self._commits = Commits(store, maintenance=maintenance, observer=observer)
        self._mark: Mark = (0, 0)  # the spool's end when everything queued was last taken
        if spool is not None:
            self._recover(spool)
        self._thread = threading.Thread(target=self._run, name="cotenant-writer", daemon=True)
        self._thread.start()

    @property
    def queued_rows(self) -> int:
        """Rows accepted but not yet written."""
        return self._queued_rows + self._in_flight

    @property
    def queued_bytes(self) -> int:
        """Arrow bytes accepted but not yet written."""
        return self._queued_bytes + self._in_flight_bytes

    @property
    def max_rows(self) -> int:
        return self._max_rows

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @property
    def full(self) -> bool:
        """Whether the queue is at either of its bounds (rows or bytes)."""
        return self.queued_rows >= self._max_rows or self.queued_bytes >= self._max_bytes

    @property
    def retry_after_s(self) -> float:
        """The retry hint given to clients when the queue is full."""
        return self._retry_after_s

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._closing

    def has_room(self, rows: int, nbytes: int = 0) -> bool:
        """Whether ``rows`` more rows (of ``nbytes`` Arrow bytes) fit now. An empty queue takes
        a batch of any size, so one export larger than the whole queue is slow, never refused
        for ever."""
        with self._cond:
            return self._has_room(rows, nbytes)

    def _has_room(self, rows: int, nbytes: int) -> bool:
        queued = self._queued_rows + self._in_flight
        return queued == 0 or (
            queued + rows <= self._max_rows
            and self._queued_bytes + self._in_flight_bytes + nbytes <= self._max_bytes
        )

    def _full_message(self) -> str:
        return (
            f"writer queue full ({self.queued_rows} of {self._max_rows} rows, "
            f"{self.queued_bytes >> 20} of {self._max_bytes >> 20} MiB queued)"
        )

    @contextmanager
    def producing(self) -> Iterator[None]:
        """Wrap the work that ends in a durable :meth:`submit` (waiting for a lock included):
        while any caller is inside, a group commit waits for its rows (up to
        ``group_commit_s``) instead of committing without them."""
        with self._cond:
            self._producers += 1
        try:
            yield
        finally:
            with self._cond:
                self._producers -= 1
                if self._durable_since is not None:
                    self._cond.notify()

    def submit(self, table: str, batch: pa.Table, *, durable: bool = False) -> Receipt:
        """Queue ``batch`` for ``table``; raise :class:`Overloaded` if the queue is full.

        Once this returns, the rows are queued: they are written before :meth:`close` returns,
        and the :class:`Receipt` tells when they are committed. ``durable``: the caller will
        wait on the receipt, so the writer commits within ``group_commit_s`` instead of
        waiting for a full batch. ``batch`` must carry the table's columns (extra ones are an
        error), with values castable to the table's types; otherwise :class:`StoreError` is
        raised here.
        """
        receipt = Receipt()
        if table not in self._schemas:
            raise StoreError(f"table {table} does not take appends")
        n = batch.num_rows
        if n == 0:
            receipt.settle()
            return receipt
        # Conform here, on the caller's thread: a malformed batch found only by the writer
        # would make it drop every acknowledged batch written together with it.
        batch = conform(table, batch, self._schemas[table])
        nbytes = batch.nbytes
        with self._cond:
            if self._closing:
                raise Overloaded("store is shutting down", self._retry_after_s)
            if not self._has_room(n, nbytes):
                raise Overloaded(self._full_message(), self._retry_after_s)
            if durable and self._spooled(table, batch):
                receipt.settle()  # durable now; queued for the next load like samples
                durable = False
            self._queue.append((table, batch, receipt, durable))
            self._queued_rows += n
            self._queued_bytes += nbytes
            if not durable and self._flush_due is None:
                self._flush_due = self._clock() + self._flush_interval_s
            if self._queued_rows >= self._batch_rows:
                self._cond.notify()
            elif durable and self._durable_since is None:
                self._durable_since = self._clock()
                self._cond.notify()
        return receipt

    def _spooled(self, table: str, batch: pa.Table) -> bool:
        """Under the lock: append ``batch`` to the spool, if there is one. On the caller's
        thread and under the lock, so that the log's end (:meth:`_take` reads it as the load's
        mark) never covers a record whose rows are not in the queue yet, and no hop to the
        writer thread is paid per export. False (the batch then waits for a commit, as
        without a spool) when there is no spool or it could not take the batch."""
        if self._spool is None:
            return False
        try:
            self._spool.append([(table, batch)])
        except StoreError as exc:
            log.error("%s; committing to the store instead", exc)
            return False
        return True

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything submitted so far is written; True if it was in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flushers += 1  # the writer stops waiting for a full batch while we wait
            self._cond.notify_all()
            try:
                while self._queued_rows or self._in_flight:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(min(left, 0.05))
            finally:
                self._flushers -= 1
        return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop accepting, write everything queued, run a last rollup refresh, stop."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error(
                "writer did not finish within %.0f s; %d rows unwritten",
                timeout_s,
                self.queued_rows,
            )

    def _take(self) -> tuple[list[QueuedBatch], bool]:
        """Wait for work, then take it off the queue: everything when a batch is full, a
        flush or close is waiting, or the oldest non-durable row has waited
        ``flush_interval_s``; otherwise, once a group commit is due, only the durable batches.
        Non-durable rows (NVML and procfs samples, ``queued`` exports) thus wait for their own
        interval instead of each adding an append (a few ms of DuckDB CPU) to the next durable
        commit. Returns [] when ``flush_interval_s`` passed with nothing to take (the caller
        runs maintenance). The flag: whether this is everything queued (not a group commit).
        """
        with self._cond:
            wake = self._clock() + self._flush_interval_s  # maintenance runs at least this often
            everything = True
            while not self._closing and not self._flushers and self._queued_rows < self._batch_rows:
                now = self._clock()
                if self._flush_due is not None and now >= self._flush_due:
                    break
                deadline = wake if self._flush_due is None else min(wake, self._flush_due)
                if self._durable_since is not None:  # someone waits for this commit
                    if not self._producers:
                        everything = False  # nobody else is about to submit: commit now
                        break
                    deadline = min(deadline, self._durable_since + self._group_commit_s)
                left = deadline - now
                if left <= 0:
                    everything = False
                    break
                self._cond.wait(left)
            if everything:
                items = list(self._queue)
                self._queue.clear()
                rows, nbytes = self._queued_rows, self._queued_bytes
                self._flush_due = None
                if self._spool is not None:  # every spooled record is among the items
                    self._mark = self._spool.end
            else:
                items = [item for item in self._queue if item[3]]
                if len(items) < len(self._queue):
                    self._queue = deque(item for item in self._queue if not item[3])
                else:
                    self._queue.clear()
                rows = sum(item[1].num_rows for item in items)
                nbytes = sum(item[1].nbytes for item in items)
            self._in_flight = rows
            self._in_flight_bytes = nbytes
            self._queued_rows -= rows
            self._queued_bytes -= nbytes
            self._durable_since = None
            return items, everything

    def _run(self) -> None:
        while True:
            items, everything = self._take()
            if items:
                try:
                    if self._spool is None or not everything:
                        self._commits.write(items)
                    else:
                        self._load(items, self._spool, self._mark)
                finally:  # no waiter is left hanging, whatever happened
                    for _, _, receipt, _ in items:
                        if not receipt.settled:
                            receipt.settle("the writer stopped before writing these rows")
            with self._cond:
                self._in_flight = 0
                self._in_flight_bytes = 0
                self._cond.notify_all()
                done = self._closing and not self._queue
            if self._maintenance is not None:
                self._maintenance.tick(final=done)
            if done:
                if self._spool is not None:
                    self._spool.close()
                return

    def _requeue(self, items: list[QueuedBatch]) -> None:
        """Put spooled (acknowledged) batches back in the queue, due at the flush interval."""
        with self._cond:
            for table, batch, receipt, _ in items:
                self._queue.append((table, batch, receipt, False))
                self._queued_rows += batch.num_rows
                self._queued_bytes += batch.nbytes
            if self._flush_due is None:
                self._flush_due = self._clock() + self._flush_interval_s

    def _load(self, items: list[QueuedBatch], spool: AckLog, mark: Mark) -> None:
        """Everything queued, under a spool: the tables holding spooled batches (receipt
        already settled) in one transaction that also records the spool as loaded up to its
        end (so a restart never loads them twice), the others as :meth:`_write` does. If that
        transaction fails, the spooled batches are queued again (they are acknowledged)."""
        spooled_tables = {table for table, _, receipt, _ in items if receipt.settled}
        if not spooled_tables:
            self._commits.write(items)
            return
        self._commits.write([item for item in items if item[0] not in spooled_tables])
        ours = [item for item in items if item[0] in spooled_tables]
        try:
            with self._store.cursor() as cur:
                self._commits.commit_loaded(cur, ours, mark, spool)
        except Exception as exc:  # the data path must not kill the writer thread
            log.exception("loading %d spooled batches failed; kept for the next flush", len(ours))
            waiting = [item for item in ours if not item[2].settled]
            for table in {item[0] for item in waiting}:
                self._commits.failed(table, [(b, r) for t, b, r, _ in waiting if t == table], exc)
            self._requeue([item for item in ours if item[2].committed])
            return
        with self._cond:  # producers append to the spool under it
            spool.loaded(mark)
        for _, _, receipt, _ in ours:
            if not receipt.settled:
                receipt.settle()

    def _recover(self, spool: AckLog) -> None:
        """Load what a previous process spooled (acknowledged) but did not load."""
        with self._store.cursor() as cur:
            batches, mark = spool.recover(cur)
            items: list[QueuedBatch] = []
            for table, batch in batches:
                if table not in self._schemas:
                    raise StoreError(f"the spool holds rows for {table}, which takes no appends")
                items.append((table, conform(table, batch, self._schemas[table]), Receipt(), False))
            if items:
                self._commits.commit_loaded(cur, items, mark, spool)
                log.info(
                    "loaded %d acknowledged rows left in the spool by the last run",
                    sum(b.num_rows for _, b, _, _ in items),
                )
        spool.loaded(mark)
