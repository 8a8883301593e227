"""``WatchedSource``: a :class:`store.source.MetricSource` that remembers whether its source
answers, for a source that can go away (Prometheus in fleet mode).

Every call is passed through. A :class:`store.errors.SourceError` is remembered (the source is
*down* from then on, with the error and the time it began), logged once at the transition, and
raised again; the first call that succeeds after that marks it *up* and logs the recovery once.
:meth:`WatchedSource.status` is what ``/api/v1/status`` and the dashboard show. Callers that
run periodically (the analysis loop) catch ``SourceError`` and skip the pass quietly: this
class has already said what went wrong.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from store.errors import SourceError
from store.queries import TimeRange
from store.source import MetricSource

log = logging.getLogger(__name__)

T = TypeVar("T")


class WatchedSource:
    """Wraps ``source`` (named ``name`` in logs and status; ``url`` shown as is)."""

    def __init__(
        self,
        source: MetricSource,
        *,
        name: str,
        url: str = "",
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.source = source
        self.name = name
        self.url = url
        self._clock = clock_ns
        self._lock = threading.Lock()
        self._down_since: int | None = None
        self._error = ""
        self._last_ok: int | None = None

    @property
    def up(self) -> bool:
        with self._lock:
            return self._down_since is None

    def status(self) -> dict[str, Any]:
        """``{name, url, up, error, down_since_ns, last_ok_ns}``."""
        with self._lock:
            return {
                "name": self.name,
                "url": self.url,
                "up": self._down_since is None,
                "error": self._error or None,
                "down_since_ns": self._down_since,
                "last_ok_ns": self._last_ok,
            }

    def _call(self, fn: Callable[[], T]) -> T:
        try:
            out = fn()
        except SourceError as exc:
            with self._lock:
                first = self._down_since is None
                if first:
                    self._down_since = self._clock()
                self._error = str(exc)
            if first:
                log.error("%s is down: %s (retrying at each pass)", self.name, exc)
            raise
        with self._lock:
            was_down = self._down_since is not None
            self._down_since = None
            self._error = ""
            self._last_ok = self._clock()
        if was_down:
            log.warning("%s answers again: analysis resumes", self.name)
        return out

    # -- MetricSource ------------------------------------------------------------------------

    @property
    def has_spans(self) -> bool:
        return self._call(lambda: self.source.has_spans)

    def request_windows(
        self, rng: TimeRange, step_s: float, model: str | None = None, gpu: str | None = None
    ) -> pa.Table:
        return self._call(lambda: self.source.request_windows(rng, step_s, model, gpu))

    def model_gpus(self, rng: TimeRange) -> list[tuple[str, str]]:
        return self._call(lambda: self.source.model_gpus(rng))

    def gpu_windows(self, rng: TimeRange, step_s: float, gpu: str | None = None) -> pa.Table:
        return self._call(lambda: self.source.gpu_windows(rng, step_s, gpu))

    def process_windows(
        self,
        rng: TimeRange,
        step_s: float,
        gpu: str | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pa.Table:
        return self._call(lambda: self.source.process_windows(rng, step_s, gpu, hosts))

    def serving_windows(self, rng: TimeRange, step_s: float, model: str | None = None) -> pa.Table:
        return self._call(lambda: self.source.serving_windows(rng, step_s, model))

    def lock_waits(self, rng: TimeRange, model: str) -> pa.Table:
        return self._call(lambda: self.source.lock_waits(rng, model))

    def replicas(self, rng: TimeRange) -> dict[tuple[str, str], str]:
        return self._call(lambda: self.source.replicas(rng))

    def token_windows(
        self, rng: TimeRange, step_s: float, gpu: str | None = None, *, lengths: bool = False
    ) -> pa.Table:
        return self._call(lambda: self.source.token_windows(rng, step_s, gpu, lengths=lengths))
