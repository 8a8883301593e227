"""The weekly report's reads of per-minute rollups in the embedded store.

:class:`cotenant.core.week_reads.WeekRollups` is what :mod:`reports.compute` asks of a week's
minutes. Each answer is a handful of small rows, so where the minutes are stored decides where
they are reduced:

* :class:`StoreWeekRollups` (embedded mode): DuckDB over the store's ``request_rollup_1m``,
  ``gpu_rollup_1m`` and ``process_rollup_1m``;
* ``collectors.prometheus.week.PromQLWeekRollups`` (fleet mode): PromQL over the recording
  rules' minute series, so a week of a whole cluster is reduced inside Prometheus.

Incidents, actions and the audit stay in the store in both modes
(:class:`store.report_queries.ReportQueries`). Times are ns UTC, latencies ms, hours as named.

Per-minute p99 over several rows (GPUs): SLO minutes use :func:`store.rollup_quantiles.
quantile_upper_bound_sql` (met only when every GPU met it); the p99 around an action uses
:func:`store.rollup_quantiles.quantile_estimate_sql` (the count-weighted level).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cotenant.core.slos import SloTable, breach_sql
from cotenant.core.week_reads import GpuThresholds
from cotenant.store.db import Store
from cotenant.store.report_queries import dict_rows
from cotenant.store.rollup_quantiles import quantile_estimate_sql, quantile_upper_bound_sql

_SLO_OF_MODEL = "CASE WHEN slo_model IS NULL THEN $default ELSE slo.slo_ms END"
"""A model's e2e SLO in the week query: its own, else the default (NULL: none)."""


