"""Alert-triggered diagnosis, run on one background thread.

For an alert about ``model`` (and ``gpu`` when labelled) that started at ``startsAt``, the
diagnosis covers ``[startsAt - lookback_s, min(startsAt + lookahead_s, now))`` through the same
:class:`analysis.analyzer.Analyzer` that ``POST /api/v1/diagnose`` uses, and links the alert to
the incident of that model (and GPU) that overlaps ``startsAt``, or else the nearest one in the
range. A failing diagnosis is stored as ``failed`` with its message; the worker never dies.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from cotenant.alerts.payload import ReceivedAlert
from cotenant.alerts.records import AlertBook
from cotenant.alerts.settings import AlertSettings
from cotenant.analysis.analyzer import Analyzer
from cotenant.core.errors import CotenantError

log = logging.getLogger(__name__)

_STOP = object()


class AlertDiagnoser:
    """Queue of alerts to diagnose and the thread that works it off."""

    def __init__(
        self,
        book: AlertBook,
        analyzer: Analyzer,
        *,
        lookback_s: float = AlertSettings.lookback_s,
        lookahead_s: float = AlertSettings.lookahead_s,
        clock_ns: Callable[[], int] = time.time_ns,
        max_queue: int = 1000,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``registry``: where ``cotenant_alert_diagnoses_total{state}`` (done, failed) is
        counted."""
        self._book = book
        self._analyzer = analyzer
        self._lookback_ns = int(lookback_s * 1e9)
        self._lookahead_ns = int(lookahead_s * 1e9)
        self._clock = clock_ns
        self._queue: queue.Queue[Any] = queue.Queue(max_queue)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._count = (
            None
            if registry is None
            else Counter(
                "cotenant_alert_diagnoses",
                "Alert-triggered diagnoses run, by outcome",
                ["state"],
                registry=registry,
            )
        )

    def submit(self, alert: ReceivedAlert) -> None:
        """Queue ``alert``; when the queue is full it is stored as failed instead."""
        self._ensure_started()
        try:
            self._queue.put_nowait(alert)
        except queue.Full:
            self._book.finish(
                alert.fingerprint,
                "failed",
                {"error": "too many alerts waiting for diagnosis; this one was dropped"},
                None,
            )

    def window(self, alert: ReceivedAlert) -> tuple[int, int]:
        """The diagnosed range in ns: lookback before startsAt, lookahead after (capped at
        now, but at least one second)."""
        start = alert.starts_at_ns - self._lookback_ns
        end = min(alert.starts_at_ns + self._lookahead_ns, self._clock())
        return start, max(end, start + 1_000_000_000)

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Block until every queued alert is diagnosed (for tests and shutdown)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop after the diagnosis in progress; alerts still queued stay ``pending`` (the next
        start resumes them)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        while True:  # make room for the stop marker
            try:
                self._queue.get_nowait()
                self._queue.task_done()
            except queue.Empty:
                break
        self._queue.put(_STOP)
        thread.join(timeout_s)

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="cotenant-alert-diagnosis", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._diagnose(item)
            except Exception:  # the worker must survive anything
                log.exception("alert diagnosis failed")
            finally:
                self._queue.task_done()

    def _diagnose(self, alert: ReceivedAlert) -> None:
        model = alert.model
        if model is None:  # claim() stores these as skipped; never queued
            return
        start, end = self.window(alert)
        incident: str | None = None
        try:
            result = self._analyzer.diagnose(model, start, end)
        except CotenantError as exc:
            state, detail = "failed", {"error": str(exc)}
        except Exception as exc:
            log.exception("diagnosis of alert %s failed", alert.fingerprint)
            state, detail = "failed", {"error": f"internal error: {exc}"}
        else:
            state, detail = "done", summarise(result, alert.gpu)
            incident = find_incident(
                self._analyzer, model, alert.gpu, alert.starts_at_ns, start, end
            )
        self._book.finish(alert.fingerprint, state, detail, incident)
        if self._count is not None:
            self._count.labels(state).inc()


def summarise(result: dict[str, Any], gpu: str | None) -> dict[str, Any]:
    """The analyzer's result kept for the alert: its diagnoses (only ``gpu``'s when the alert
    names a GPU that has any) and the top cause of the worst one."""
    diags: list[dict[str, Any]] = result.get("diagnoses", [])
    if gpu is not None and any(d.get("gpu") == gpu for d in diags):
        diags = [d for d in diags if d.get("gpu") == gpu]
    worst = max(diags, key=lambda d: d.get("peak_p99_ms") or 0.0, default=None)
    top = None
    if worst is not None:
        top = next((c for c in worst.get("causes", []) if c.get("kind") != "unknown"), None)
    return {
        "model": result.get("model"),
        "gpu": gpu,
        "start_ns": result.get("start_ns"),
        "end_ns": result.get("end_ns"),
        "top_cause": top,
        "diagnoses": diags,
    }


def find_incident(
    analyzer: Analyzer, model: str, gpu: str | None, at_ns: int, start_ns: int, end_ns: int
) -> str | None:
    """The id of ``model``'s incident (on ``gpu`` if given) covering ``at_ns``, else the one
    in ``[start_ns, end_ns]`` that starts nearest to it; None when there is none."""
    rows = [
        i
        for i in analyzer.incidents(since_ns=start_ns, model=model, limit=100)
        if i["start_ns"] <= end_ns and (gpu is None or i.get("gpu") == gpu)
    ]
    if not rows:
        return None
    covering = [i for i in rows if i["start_ns"] <= at_ns <= i["end_ns"]]
    best = min(covering or rows, key=lambda i: abs(i["start_ns"] - at_ns))
    return str(best["id"])
