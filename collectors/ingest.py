"""The ingest pipeline shared by the OTLP/HTTP and OTLP/gRPC receivers:
normalize -> queue for the store -> count. Thread-safe."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from collectors.ingest_metrics import IngestMetrics
from collectors.normalize import Normalizer, NormalizeResult
from store.errors import Overloaded
from store.writer import Writer


@dataclass(frozen=True)
class ExportOutcome:
    """What one accepted export produced: rows queued and spans rejected (partial success)."""

    spans: int
    requests: int
    rejected: int
    message: str


class IngestPipeline:
    def __init__(self, normalizer: Normalizer, writer: Writer, metrics: IngestMetrics) -> None:
        self._normalizer = normalizer
        self._writer = writer
        self._metrics = metrics
        self._lock = threading.Lock()
        self._expired_seen: Counter[str] = Counter()

    @property
    def normalizer(self) -> Normalizer:
        return self._normalizer

    def export(self, request: Any, protocol: str, fmt: str) -> ExportOutcome:
        """Normalize and queue one ``ExportTraceServiceRequest``.

        Raises :class:`Overloaded` (nothing kept, the client should retry) when the writer
        queue cannot take the export. Once this returns, the requests are acknowledged.
        """
        with self._lock:
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
                self._writer.submit("requests", res.requests)
            except Overloaded:
                self._metrics.exports.labels(protocol, "overloaded").inc()
                raise
            self._count_expired()
        self._count(res, protocol, fmt)
        return ExportOutcome(res.spans, res.requests.num_rows, res.rejected_count, _message(res))

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

    def count_refused(self, protocol: str, reason: str) -> None:
        """Count a whole export refused before decoding (bad body, too large, …)."""
        self._metrics.exports.labels(protocol, reason).inc()


def _message(res: NormalizeResult) -> str:
    if not res.rejected:
        return ""
    by = ", ".join(f"{n} {r}" for r, n in sorted(res.rejected.items()))
    return f"rejected {res.rejected_count} spans ({by}); first: {res.first_error}"