class StoreWeekRollups:
    """:class:`WeekRollups` over an embedded store's rollup tables, one DuckDB query each."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def model_weeks(
        self, lo: int, hi: int, slos: SloTable, *, detail: bool = True
    ) -> dict[str, dict[str, Any]]:
        rows = dict_rows(
            self._store,
            f"""
            WITH m AS (
                SELECT minute_ns, model, sum(count) AS n, sum(errors) AS e,
                       {quantile_upper_bound_sql("p99_ms")} AS p99
                FROM request_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi
                GROUP BY minute_ns, model),
            slo AS (SELECT unnest($names::VARCHAR[]) AS slo_model,
                           unnest($values::DOUBLE[]) AS slo_ms)
            SELECT m.model AS model, sum(n)::BIGINT AS requests, sum(e)::BIGINT AS errors,
                   count(*) FILTER (WHERE n > 0) AS minutes,
                   count(*) FILTER (WHERE n > 0 AND NOT {breach_sql("p99", _SLO_OF_MODEL)})
                        AS met,
                   max(n) / nullif(median(n), 0) AS burst
            FROM m LEFT JOIN slo ON slo_model = m.model GROUP BY m.model ORDER BY 1""",
            {
                "lo": lo,
                "hi": hi,
                "names": list(slos.explicit),
                "values": [slos.of(m) for m in slos.explicit],
                "default": slos.default if slos.default > 0 else None,
            },
        )
        return {str(r.pop("model")): r for r in rows}

    def token_slo_weeks(
        self, lo: int, hi: int, slo_ms: Mapping[str, Mapping[str, float]]
    ) -> list[dict[str, Any]]:
        ttft, tpot = dict(slo_ms.get("ttft", {})), dict(slo_ms.get("tpot", {}))
        names = sorted(set(ttft) | set(tpot))
        if not names:
            return []
        return dict_rows(
            self._store,
            f"""
            WITH m AS (
                SELECT minute_ns, model, max(ttft_p99_ms) AS ttft, max(tpot_p99_ms) AS tpot
                FROM request_rollup_1m
                WHERE minute_ns >= $lo AND minute_ns < $hi AND model IN (SELECT unnest($names))
                GROUP BY minute_ns, model),
            slo AS (SELECT unnest($names::VARCHAR[]) AS model,
                           unnest($ttft::DOUBLE[]) AS ttft_slo,
                           unnest($tpot::DOUBLE[]) AS tpot_slo)
            SELECT model,
                   count(ttft) AS ttft_minutes,
                   count(*) FILTER (WHERE NOT {breach_sql("ttft", "ttft_slo")}) AS ttft_met,
                   count(tpot) AS tpot_minutes,
                   count(*) FILTER (WHERE NOT {breach_sql("tpot", "tpot_slo")}) AS tpot_met
            FROM m JOIN slo USING (model)
            GROUP BY model HAVING count(ttft) + count(tpot) > 0
            ORDER BY model""",
            {
                "lo": lo,
                "hi": hi,
                "names": names,
                "ttft": [ttft.get(n) for n in names],
                "tpot": [tpot.get(n) for n in names],
            },
        )

    def gpu_weeks(self, lo: int, hi: int, t: GpuThresholds) -> list[dict[str, Any]]:
        return dict_rows(
            self._store,
            """
            WITH g AS (
                SELECT host, gpu, count(*) / 60.0 AS sampled,
                    count(*) FILTER (WHERE sm_util >= $sm) / 60.0 AS sm_h,
                    count(*) FILTER (WHERE coalesce(dram_active, mem_util / 100.0) >= $dram)
                        / 60.0 AS dram_h,
                    count(*) FILTER (WHERE coalesce(pcie_tx_bps, 0) + coalesce(pcie_rx_bps, 0)
                        >= $pcie) / 60.0 AS pcie_h,
                    count(*) FILTER (WHERE coalesce(clock_event_reasons, 0) & $bits <> 0)
                        / 60.0 AS thr_h,
                    count(*) FILTER (WHERE mem_used_bytes_max >= $mem * mem_total_bytes)
                        / 60.0 AS full_h
                FROM gpu_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi
                GROUP BY host, gpu),
            tenants AS (
                SELECT minute_ns, gpu, model AS tenant, true AS is_model FROM request_rollup_1m
                WHERE minute_ns >= $lo AND minute_ns < $hi AND count > 0
                UNION
                SELECT minute_ns, gpu, process_name, false FROM process_rollup_1m
                WHERE minute_ns >= $lo AND minute_ns < $hi AND model IS NULL AND sm_util > 1),
            co AS (
                SELECT gpu, count(*) / 60.0 AS co_h FROM (
                    SELECT minute_ns, gpu FROM tenants GROUP BY ALL
                    HAVING count(DISTINCT tenant) >= 2) GROUP BY gpu),
            names AS (
                SELECT gpu, list(DISTINCT tenant ORDER BY tenant) FILTER (WHERE is_model) AS ms,
                       list(DISTINCT tenant ORDER BY tenant) FILTER (WHERE NOT is_model) AS ps
                FROM tenants GROUP BY gpu)
            SELECT g.gpu AS gpu, g.host AS host, sampled AS hours_sampled, sm_h, dram_h,
                   pcie_h, thr_h AS throttled_h, full_h AS memory_full_h,
                   coalesce(ms, []) AS models, coalesce(ps, []) AS processes,
                   coalesce(co_h, 0.0) AS cotenancy_h
            FROM g LEFT JOIN co USING (gpu) LEFT JOIN names USING (gpu)
            ORDER BY g.gpu, g.host""",
            {
                "lo": lo,
                "hi": hi,
                "sm": t.sm,
                "dram": t.dram,
                "pcie": t.pcie_bps,
                "bits": t.throttle_bits,
                "mem": t.memory_full,
            },
        )

    def p99_estimate(self, model: str, lo: int, hi: int) -> float | None:
        rows = dict_rows(
            self._store,
            f"SELECT {quantile_estimate_sql('p99_ms', 'count')} AS p99 FROM request_rollup_1m "
            "WHERE model = $model AND minute_ns >= $lo AND minute_ns < $hi",
            {"model": model, "lo": lo, "hi": hi},
        )
        p99 = rows[0]["p99"] if rows else None
        return None if p99 is None else float(p99)

    def load_wait_weeks(self, lo: int, hi: int) -> list[dict[str, Any]]:
        return dict_rows(
            self._store,
            """
            SELECT model, sum(count)::BIGINT AS requests,
                   sum(latency_sum_ms) AS latency_ms,
                   sum(coalesce(other_ms, 0) * count) AS wait_ms
            FROM request_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi
            GROUP BY model HAVING sum(coalesce(other_ms, 0) * count) > 0
            ORDER BY wait_ms DESC, model""",
            {"lo": lo, "hi": hi},
        )

    def load_weeks(self, lo: int, hi: int) -> list[dict[str, Any]]:
        return dict_rows(
            self._store,
            """
            SELECT model, coalesce(replica, gpu, '') AS replica, kind,
                   sum(loads)::BIGINT AS loads, sum(duration_ms_sum) AS load_ms,
                   max(duration_ms_max) AS max_ms, count(DISTINCT minute_ns) AS minutes
            FROM load_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi
            GROUP BY ALL ORDER BY model, load_ms DESC, replica, kind""",
            {"lo": lo, "hi": hi},
        )
