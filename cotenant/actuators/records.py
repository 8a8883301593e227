"""Action records in the ``actions`` table and their append-only ``audit`` trail.

An action's row is rewritten at every step of its state machine; each step also appends one
``audit`` row (who, what, when, why, before/after values) in the same transaction, so the two
never disagree. The rows are read and written through :mod:`store.action_rows`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from cotenant.core.errors import NotFoundError
from cotenant.store.action_rows import (
    AuditEntry,
    StoredAction,
    actions_of_incidents,
    append_audit,
    audit_trail,
    count_audit_events,
    find_actions,
    get_action,
    last_change_ended_ns,
    write_action,
)
from cotenant.store.db import Store

IN_EFFECT = ("applied", "verified")
"""States in which an action's change is in place on the backend."""

OPEN_STATES = ("proposed", "approved", "applied", "verified")
"""States the control loop still advances (``verified`` changes expire at their TTL)."""

ENDED_STATES = ("rolled_back", "expired")
"""States of an action whose change was taken back off the backend."""


CHANGE_KEYS = ("rate_rps", "burst", "max_wait_s", "priority", "fraction", "weights")
"""Keys of ``params`` that belong to the backend change; the rest is context."""


@dataclass(frozen=True)
class ActionRecord:
    id: str
    incident_id: str
    kind: str  # rate_limit | priority | reroute | notify
    target: str
    backend: str
    state: str
    created_ns: int
    updated_ns: int
    params: dict[str, Any] = field(default_factory=dict)
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    reason: str = ""

    @staticmethod
    def new_id() -> str:
        return "act-" + uuid.uuid4().hex[:12]

    @property
    def change_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if k in CHANGE_KEYS}

    @property
    def context(self) -> dict[str, Any]:
        ctx: dict[str, Any] = self.params.get("context", {})
        return ctx

    def to_dict(self) -> dict[str, Any]:
        verification = self.params.get("verification") or {}
        return {
            "id": self.id,
            "incident_id": self.incident_id,
            "kind": self.kind,
            "target": self.target,
            "backend": self.backend,
            "state": self.state,
            "created_ns": self.created_ns,
            "updated_ns": self.updated_ns,
            "params": self.params,
            "before": self.before,
            "after": self.after,
            "reason": self.reason,
            "victim_p99_before_ms": verification.get("victim_p99_before_ms"),
            "victim_p99_after_ms": verification.get("victim_p99_after_ms"),
        }


def _from_stored(r: StoredAction) -> ActionRecord:
    return ActionRecord(
        id=r.id,
        incident_id=r.incident_id,
        kind=r.kind,
        target=r.target,
        backend=r.backend,
        state=r.state,
        created_ns=r.created_ns,
        updated_ns=r.updated_ns,
        params=r.params,
        before=r.before,
        after=r.after,
        reason=r.reason,
    )


def _to_stored(a: ActionRecord) -> StoredAction:
    return StoredAction(
        id=a.id,
        incident_id=a.incident_id,
        kind=a.kind,
        target=a.target,
        backend=a.backend,
        state=a.state,
        created_ns=a.created_ns,
        updated_ns=a.updated_ns,
        params=a.params,
        before=a.before,
        after=a.after,
        reason=a.reason,
    )


class ActionLog:
    """Reads and writes ``actions`` and appends to ``audit`` (through
    :mod:`store.action_rows`). Callers serialise writes: the controller holds its lock."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def write(
        self,
        action: ActionRecord,
        *,
        actor: str,
        event: str,
        now_ns: int,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Insert or rewrite ``action`` and append one audit row, in one transaction."""
        audit = {
            "state": action.state,
            "kind": action.kind,
            "target": action.target,
            "reason": action.reason,
            "before": action.before,
            "after": action.after,
            **(detail or {}),
        }
        write_action(
            self._store, _to_stored(action), AuditEntry(now_ns, actor, action.id, event, audit)
        )

    def note(
        self, action_id: str, *, actor: str, event: str, now_ns: int, detail: dict[str, Any]
    ) -> None:
        """Append an audit row that does not change the action (e.g. a guardrail hold)."""
        append_audit(self._store, AuditEntry(now_ns, actor, action_id, event, detail))

    def get(self, action_id: str) -> ActionRecord:
        r = get_action(self._store, action_id)
        if r is None:
            raise NotFoundError(f"no action {action_id!r}")
        return _from_stored(r)

    def find(
        self,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        incident_id: str | None = None,
        states: tuple[str, ...] | None = None,
        target: str | None = None,
        limit: int = 200,
    ) -> list[ActionRecord]:
        """Actions newest first (by creation); ``since_ns``: last changed at or after it;
        ``until_ns``: created before it."""
        found = find_actions(
            self._store,
            since_ns=since_ns,
            until_ns=until_ns,
            incident_id=incident_id,
            states=states,
            target=target,
            limit=limit,
        )
        return [_from_stored(r) for r in found]

    def by_incident(self, incident_ids: list[str]) -> dict[str, list[ActionRecord]]:
        """Every action of each incident in ``incident_ids`` (one query)."""
        found = actions_of_incidents(self._store, incident_ids)
        return {i: [_from_stored(r) for r in rows] for i, rows in found.items()}

    def count_events(self, event: str, since_ns: int, target: str | None = None) -> int:
        """How many audit rows of ``event`` (for ``target`` when given) since ``since_ns``."""
        return count_audit_events(self._store, event, since_ns, target)

    def last_ended_ns(self, target: str) -> int | None:
        """When the last change applied to ``target`` ended (rolled back or expired)."""
        return last_change_ended_ns(self._store, target, ENDED_STATES)

    def audit(self, action_id: str) -> list[dict[str, Any]]:
        """The audit trail of one action, oldest first: dicts with ``ts_ns``, ``actor``,
        ``event`` and ``detail``."""
        return audit_trail(self._store, action_id)


def moved(action: ActionRecord, state: str, now_ns: int, **changes: Any) -> ActionRecord:
    """``action`` in ``state`` at ``now_ns`` with the other fields in ``changes``."""
    return replace(action, state=state, updated_ns=now_ns, **changes)
