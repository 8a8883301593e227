"""The action log's contract: how the HTTP API and the dashboard read and drive actions.

``cotenant.actuators.controller.ActionController`` implements it (the control loop over the
``actions`` and ``audit`` tables); ``/api/v1/actions`` and the dashboard's Actions and
Incident pages depend only on this protocol, so neither the dashboard nor anything but the
composition root imports ``actuators`` to read actions.
"""

from __future__ import annotations

from typing import Any, Protocol

ACTION_STATES = (
    "proposed",
    "approved",
    "applied",
    "verified",
    "rolled_back",
    "failed",
    "expired",
)
"""Every state an action can be in; the last four are final."""


class ActionControl(Protocol):
    """Read and drive the action log.

    Action dicts carry the ``actions`` table's columns with ``params``, ``before`` and ``after``
    decoded from their JSON columns, plus ``victim_p99_before_ms`` / ``victim_p99_after_ms``
    where verification measured them.
    """

    @property
    def mode(self) -> str:
        """``off``, ``dry-run``, ``manual`` or ``auto``."""
        ...

    def authorize(self, token: str | None) -> None:
        """Raise :class:`cotenant.core.errors.Unauthorized` when ``token`` is None or empty and
        :class:`cotenant.core.errors.Forbidden` when it is not the configured token."""
        ...

    def list_actions(
        self,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        incident_id: str | None = None,
        limit: int = 200,
    ) -> list[dict[str, Any]]:
        """Actions newest first."""
        ...

    def approve(self, action_id: str, *, actor: str) -> dict[str, Any]:
        """Approve a proposed action (manual mode); returns the action after the step.
        Raises NotFoundError, or ActionError when the action is not ``proposed``."""
        ...

    def rollback(self, action_id: str, *, actor: str, reason: str) -> dict[str, Any]:
        """Revert an applied action now; returns the action after the step."""
        ...
