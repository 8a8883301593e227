"""The gateway's router: its replicas, each model's route, and the changes the control API makes.

A model's route is, in order: the weights set through the control API (``PUT
/control/v1/weights/{model}``), else its configured ``[routes."MODEL"]``, else the default route
(every replica with its configured ``weight``; named ``*`` in the control API, where setting its
weights changes it for every model without a route of its own). Setting weights for a model
starts from its current route and changes only the replicas named; a replica named that was
not in the route joins it. Clearing them goes back to the configured route. Ejecting,
restoring and reserving act on a replica, for every route it is in.

Every method runs on the event loop thread; bad arguments raise :class:`ValueError` with a
message naming the field (the control API answers it with 422).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from cotenant.gateway.balance import MAX_WEIGHT, Route
from cotenant.gateway.health import PassiveHealth
from cotenant.gateway.replica import Replica, Reservation
from cotenant.gateway.routing_config import RoutingSpec, check_routing

DEFAULT_ROUTE = "*"
"""The name of the default route in the control API's state."""


class Router:
    """See the module docstring. ``clock``: monotonic seconds; ``rng`` draws the least-loaded
    pairs (seed it for reproducible tests)."""

    def __init__(
        self,
        spec: RoutingSpec,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        check_routing(spec)
        self.clock = clock
        self.rng = rng or random.Random()
        self.spec = spec
        self.replicas: dict[str, Replica] = {}
        for r in spec.replicas:
            self.replicas[r.name] = Replica(
                r.name,
                r.url,
                max_in_flight=r.max_in_flight,
                reservation=(
                    Reservation(r.reserve_slots, r.reserve_priority) if r.reserve_slots else None
                ),
                health=PassiveHealth(spec.eject_after, spec.eject_s, 10 * spec.eject_s),
            )
        self._configured_default = self.default = Route(
            spec.policy, {self.replicas[r.name]: r.weight for r in spec.replicas}, self.rng
        )
        self._configured = {
            model: Route(
                route.policy or spec.policy,
                {self.replicas[n]: w for n, w in route.weights.items()},
                self.rng,
            )
            for model, route in spec.routes.items()
        }
        self._overrides: dict[str, Route] = {}
        self._effective = dict(self._configured)

    # -- the data path --------------------------------------------------------------------

    def route_for(self, model: str) -> Route:
        return self._effective.get(model, self.default)

    def first_url(self) -> str:
        return next(iter(self.replicas.values())).url

    # -- weights ----------------------------------------------------------------------------

    def set_weights(self, model: str, weights: dict[str, Any]) -> Route:
        """Set the weights of the replicas named in ``weights`` (integers 0..256) for
        ``model``; the other replicas of its route keep theirs. Raises ValueError naming the
        field when a name is unknown, a weight is out of range, or no weight would stay > 0;
        then nothing is changed."""
        if not weights:
            raise ValueError("field 'weights' must name at least one replica")
        current = self.route_for(model)
        new: dict[Replica, int] = {m.replica: m.weight for m in current.members}
        for name, w in weights.items():
            replica = self.replicas.get(name)
            if replica is None:
                raise ValueError(
                    f"field 'weights.{name}': no replica named {name!r} "
                    f"(replicas: {', '.join(self.replicas)})"
                )
            if isinstance(w, bool) or not isinstance(w, int):
                raise ValueError(
                    f"field 'weights.{name}' must be an integer, not {type(w).__name__}"
                )
            if not 0 <= w <= MAX_WEIGHT:
                raise ValueError(
                    f"field 'weights.{name}' must be an integer from 0 to {MAX_WEIGHT}, not {w!r}"
                )
            new[replica] = w
        if not any(w > 0 for w in new.values()):
            raise ValueError(
                f"field 'weights': at least one replica of {model!r} must keep a weight > 0 "
                "(eject a replica to stop sending it anything)"
            )
        route = Route(current.policy, new, self.rng)
        if model == DEFAULT_ROUTE:
            self.default = route
        else:
            self._overrides[model] = route
            self._effective[model] = route
        return route

    def clear_weights(self, model: str) -> Route:
        """Back to the configured route of ``model`` (idempotent)."""
        if model == DEFAULT_ROUTE:
            self.default = self._configured_default
            return self.default
        self._overrides.pop(model, None)
        configured = self._configured.get(model)
        if configured is None:
            self._effective.pop(model, None)
            return self.default
        self._effective[model] = configured
        return configured

    # -- replicas ---------------------------------------------------------------------------

    def replica(self, name: str) -> Replica:
        """The replica named ``name``; KeyError naming the known ones."""
        r = self.replicas.get(name)
        if r is None:
            raise KeyError(f"no replica named {name!r} (replicas: {', '.join(self.replicas)})")
        return r

    def eject(self, name: str, duration_s: float | None) -> Replica:
        r = self.replica(name)
        r.eject(self.clock(), duration_s)
        return r

    def restore(self, name: str) -> Replica:
        r = self.replica(name)
        r.restore()
        return r

    def set_reservation(self, name: str, slots: int, priority: int) -> Replica:
        """Keep ``slots`` of the replica's ``max_in_flight`` for priorities <= ``priority``.
        ValueError when it has no ``max_in_flight`` or ``slots`` exceeds it."""
        r = self.replica(name)
        if r.max_in_flight is None:
            raise ValueError(
                f"replica {name!r} has no max_in_flight: slots are reserved out of it "
                f"(set max_in_flight in [upstreams.{name}])"
            )
        if slots > r.max_in_flight:
            raise ValueError(
                f"field 'slots' {slots} is more than replica {name!r}'s max_in_flight "
                f"{r.max_in_flight}"
            )
        r.reservation = Reservation(slots, priority) if slots else None
        return r

    def clear_reservation(self, name: str) -> Replica:
        r = self.replica(name)
        r.reservation = None
        return r

    # -- state ------------------------------------------------------------------------------

    def route_state(self, model: str) -> dict[str, Any]:
        """``{"model", "policy", "weights", "configured_weights", "overridden"}``."""
        route = self.route_for(model)
        if model == DEFAULT_ROUTE:
            configured = self._configured_default
        else:
            configured = self._configured.get(model, self._configured_default)
        return {
            "model": model,
            "policy": route.policy,
            "weights": route.weights,
            "configured_weights": configured.weights,
            "overridden": route is not configured,
        }

    def state(self) -> dict[str, Any]:
        """``{"replicas": {name: state}, "routes": {"*": default, model: route}}``."""
        now = self.clock()
        routes: dict[str, Any] = {}
        for model in (DEFAULT_ROUTE, *self._effective):
            s = self.route_state(model)
            del s["model"]
            routes[model] = s
        return {
            "replicas": {n: r.state(now) for n, r in self.replicas.items()},
            "routes": routes,
        }
