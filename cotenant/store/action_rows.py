"""The ``actions`` table and its append-only ``audit`` trail: typed reads and writes.

An action's row is rewritten (``INSERT OR REPLACE`` on ``id``) at every step of its state
machine; :func:`write_action` appends that step's ``audit`` row in the same transaction, so the
two never disagree. What the states mean and when an action moves is
:mod:`actuators.controller`'s business; this module only moves rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from cotenant.store.db import Store
from cotenant.store.queries import select_rows


@dataclass(frozen=True)
class StoredAction:
    """One ``actions`` row. Times in ns UTC; ``params`` / ``before`` / ``after`` are the
    parsed JSON columns (``params`` is ``{}`` when null)."""

    id: str
    incident_id: str
    kind: str
    target: str
    backend: str
    state: str
    created_ns: int
    updated_ns: int
    params: dict[str, Any]
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    reason: str


@dataclass(frozen=True)
class AuditEntry:
    """One ``audit`` row: who (``actor``) did what (``event``) to action ``action_id`` at
    ``ts_ns``; ``detail`` is stored as JSON (values JSON cannot hold are written as ``str``)."""

    ts_ns: int
    actor: str
    action_id: str
    event: str
    detail: dict[str, Any]


_COLS = (
    "id, incident_id, kind, target, backend, state, created_ns, updated_ns, params_json, "
    "before_json, after_json, reason"
)

_AUDIT_INSERT = (
    "INSERT INTO audit (ts_ns, actor, action_id, event, detail_json) VALUES (?, ?, ?, ?, ?)"
)


def _load(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def _row(r: tuple[Any, ...]) -> StoredAction:
    return StoredAction(
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


def _audit_params(entry: AuditEntry) -> list[Any]:
    return [
        entry.ts_ns,
        entry.actor,
        entry.action_id,
        entry.event,
        json.dumps(entry.detail, default=str),
    ]


def write_action(store: Store, action: StoredAction, audit: AuditEntry) -> None:
    """Insert or rewrite ``action`` and append ``audit``, in one transaction: both land or
    neither does (the error is re-raised after the rollback). Callers serialise writes of
    one action (see :mod:`store.writer` on concurrent writers)."""
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
    with store.cursor() as cur:
        cur.execute("BEGIN TRANSACTION")
        try:
            cur.execute(
                f"INSERT OR REPLACE INTO actions ({_COLS}) VALUES ({', '.join('?' * 12)})", row
            )
            cur.execute(_AUDIT_INSERT, _audit_params(audit))
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise


def append_audit(store: Store, entry: AuditEntry) -> None:
    """Append one audit row without touching the action (e.g. a guardrail hold)."""
    with store.cursor() as cur:
        cur.execute(_AUDIT_INSERT, _audit_params(entry))


def get_action(store: Store, action_id: str) -> StoredAction | None:
    """The action ``action_id``, or None when there is none."""
    with store.cursor() as cur:
        r = cur.execute(f"SELECT {_COLS} FROM actions WHERE id = ?", [action_id]).fetchone()
    return None if r is None else _row(r)


def find_actions(
    store: Store,
    *,
    since_ns: int | None = None,
    until_ns: int | None = None,
    incident_id: str | None = None,
    states: tuple[str, ...] | None = None,
    target: str | None = None,
    limit: int = 200,
) -> list[StoredAction]:
    """Actions newest first (by creation, then id); ``since_ns``: last changed at or after
    it; ``until_ns``: created before it; ``states``: in any of them. Filters left None do not
    apply. Raises QueryError for a limit outside 1..10,000."""
    rows = select_rows(
        store,
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


def actions_of_incidents(store: Store, incident_ids: list[str]) -> dict[str, list[StoredAction]]:
    """Every action of each incident in ``incident_ids`` (one query), newest first; each
    id maps to a list, empty when it has no action."""
    out: dict[str, list[StoredAction]] = {i: [] for i in incident_ids}
    if not incident_ids:
        return out
    with store.cursor() as cur:
        rows = cur.execute(
            f"SELECT {_COLS} FROM actions WHERE incident_id IN "
            f"(SELECT unnest(?::VARCHAR[])) ORDER BY created_ns DESC, id",
            [incident_ids],
        ).fetchall()
    for r in rows:
        out[r[1]].append(_row(r))
    return out


def count_audit_events(store: Store, event: str, since_ns: int, target: str | None = None) -> int:
    """How many audit rows of ``event`` (of actions on ``target``, when given) have
    ``ts_ns >= since_ns``."""
    sql = (
        "SELECT count(*) FROM audit a JOIN actions x ON x.id = a.action_id "
        "WHERE a.event = ? AND a.ts_ns >= ?"
    )
    params: list[Any] = [event, since_ns]
    if target is not None:
        sql += " AND x.target = ?"
        params.append(target)
    with store.cursor() as cur:
        r = cur.execute(sql, params).fetchone()
    return int(r[0]) if r else 0


def last_change_ended_ns(store: Store, target: str, ended_states: tuple[str, ...]) -> int | None:
    """The newest ``updated_ns`` of an action on ``target`` that changed something (not a
    ``notify``, with a ``before`` value) and is now in one of ``ended_states``; None if none."""
    with store.cursor() as cur:
        r = cur.execute(
            "SELECT max(updated_ns) FROM actions WHERE target = ? AND kind <> 'notify' "
            "AND state IN (SELECT unnest(?::VARCHAR[])) AND before_json IS NOT NULL",
            [target, list(ended_states)],
        ).fetchone()
    return None if r is None or r[0] is None else int(r[0])


def audit_trail(store: Store, action_id: str) -> list[dict[str, Any]]:
    """The audit rows of one action, oldest first (insertion order breaks ties), as dicts
    with keys ``ts_ns`` (int), ``actor``, ``event`` (str) and ``detail`` (the parsed JSON)."""
    with store.cursor() as cur:
        rows = cur.execute(
            "SELECT ts_ns, actor, event, detail_json FROM audit WHERE action_id = ? "
            "ORDER BY ts_ns, rowid",
            [action_id],
        ).fetchall()
    return [
        {"ts_ns": r[0], "actor": r[1], "event": r[2], "detail": json.loads(r[3] or "{}")}
        for r in rows
    ]
