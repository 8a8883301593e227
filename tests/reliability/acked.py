"""What an exporter was told: the real OTLP/HTTP exporter wrapped so that every request whose
export got a 2xx is recorded, and a steady sender that can ``kill -9`` the server the moment
an acknowledgement arrives. Shared by ``test_kill9.py`` and ``bench/kill9.py``."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from spans import SpanFactory

from cotenant.store.db import Store


class AckRecorder(SpanExporter):
    """A :class:`SpanExporter` around ``inner`` that records the span ids (hex) of the request
    roots (spans with ``cotenant.model``) of each batch ``inner`` acknowledged, and calls
    ``on_ack(acked exports so far)`` right after."""

    def __init__(self, inner: SpanExporter, on_ack: Callable[[int], None] | None = None) -> None:
        self._inner = inner
        self._on_ack = on_ack
        self.acked: list[str] = []
        self.exports_acked = 0
        self.exports_failed = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self._inner.export(spans)
        if result is SpanExportResult.SUCCESS:
            self.acked.extend(
                f"{s.context.span_id:016x}"
                for s in spans
                if s.context is not None and s.attributes and "cotenant.model" in s.attributes
            )
            self.exports_acked += 1
            if self._on_ack is not None:
                self._on_ack(self.exports_acked)
        else:
            self.exports_failed += 1
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()


@dataclass
class Life:
    """One run of a server between its start and its kill."""

    acked: list[str] = field(default_factory=list)
    exports_acked: int = 0
    exports_failed: int = 0
    killed: bool = False


def stream_until_kill(
    otlp_http: str,
    pid: int,
    kill_after: int | None,
    *,
    batch: int = 20,
    rate_rps: float = 1000.0,
    max_s: float = 20.0,
    seed: int = 0,
) -> Life:
    """Send batches of ``batch`` requests (a root and two phase children each) through the
    real exporter at about ``rate_rps`` requests/s; right after the ``kill_after``-th
    acknowledged export, ``kill -9`` ``pid`` (from the sending thread, so nothing else is
    sent in between), then send until an export fails (the server is gone). With
    ``kill_after`` None, stop after ``max_s`` seconds. Bounded by ``max_s`` in every case."""
    life = Life()

    def on_ack(n: int) -> None:
        if kill_after is not None and n == kill_after:
            os.kill(pid, signal.SIGKILL)
            life.killed = True

    rec = AckRecorder(OTLPSpanExporter(endpoint=otlp_http, timeout=3), on_ack)
    f = SpanFactory({"service.name": f"kill9-{seed}", "host.name": "h"})
    period = batch / rate_rps
    deadline = time.monotonic() + max_s
    t_next = time.monotonic()
    k = 0
    while time.monotonic() < deadline and not (life.killed and rec.exports_failed):
        t0 = time.time_ns() - 5_000_000_000
        for i in range(batch):
            f.ours(
                "kill9",
                t0 + (k * batch + i) * 1000,
                4.0,
                [("queue", 0.0, 1.0), ("compute", 1.0, 3.5)],
                attrs={"cotenant.gpu": "0"},
            )
        k += 1
        rec.export(f.take())
        t_next += period
        pause = t_next - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # a steady rate, not a wait for the server
    rec.shutdown()
    life.acked = rec.acked
    life.exports_acked = rec.exports_acked
    life.exports_failed = rec.exports_failed
    return life


def stored_span_ids(path: Path) -> set[str]:
    """Span ids of every request in the store file at ``path`` (opened read-only)."""
    with Store(path, read_only=True) as store, store.cursor() as cur:
        return {r[0] for r in cur.execute("SELECT span_id FROM requests").fetchall()}
