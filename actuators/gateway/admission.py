"""Admission control: per-model and per-tenant token buckets, then a priority queue under the
upstream's concurrency limit.

A request is admitted in two steps:

1. **rate**: the model's and the tenant's buckets (where a limit is set) must both have a
   token. When one must wait ``w`` seconds and ``w`` is within ``rate_wait_s`` (the bounded
   wait), both tokens are reserved and the request sleeps ``w``; otherwise it is rejected with
   429 and ``Retry-After`` = ``ceil(w)``.
2. **concurrency**: at most ``max_concurrency`` requests are in flight to the upstream; the
   others wait in a queue ordered by priority (lower first, as in vLLM), then arrival. A full
   queue (``max_queue``) or a wait longer than ``queue_timeout_s`` answers 503 with
   ``Retry-After``.

The effective priority of a request is its model's, else its tenant's, else the default.
Counters are kept per model and per tenant name; to bound memory under arbitrary client input
at most ``max_tracked`` names of each kind are tracked, the rest count under ``(other)``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from typing import Any, Literal

from actuators.gateway.token_bucket import TokenBucket

Kind = Literal["models", "tenants"]
OTHER = "(other)"


class Rejected(Exception):
    """A request is refused: ``status`` (429 or 503), ``reason`` (a metric label), and the
    ``retry_after_s`` the client is told."""

    def __init__(self, status: int, reason: str, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` in whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


class Entry:
    """The limit, priority and counters of one model or tenant."""

    __slots__ = ("admitted", "bucket", "in_flight", "name", "priority", "queued", "rejected")

    def __init__(self, name: str) -> None:
        self.name = name
        self.bucket: TokenBucket | None = None
        self.priority: int | None = None
        self.in_flight = 0
        self.queued = 0
        self.admitted = 0
        self.rejected = 0

    def state(self) -> dict[str, Any]:
        """This entry as the control API's state (contract 3)."""
        b = self.bucket
        return {
            "rate_rps": None if b is None else b.rate_rps,
            "burst": None if b is None else b.burst,
            "priority": self.priority,
            "in_flight": self.in_flight,
            "queued": self.queued,
            "admitted_total": self.admitted,
            "rejected_total": self.rejected,
        }


class Ticket:
    """An admitted request: release it with :meth:`Admission.release` when it is done."""

    __slots__ = ("explicit_priority", "model", "priority", "tenant")

    def __init__(self, model: Entry, tenant: Entry, priority: int, explicit: bool) -> None:
        self.model = model
        self.tenant = tenant
        self.priority = priority
        self.explicit_priority = explicit
        """True when the priority was set for the model or tenant (not the default)."""


class _QueueTimeout(Exception):
    pass


