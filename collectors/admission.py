"""How many bytes of export bodies the OTLP receivers hold at once.

Every export costs memory from the moment its body is read until it is answered: the body,
its decoded protobuf, the normalized rows (together a few times the body). The writer queue
bounds what is *accepted*; :class:`InflightBytes` bounds what is *being worked on*, so a flood
of large exports is answered 503 + ``Retry-After`` (UNAVAILABLE + ``RetryInfo`` on gRPC)
before it is read, instead of growing the process. Both receivers share one budget
(``otlp.max_inflight_bytes``).

An export larger than the whole budget is admitted when nothing else is in flight (slow,
never refused for ever), as the writer queue does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from store.errors import Overloaded


class InflightBytes:
    """A byte budget; :meth:`hold` it around the work on one export. Thread-safe."""

    def __init__(self, max_bytes: int, retry_after_s: float) -> None:
        self._max = max_bytes
        self._retry_after_s = retry_after_s
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes of exports in flight now."""
        return self._held

    @property
    def max_bytes(self) -> int:
        return self._max

    def acquire(self, nbytes: int) -> None:
        """Reserve ``nbytes``, or raise :class:`Overloaded` at once (nothing reserved) when
        they do not fit; :meth:`release` them when the export is answered."""
        with self._lock:
            if self._held and self._held + nbytes > self._max:
                raise Overloaded(
                    f"receivers hold {self._held >> 20} MiB of exports (limit "
                    f"{self._max >> 20} MiB); retry later",
                    self._retry_after_s,
                )
            self._held += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._held -= nbytes

    @contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """:meth:`acquire` ``nbytes`` for the ``with`` block."""
        self.acquire(nbytes)
        try:
            yield
        finally:
            self.release(nbytes)
