"""The one small interface every actuator backend implements: apply, revert, current state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ChangeKind = Literal["rate_limit", "priority", "reroute", "reserve", "max_in_flight"]


@dataclass(frozen=True)
class Change:
    """A change to one target (a model, or a model's deployment) in the serving stack.

    ``rate_limit`` params: ``rate_rps`` (float), ``burst`` (int).
    ``priority`` params: ``priority`` (int; lower is served first, as in vLLM).
    ``reroute`` (target: a model) params: ``weights`` (``{replica: int 0..256}``; replicas
    not named keep theirs); optionally ``states`` (``{replica: "ready" | "drain" |
    "maint"}``, where the backend has them: HAProxy).
    ``reserve`` (target: a replica) params: ``slots`` (int >= 0) of its concurrency kept for
    requests of priority <= ``priority`` (int) (the gateway).
    ``max_in_flight`` (target: a model) params: ``max_in_flight`` (``{replica: int >= 0}``,
    0 = no limit): how many of the model's requests each replica takes at once (HAProxy's
    ``maxconn``), so the rest of a shared replica stays for others.

    A backend refuses (:class:`store.errors.BackendError`) the kinds it has no lever for.
    """

    kind: ChangeKind
    target: str
    params: dict[str, Any] = field(default_factory=dict)


class Backend(Protocol):
    """Applies changes to a serving stack. Every method raises
    :class:`store.errors.BackendError` when the backend is down, slow or refuses; a failed
    ``apply`` leaves the target as it was (no half-applied change)."""

    name: str

    def current(self, target: str) -> dict[str, Any]:
        """The target's current settings as this backend sees them (JSON-serialisable)."""
        ...

    def apply(self, change: Change) -> dict[str, Any]:
        """Apply ``change``; returns the target's settings after it."""
        ...

    def revert(self, target: str, before: dict[str, Any]) -> dict[str, Any]:
        """Restore the settings ``before`` (as returned by :meth:`current` before the change);
        returns the settings after the revert."""
        ...
