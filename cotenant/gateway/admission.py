"""Admission control: per-model and per-tenant token buckets, then a priority queue under the
upstream's concurrency limit.

A request is admitted in two steps:

1. **rate**: the model's and the tenant's buckets (where a limit is set) must both have a
   token. When one must wait ``w`` seconds and ``w`` is within ``rate_wait_s`` (the bounded
   wait), both tokens are reserved and the request sleeps ``w``; otherwise it is rejected with
   429 and ``Retry-After`` = ``ceil(w)``.
2. **concurrency and routing**: at most ``max_concurrency`` requests are in flight through the
   gateway, and each goes to a replica of its model's route (:mod:`actuators.gateway.routing`)
   that has room for it (its ``max_in_flight`` and reservation). The others wait, per route, in
   a queue ordered by priority (lower first, as in vLLM), then arrival; a freed slot goes to the
   best waiting request that can use it, so a full replica does not hold up requests bound for
   other replicas. A full queue (``max_queue``) or a wait longer than ``queue_timeout_s``
   answers 503 with ``Retry-After``; so does a route with no replica that may take requests
   (all ejected by an operator, or at weight 0).

The effective priority of a request is its model's, else its tenant's, else the default.
Counters are kept per model and per tenant name; to bound memory under arbitrary client input
at most ``max_tracked`` names of each kind are tracked, the rest count under ``(other)``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

from cotenant.core.token_bucket import TokenBucket
from cotenant.gateway.balance import NoReplica, Route
from cotenant.gateway.replica import Replica
from cotenant.gateway.routing import Router
from cotenant.gateway.tickets import OTHER, Entry, Grant, Kind, Rejected, Ticket

__all__ = ["OTHER", "Admission", "Entry", "Kind", "Rejected", "Ticket"]

_Waiter = tuple[int, int, "asyncio.Future[Grant]", str]
"""``(priority, arrival number, future, model)`` in a route's queue."""


class _QueueTimeout(Exception):
    pass


class _NoReplicaLeft(Exception):
    pass