class Admission:
    """Admits requests (see the module docstring). All methods run on the event loop thread.

    ``clock`` is monotonic seconds (injectable for tests of the buckets).
    """

    def __init__(
        self,
        *,
        max_concurrency: int,
        max_queue: int,
        queue_timeout_s: float,
        rate_wait_s: float = 0.0,
        default_priority: int = 0,
        max_tracked: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.rate_wait_s = rate_wait_s
        self.default_priority = default_priority
        self.max_tracked = max_tracked
        self._clock = clock
        self._entries: dict[Kind, dict[str, Entry]] = {"models": {}, "tenants": {}}
        self.in_flight = 0
        self.queued = 0
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    # -- configuration (the control API) --------------------------------------------------

    def entry(self, kind: Kind, name: str, *, create: bool = True) -> Entry:
        """The entry for ``name``; past ``max_tracked`` names, new data-path names share
        :data:`OTHER` unless ``create`` forces a new one (the control API does)."""
        entries = self._entries[kind]
        e = entries.get(name)
        if e is None:
            if len(entries) >= self.max_tracked and not create:
                name = OTHER
                e = entries.get(name)
                if e is not None:
                    return e
            e = entries[name] = Entry(name)
        return e

    def set_limit(self, kind: Kind, name: str, rate_rps: float, burst: int) -> Entry:
        """Limit ``name`` to ``rate_rps`` with ``burst``; keeps the banked tokens (capped)."""
        e = self.entry(kind, name)
        old = e.bucket
        e.bucket = TokenBucket(rate_rps, burst, self._clock(), None if old is None else old.tokens)
        return e

    def clear_limit(self, kind: Kind, name: str) -> Entry:
        e = self.entry(kind, name)
        e.bucket = None
        return e

    def set_priority(self, kind: Kind, name: str, priority: int | None) -> Entry:
        e = self.entry(kind, name)
        e.priority = priority
        return e

    def state(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{"models": {name: state}, "tenants": {name: state}}``."""
        return {k: {n: e.state() for n, e in v.items()} for k, v in self._entries.items()}

    # -- the data path --------------------------------------------------------------------

    def try_admit(self, model: str, tenant: str) -> Ticket | None:
        """Admit at once when nothing needs to wait (the fast path, no coroutine); None when
        the request must wait (then call :meth:`admit`). Raises :class:`Rejected`."""
        m = self.entry("models", model, create=False)
        t = self.entry("tenants", tenant, create=False)
        limited = m.bucket is not None or t.bucket is not None
        if limited:
            now = self._clock()
            if self._rate_wait(m, t, now) > 0:
                return None
        if self.in_flight >= self.max_concurrency or self.queued:
            return None
        if limited:
            self._take(m, t, now)
        self.in_flight += 1
        return self._admitted(m, t)

    async def admit(self, model: str, tenant: str) -> Ticket:
        """Admit a request of ``model`` from ``tenant``, waiting as configured. Raises
        :class:`Rejected`; cancelling the caller leaves every counter as it was."""
        m = self.entry("models", model, create=False)
        t = self.entry("tenants", tenant, create=False)
        if m.bucket is not None or t.bucket is not None:
            now = self._clock()
            wait = self._rate_wait(m, t, now)
            self._take(m, t, now)
            if wait > 0:
                m.queued += 1
                t.queued += 1
                try:
                    await asyncio.sleep(wait)
                finally:
                    m.queued -= 1
                    t.queued -= 1
        if self.in_flight < self.max_concurrency and not self.queued:
            self.in_flight += 1
        else:
            await self._queue(m, t, self._priority(m, t)[0])
        return self._admitted(m, t)

    def _priority(self, m: Entry, t: Entry) -> tuple[int, bool]:
        if m.priority is not None:
            return m.priority, True
        if t.priority is not None:
            return t.priority, True
        return self.default_priority, False

    def _admitted(self, m: Entry, t: Entry) -> Ticket:
        m.in_flight += 1
        t.in_flight += 1
        m.admitted += 1
        t.admitted += 1
        return Ticket(m, t, *self._priority(m, t))

    def release(self, ticket: Ticket) -> None:
        """The request of ``ticket`` is done: free its slot for the next queued one."""
        ticket.model.in_flight -= 1
        ticket.tenant.in_flight -= 1
        self._give_back_slot()

    def _reject(self, m: Entry, t: Entry, exc: Rejected) -> Rejected:
        m.rejected += 1
        t.rejected += 1
        return exc

    def _rate_wait(self, m: Entry, t: Entry, now: float) -> float:
        """Seconds until both buckets have a token; raises :class:`Rejected` when that is
        longer than the bounded wait."""
        wm = 0.0 if m.bucket is None else m.bucket.wait_s(now)
        wt = 0.0 if t.bucket is None else t.bucket.wait_s(now)
        wait = max(wm, wt)
        if wait > self.rate_wait_s:
            who, kind = (m, "model") if wm > 0 else (t, "tenant")
            raise self._reject(
                m,
                t,
                Rejected(
                    429,
                    f"rate_limit_{kind}",
                    wait,
                    f"rate limit of {kind} {who.name!r} exceeded; retry after {wait:.3f} s",
                ),
            )
        return wait

    @staticmethod
    def _take(m: Entry, t: Entry, now: float) -> None:
        if m.bucket is not None:
            m.bucket.take(now)
        if t.bucket is not None:
            t.bucket.take(now)

    async def _queue(self, m: Entry, t: Entry, prio: int) -> None:
        if self.queued >= self.max_queue:
            raise self._reject(
                m, t, Rejected(503, "queue_full", 1.0, f"gateway queue full ({self.max_queue})")
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._heap, (prio, next(self._seq), fut))
        timer = loop.call_later(self.queue_timeout_s, _expire, fut)
        self.queued += 1
        m.queued += 1
        t.queued += 1
        try:
            await fut
        except _QueueTimeout:
            raise self._reject(
                m,
                t,
                Rejected(
                    503,
                    "queue_timeout",
                    self.queue_timeout_s,
                    f"waited {self.queue_timeout_s:g} s in the gateway queue",
                ),
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._give_back_slot()  # granted just as the caller went away
            else:
                fut.cancel()
            raise
        finally:
            timer.cancel()
            self.queued -= 1
            m.queued -= 1
            t.queued -= 1

    def _give_back_slot(self) -> None:
        heap = self._heap
        while heap:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)  # the slot passes straight to the next in line
                return
        self.in_flight -= 1


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(_QueueTimeout())
