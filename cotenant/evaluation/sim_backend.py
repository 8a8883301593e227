"""The simulator backend: applies actions to a running :class:`simulator.engine.Simulation`.

Changes take effect at the simulation's current virtual time, so the control loop can be run
and benchmarked in virtual time (:mod:`evaluation.closed_loop`):

* ``rate_limit`` (``rate_rps`` > 0, ``burst`` >= 1, optional ``max_wait_s`` >= 0): the model's
  requests pass a token bucket; those finding no token wait up to ``max_wait_s`` or are
  refused, as the bundled gateway does.
* ``priority`` (an integer; lower is served first, as in vLLM and the gateway): the simulator
  weighs a model's kernels ``2**p`` with ``p`` the scenario's priority (higher gets more), so
  this backend sets ``p = -priority`` and reports ``priority = -p``.
* ``reroute`` (``weights``: ``{replica: int 0..256}``, replicas not named keep theirs):
  the model's new requests are routed by these weights (a model with ``replicas`` only).

:meth:`SimulatorBackend.current` reports ``rate_rps``, ``burst``, ``max_wait_s`` (None when
unlimited) and ``priority``, and for a model with replicas its ``weights``. Every applied
change and revert is recorded in :attr:`SimulatorBackend.log` with its virtual time.
Errors (unknown model or kind, a bad parameter) raise :class:`store.errors.BackendError`
and change nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from cotenant.actuators.backend import Change
from cotenant.core.errors import BackendError, UsageError
from cotenant.simulator.engine import Simulation


@dataclass(frozen=True)
class BackendEvent:
    """One change to the simulated serving stack: ``op`` is ``apply`` or ``revert``."""

    t_s: float
    op: str
    target: str
    kind: str
    before: dict[str, Any]
    after: dict[str, Any]


class SimulatorBackend:
    name = "simulator"

    def __init__(self, sim: Simulation) -> None:
        self._sim = sim
        self.log: list[BackendEvent] = []

    def current(self, target: str) -> dict[str, Any]:
        a = self._admission(target)
        out: dict[str, Any] = {
            "rate_rps": a["rate_rps"],
            "burst": a["burst"],
            "max_wait_s": a["max_wait_s"],
            "priority": -int(a["priority"]),
        }
        weights = self._sim.controls.routing(target)["weights"]
        if weights:
            out["weights"] = dict(weights)
        return out

    def apply(self, change: Change) -> dict[str, Any]:
        before = self.current(change.target)
        p = change.params
        if change.kind == "rate_limit":
            rate = _number(p, "rate_rps", change)
            burst = _number(p, "burst", change, integer=True)
            wait = _number(p, "max_wait_s", change, default=0.0, zero_ok=True)
            self._sim.controls.set_rate_limit(change.target, rate, int(burst), max_wait_s=wait)
        elif change.kind == "priority":
            prio = _number(p, "priority", change, integer=True, signed=True)
            self._sim.controls.set_priority(change.target, -int(prio))
        elif change.kind == "reroute":
            weights = p.get("weights")
            if not isinstance(weights, dict) or not weights:
                raise BackendError(
                    f"simulator backend: reroute {change.target!r}: weights: bad value "
                    f"{weights!r}: expected a mapping of replica to weight"
                )
            try:
                self._sim.controls.set_weights(change.target, weights)
            except UsageError as exc:
                raise BackendError(
                    f"simulator backend: reroute {change.target!r}: weights: {exc}"
                ) from exc
        else:
            raise BackendError(
                f"simulator backend: unknown change kind {change.kind!r} for {change.target!r} "
                "(known: rate_limit, priority, reroute)"
            )
        after = self.current(change.target)
        self.log.append(
            BackendEvent(self._sim.t, "apply", change.target, change.kind, before, after)
        )
        return after

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        now = self.current(target)
        rate = before.get("rate_rps")
        prio = before.get("priority", now["priority"])
        try:
            if rate is None:
                self._sim.controls.set_rate_limit(target, None)
            else:
                self._sim.controls.set_rate_limit(
                    target,
                    float(rate),
                    int(before.get("burst") or 1),
                    max_wait_s=float(before.get("max_wait_s") or 0.0),
                )
            if prio != now["priority"]:
                self._sim.controls.set_priority(target, -int(prio))
            weights = before.get("weights")
            if weights and weights != now.get("weights"):
                self._sim.controls.set_weights(target, dict(weights))
        except (UsageError, TypeError, ValueError, AttributeError) as exc:
            raise BackendError(
                f"simulator backend: cannot restore {target!r} to {before!r}: {exc}"
            ) from exc
        after = self.current(target)
        if before.get("weights") and before.get("weights") != now.get("weights"):
            kind = "reroute"
        elif prio != now["priority"] and rate == now["rate_rps"]:
            kind = "priority"
        else:
            kind = "rate_limit"
        self.log.append(BackendEvent(self._sim.t, "revert", target, kind, now, after))
        return after

    def _admission(self, target: str) -> dict[str, Any]:
        try:
            return self._sim.controls.admission(target)
        except UsageError as exc:
            raise BackendError(f"simulator backend: {exc}") from exc


def _number(
    params: dict[str, Any],
    key: str,
    change: Change,
    *,
    default: float | None = None,
    integer: bool = False,
    signed: bool = False,
    zero_ok: bool = False,
) -> float:
    """``params[key]`` checked: a finite number (an integer when ``integer``), > 0 (>= 0 when
    ``zero_ok``, any sign when ``signed``, >= 1 for an integer that is not signed)."""
    value = params.get(key, default)
    where = f"simulator backend: {change.kind} {change.target!r}: {key}"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BackendError(f"{where}: bad value {value!r}: expected a finite number")
    if integer and int(value) != value:
        raise BackendError(f"{where}: bad value {value!r}: expected an integer")
    if signed:
        return float(value)
    low_ok = value >= 1 if integer else (value >= 0 if zero_ok else value > 0)
    if not low_ok:
        bound = ">= 1" if integer else (">= 0" if zero_ok else "> 0")
        raise BackendError(f"{where}: bad value {value!r}: must be {bound}")
    return float(value)
