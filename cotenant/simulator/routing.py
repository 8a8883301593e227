"""Which replica of a model takes a request in the simulator: the gateway's two policies.

* ``weighted`` — smooth weighted round robin (nginx's, as ``actuators/gateway/balance.py``):
  over any window of sum(weights) requests each replica gets its weight's share, interleaved.
* ``least-loaded`` — power of two choices: two distinct replicas drawn in proportion to their
  weights, the one with fewer requests in flight per unit of weight wins (a tie: the first
  drawn). Draws come from the route's own seeded RNG, so a run is reproducible and adding a
  replicated model changes no other model's arrivals.

A replica with weight 0 takes nothing. Weights change at run time (:meth:`Route.set_weights`,
what a ``reroute`` action does); requests already routed stay where they are.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from cotenant.core.errors import UsageError
from cotenant.simulator.scenario import MAX_REPLICA_WEIGHT, Routing
from cotenant.simulator.state import SimModel


class Route:
    """A model's replicas (run-time instances, in scenario order) with their weights."""

    __slots__ = ("_current", "members", "policy", "rng", "weights")

    def __init__(
        self, policy: Routing, members: Sequence[SimModel], weights: Sequence[int], seed: str
    ) -> None:
        self.policy = policy
        self.members = list(members)
        self.weights = list(weights)
        self._current = [0] * len(self.members)
        self.rng = random.Random(seed)

    def pick(self) -> SimModel:
        """The replica for the next request (not yet counted in flight)."""
        members = self.members
        if len(members) == 1:
            return members[0]
        live = [i for i, w in enumerate(self.weights) if w > 0]
        if len(live) == 1:
            return members[live[0]]
        if self.policy == "weighted":
            return members[self._round_robin(live)]
        return members[self._two_choices(live)]

    def set_weights(self, weights: Mapping[str, int]) -> None:
        """Set the weights of the named replicas (the others keep theirs). Raises
        :class:`UsageError` naming the replica for an unknown name, a weight outside
        0..MAX_REPLICA_WEIGHT, or a change that leaves no replica a weight > 0; changes
        nothing then."""
        names = [ms.replica or ms.m.name for ms in self.members]
        new = list(self.weights)
        for name, w in weights.items():
            if name not in names:
                raise UsageError(f"no replica {name!r} (replicas: {', '.join(names)})")
            if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= MAX_REPLICA_WEIGHT:
                why = f"must be an integer 0..{MAX_REPLICA_WEIGHT}"
                raise UsageError(f"replica {name!r}: bad weight {w!r}: {why}")
            new[names.index(name)] = w
        if not any(w > 0 for w in new):
            raise UsageError(f"weights {dict(zip(names, new, strict=True))}: none is > 0")
        self.weights = new

    def _round_robin(self, live: list[int]) -> int:
        cur, weights = self._current, self.weights
        total = 0
        best = live[0]
        for i in live:
            cur[i] += weights[i]
            total += weights[i]
            if cur[i] > cur[best]:
                best = i
        cur[best] -= total
        return best

    def _two_choices(self, live: list[int]) -> int:
        w = self.weights
        rand = self.rng.random
        total = sum(w[i] for i in live)
        a = _draw(live, w, rand() * total, -1)
        b = _draw(live, w, rand() * (total - w[a]), a)
        fa, fb = self.members[a].in_flight, self.members[b].in_flight
        return a if fa * w[b] <= fb * w[a] else b


def _draw(live: list[int], w: list[int], x: float, skip: int) -> int:
    """The index in ``live`` (not ``skip``) whose weight interval holds ``x``."""
    last = skip
    for i in live:
        if i == skip:
            continue
        last = i
        x -= w[i]
        if x < 0:
            return i
    return last
