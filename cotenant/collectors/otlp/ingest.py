"""The ingest pipeline shared by the OTLP/HTTP and OTLP/gRPC receivers:
normalize -> queue for the store -> (under ``store.ack = "durable"``) wait for the commit ->
count. Thread-safe; concurrent exports share one commit (:mod:`store.writer`, group commit)."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cotenant.collectors.ingest_metrics import IngestMetrics
from cotenant.collectors.otlp.admission import InflightBytes, Reservation
from cotenant.collectors.otlp.normalize import Normalizer, NormalizeResult
from cotenant.core.errors import Overloaded, StoreError, UsageError
from cotenant.store.settings import StoreSettings
from cotenant.store.write_batches import Receipt
from cotenant.store.writer import Writer

ACKS = ("durable", "queued")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportOutcome:
    """What one accepted export produced: rows queued and spans rejected (partial success)."""

    spans: int
    requests: int
    rejected: int
    message: str


class IngestPipeline:
    """``ack``: ``"durable"`` (:meth:`export` returns once the rows are committed to the
    store file) or ``"queued"`` (once they are in the writer's queue); ``ack_timeout_s``: the
    longest a durable export waits for its commit; ``inflight``: the receivers' shared budget
    of bytes in flight (:meth:`admit`; None: unbounded)."""

    def __init__(
        self,
        normalizer: Normalizer,
        writer: Writer,
        metrics: IngestMetrics,
        *,
        ack: str = StoreSettings.ack,
        ack_timeout_s: float = StoreSettings.ack_timeout_s,
        inflight: InflightBytes | None = None,
    ) -> None:
        if ack not in ACKS:
            raise UsageError(f"ack must be one of {', '.join(ACKS)}, got {ack!r}")
        self._normalizer = normalizer
        self._writer = writer
        self._metrics = metrics
        self._durable = ack == "durable"
        self._ack_timeout_s = ack_timeout_s
        self._inflight = inflight
        self._lock = threading.Lock()
        self._expired_seen: Counter[str] = Counter()

    @property
    def normalizer(self) -> Normalizer:
        return self._normalizer

    @property
    def inflight_bytes(self) -> int:
        """Bytes of exports the receivers are working on now (0 when unbounded)."""
        return 0 if self._inflight is None else self._inflight.held

    @contextmanager
    def admit(self, nbytes: int, protocol: str) -> Iterator[Callable[[int], None]]:
        """Hold ``nbytes`` of the in-flight budget while one export is read and ingested;
        raises :class:`Overloaded` (counted as ``overloaded``) at once when they do not fit.
        Yields ``grow(n)``: hold ``n`` bytes more (a body of undeclared length, chunk by
        chunk), raising :class:`Overloaded` when they do not fit."""
        if self._inflight is None:
            yield _no_limit
            return
        metric = self._metrics.exports.labels(protocol, "overloaded")
        try:
            self._inflight.acquire(nbytes)
        except Overloaded:
            metric.inc()
            raise
        reservation = Reservation(self._inflight, nbytes)

        def grow(n: int) -> None:
            try:
                reservation.grow(n)
            except Overloaded:
                metric.inc()
                raise

        try:
            yield grow
        finally:
            self._inflight.release(reservation.nbytes)

    def export(self, request: Any, protocol: str, fmt: str) -> ExportOutcome:
        """Normalize and queue one ``ExportTraceServiceRequest``; under durable ack, wait until
        its rows are committed.

        Raises :class:`Overloaded` (the client should retry) when the writer queue cannot take
        the export (nothing kept), or, under durable ack, when the commit failed (nothing
        kept) or did not happen within ``ack_timeout_s`` (the rows may still be written).
        Once this returns, the requests are acknowledged.
        """
        # producing(): while this export waits for the lock and normalizes, a group commit
        # of the exports before it waits for its rows too
        with self._writer.producing(), self._lock:
            spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            if not self._writer.has_room(spans):
                self._metrics.exports.labels(protocol, "overloaded").inc()
                raise Overloaded(
                    f"writer queue full ({self._writer.queued_rows} of "
                    f"{self._writer.max_rows} rows queued); retry later",
                    self._writer.retry_after_s,
                )
            res = self._normalizer.normalize(request)
            try:
                receipt = self._writer.submit("requests", res.requests, durable=self._durable)
            except Overloaded:
                self._metrics.exports.labels(protocol, "overloaded").inc()
                raise
            self._count_expired()
        if self._durable:  # outside the lock: concurrent exports queue up for one commit
            self._await_commit(receipt, protocol)
        self._count(res, protocol, fmt)
        return ExportOutcome(res.spans, res.requests.num_rows, res.rejected_count, _message(res))

    def flush(self) -> int:
        """Queue the rows of the roots the normalizer still holds (at shutdown, before the
        writer closes); returns how many. Never raises: a full queue is logged."""
        with self._lock:
            res = self._normalizer.flush()
            if res.requests.num_rows:
                try:
                    self._writer.submit("requests", res.requests, durable=False)
                except (Overloaded, StoreError) as exc:
                    log.error(
                        "%d held request rows lost at shutdown: %s", res.requests.num_rows, exc
                    )
                    return 0
            return int(res.requests.num_rows)

    def _await_commit(self, receipt: Receipt, protocol: str) -> None:
        try:
            committed = receipt.wait(self._ack_timeout_s)
        except StoreError as exc:
            self._metrics.exports.labels(protocol, "not_committed").inc()
            raise Overloaded(f"{exc}; retry", self._writer.retry_after_s) from exc
        if not committed:
            self._metrics.exports.labels(protocol, "not_committed").inc()
            raise Overloaded(
                f"rows not committed within {self._ack_timeout_s:g} s (store busy); retry",
                self._writer.retry_after_s,
            )

    def _count_expired(self) -> None:
        for reason, n in self._normalizer.expired.items():
            delta = n - self._expired_seen[reason]
            if delta:
                self._metrics.spans_ignored.labels(reason).inc(delta)
                self._expired_seen[reason] = n

    def _count(self, res: NormalizeResult, protocol: str, fmt: str) -> None:
        m = self._metrics
        m.spans_received.labels(protocol, fmt).inc(res.spans)
        for reason, n in res.rejected.items():
            m.spans_rejected.labels(reason).inc(n)
        for reason, n in res.ignored.items():
            m.spans_ignored.labels(reason).inc(n)
        m.exports.labels(protocol, "partial" if res.rejected else "ok").inc()
        if res.requests.num_rows:
            for source, n in Counter(res.requests.column("source").to_pylist()).items():
                m.requests_ingested.labels(source).inc(n)
            m.durations.observe_requests(res.requests)
            m.tokens.observe_requests(res.requests)

    def count_refused(self, protocol: str, reason: str) -> None:
        """Count a whole export refused before decoding (bad body, too large, …)."""
        self._metrics.exports.labels(protocol, reason).inc()


def _no_limit(_: int) -> None:
    """``grow`` of an unbounded budget."""


def _message(res: NormalizeResult) -> str:
    if not res.rejected:
        return ""
    by = ", ".join(f"{n} {r}" for r, n in sorted(res.rejected.items()))
    return f"rejected {res.rejected_count} spans ({by}); first: {res.first_error}"
