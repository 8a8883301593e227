"""Which replica a request goes to: a model's route (replicas with weights) and its policy.

The policies are :mod:`core.balancing`'s: ``weighted`` (smooth weighted round robin) and
``least-loaded`` (power of two choices by weight, fewer in flight per unit of weight wins).

A replica is a candidate when its weight is > 0, no operator ejected it, its passive health
lets a request through, and it has room for the request's priority (``max_in_flight`` and the
reservation). When no replica with a weight is healthy, health is ignored (a request may still
succeed; refusing them all surely fails). A route whose replicas all have weight 0 or are
ejected by an operator has nowhere to send anything: :class:`NoReplica`.
"""

from __future__ import annotations

import random

from cotenant.core.balancing import smooth_weighted, two_choices
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

    @property
    def in_flight(self) -> int:
        return self.replica.in_flight


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
            return smooth_weighted(fits).replica
        return two_choices(fits, self.rng.random).replica

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