class Admission:
    """Admits requests (see the module docstring). All methods run on the event loop thread.

    ``router`` gives each request its replica; ``clock`` is monotonic seconds (injectable for
    tests of the buckets).
    """

    def __init__(
        self,
        *,
        router: Router,
        max_concurrency: int,
        max_queue: int,
        queue_timeout_s: float,
        rate_wait_s: float = 0.0,
        default_priority: int = 0,
        max_tracked: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
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
        self._waiting: dict[Route, list[_Waiter]] = {}
        """The queue of each route that has waiting requests (never an empty list)."""
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
        now = self._clock()
        limited = m.bucket is not None or t.bucket is not None
        if limited and self._rate_wait(m, t, now) > 0:
            return None
        route = self.router.route_for(model)
        if self.in_flight >= self.max_concurrency or route in self._waiting:
            return None
        prio, explicit = self._priority(m, t)
        try:
            replica = route.pick(prio, now)
        except NoReplica:
            raise self._no_replica(m, t) from None
        if replica is None:
            return None
        if limited:
            self._take(m, t, now)
        self.in_flight += 1
        return self._admitted(m, t, prio, explicit, route, self._grant(replica, prio))

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
        prio, explicit = self._priority(m, t)
        route = self.router.route_for(model)
        replica: Replica | None = None
        if self.in_flight < self.max_concurrency and route not in self._waiting:
            try:
                replica = route.pick(prio, self._clock())
            except NoReplica:
                raise self._no_replica(m, t) from None
        elif not route.usable(self._clock()):
            raise self._no_replica(m, t)
        if replica is not None:
            self.in_flight += 1
            grant = self._grant(replica, prio)
        else:
            route, grant = await self._queue(m, t, prio, route, model)
        return self._admitted(m, t, prio, explicit, route, grant)

    def _priority(self, m: Entry, t: Entry) -> tuple[int, bool]:
        if m.priority is not None:
            return m.priority, True
        if t.priority is not None:
            return t.priority, True
        return self.default_priority, False

    def _admitted(
        self, m: Entry, t: Entry, prio: int, explicit: bool, route: Route, grant: Grant
    ) -> Ticket:
        m.in_flight += 1
        t.in_flight += 1
        m.admitted += 1
        t.admitted += 1
        return Ticket(m, t, prio, explicit, route, grant)

    @staticmethod
    def _grant(replica: Replica, prio: int) -> Grant:
        reserved, probe = replica.take(prio)
        return replica, reserved, probe

    def release(self, ticket: Ticket) -> None:
        """The request of ``ticket`` is done: free its slots for the next queued one."""
        ticket.model.in_flight -= 1
        ticket.tenant.in_flight -= 1
        replica = ticket.replica
        if replica is not None:
            self._give_back(replica, ticket.reserved, ticket.probe and not ticket.outcome)
            ticket.replica = None
        self.in_flight -= 1
        if self._waiting:
            self._dispatch()

    @staticmethod
    def _give_back(replica: Replica, reserved: bool, open_probe: bool) -> None:
        replica.give_back(reserved)
        if open_probe:
            replica.health.finished_probe()

    # -- what the replica did (passive health) --------------------------------------------

    def succeeded(self, ticket: Ticket) -> None:
        """The replica answered (whatever its status code)."""
        if ticket.replica is not None and not ticket.outcome:
            ticket.outcome = True
            ticket.replica.health.succeeded(ticket.probe)

    def failed(self, ticket: Ticket) -> bool:
        """The exchange with the replica failed (connect, timeout, reset, protocol); returns
        True when this ejects the replica."""
        replica = ticket.replica
        if replica is None or ticket.outcome:
            return False
        ticket.outcome = True
        replica.failed_total += 1
        return replica.health.failed(self._clock(), ticket.probe)

    def retry_elsewhere(self, ticket: Ticket) -> bool:
        """Move ``ticket`` to another replica of its route with room for it now (after its
        replica refused the connection: nothing was sent). False when there is none; the
        ticket keeps its replica then."""
        old = ticket.replica
        if old is None:
            return False
        try:
            replica = ticket.route.pick(ticket.priority, self._clock(), exclude=old)
        except NoReplica:
            return False
        if replica is None:
            return False
        self._give_back(old, ticket.reserved, ticket.probe and not ticket.outcome)
        ticket.replica, ticket.reserved, ticket.probe = self._grant(replica, ticket.priority)
        ticket.outcome = False
        if self._waiting:
            self._dispatch()
        return True

    def routing_changed(self) -> None:
        """Weights, ejections or reservations changed: requests waiting follow their model's
        route as it is now, and those that can go now do."""
        moved: list[tuple[Route, _Waiter]] = []
        for route, queue in list(self._waiting.items()):
            keep = []
            for item in queue:
                if item[2].done():
                    continue
                target = self.router.route_for(item[3])
                if target is route:
                    keep.append(item)
                else:
                    moved.append((target, item))
            if keep:
                heapq.heapify(keep)
                self._waiting[route] = keep
            else:
                del self._waiting[route]
        for target, item in moved:
            heapq.heappush(self._waiting.setdefault(target, []), item)
        self._dispatch()

    def _no_replica(self, m: Entry, t: Entry) -> Rejected:
        return self._reject(
            m,
            t,
            Rejected(
                503,
                "no_replica",
                1.0,
                f"no replica may take requests for model {m.name!r}: every one of its route "
                "is ejected or at weight 0",
            ),
        )

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

    async def _queue(
        self, m: Entry, t: Entry, prio: int, route: Route, model: str
    ) -> tuple[Route, Grant]:
        if self.queued >= self.max_queue:
            raise self._reject(
                m, t, Rejected(503, "queue_full", 1.0, f"gateway queue full ({self.max_queue})")
            )
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Grant] = loop.create_future()
        heapq.heappush(self._waiting.setdefault(route, []), (prio, next(self._seq), fut, model))
        timer = loop.call_later(self.queue_timeout_s, _expire, fut)
        self.queued += 1
        m.queued += 1
        t.queued += 1
        try:
            if self.in_flight < self.max_concurrency:
                self._dispatch()  # it may fit where the requests ahead of it do not
            grant = await fut
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
        except _NoReplicaLeft:
            raise self._no_replica(m, t) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # granted just as the caller went away: give the slots back
                replica, reserved, probe = fut.result()
                self._give_back(replica, reserved, probe)
                self.in_flight -= 1
                self._dispatch()
            else:
                fut.cancel()
            raise
        finally:
            timer.cancel()
            self.queued -= 1
            m.queued -= 1
            t.queued -= 1
        return self.router.route_for(model), grant

    def _dispatch(self) -> None:
        """Grant free slots to waiting requests: each time, the best (priority, arrival) head
        among the routes that can place their head now. A route whose replicas are all
        ejected or at weight 0 fails its waiters with 503."""
        waiting = self._waiting
        now = self._clock()
        while waiting and self.in_flight < self.max_concurrency:
            best: tuple[int, int] | None = None
            best_route: Route | None = None
            for route, queue in list(waiting.items()):
                while queue and queue[0][2].done():
                    heapq.heappop(queue)
                if not queue:
                    del waiting[route]
                    continue
                key = queue[0][:2]
                if best is not None and key >= best:
                    continue
                if route.can_take(key[0], now):
                    best, best_route = key, route
                elif not route.usable(now):
                    del waiting[route]
                    for item in queue:
                        if not item[2].done():
                            item[2].set_exception(_NoReplicaLeft())
            if best_route is None:
                return
            queue = waiting[best_route]
            prio, _, fut, _ = heapq.heappop(queue)
            if not queue:
                del waiting[best_route]
            replica = best_route.pick(prio, now)
            if replica is None:  # pragma: no cover - can_take said it fits
                continue
            self.in_flight += 1
            fut.set_result(self._grant(replica, prio))


def _expire(fut: asyncio.Future[Grant]) -> None:
    if not fut.done():
        fut.set_exception(_QueueTimeout())
