"""What every page's callbacks are built with (passed in by :func:`dashboard.app.create_app`),
and :class:`ActionLog`, the contract of the action log the dashboard reads and drives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cotenant.dashboard.data import DashboardData
from cotenant.dashboard.settings import DashboardSettings
from cotenant.dashboard.timerange import Range, parse_range


class ActionLog(Protocol):
    """The action log as the Actions and Incident pages use it.

    Defined here so that the dashboard does not import ``actuators``: the composition root
    (``cotenant/service.py``) passes ``actuators.controller.ActionController`` in, and mypy
    checks it against this protocol there. Action dicts carry the ``actions`` table's columns
    (``state``, ``target``, ``kind``, ...) with ``params``, ``before`` and ``after`` decoded.
    """

    @property
    def mode(self) -> str:
        """``off``, ``dry-run``, ``manual`` or ``auto``."""
        ...

    def authorize(self, token: str | None) -> None:
        """Raise :class:`store.errors.Unauthorized` (no token) or :class:`store.errors.Forbidden`
        (a wrong one)."""
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
        """Approve a proposed action; the action after the step. Raises NotFoundError, or
        ActionError when it is not ``proposed``."""
        ...

    def rollback(self, action_id: str, *, actor: str, reason: str) -> dict[str, Any]:
        """Revert an applied action now; the action after the step."""
        ...


@dataclass(frozen=True)
class PageContext:
    data: DashboardData
    actions: ActionLog | None
    report_dir: Path
    default_range: str = DashboardSettings.default_range

    def range(self, text: str | None) -> Range:
        """The page's range from its URL value (the configured default when absent); raises
        QueryError for a malformed one."""
        return parse_range(text, self.data.clock_ns(), self.default_range)
