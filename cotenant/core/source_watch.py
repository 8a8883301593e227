"""``WatchedSource``: a :class:`cotenant.core.readers.MetricSource` that remembers whether its
source answers, for a source that can go away (Prometheus in fleet mode).

Every call is passed through. A :class:`cotenant.core.errors.SourceError` is remembered (the
source is *down* from then on, with the error and the time it began), logged once at the
transition, and raised again; the first call that succeeds after that marks it *up* and logs
the recovery once. :meth:`WatchedSource.status` is what ``/api/v1/status`` and the dashboard
show. Callers that run periodically (the analysis loop) catch ``SourceError`` and skip the
pass quietly: this class has already said what went wrong.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from cotenant.core.errors import SourceError
from cotenant.core.readers import DelegatingSource, MetricSource

log = logging.getLogger(__name__)

T = TypeVar("T")


class WatchedSource(DelegatingSource):
    """Wraps ``source`` (named ``name`` in logs and status; ``url`` shown as is)."""

    def __init__(
        self,
        source: MetricSource,
        *,
        name: str,
        url: str = "",
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        super().__init__(source)
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

    def through(self, read: Callable[[], T]) -> T:
        try:
            out = read()
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
