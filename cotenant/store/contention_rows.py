"""The ``contention`` table: ordinary contention, typed reads and upserts (schema 8).

One row per slowdown within the SLO that the incident book kept out of the incidents because
it was ordinary (:mod:`analysis.detector.verdicts`): the model's own traffic, or a
co-tenant's burst like the ones it has lately had. Rewritten in place (``INSERT OR REPLACE``
on ``id``) while the slowdown lasts, so the weekly report can count who slows whom even when
nobody was paged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cotenant.store.db import Store


@dataclass(frozen=True)
class Contention:
    """One ``contention`` row. Times in ns UTC; ``causes``: the diagnosis's causes as dicts
    (``kind``, ``culprit``, ``share``, ``evidence``)."""

    id: str
    model: str
    gpu: str
    indicator: str
    start_ns: int
    end_ns: int
    updated_ns: int
    reason: str  # own_load | recurring
    top_cause: str | None = None
    top_culprit: str | None = None
    causes: list[dict[str, Any]] = field(default_factory=list)


_COLS = (
    "id, model, gpu, indicator, start_ns, end_ns, updated_ns, reason, top_cause, top_culprit, "
    "causes_json"
)


def upsert_contention(store: Store, rows: Sequence[Contention]) -> None:
    """Insert each row, or replace the one with its ``id``, in one batch."""
    if not rows:
        return
    values = [
        (
            r.id,
            r.model,
            r.gpu,
            r.indicator,
            r.start_ns,
            r.end_ns,
            r.updated_ns,
            r.reason,
            r.top_cause,
            r.top_culprit,
            json.dumps(r.causes),
        )
        for r in rows
    ]
    with store.cursor() as cur:
        cur.executemany(
            f"INSERT OR REPLACE INTO contention ({_COLS}) VALUES ({', '.join('?' * 11)})", values
        )


def find_contention(store: Store, model: str, gpu: str, since_ns: int) -> list[Contention]:
    """The rows of (``model``, ``gpu``) ending at or after ``since_ns``, oldest first."""
    sql = (
        f"SELECT {_COLS} FROM contention WHERE model = ? AND gpu = ? AND end_ns >= ? "
        "ORDER BY start_ns"
    )
    with store.cursor() as cur:
        got = cur.execute(sql, [model, gpu, since_ns]).fetchall()
    return [
        Contention(
            id=r[0],
            model=r[1],
            gpu=r[2],
            indicator=r[3],
            start_ns=r[4],
            end_ns=r[5],
            updated_ns=r[6],
            reason=r[7],
            top_cause=r[8],
            top_culprit=r[9],
            causes=json.loads(r[10]) if r[10] else [],
        )
        for r in got
    ]
