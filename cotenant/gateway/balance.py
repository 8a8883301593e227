"""Which replica a request goes to: a model's route (replicas with weights) and its policy.

* ``weighted`` — smooth weighted round robin (nginx's): over any window of sum(weights)
  requests each replica gets its weight's share, interleaved (weights 5, 1, 1 send
  a a b a c a a, not a a a a a b c).
* ``least-loaded`` — power of two choices: two distinct replicas drawn at random in proportion
  to their weights, the one with fewer requests in flight per unit of weight wins (ties, as
  between idle replicas: the first drawn, so idle replicas share requests by weight). Its cost
  does not grow with the number of replicas, and unlike "always the least loaded" it does not
  send a burst of new requests to the one replica that just freed.

A replica is a candidate when its weight is > 0, no operator ejected it, its passive health
lets a request through, and it has room for the request's priority (``max_in_flight`` and the
reservation). When no replica with a weight is healthy, health is ignored (a request may still
succeed; refusing them all surely fails). A route whose replicas all have weight 0 or are
ejected by an operator has nowhere to send anything: :class:`NoReplica`.
"""

from __future__ import annotations

import random

from cotenant.gateway.replica import Replica
from cotenant.gateway.routing_config import MAX_WEIGHT, POLICIES, Policy

__all__ = ["MAX_WEIGHT", "POLICIES", "Member", "NoReplica", "Policy", "Route"]


class NoReplica(Exception):
    """The route has no replica that may take requests (all at weight 0 or ejected)."""


class Member:
    """A replica in a route, with its weight there (and the round robin's running score)."""

    __slots__ = ("current", "replica", "weight")

    def __init__(self, replica: Replica, weight: int) -> None:
        self.replica = replica
        self.weight = weight
        self.current = 0


class Route:
    """A model's replicas and weights under one policy; ``rng`` draws the least-loaded pairs."""

    __slots__ = ("_single", "members", "policy", "rng")

    def __init__(self, policy: Policy, weights: dict[Replica, int], rng: random.Random) -> None:
        self.policy = policy
        self.rng = rng
        self.members = [Member(r, w) for r, w in weights.items()]
        only = [m for m in self.members if m.weight > 0]
        self._single = only[0].replica if len(only) == 1 and len(self.members) == 1 else None

    @property
    def weights(self) -> dict[str, int]:
        return {m.replica.name: m.weight for m in self.members}

    def pick(self, priority: int, now: float, exclude: Replica | None = None) -> Replica | None:
        """The replica for a request of ``priority``, or None when every candidate is full
        (the request waits) or is ``exclude`` (a retry after it failed). Raises
        :class:`NoReplica`. Does not count the request: call :meth:`Replica.take` on the
        answer."""
        single = self._single
        if single is not None:  # one replica: nothing to choose
            if not single.usable(now):
                raise NoReplica
            return single if single.has_room(priority) and single is not exclude else None
        fits = self._fits(priority, now, exclude)
        if not fits:
            return None
        if len(fits) == 1:
            return fits[0].replica
        if self.policy == "weighted":
            return self._round_robin(fits)
        return self._two_choices(fits)

    def _fits(self, priority: int, now: float, exclude: Replica | None) -> list[Member]:
        """The candidates (see the module docstring), in one pass; raises :class:`NoReplica`."""
        fits: list[Member] = []
        spare: list[Member] = []  # candidates that health would rather not use
        usable = healthy = False
        for m in self.members:
            r = m.replica
            if m.weight <= 0 or (r.manual and not r.usable(now)):
                continue
            usable = True
            h = r.health
            ok = h.state == "healthy" or h.available(now)
            healthy = healthy or ok
            if r is not exclude and (r.max_in_flight is None or r.has_room(priority)):
                (fits if ok else spare).append(m)
        if not usable:
            raise NoReplica
        return fits if healthy else spare

    def can_take(self, priority: int, now: float) -> bool:
        """Whether :meth:`pick` would find a replica now (no state changes but health's)."""
        single = self._single
        if single is not None:
            return single.usable(now) and single.has_room(priority)
        try:
            return bool(self._fits(priority, now, None))
        except NoReplica:
            return False

    def usable(self, now: float) -> bool:
        """False when no replica may take requests at all (see :class:`NoReplica`)."""
        return any(m.weight > 0 and m.replica.usable(now) for m in self.members)

    @staticmethod
    def _round_robin(fits: list[Member]) -> Replica:
        total = 0
        best = fits[0]
        for m in fits:
            m.current += m.weight
            total += m.weight
            if m.current > best.current:
                best = m
        best.current -= total
        return best.replica

    def _two_choices(self, fits: list[Member]) -> Replica:
        rand = self.rng.random
        total = 0
        for m in fits:
            total += m.weight
        x = rand() * total
        a = fits[-1]
        for m in fits:
            x -= m.weight
            if x < 0:
                a = m
                break
        x = rand() * (total - a.weight)
        b = a
        for m in fits:
            if m is not a:
                b = m
                x -= m.weight
                if x < 0:
                    break
        ra, rb = a.replica, b.replica
        # fewer in flight per unit of weight (as nginx's least_conn); a tie goes to the first
        # drawn, which was drawn by weight
        return ra if ra.in_flight * b.weight <= rb.in_flight * a.weight else rb
