"""A daemon thread that calls one function every ``interval_s`` until stopped, surviving any
exception it raises (logged, and counted by ``on_error``). The continuous analysis loop and the
actuators' control loop run on it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    def __init__(
        self,
        name: str,
        interval_s: float,
        fn: Callable[[], object],
        *,
        what: str,
        on_error: Callable[[], None] | None = None,
    ) -> None:
        """``name``: the thread's name; ``what``: how a failed call is named in the log."""
        self.name = name
        self.interval_s = interval_s
        self._fn = fn
        self._what = what
        self._on_error = on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop and wait for a call in progress to end (up to ``timeout_s``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._fn()
            except Exception:  # the loop must survive any bad pass
                log.exception("%s failed", self._what)
                if self._on_error is not None:
                    self._on_error()
