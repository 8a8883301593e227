"""How many bytes of export bodies the OTLP receivers hold at once.

Every export costs memory from the moment its body is read until it is answered: the body,
its decoded protobuf, the normalized rows (together a few times the body). The writer queue
bounds what is *accepted*; :class:`InflightBytes` bounds what is *being worked on*, so a flood
of large exports is answered 503 + ``Retry-After`` (UNAVAILABLE + ``RetryInfo`` on gRPC)
before it is read, instead of growing the process. Both receivers share one budget
(``otlp.max_inflight_bytes``).

An export larger than the whole budget is admitted when nothing else is in flight (slow,
never refused for ever), as the writer queue does. An export of undeclared length (chunked)
takes its share chunk by chunk (:meth:`Reservation.grow`), and is refused as soon as its
next chunk does not fit.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cotenant.core.errors import Overloaded


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

    def acquire(self, nbytes: int, mine: int = 0) -> None:
        """Reserve ``nbytes``, or raise :class:`Overloaded` at once (nothing reserved) when
        they do not fit; :meth:`release` them when the export is answered. ``mine``: bytes
        the same export already holds (an export alone is never refused)."""
        with self._lock:
            if self._held > mine and self._held + nbytes > self._max:
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
    def hold(self, nbytes: int) -> Iterator[Reservation]:
        """:meth:`acquire` ``nbytes`` for the ``with`` block; the :class:`Reservation` can
        grow inside it, and all of it is released at the end."""
        self.acquire(nbytes)
        r = Reservation(self, nbytes)
        try:
            yield r
        finally:
            self.release(r.nbytes)


class Reservation:
    """The bytes one export holds of an :class:`InflightBytes`."""

    def __init__(self, budget: InflightBytes, nbytes: int) -> None:
        self._budget = budget
        self.nbytes = nbytes

    def grow(self, nbytes: int) -> None:
        """Hold ``nbytes`` more, or raise :class:`Overloaded` (the export should be refused)."""
        self._budget.acquire(nbytes, mine=self.nbytes)
        self.nbytes += nbytes
