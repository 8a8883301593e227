"""``StoreSource``: :class:`cotenant.core.readers.MetricSource` over the embedded DuckDB store
(spans and NVML samples). The other implementation is
``cotenant.collectors.prometheus.source.PrometheusSource``; both return the frames of
:mod:`cotenant.core.frames`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cotenant.core.frames import (
    GPU_WINDOWS,
    LOCK_WAITS,
    PROCESS_WINDOWS,
    REQUEST_WINDOWS,
    SERVING_WINDOWS,
    TOKEN_WINDOWS,
)
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.core.readers import check_range
from cotenant.core.timerange import TimeRange
from cotenant.store.db import Store
from cotenant.store.rollup_quantiles import quantile_estimate_sql
from cotenant.store.schema import TPOT_MS_SQL

MINUTE_NS = 60_000_000_000


class StoreSource:
    """:class:`MetricSource` over the embedded store. Steps that are whole minutes read the
    per-minute rollups (so long ranges never scan raw rows); other steps read raw rows.

    From rollups, quantiles of windows longer than a minute are the count-weighted mean of the
    per-minute quantiles (:func:`store.rollup_quantiles.quantile_estimate_sql`: a smoother
    estimate, not a bound; exact for one-minute steps, where each (window, model, GPU) is one
    rollup row)."""

    has_spans = True

    def __init__(self, store: Store) -> None:
        self._store = store

    def _query(self, sql: str, params: dict[str, Any], schema: pa.Schema) -> pa.Table:
        with self._store.cursor() as cur:
            t = cur.sql(sql, params=params).to_arrow_table()
        return t.select(schema.names).cast(schema)

    def model_gpus(self, rng: TimeRange) -> list[tuple[str, str]]:
        lo, hi, _ = check_range(rng, 1.0)
        with self._store.cursor() as cur:
            rows = cur.execute(
                "SELECT DISTINCT model, coalesce(gpu, '') FROM requests "
                "WHERE ts_end_ns >= $lo AND ts_end_ns < $hi ORDER BY 1, 2",
                {"lo": lo, "hi": hi},
            ).fetchall()
        return [(str(m), str(g)) for m, g in rows]

    def replicas(self, rng: TimeRange) -> dict[tuple[str, str], str]:
        lo, hi, _ = check_range(rng, 1.0)
        with self._store.cursor() as cur:
            rows = cur.execute(
                "SELECT model, coalesce(gpu, ''), arg_max(replica, n) FROM ("
                "  SELECT model, gpu, replica, count(*) AS n FROM requests"
                "  WHERE ts_end_ns >= $lo AND ts_end_ns < $hi AND replica IS NOT NULL"
                "  GROUP BY ALL) GROUP BY 1, 2",
                {"lo": lo, "hi": hi},
            ).fetchall()
        return {(str(m), str(g)): str(r) for m, g, r in rows}

    def request_windows(
        self, rng: TimeRange, step_s: float, model: str | None = None, gpu: str | None = None
    ) -> pa.Table:
        lo, hi, step = check_range(rng, step_s)
        p: dict[str, Any] = {"lo": lo, "hi": hi, "step": step, "secs": step / 1e9}
        mf = ""
        if model is not None:
            mf = "AND model = $model"
            p["model"] = model
        if gpu is not None:
            mf += " AND gpu = $gpu"
            p["gpu"] = gpu
        if step % MINUTE_NS == 0:
            phases = ", ".join(f"sum({c} * count) / sum(count) AS {c}" for c in PHASE_COLUMNS)
            sql = f"""
                SELECT (minute_ns // $step) * $step AS ts_ns, model, gpu,
                       sum(count)::DOUBLE AS count, sum(count) / $secs AS rate_rps,
                       sum(count) / $secs AS arrival_rps,
                       sum(errors)::DOUBLE AS errors, sum(latency_sum_ms) / sum(count) AS mean_ms,
                       {quantile_estimate_sql("p50_ms")} AS p50_ms,
                       {quantile_estimate_sql("p95_ms")} AS p95_ms,
                       {quantile_estimate_sql("p99_ms")} AS p99_ms, {phases},
                       sum(batch_size_mean * count) / sum(count) AS batch_size_mean
                FROM request_rollup_1m
                WHERE minute_ns >= $lo AND minute_ns < $hi {mf}
                GROUP BY ALL ORDER BY ts_ns, model, gpu"""
        else:
            phases = ", ".join(f"avg({c}) AS {c}" for c in PHASE_COLUMNS)
            sql = f"""
                SELECT ts_ns, model, gpu, coalesce(count, 0) AS count,
                       coalesce(rate_rps, 0) AS rate_rps,
                       coalesce(a.arrivals, 0) / $secs AS arrival_rps,
                       coalesce(errors, 0) AS errors, mean_ms,
                       q[1] AS p50_ms, q[2] AS p95_ms, q[3] AS p99_ms,
                       {", ".join(PHASE_COLUMNS)}, batch_size_mean
                FROM (
                    SELECT (ts_end_ns // $step) * $step AS ts_ns, model, gpu,
                           count(*)::DOUBLE AS count, count(*) / $secs AS rate_rps,
                           (count(*) FILTER (WHERE status = 'error'))::DOUBLE AS errors,
                           avg(latency_ms) AS mean_ms,
                           quantile_cont(latency_ms, [0.5, 0.95, 0.99]) AS q, {phases},
                           avg(batch_size) AS batch_size_mean
                    FROM requests WHERE ts_end_ns >= $lo AND ts_end_ns < $hi {mf}
                    GROUP BY ALL) c
                FULL JOIN (  -- arrivals in windows where nothing completed count too
                    SELECT (ts_start_ns // $step) * $step AS ts_ns, model, gpu,
                           count(*)::DOUBLE AS arrivals
                    FROM requests WHERE ts_start_ns >= $lo AND ts_start_ns < $hi {mf}
                    GROUP BY ALL) a USING (ts_ns, model, gpu)
                ORDER BY ts_ns, model, gpu"""
        return self._query(sql, p, REQUEST_WINDOWS)

    def request_counts(self, rng: TimeRange, gpu: str) -> tuple[int, int] | None:
        lo, hi, _ = check_range(rng, 1.0)
        with self._store.cursor() as cur:
            row = cur.execute(
                "SELECT count(*) FILTER (WHERE ts_end_ns >= $lo AND ts_end_ns < $hi), "
                "count(*) FILTER (WHERE ts_start_ns >= $lo AND ts_start_ns < $hi) "
                "FROM requests WHERE gpu = $gpu AND ((ts_end_ns >= $lo AND ts_end_ns < $hi) "
                "OR (ts_start_ns >= $lo AND ts_start_ns < $hi))",
                {"lo": lo, "hi": hi, "gpu": gpu},
            ).fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def gpu_windows(self, rng: TimeRange, step_s: float, gpu: str | None = None) -> pa.Table:
        lo, hi, step = check_range(rng, step_s)
        p: dict[str, Any] = {"lo": lo, "hi": hi, "step": step}
        gf = ""
        if gpu is not None:
            gf = "AND gpu = $gpu"
            p["gpu"] = gpu
        if step % MINUTE_NS == 0:
            sql = f"""
                SELECT (minute_ns // $step) * $step AS ts_ns, host, gpu,
                       avg(sm_util) AS sm_util, avg(mem_util) AS mem_util,
                       avg(dram_active) AS dram_active, avg(pcie_tx_bps) AS pcie_tx_bps,
                       avg(pcie_rx_bps) AS pcie_rx_bps, avg(nvlink_tx_bps) AS nvlink_tx_bps,
                       avg(nvlink_rx_bps) AS nvlink_rx_bps,
                       max(mem_used_bytes_max) AS mem_used_bytes,
                       max(mem_total_bytes) AS mem_total_bytes, avg(power_w) AS power_w,
                       max(temp_c_max) AS temp_c, avg(sm_clock_mhz) AS sm_clock_mhz,
                       max(max_sm_clock_mhz) AS max_sm_clock_mhz,
                       bit_or(clock_event_reasons) AS clock_event_reasons
                FROM gpu_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi {gf}
                GROUP BY ALL ORDER BY ts_ns, host, gpu"""
        else:
            sql = f"""
                SELECT (ts_ns // $step) * $step AS ts_ns, host, gpu,
                       avg(sm_util) AS sm_util, avg(mem_util) AS mem_util,
                       avg(dram_active) AS dram_active, avg(pcie_tx_bps) AS pcie_tx_bps,
                       avg(pcie_rx_bps) AS pcie_rx_bps, avg(nvlink_tx_bps) AS nvlink_tx_bps,
                       avg(nvlink_rx_bps) AS nvlink_rx_bps, avg(mem_used_bytes) AS mem_used_bytes,
                       max(mem_total_bytes) AS mem_total_bytes, avg(power_w) AS power_w,
                       avg(temp_c) AS temp_c, avg(sm_clock_mhz) AS sm_clock_mhz,
                       max(max_sm_clock_mhz) AS max_sm_clock_mhz,
                       bit_or(clock_event_reasons) AS clock_event_reasons
                FROM gpu_samples WHERE ts_ns >= $lo AND ts_ns < $hi {gf}
                GROUP BY ALL ORDER BY ts_ns, host, gpu"""
        return self._query(sql, p, GPU_WINDOWS)

    def process_windows(
        self,
        rng: TimeRange,
        step_s: float,
        gpu: str | None = None,
        hosts: Sequence[str] | None = None,
    ) -> pa.Table:
        lo, hi, step = check_range(rng, step_s)
        p: dict[str, Any] = {"lo": lo, "hi": hi, "step": step}
        gf = ""
        if gpu is not None:
            gf = "AND gpu = $gpu"
            p["gpu"] = gpu
        if hosts is not None:
            gf += " AND list_contains($hosts, host)"
            p["hosts"] = list(hosts)
        if step % MINUTE_NS == 0:
            sql = f"""
                SELECT (minute_ns // $step) * $step AS ts_ns, host, gpu, pid,
                       any_value(process_name) AS process_name, any_value(model) AS model,
                       avg(sm_util) AS sm_util, avg(mem_util) AS mem_util,
                       max(mem_used_bytes_max) AS mem_used_bytes, avg(cpu_cores) AS cpu_cores,
                       NULL::DOUBLE AS cpu_freq_mhz, NULL::DOUBLE AS cpu_max_freq_mhz
                FROM process_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi {gf}
                GROUP BY ts_ns, host, gpu, pid ORDER BY ts_ns, host, gpu, pid"""
        else:
            sql = f"""
                SELECT (ts_ns // $step) * $step AS ts_ns, host, gpu, pid,
                       any_value(process_name) AS process_name, any_value(model) AS model,
                       avg(sm_util) AS sm_util, avg(mem_util) AS mem_util,
                       avg(mem_used_bytes) AS mem_used_bytes, avg(cpu_cores) AS cpu_cores,
                       avg(cpu_freq_mhz) AS cpu_freq_mhz, avg(cpu_max_freq_mhz) AS cpu_max_freq_mhz
                FROM process_samples WHERE ts_ns >= $lo AND ts_ns < $hi {gf}
                GROUP BY 1, host, gpu, pid ORDER BY ts_ns, host, gpu, pid"""
        return self._query(sql, p, PROCESS_WINDOWS)

    def serving_windows(self, rng: TimeRange, step_s: float, model: str | None = None) -> pa.Table:
        check_range(rng, step_s)
        return SERVING_WINDOWS.empty_table()  # engine gauges come only from exporters

    def token_windows(
        self, rng: TimeRange, step_s: float, gpu: str | None = None, *, lengths: bool = False
    ) -> pa.Table:
        """From raw rows at any step (token counts and TTFT are not rolled up): only as far
        back as raw requests are kept (``[store] retention``)."""
        lo, hi, step = check_range(rng, step_s)
        p: dict[str, Any] = {"lo": lo, "hi": hi, "step": step}
        gf = ""
        if gpu is not None:
            gf = "AND gpu = $gpu"
            p["gpu"] = gpu

        def p99(col: str) -> str:
            return f"quantile_cont({col}, 0.99)" if lengths else "NULL::DOUBLE"

        sql = f"""
            SELECT (ts_end_ns // $step) * $step AS ts_ns, model, gpu, count(*)::DOUBLE AS count,
                   quantile_cont(ttft_ms, 0.99) AS ttft_p99_ms, avg(ttft_ms) AS ttft_mean_ms,
                   quantile_cont(tpot, 0.99) AS tpot_p99_ms, avg(tpot) AS tpot_mean_ms,
                   avg(prompt_tokens) AS prompt_tokens_mean,
                   avg(output_tokens) AS output_tokens_mean,
                   {p99("prompt_tokens")} AS prompt_tokens_p99,
                   {p99("output_tokens")} AS output_tokens_p99
            FROM (
                SELECT ts_end_ns, model, gpu, ttft_ms, prompt_tokens, output_tokens,
                       {TPOT_MS_SQL} AS tpot
                FROM requests
                WHERE ts_end_ns >= $lo AND ts_end_ns < $hi AND output_tokens > 0 {gf})
            GROUP BY ALL ORDER BY ts_ns, model, gpu"""
        return self._query(sql, p, TOKEN_WINDOWS)

    def lock_waits(self, rng: TimeRange, model: str) -> pa.Table:
        lo, hi, _ = check_range(rng, 1.0)
        sql = """
            SELECT lock_name, lock_holder, count(*) AS requests, sum(lock_wait_ms) AS wait_ms_sum
            FROM requests
            WHERE ts_end_ns >= $lo AND ts_end_ns < $hi AND model = $model
              AND lock_wait_ms > 0 AND lock_name IS NOT NULL
            GROUP BY ALL ORDER BY wait_ms_sum DESC"""
        return self._query(sql, {"lo": lo, "hi": hi, "model": model}, LOCK_WAITS)
