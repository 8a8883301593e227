"""What a gateway in front of the simulated models changes at run time, and what it reads.

:class:`RunControls` is what actions use of a running :class:`simulator.engine.Simulation`
(``Simulation.controls``; :mod:`evaluation.sim_backend`): a model's rate limit, priority and
replica weights, set at the simulation's current virtual time, and its admission counts,
routing and arrivals read back. Every method raises :class:`cotenant.core.errors.UsageError`
for an unknown model or a bad value and then changes nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from cotenant.core.errors import UsageError
from cotenant.simulator.admission import VirtualTokenBucket
from cotenant.simulator.arrivals import MergedArrivals
from cotenant.simulator.routing import Route
from cotenant.simulator.scenario import Scenario
from cotenant.simulator.state import SimGpu, SimModel


class RunState(Protocol):
    """What the controls read and change of a running simulation (its virtual time ``t``
    moves as it runs)."""

    s: Scenario
    t: float
    gpus: list[SimGpu]
    routes: list[Route]

    @property
    def arrivals(self) -> MergedArrivals: ...


class RunControls:
    """Run-time controls over the state of one running simulation (``run``)."""

    def __init__(self, run: RunState) -> None:
        self._run = run

    def _model(self, name: str) -> SimModel:
        """The model's first (or only) run-time instance."""
        return self._run.routes[self._model_index(name)].members[0]

    def _model_index(self, name: str) -> int:
        for i, m in enumerate(self._run.s.models):
            if m.name == name:
                return i
        known = ", ".join(m.name for m in self._run.s.models)
        raise UsageError(f"no model {name!r} in scenario {self._run.s.name!r} (models: {known})")

    def routing(self, model: str) -> dict[str, Any]:
        """``model``'s routing now: ``policy`` and ``weights`` (replica -> weight; empty for a
        model without replicas), ``gpus`` (replica -> GPU id) and ``in_flight`` (replica ->
        requests routed there and not finished). Raises UsageError for an unknown model."""
        route = self._run.routes[self._model_index(model)]
        reps = [ms for ms in route.members if ms.replica is not None]
        return {
            "policy": route.policy,
            "weights": {ms.replica: w for ms, w in zip(reps, route.weights, strict=False)},
            "gpus": {ms.replica: self._run.gpus[ms.gpu].spec.id for ms in reps},
            "in_flight": {ms.replica: ms.in_flight for ms in reps},
        }

    def set_weights(self, model: str, weights: dict[str, int]) -> None:
        """From now, route ``model``'s new requests by these replica weights (replicas not
        named keep theirs; requests already routed stay). Raises UsageError for an unknown
        model or replica, a model without replicas, a weight outside 0..256 or weights that
        leave no replica a weight > 0 (nothing changes then)."""
        route = self._run.routes[self._model_index(model)]
        if route.members[0].replica is None:
            raise UsageError(f"model {model!r} has no replicas to route between")
        route.set_weights(weights)

    def set_rate_limit(
        self, model: str, rate_rps: float | None, burst: int = 1, *, max_wait_s: float = 0.0
    ) -> None:
        """From now (virtual time ``t``) admit ``model``'s requests through a token bucket of
        ``rate_rps`` and ``burst`` (full at first); ``rate_rps=None`` removes the limit.
        Requests finding no token wait up to ``max_wait_s`` (deferred), else are refused.
        Raises UsageError for an unknown model or values out of range."""
        ms = self._model(model)
        ms.adm.bucket = (
            None
            if rate_rps is None
            else VirtualTokenBucket(rate_rps, burst, max_wait_s=max_wait_s, t=self._run.t)
        )

    def set_priority(self, model: str, priority: int) -> None:
        """From now, ``model``'s kernels weigh ``2**priority`` against co-runners (the
        scenario's ``priority`` semantics: higher gets more of the GPU); kernels in flight are
        re-weighted at once. Raises UsageError for an unknown model."""
        if int(priority) != priority:
            raise UsageError(f"priority {priority!r} must be an integer")
        for ms in self._run.routes[self._model_index(model)].members:
            ms.priority = int(priority)
            ms.weight = 2.0**ms.priority
            g = self._run.gpus[ms.gpu]
            mine = [j for j in g.kern.jobs if j.owner == ms.idx]
            for j in mine:
                j.weight = ms.weight
            if mine:
                g.kern.changed(self._run.t)

    def admission(self, model: str) -> dict[str, Any]:
        """``model``'s current limit and priority and its admission counts so far:
        ``rate_rps``, ``burst``, ``max_wait_s`` (None when unlimited), ``priority``,
        ``admitted_total``, ``deferred_total``, ``rejected_total``."""
        ms = self._model(model)
        b = ms.adm.bucket
        return {
            "rate_rps": None if b is None else b.rate_rps,
            "burst": None if b is None else b.burst,
            "max_wait_s": None if b is None else b.max_wait_s,
            "priority": ms.priority,
            "admitted_total": ms.adm.admitted,
            "deferred_total": ms.adm.deferred,
            "rejected_total": ms.adm.rejected,
        }

    def arrival_times(self, model: str) -> np.ndarray:
        """Virtual times (s) of ``model``'s open-loop arrivals over the whole run (offered
        load, before admission), sorted; empty for a closed-loop model."""
        idx = self._model_index(model)
        t = np.asarray(self._run.arrivals.t)
        return t[np.asarray(self._run.arrivals.model, dtype=np.int64) == idx] if len(t) else t

    def rejected_times(self, model: str) -> list[float]:
        """Virtual times (s) at which ``model``'s requests were refused, in order."""
        return list(self._model(model).adm.rejected_at)
