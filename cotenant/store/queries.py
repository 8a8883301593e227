"""Typed read queries over the store. Callers use these, not SQL of their own."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa

from cotenant.core.errors import QueryError, UsageError
from cotenant.core.timerange import TimeRange
from cotenant.store.db import Store

MAX_LIMIT = 100_000


def _where(
    clauses: list[str],
    params: dict[str, Any],
    rng: TimeRange,
    col: str,
    model: str | None,
    gpu: str | None = None,
) -> str:
    if rng.since_ns is not None:
        clauses.append(f"{col} >= $since")
        params["since"] = rng.since_ns
    if rng.until_ns is not None:
        clauses.append(f"{col} < $until")
        params["until"] = rng.until_ns
    if model is not None:
        clauses.append("model = $model")
        params["model"] = model
    if gpu is not None:
        clauses.append("gpu = $gpu")
        params["gpu"] = gpu
    return ("WHERE " + " AND ".join(clauses)) if clauses else ""


def requests_table(
    store: Store,
    rng: TimeRange,
    *,
    model: str | None = None,
    gpu: str | None = None,
    limit: int = 1000,
) -> pa.Table:
    """Raw requests completed in ``rng`` (newest first), at most ``limit`` rows."""
    if not 1 <= limit <= MAX_LIMIT:
        raise QueryError(f"limit {limit} must be between 1 and {MAX_LIMIT}")
    params: dict[str, Any] = {"limit": limit}
    where = _where([], params, rng, "ts_end_ns", model, gpu)
    with store.cursor() as cur:
        return cur.sql(
            f"SELECT * FROM requests {where} ORDER BY ts_end_ns DESC LIMIT $limit", params=params
        ).to_arrow_table()


def request_latencies(store: Store) -> pa.Table:
    """Every completed request's ``model``, ``ts_end_ns`` and ``latency_ms``, unlimited: for
    scoring one simulated run held in a store (the benchmarks)."""
    with store.cursor() as cur:
        return cur.sql("SELECT model, ts_end_ns, latency_ms FROM requests").to_arrow_table()


def requests_rows(
    store: Store,
    rng: TimeRange,
    *,
    model: str | None = None,
    gpu: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """Like :func:`requests_table`, as JSON-ready dicts: a non-finite float (NaN, or an
    infinity a store written before ingest refused them may hold) becomes None, so the
    answer always serialises."""
    rows: list[dict[str, Any]] = requests_table(
        store, rng, model=model, gpu=gpu, limit=limit
    ).to_pylist()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float) and not math.isfinite(v):
                r[k] = None
    return rows


MAX_SLOWEST = 1000


def slowest_requests(
    store: Store, rng: TimeRange, model: str, *, gpu: str | None = None, limit: int = 20
) -> list[dict[str, Any]]:
    """The ``limit`` slowest requests of ``model`` (on ``gpu`` when given) completed in
    ``rng`` (both ends required), slowest first, as JSON-ready dicts (non-finite floats as
    None). The agent's drill-down. QueryError for an open range or a limit outside
    1..MAX_SLOWEST."""
    if rng.since_ns is None or rng.until_ns is None:
        raise QueryError("since and until are both required")
    if not 1 <= limit <= MAX_SLOWEST:
        raise QueryError(f"limit {limit} must be between 1 and {MAX_SLOWEST}")
    params: dict[str, Any] = {"limit": limit}
    where = _where([], params, rng, "ts_end_ns", model, gpu)
    with store.cursor() as cur:
        rows: list[dict[str, Any]] = (
            cur.sql(
                f"SELECT * FROM requests {where} ORDER BY latency_ms DESC, ts_end_ns DESC "
                "LIMIT $limit",
                params=params,
            )
            .to_arrow_table()
            .to_pylist()
        )
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float) and not math.isfinite(v):
                r[k] = None
    return rows


def request_count(store: Store, rng: TimeRange | None = None, *, model: str | None = None) -> int:
    params: dict[str, Any] = {}
    where = _where([], params, rng or TimeRange(), "ts_end_ns", model)
    with store.cursor() as cur:
        row = cur.execute(f"SELECT count(*) FROM requests {where}", params).fetchone()
    return int(row[0]) if row else 0


def requests_from(store: Store, source: str) -> int:
    """Request rows whose ``source`` (the span shape or importer that wrote them) is
    ``source``."""
    with store.cursor() as cur:
        row = cur.execute(
            "SELECT count(*) FROM requests WHERE source = $s", {"s": source}
        ).fetchone()
    return int(row[0]) if row else 0


ROLLUP_TABLES = ("request_rollup_1m", "gpu_rollup_1m", "process_rollup_1m", "load_rollup_1m")


def rollup_minutes(store: Store, table: str, rng: TimeRange) -> pa.Table:
    """Every row of the rollup ``table`` (one of :data:`ROLLUP_TABLES`) whose minute starts in
    ``rng``, ordered by minute. Raises UsageError for another table."""
    if table not in ROLLUP_TABLES:
        raise UsageError(f"{table!r} is not a rollup table ({', '.join(ROLLUP_TABLES)})")
    params: dict[str, Any] = {}
    where = _where([], params, rng, "minute_ns", None)
    with store.cursor() as cur:
        return cur.sql(
            f"SELECT * FROM {table} {where} ORDER BY minute_ns", params=params
        ).to_arrow_table()


def request_rollups(
    store: Store, rng: TimeRange, *, model: str | None = None, gpu: str | None = None
) -> pa.Table:
    """Per-minute per-(model, gpu) rollup rows whose minute starts in ``rng``."""
    params: dict[str, Any] = {}
    where = _where([], params, rng, "minute_ns", model, gpu)
    with store.cursor() as cur:
        return cur.sql(
            f"SELECT * FROM request_rollup_1m {where} ORDER BY minute_ns, model, gpu", params=params
        ).to_arrow_table()


def models(store: Store, rng: TimeRange | None = None) -> list[str]:
    """Models seen in the rollups over ``rng``."""
    params: dict[str, Any] = {}
    where = _where([], params, rng or TimeRange(), "minute_ns", None)
    with store.cursor() as cur:
        rows = cur.execute(
            f"SELECT DISTINCT model FROM request_rollup_1m {where} ORDER BY 1", params
        ).fetchall()
    return [str(r[0]) for r in rows if r[0] is not None]


def rollup_model_gpus(store: Store, rng: TimeRange) -> list[tuple[str, str]]:
    """Distinct (model, gpu) pairs of the rollup rows whose minute starts in ``rng``, sorted;
    a null GPU reads as ``""``. The rollup twin of ``StoreSource.model_gpus``, for ranges
    whose raw rows may have expired."""
    params: dict[str, Any] = {}
    where = _where([], params, rng, "minute_ns", None)
    with store.cursor() as cur:
        rows = cur.execute(
            f"SELECT DISTINCT model, coalesce(gpu, '') FROM request_rollup_1m {where} "
            "ORDER BY 1, 2",
            params,
        ).fetchall()
    return [(str(m), str(g)) for m, g in rows]


def pending_spans(store: Store) -> list[tuple[str, bytes]]:
    with store.cursor() as cur:
        rows = cur.execute("SELECT trace_id, payload FROM pending_spans").fetchall()
    return [(str(t), bytes(p)) for t, p in rows]


def replace_pending_spans(store: Store, items: list[tuple[str, bytes]], now_ns: int) -> None:
    """Replace the saved pending child spans with ``items`` (at shutdown)."""
    with store.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("DELETE FROM pending_spans")
        if items:
            cur.executemany(
                "INSERT INTO pending_spans VALUES (?, ?, ?)", [(t, now_ns, p) for t, p in items]
            )
        cur.execute("COMMIT")


def select_rows(
    store: Store,
    table: str,
    columns: str,
    *,
    where: dict[str, Any | tuple[Any, ...] | None],
    order_by: str,
    limit: int,
) -> list[tuple[Any, ...]]:
    """Rows of ``table`` (``columns``, a trusted column list) matching every filter in
    ``where`` whose value is not None — ``"col >= ?"`` style keys take the value as given,
    bare column names test equality, a tuple value tests membership — newest first by
    ``order_by``. For the record books (incidents, actions, alerts): one place for their
    filter SQL. Raises QueryError for a limit outside 1..10,000."""
    if not 1 <= limit <= 10_000:
        raise QueryError(f"limit {limit} must be between 1 and 10000")
    clauses: list[str] = []
    params: list[Any] = []
    for key, value in where.items():
        if value is None:
            continue
        if isinstance(value, tuple):
            clauses.append(f"{key} IN ({', '.join('?' * len(value))})" if value else "FALSE")
            params.extend(value)
        else:
            clauses.append(key if "?" in key else f"{key} = ?")
            params.append(value)
    sql = f"SELECT {columns} FROM {table}"
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += f" ORDER BY {order_by} LIMIT {int(limit)}"
    with store.cursor() as cur:
        return list(cur.execute(sql, params).fetchall())
