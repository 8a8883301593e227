"""A daemon thread that calls one function every ``interval_s`` until stopped, surviving any
exception it raises (logged, and counted by ``on_error``): the one worker of every periodic
job — the continuous analysis loop, the actuators' control loop, the NVML and procfs pollers.

Two schedules: ``fixed_rate=False`` waits ``interval_s`` after each call ends (first call one
interval after start); ``fixed_rate=True`` calls at start and then on a fixed grid of
``interval_s``, skipping the ticks it fell behind on rather than calling in a burst (a poller:
samples evenly spaced)."""

from __future__ import annotations

import logging
import threading
import time
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
        fixed_rate: bool = False,
    ) -> None:
        """``name``: the thread's name; ``what``: how a failed call is named in the log;
        ``fixed_rate``: the schedule (module docstring)."""
        self.name = name
        self._fixed_rate = fixed_rate
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

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        if not self._fixed_rate:
            while not self._stop.wait(self.interval_s):
                self._call()
            return
        next_t = time.monotonic()
        while not self._stop.is_set():
            self._call()
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind: skip the missed ticks rather than call in a burst
                next_t, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def _call(self) -> None:
        try:
            self._fn()
        except Exception:  # the loop must survive any bad pass
            log.exception("%s failed", self._what)
            if self._on_error is not None:
                self._on_error()
