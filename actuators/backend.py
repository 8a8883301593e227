"""The one small interface every actuator backend implements: apply, revert, current state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

ChangeKind = Literal["rate_limit", "priority"]


@dataclass(frozen=True)
class Change:
    """A change to one target (a model, or a model's deployment) in the serving stack.

    ``rate_limit`` params: ``rate_rps`` (float), ``burst`` (int).
    ``priority`` params: ``priority`` (int; lower is served first, as in vLLM).
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
