"""The dashboard's small reads that are not windowed series: what exists, the "now" tiles.

Windowed series come from :class:`store.source.StoreSource`, incidents from
:mod:`store.incident_rows`; these are the rest of what :class:`dashboard.data.DashboardData`
shows. Each is one small aggregation; none returns raw rows. Times are ns UTC.
"""

from __future__ import annotations

from typing import Any

from cotenant.store.db import Store

GPU_TILE_KEYS = (
    "gpu",
    "sm_util",
    "mem_util",
    "pcie_bps",
    "power_w",
    "sm_clock_mhz",
    "max_sm_clock_mhz",
    "clock_event_reasons",
    "mem_used_bytes",
    "mem_total_bytes",
)
"""Keys of a GPU tile: mean SM / memory-controller util (%), PCIe TX + RX (bytes/s), power (W),
SM clock (MHz); max clock (MHz); OR of the clock-event reasons; peak memory used and total
(bytes)."""

_GPU_TILE_COLS = (
    "gpu, avg(sm_util), avg(mem_util), avg(pcie_tx_bps + pcie_rx_bps), avg(power_w), "
    "avg(sm_clock_mhz), max(max_sm_clock_mhz), bit_or(clock_event_reasons), "
    "max(mem_used_bytes{mx}), max(mem_total_bytes)"
)


def _rows(store: Store, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    with store.cursor() as cur:
        return cur.execute(sql, params or {}).fetchall()


def known_models(store: Store) -> list[str]:
    """Every model in the rollups, then up to 64 distinct models of the raw requests (not yet
    rolled up); a name may appear twice."""
    rows = _rows(store, "SELECT DISTINCT model FROM request_rollup_1m WHERE model NOTNULL")
    rows += _rows(store, "SELECT DISTINCT model FROM requests WHERE model NOTNULL LIMIT 64")
    return [str(r[0]) for r in rows]


def has_requests(store: Store) -> bool:
    """Whether any request (raw or rolled up) is stored."""
    return bool(
        _rows(store, "SELECT 1 FROM request_rollup_1m LIMIT 1")
        or _rows(store, "SELECT 1 FROM requests LIMIT 1")
    )


def has_gpu_samples(store: Store) -> bool:
    """Whether any GPU sample (raw or rolled up) is stored."""
    return bool(
        _rows(store, "SELECT 1 FROM gpu_rollup_1m LIMIT 1")
        or _rows(store, "SELECT 1 FROM gpu_samples LIMIT 1")
    )


def earliest_data_ns(store: Store) -> int | None:
    """The oldest thing stored: a request's start, a GPU sample, or a rollup minute's start;
    None when the store is empty. (DuckDB's ``least`` skips nulls.)"""
    rows = _rows(
        store,
        "SELECT least((SELECT min(ts_start_ns) FROM requests),"
        " (SELECT min(minute_ns) FROM request_rollup_1m),"
        " (SELECT min(ts_ns) FROM gpu_samples),"
        " (SELECT min(minute_ns) FROM gpu_rollup_1m))",
    )
    return None if not rows or rows[0][0] is None else int(rows[0][0])


def recent_latency(store: Store, lo: int, hi: int) -> dict[str, tuple[int, float | None]]:
    """Per model, from the raw requests completed in ``[lo, hi)``: (how many, their exact p99
    in ms; None when it cannot be computed)."""
    rows = _rows(
        store,
        "SELECT model, count(*), quantile_cont(latency_ms, 0.99) FROM requests "
        "WHERE ts_end_ns >= $lo AND ts_end_ns < $hi GROUP BY model",
        {"lo": lo, "hi": hi},
    )
    return {str(m): (int(n), float(p99) if p99 is not None else None) for m, n, p99 in rows}


def rollup_models(store: Store, lo: int, hi: int) -> set[str]:
    """Models with a rollup row whose minute starts in ``[lo, hi)`` (a null model as
    ``"None"``)."""
    rows = _rows(
        store,
        "SELECT DISTINCT model FROM request_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi",
        {"lo": lo, "hi": hi},
    )
    return {str(r[0]) for r in rows}


def gpu_tiles_raw(store: Store, lo: int, hi: int) -> list[dict[str, Any]]:
    """Per GPU, sorted: the :data:`GPU_TILE_KEYS` over raw samples in ``[lo, hi)`` (empty
    when the raw samples of that range have expired or never were)."""
    rows = _rows(
        store,
        f"SELECT {_GPU_TILE_COLS.format(mx='')} FROM gpu_samples "
        "WHERE ts_ns >= $lo AND ts_ns < $hi GROUP BY gpu ORDER BY gpu",
        {"lo": lo, "hi": hi},
    )
    return [dict(zip(GPU_TILE_KEYS, r, strict=True)) for r in rows]


def gpu_tiles_rollup(store: Store, lo: int, hi: int) -> list[dict[str, Any]]:
    """Per GPU, sorted: the :data:`GPU_TILE_KEYS` of the newest rollup minute starting in
    ``[lo, hi)`` (the memory peak is the minute's maximum)."""
    rows = _rows(
        store,
        f"SELECT {_GPU_TILE_COLS.format(mx='_max')} FROM gpu_rollup_1m "
        "WHERE minute_ns = (SELECT max(minute_ns) FROM gpu_rollup_1m "
        "WHERE minute_ns >= $lo AND minute_ns < $hi) GROUP BY gpu ORDER BY gpu",
        {"lo": lo, "hi": hi},
    )
    return [dict(zip(GPU_TILE_KEYS, r, strict=True)) for r in rows]
