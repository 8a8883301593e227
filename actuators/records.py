"""Action records in the ``actions`` table and their append-only ``audit`` trail.

An action's row is rewritten at every step of its state machine; each step also appends one
``audit`` row (who, what, when, why, before/after values) in the same transaction, so the two
never disagree.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from store.db import Store
from store.errors import NotFoundError
from store.queries import select_rows

IN_EFFECT = ("applied", "verified")
"""States in which an action's change is in place on the backend."""

OPEN_STATES = ("proposed", "approved", "applied", "verified")
"""States the control loop still advances (``verified`` changes expire at their TTL)."""

CHANGE_KEYS = ("rate_rps", "burst", "max_wait_s", "priority", "fraction")
"""Keys of ``params`` that belong to the backend change; the rest is context."""


@dataclass(frozen=True)
class ActionRecord:
    id: str
    incident_id: str
    kind: str  # rate_limit | priority | notify
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


_COLS = (
    "id, incident_id, kind, target, backend, state, created_ns, updated_ns, params_json, "
    "before_json, after_json, reason"
)


def _load(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def _row(r: tuple[Any, ...]) -> ActionRecord:
    return ActionRecord(
        id=r[0],
        incident_id=r[1],
        kind=r[2],
        target=r[3],
        backend=r[4],
        state=r[5],
        created_ns=r[6],
        updated_ns=r[7],
        params=_load(r[8]) or {},
        before=_load(r[9]),
        after=_load(r[10]),
        reason=r[11] or "",
    )


class ActionLog:
    """Reads and writes ``actions`` and appends to ``audit``. Callers serialise writes."""

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
        row = (
            action.id,
            action.incident_id,
            action.kind,
            action.target,
            action.backend,
            action.state,
            action.created_ns,
            action.updated_ns,
            json.dumps(action.params),
            None if action.before is None else json.dumps(action.before),
            None if action.after is None else json.dumps(action.after),
            action.reason,
        )
        audit = {
            "state": action.state,
            "kind": action.kind,
            "target": action.target,
            "reason": action.reason,
            "before": action.before,
            "after": action.after,
            **(detail or {}),
        }
        with self._store.cursor() as cur:
            cur.execute("BEGIN TRANSACTION")
            try:
                cur.execute(
                    f"INSERT OR REPLACE INTO actions ({_COLS}) VALUES ({', '.join('?' * 12)})", row
                )
                cur.execute(
                    "INSERT INTO audit (ts_ns, actor, action_id, event, detail_json) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [now_ns, actor, action.id, event, json.dumps(audit, default=str)],
                )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise

    def note(
        self, action_id: str, *, actor: str, event: str, now_ns: int, detail: dict[str, Any]
    ) -> None:
        """Append an audit row that does not change the action (e.g. a guardrail hold)."""
        with self._store.cursor() as cur:
            cur.execute(
                "INSERT INTO audit (ts_ns, actor, action_id, event, detail_json) "
                "VALUES (?, ?, ?, ?, ?)",
                [now_ns, actor, action_id, event, json.dumps(detail, default=str)],
            )

    def get(self, action_id: str) -> ActionRecord:
        with self._store.cursor() as cur:
            r = cur.execute(f"SELECT {_COLS} FROM actions WHERE id = ?", [action_id]).fetchone()
        if r is None:
            raise NotFoundError(f"no action {action_id!r}")
        return _row(r)

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
        rows = select_rows(
            self._store,
            "actions",
            _COLS,
            where={
                "updated_ns >= ?": since_ns,
                "created_ns < ?": until_ns,
                "incident_id": incident_id,
                "target": target,
                "state": states,
            },
            order_by="created_ns DESC, id",
            limit=limit,
        )
        return [_row(r) for r in rows]

    def by_incident(self, incident_ids: list[str]) -> dict[str, list[ActionRecord]]:
        """Every action of each incident in ``incident_ids`` (one query)."""
        out: dict[str, list[ActionRecord]] = {i: [] for i in incident_ids}
        if not incident_ids:
            return out
        with self._store.cursor() as cur:
            rows = cur.execute(
                f"SELECT {_COLS} FROM actions WHERE incident_id IN "
                f"(SELECT unnest(?::VARCHAR[])) ORDER BY created_ns DESC, id",
                [incident_ids],
            ).fetchall()
        for r in rows:
            out[r[1]].append(_row(r))
        return out

    def count_events(self, event: str, since_ns: int, target: str | None = None) -> int:
        """How many audit rows of ``event`` (for ``target`` when given) since ``since_ns``."""
        sql = (
            "SELECT count(*) FROM audit a JOIN actions x ON x.id = a.action_id "
            "WHERE a.event = ? AND a.ts_ns >= ?"
        )
        params: list[Any] = [event, since_ns]
        if target is not None:
            sql += " AND x.target = ?"
            params.append(target)
        with self._store.cursor() as cur:
            r = cur.execute(sql, params).fetchone()
        return int(r[0]) if r else 0

    def last_ended_ns(self, target: str) -> int | None:
        """When the last change applied to ``target`` ended (rolled back or expired)."""
        with self._store.cursor() as cur:
            r = cur.execute(
                "SELECT max(updated_ns) FROM actions WHERE target = ? AND kind <> 'notify' "
                "AND state IN ('rolled_back', 'expired') AND before_json IS NOT NULL",
                [target],
            ).fetchone()
        return None if r is None or r[0] is None else int(r[0])

    def audit(self, action_id: str) -> list[dict[str, Any]]:
        """The audit trail of one action, oldest first."""
        with self._store.cursor() as cur:
            rows = cur.execute(
                "SELECT ts_ns, actor, event, detail_json FROM audit WHERE action_id = ? "
                "ORDER BY ts_ns, rowid",
                [action_id],
            ).fetchall()
        return [
            {"ts_ns": r[0], "actor": r[1], "event": r[2], "detail": json.loads(r[3] or "{}")}
            for r in rows
        ]


def moved(action: ActionRecord, state: str, now_ns: int, **changes: Any) -> ActionRecord:
    """``action`` in ``state`` at ``now_ns`` with the other fields in ``changes``."""
    return replace(action, state=state, updated_ns=now_ns, **changes)
