"""Which replica of a model takes a request in the simulator: the gateway's two policies,
:mod:`core.balancing`'s ``weighted`` (smooth weighted round robin) and ``least-loaded`` (power
of two choices by weight). Draws come from the route's own seeded RNG, so a run is
reproducible and adding a replicated model changes no other model's arrivals.

A replica with weight 0 takes nothing. Weights change at run time (:meth:`Route.set_weights`,
what a ``reroute`` action does); requests already routed stay where they are.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from cotenant.core.balancing import smooth_weighted, two_choices
from cotenant.core.errors import UsageError
from cotenant.simulator.scenario import MAX_REPLICA_WEIGHT, Routing
from cotenant.simulator.state import SimModel


class _Slot:
    """A replica in a route: its weight there and the round robin's running score."""

    __slots__ = ("current", "model", "weight")

    def __init__(self, model: SimModel, weight: int) -> None:
        self.model = model
        self.weight = weight
        self.current = 0

    @property
    def in_flight(self) -> int:
        return self.model.in_flight


class Route:
    """A model's replicas (run-time instances, in scenario order) with their weights."""

    __slots__ = ("_slots", "members", "policy", "rng")

    def __init__(
        self, policy: Routing, members: Sequence[SimModel], weights: Sequence[int], seed: str
    ) -> None:
        self.policy = policy
        self.members = list(members)
        self._slots = [_Slot(m, w) for m, w in zip(self.members, weights, strict=True)]
        self.rng = random.Random(seed)

    @property
    def weights(self) -> list[int]:
        """The replicas' weights, in scenario order."""
        return [s.weight for s in self._slots]

    def pick(self) -> SimModel:
        """The replica for the next request (not yet counted in flight)."""
        members = self.members
        if len(members) == 1:
            return members[0]
        live = [s for s in self._slots if s.weight > 0]
        if len(live) == 1:
            return live[0].model
        if self.policy == "weighted":
            return smooth_weighted(live).model
        return two_choices(live, self.rng.random).model

    def set_weights(self, weights: Mapping[str, int]) -> None:
        """Set the weights of the named replicas (the others keep theirs). Raises
        :class:`UsageError` naming the replica for an unknown name, a weight outside
        0..MAX_REPLICA_WEIGHT, or a change that leaves no replica a weight > 0; changes
        nothing then."""
        names = [ms.replica or ms.m.name for ms in self.members]
        new = self.weights
        for name, w in weights.items():
            if name not in names:
                raise UsageError(f"no replica {name!r} (replicas: {', '.join(names)})")
            if isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= MAX_REPLICA_WEIGHT:
                why = f"must be an integer 0..{MAX_REPLICA_WEIGHT}"
                raise UsageError(f"replica {name!r}: bad weight {w!r}: {why}")
            new[names.index(name)] = w
        if not any(w > 0 for w in new):
            raise UsageError(f"weights {dict(zip(names, new, strict=True))}: none is > 0")
        for s, w in zip(self._slots, new, strict=True):
            s.weight = w
