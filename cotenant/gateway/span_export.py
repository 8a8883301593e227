"""The gateway's own span exporter: pre-encoded OTLP/HTTP protobuf, sent from a thread.

On the event loop, :meth:`OtlpSpanExporter.emit` samples the request (by a random draw, so a
request's two spans are kept or dropped together), encodes its spans to protobuf bytes
(:mod:`actuators.gateway.otlp_spans`) and appends them to a bounded queue; nothing else. A
sender thread wakes every ``interval_s`` (or when ``max_batch`` requests are queued), joins up
to ``max_batch`` of them into one ``ExportTraceServiceRequest`` and POSTs it to
``{endpoint}/v1/traces`` over a kept-alive connection: a few ``bytes`` joins and a socket write
that releases the GIL, so it never holds the proxy's core for long.

It never slows or breaks the data path: a full queue drops the new request's spans and counts
them (``queue_full``); an export the collector refuses or cannot take after ``retries`` tries
(connection errors, timeouts, 429, 502, 503 and 504; waiting ``backoff_s`` x 2^n between) is
dropped and counted (``export_failed``), and logged once per distinct error. :meth:`shutdown`
sends what is queued (bounded by a timeout).
"""

from __future__ import annotations

import http.client
import logging
import random
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterator
from urllib.parse import urlsplit

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from cotenant.core.errors import UsageError
from cotenant.gateway.finished import FinishedRequest
from cotenant.gateway.otlp_spans import SpanEncoder, export_request, resource_prefix

log = logging.getLogger(__name__)
SPANS_PER_REQUEST = 2


class OtlpSpanExporter:
    """See the module docstring; implements :class:`actuators.gateway.telemetry.SpanSink`.
    ``endpoint`` is the collector's base URL (``/v1/traces`` is added unless already there).
    Call :meth:`start` once, :meth:`shutdown` at the end."""

    def __init__(
        self,
        endpoint: str,
        *,
        service_name: str = "cotenant-gateway",
        sample_ratio: float = 1.0,
        max_queue: int = 65536,
        max_batch: int = 4096,
        interval_s: float = 0.5,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--otlp-endpoint {endpoint!r}: give an http:// or https:// URL")
        try:
            port = parts.port
        except ValueError:
            raise UsageError(f"--otlp-endpoint {endpoint!r}: invalid port") from None
        if not 0 < sample_ratio <= 1:
            raise UsageError(f"sample ratio {sample_ratio!r}: give 0 < R <= 1")
        path = parts.path.rstrip("/")
        self.url = endpoint
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port or (443 if self._https else 80)
        self._path = path if path.endswith("/v1/traces") else path + "/v1/traces"
        self.sample_ratio = sample_ratio
        self.max_queue = max_queue
        self.max_batch = max_batch
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        rng = rng or random.Random()
        self._random = rng.random
        self._encoder = SpanEncoder(rng)
        self._resource, self._scope = resource_prefix(service_name)
        self._queue: deque[bytes] = deque()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._send_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cotenant-span-export", daemon=True)
        self._conn: http.client.HTTPConnection | None = None
        self._last_error = ""
        self.dropped_queue_full = 0
        """Spans dropped because the queue was full (counted on the event loop thread)."""
        self.dropped_failed = 0
        """Spans dropped because their export failed (counted on the sender thread)."""
        self.exported = 0
        """Spans the collector accepted."""

    # -- the event loop's side -------------------------------------------------------------

    def emit(self, req: FinishedRequest) -> None:
        """Queue one request's spans (see the module docstring)."""
        if self.sample_ratio < 1.0 and self._random() >= self.sample_ratio:
            return
        queue = self._queue
        if len(queue) >= self.max_queue:
            self.dropped_queue_full += SPANS_PER_REQUEST
            return
        queue.append(self._encoder.encode(req))
        if len(queue) == self.max_batch:
            self._wake.set()

    @property
    def queued(self) -> int:
        """Requests whose spans wait to be sent."""
        return len(self._queue)

    # -- the sender thread -------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and send what is queued, for up to ``timeout_s`` seconds."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.flush(deadline=time.monotonic() + timeout_s)
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def flush(self, deadline: float | None = None) -> None:
        """Send everything queued now (in batches of ``max_batch``), on the caller's thread."""
        while self._queue and (deadline is None or time.monotonic() < deadline):
            self._send_batch()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            try:
                while len(self._queue) and not self._stopping.is_set():
                    self._send_batch()
                    if len(self._queue) < self.max_batch:
                        break  # the rest waits for the next tick: fewer, larger exports
            except Exception:  # the thread never dies
                log.exception("gateway: span export failed unexpectedly")

    def _send_batch(self) -> None:
        with self._send_lock:
            queue = self._queue
            batch: list[bytes] = []
            for _ in range(self.max_batch):
                try:
                    batch.append(queue.popleft())
                except IndexError:
                    break
            if not batch:
                return
            error = self._post(export_request(self._resource, self._scope, batch))
            spans = SPANS_PER_REQUEST * len(batch)
            if error:
                self.dropped_failed += spans
                if error != self._last_error:
                    log.warning(
                        "gateway: dropped %d spans: export to %s failed: %s (logged once "
                        "until it changes)",
                        spans,
                        self.url,
                        error,
                    )
                self._last_error = error
                return
            self.exported += spans
            if self._last_error:
                log.info("gateway: span export to %s works again", self.url)
                self._last_error = ""

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(
                    self._host,
                    self._port,
                    timeout=self.timeout_s,
                    context=ssl.create_default_context(),
                )
            else:
                self._conn = http.client.HTTPConnection(
                    self._host, self._port, timeout=self.timeout_s
                )
        return self._conn

    def _post(self, body: bytes) -> str:
        """POST ``body``; '' when accepted, else what went wrong (after the retries)."""
        headers = {"Content-Type": "application/x-protobuf"}
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._stopping.wait(min(5.0, self.backoff_s * 2 ** (attempt - 1)))
            conn = self._connection()
            try:
                conn.request("POST", self._path, body, headers)
                response = conn.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._conn = None
                error = f"{type(exc).__name__}: {exc}"
                continue
            if 200 <= response.status < 300:
                return ""
            error = f"HTTP {response.status}: {answer[:200]!r}"
            if response.status not in (429, 502, 503, 504):
                return error
        return error


class SpanExportCollector:
    """Prometheus series of an :class:`OtlpSpanExporter`: ``cotenant_gateway_spans_exported_
    total``, ``cotenant_gateway_spans_dropped_total{reason}`` (``queue_full``,
    ``export_failed``) and ``cotenant_gateway_span_queue`` (requests waiting)."""

    def __init__(self, exporter: OtlpSpanExporter) -> None:
        self._exp = exporter

    def collect(self) -> Iterator[Metric]:
        e = self._exp
        yield CounterMetricFamily(
            "cotenant_gateway_spans_exported", "Spans the collector accepted", value=e.exported
        )
        dropped = CounterMetricFamily(
            "cotenant_gateway_spans_dropped",
            "Spans dropped: the export queue was full, or the export failed",
            labels=["reason"],
        )
        dropped.add_metric(["queue_full"], e.dropped_queue_full)
        dropped.add_metric(["export_failed"], e.dropped_failed)
        yield dropped
        yield GaugeMetricFamily(
            "cotenant_gateway_span_queue",
            "Requests whose spans wait to be exported",
            value=e.queued,
        )
