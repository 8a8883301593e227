"""Rollups and retention, run on the writer thread: they never contend with its appends, and
the rollups have one writer (:mod:`store.writer` says who else writes, and why it is safe).

Rollups are per-minute aggregates (``request_rollup_1m``, ``gpu_rollup_1m``,
``process_rollup_1m``, ``load_rollup_1m``) recomputed from raw rows for every minute that
received rows since the last refresh, so late spans correct the minute they belong to. A
request belongs to the minute in which it completed (``ts_end_ns``). Rollups are kept far
longer than raw rows, so long ranges and weekly reports never scan raw requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import duckdb
import numpy as np

from cotenant.core.phases import PHASE_COLUMNS
from cotenant.store.db import Store
from cotenant.store.schema import TPOT_MS_SQL
from cotenant.store.settings import StoreSettings

log = logging.getLogger(__name__)

MINUTE_NS = 60_000_000_000
HOUR_NS = 3_600_000_000_000
DAY_NS = 24 * HOUR_NS

_PHASE_AVGS = ", ".join(f"avg({c}) AS {c}" for c in PHASE_COLUMNS)
_PHASE_COLS = ", ".join(PHASE_COLUMNS)

# raw table -> (rollup table, timestamp column, SELECT producing the rollup rows for the
# minutes listed in the temporary table _dirty(minute_ns)).
_ROLLUPS: dict[str, tuple[str, str, str]] = {
    "requests": (
        "request_rollup_1m",
        "ts_end_ns",
        f"""
        SELECT minute_ns, model, gpu, count, errors, latency_sum_ms, latency_max_ms,
               q[1] AS p50_ms, q[2] AS p90_ms, q[3] AS p95_ms, q[4] AS p99_ms, {_PHASE_COLS},
               batch_size_mean, prompt_tokens_sum, output_tokens_sum, ttft_p99_ms, tpot_p99_ms
        FROM (
            SELECT (ts_end_ns // {MINUTE_NS}) * {MINUTE_NS} AS minute_ns, model, gpu,
                   count(*) AS count, count(*) FILTER (WHERE status = 'error') AS errors,
                   sum(latency_ms) AS latency_sum_ms, max(latency_ms) AS latency_max_ms,
                   quantile_cont(latency_ms, [0.5, 0.9, 0.95, 0.99]) AS q, {_PHASE_AVGS},
                   avg(batch_size) AS batch_size_mean, sum(prompt_tokens) AS prompt_tokens_sum,
                   sum(output_tokens) AS output_tokens_sum,
                   quantile_cont(ttft_ms, 0.99) AS ttft_p99_ms,
                   quantile_cont({TPOT_MS_SQL}, 0.99) AS tpot_p99_ms
            FROM requests
            WHERE ts_end_ns >= $lo AND ts_end_ns < $hi
              AND (ts_end_ns // {MINUTE_NS}) * {MINUTE_NS} IN (SELECT minute_ns FROM _dirty)
            GROUP BY ALL)""",
    ),
    "gpu_samples": (
        "gpu_rollup_1m",
        "ts_ns",
        f"""
        SELECT (ts_ns // {MINUTE_NS}) * {MINUTE_NS} AS minute_ns, host, gpu,
               count(*) AS samples, avg(sm_util) AS sm_util, max(sm_util) AS sm_util_max,
               avg(mem_util) AS mem_util, max(mem_util) AS mem_util_max,
               avg(dram_active) AS dram_active, avg(pcie_tx_bps) AS pcie_tx_bps,
               avg(pcie_rx_bps) AS pcie_rx_bps, avg(nvlink_tx_bps) AS nvlink_tx_bps,
               avg(nvlink_rx_bps) AS nvlink_rx_bps, max(mem_used_bytes) AS mem_used_bytes_max,
               max(mem_total_bytes) AS mem_total_bytes, avg(power_w) AS power_w,
               max(temp_c) AS temp_c_max, avg(sm_clock_mhz) AS sm_clock_mhz,
               min(sm_clock_mhz) AS sm_clock_mhz_min, max(max_sm_clock_mhz) AS max_sm_clock_mhz,
               bit_or(clock_event_reasons) AS clock_event_reasons
        FROM gpu_samples
        WHERE ts_ns >= $lo AND ts_ns < $hi
          AND (ts_ns // {MINUTE_NS}) * {MINUTE_NS} IN (SELECT minute_ns FROM _dirty)
        GROUP BY ALL""",
    ),
    "process_samples": (
        "process_rollup_1m",
        "ts_ns",
        f"""
        SELECT (ts_ns // {MINUTE_NS}) * {MINUTE_NS} AS minute_ns, host, gpu, pid,
               any_value(process_name) AS process_name, any_value(model) AS model,
               count(*) AS samples, avg(sm_util) AS sm_util, max(sm_util) AS sm_util_max,
               avg(mem_util) AS mem_util, max(mem_used_bytes) AS mem_used_bytes_max,
               avg(cpu_cores) AS cpu_cores
        FROM process_samples
        WHERE ts_ns >= $lo AND ts_ns < $hi
          AND (ts_ns // {MINUTE_NS}) * {MINUTE_NS} IN (SELECT minute_ns FROM _dirty)
        GROUP BY host, gpu, pid, minute_ns""",
    ),
    "model_loads": (
        "load_rollup_1m",
        "ts_ns",
        f"""
        SELECT (ts_ns // {MINUTE_NS}) * {MINUTE_NS} AS minute_ns, host, gpu, replica, model, kind,
               sum(coalesce(loads, 1)) AS loads,
               sum(duration_ms * coalesce(loads, 1)) AS duration_ms_sum,
               max(duration_ms) AS duration_ms_max
        FROM model_loads
        WHERE ts_ns >= $lo AND ts_ns < $hi
          AND (ts_ns // {MINUTE_NS}) * {MINUTE_NS} IN (SELECT minute_ns FROM _dirty)
        GROUP BY ALL""",
    ),
}

_RAW_EXPIRED_META = "raw_expired_before_ns"

# table -> (timestamp column, retention class)
_RETENTION: dict[str, tuple[str, str]] = {
    "requests": ("ts_end_ns", "raw"),
    "gpu_samples": ("ts_ns", "raw"),
    "process_samples": ("ts_ns", "raw"),
    "model_loads": ("ts_ns", "raw"),
    "request_rollup_1m": ("minute_ns", "rollup"),
    "gpu_rollup_1m": ("minute_ns", "rollup"),
    "process_rollup_1m": ("minute_ns", "rollup"),
    "load_rollup_1m": ("minute_ns", "rollup"),
    "incidents": ("coalesce(end_ns, updated_ns)", "incident"),
    "contention": ("end_ns", "incident"),
    "actions": ("updated_ns", "incident"),
    "audit": ("ts_ns", "incident"),
    "alerts": ("received_ns", "incident"),
}


class Maintenance:
    """Keeps rollups fresh and expires old rows. Call only from the writer thread."""

    def __init__(
        self,
        store: Store,
        *,
        rollup_interval_s: float = StoreSettings.rollup_interval_s,
        retention_interval_s: float = StoreSettings.retention_interval_s,
        raw_retention_h: float = StoreSettings.raw_retention_h,
        rollup_retention_days: float = StoreSettings.rollup_retention_days,
        incident_retention_days: float = StoreSettings.incident_retention_days,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._store = store
        self._rollup_every_ns = int(rollup_interval_s * 1e9)
        self._retention_every_ns = int(retention_interval_s * 1e9)
        self._keep_ns = {
            "raw": int(raw_retention_h * HOUR_NS),
            "rollup": int(rollup_retention_days * DAY_NS),
            "incident": int(incident_retention_days * DAY_NS),
        }
        self._clock_ns = clock_ns
        self._dirty: dict[str, set[int]] = {t: set() for t in _ROLLUPS}
        # raw rows before this time may have been deleted by expire(); kept across restarts
        held = store.get_meta(_RAW_EXPIRED_META)
        self._raw_expired_before: int | None = None if held is None else int(held)
        now = clock_ns()
        self._last_rollup = now
        self._last_retention = now - self._retention_every_ns  # expire once soon after start
        self.recover()

    def recover(self) -> None:
        """Mark minutes with raw rows newer than the latest rollup, e.g. after a crash."""
        with self._store.cursor() as cur:
            for raw, (rollup, ts, _) in _ROLLUPS.items():
                row = cur.execute(f"SELECT max(minute_ns) FROM {rollup}").fetchone()
                since = row[0] if row and row[0] is not None else None
                where = "" if since is None else f"WHERE {ts} >= {int(since)}"
                minutes = cur.execute(
                    f"SELECT DISTINCT ({ts} // {MINUTE_NS}) * {MINUTE_NS} FROM {raw} {where}"
                ).fetchall()
                self._dirty[raw].update(int(m[0]) for m in minutes if m[0] is not None)

    def mark_dirty(self, table: str, minutes: Iterable[int] | np.ndarray) -> None:
        if table in self._dirty:
            self._dirty[table].update(int(m) for m in minutes)

    def tick(self, final: bool = False) -> None:
        """Refresh rollups and expire rows when their interval has passed (or ``final``)."""
        now = self._clock_ns()
        try:
            if final or now - self._last_rollup >= self._rollup_every_ns:
                self.refresh_rollups()
                self._last_rollup = now
            if not final and now - self._last_retention >= self._retention_every_ns:
                self.expire(now)
                self._last_retention = now
        except duckdb.Error as exc:  # maintenance failing must not stop ingest
            log.exception("store maintenance failed: %s", exc)

    def refresh_rollups(self) -> int:
        """Recompute the rollup rows of every dirty minute; returns minutes refreshed."""
        done = 0
        with self._store.cursor() as cur:
            for raw, (rollup, _, select) in _ROLLUPS.items():
                minutes = self._refreshable(cur, rollup, sorted(self._dirty[raw]))
                self._dirty[raw] = set()
                if not minutes:
                    continue
                dirty = np.asarray(minutes, dtype=np.int64)
                cur.execute("CREATE OR REPLACE TEMP TABLE _dirty (minute_ns BIGINT)")
                cur.execute("INSERT INTO _dirty SELECT unnest($m)", {"m": dirty.tolist()})
                cur.execute("BEGIN")
                try:
                    cur.execute(
                        f"DELETE FROM {rollup} WHERE minute_ns IN (SELECT minute_ns FROM _dirty)"
                    )
                    cur.execute(
                        f"INSERT INTO {rollup} BY NAME {select}",
                        {"lo": int(dirty[0]), "hi": int(dirty[-1]) + MINUTE_NS},
                    )
                    cur.execute("COMMIT")
                except duckdb.Error:
                    cur.execute("ROLLBACK")
                    self._dirty[raw].update(minutes)
                    raise
                done += len(minutes)
        return done

    def _refreshable(
        self, cur: duckdb.DuckDBPyConnection, rollup: str, minutes: list[int]
    ) -> list[int]:
        """``minutes`` less those whose raw rows were (partly) expired but whose rollup remains.

        Recomputing such a minute from the raw rows left (e.g. one very late span) would
        replace its rollup, the only full record of that minute, with a fragment.
        """
        cut = self._raw_expired_before
        old = [m for m in minutes if cut is not None and m < cut]
        if not old:
            return minutes
        rows = cur.execute(
            f"SELECT DISTINCT minute_ns FROM {rollup} WHERE minute_ns IN (SELECT unnest($m))",
            {"m": old},
        ).fetchall()
        keep = {int(r[0]) for r in rows}
        if keep:
            log.info("not recomputing %d expired minutes of %s from late rows", len(keep), rollup)
        return [m for m in minutes if m not in keep]

    def expire(self, now_ns: int | None = None) -> dict[str, int]:
        """Delete rows older than their table's retention; returns rows deleted per table."""
        now = self._clock_ns() if now_ns is None else now_ns
        deleted: dict[str, int] = {}
        with self._store.cursor() as cur:
            for table, (ts, klass) in _RETENTION.items():
                cutoff = now - self._keep_ns[klass]
                row = cur.execute(f"DELETE FROM {table} WHERE {ts} < $c", {"c": cutoff}).fetchone()
                deleted[table] = int(row[0]) if row else 0
        raw_cut = now - self._keep_ns["raw"]
        if self._raw_expired_before is None or raw_cut > self._raw_expired_before:
            self._raw_expired_before = raw_cut
            self._store.set_meta(_RAW_EXPIRED_META, str(raw_cut))
        if any(deleted.values()):
            log.info("retention deleted %s", {k: v for k, v in deleted.items() if v})
        return deleted
