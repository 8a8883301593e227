"""The weekly report's aggregations: one DuckDB query per section, over one ``[lo, hi)`` range.

They read only the per-minute rollups (``request_rollup_1m``, ``gpu_rollup_1m``,
``process_rollup_1m``), ``incidents``, ``actions`` and ``audit`` — never raw requests — so a
week costs the same at 1 or 1,000 requests per second. Each method returns small results as
dicts whose keys are listed in its docstring; :mod:`reports.compute` shapes them into the
summary. Times are ns UTC, latencies ms, durations in minutes or hours as named.

Per-minute p99 over rollup rows: SLO minutes use :func:`store.rollup_quantiles.
quantile_upper_bound_sql` (met only when every GPU met it); an action's before / after p99
uses :func:`store.rollup_quantiles.quantile_estimate_sql` (the count-weighted level).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import duckdb

from store.db import Store
from store.errors import ReportError
from store.rollup_quantiles import quantile_estimate_sql, quantile_upper_bound_sql

_CAUSE_TYPE = '[{"kind":"VARCHAR","culprit":"VARCHAR","share":"DOUBLE","resource":"VARCHAR"}]'

_INCIDENTS = """
    SELECT id, model, gpu, replica, start_ns, coalesce(end_ns, updated_ns) AS end_ns, peak_p99_ms,
           baseline_p99_ms, slo_ms, top_cause, top_culprit, top_share, detail_json,
           (least(coalesce(end_ns, updated_ns), $hi) - greatest(start_ns, $lo)) / 6e10 AS minutes
    FROM incidents WHERE start_ns < $hi AND coalesce(end_ns, updated_ns) > $lo"""
"""Incidents overlapping ``[$lo, $hi)`` with the minutes of them inside the range."""

_CAUSES = f"""
    SELECT i.id, i.model AS victim, i.gpu, c.kind, c.culprit, c.resource,
           i.minutes * c.share AS minutes
    FROM ({_INCIDENTS}) i,
         unnest(from_json(json_extract(i.detail_json, '$.causes'), '{_CAUSE_TYPE}')) AS t(c)"""
"""One row per cause of each such incident: its share of the incident's minutes."""


def _dicts(
    cur: duckdb.DuckDBPyConnection, sql: str, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    cur.execute(sql, dict(params))
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


class ReportQueries:
    """The report's reads of ``store``. Every method raises :class:`ReportError` naming the
    store when DuckDB cannot answer."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @contextmanager
    def _cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        try:
            with self._store.cursor() as cur:
                yield cur
        except duckdb.Error as exc:
            raise ReportError(f"cannot read the store {self._store.path}: {exc}") from exc

    def _rows(self, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        with self._cursor() as cur:
            return _dicts(cur, sql, params)

    def model_names(self, lo: int, hi: int) -> list[str]:
        """Models with rollup rows or incidents in ``[lo, hi)``, sorted."""
        rows = self._rows(
            "SELECT DISTINCT model FROM request_rollup_1m "
            "WHERE minute_ns >= $lo AND minute_ns < $hi UNION "
            "SELECT DISTINCT model FROM incidents WHERE start_ns < $hi "
            "AND coalesce(end_ns, updated_ns) > $lo ORDER BY 1",
            {"lo": lo, "hi": hi},
        )
        return [str(r["model"]) for r in rows]

    def model_weeks(
        self, lo: int, hi: int, models: list[str], slo_ms: Mapping[str, float]
    ) -> list[dict[str, Any]]:
        """One row per model of ``models`` (sorted), with ``slo_ms`` the models that have a
        p99 SLO (ms). Keys: ``model``; ``requests``, ``errors`` (int); ``minutes`` (minutes
        with requests); ``slo_ms`` (None without an SLO); ``met`` (minutes with requests whose
        p99 — the max over the model's GPUs — is within the SLO); ``incidents`` (overlapping
        the range) and ``impacted_minutes`` (their minutes inside it); ``burst`` (the busiest
        minute's requests over the median minute's; None when the median is 0)."""
        p99 = quantile_upper_bound_sql("p99_ms")
        return self._rows(
            f"""
            WITH m AS (
                SELECT minute_ns, model, sum(count) AS n, sum(errors) AS e, {p99} AS p99
                FROM request_rollup_1m WHERE minute_ns >= $lo AND minute_ns < $hi
                GROUP BY minute_ns, model),
            slo AS (SELECT unnest($names::VARCHAR[]) AS model,
                           unnest($slos::DOUBLE[]) AS slo_ms),
            agg AS (
                SELECT m.model, sum(n)::BIGINT AS requests, sum(e)::BIGINT AS errors,
                       count(*) FILTER (WHERE n > 0) AS minutes,
                       count(*) FILTER (WHERE n > 0 AND p99 <= slo.slo_ms) AS met,
                       max(n) / nullif(median(n), 0) AS burst
                FROM m LEFT JOIN slo USING (model) GROUP BY m.model),
            inc AS (SELECT model, count(*) AS k, sum(minutes) AS minutes
                    FROM ({_INCIDENTS}) GROUP BY model),
            names AS (SELECT unnest($all::VARCHAR[]) AS model)
            SELECT names.model AS model, coalesce(requests, 0) AS requests,
                   coalesce(errors, 0) AS errors, coalesce(agg.minutes, 0) AS minutes,
                   slo.slo_ms AS slo_ms, coalesce(met, 0) AS met, coalesce(k, 0) AS incidents,
                   coalesce(inc.minutes, 0.0) AS impacted_minutes, burst
            FROM names LEFT JOIN agg USING (model) LEFT JOIN slo USING (model)
                 LEFT JOIN inc USING (model)
            ORDER BY names.model""",
            {
                "lo": lo,
                "hi": hi,
                "names": list(slo_ms),
                "slos": [float(v) for v in slo_ms.values()],
                "all": models,
            },
        )

    def token_slo_weeks(
        self, lo: int, hi: int, slo_ms: Mapping[str, Mapping[str, float]]
    ) -> list[dict[str, Any]]:
        """Per generative model with a TTFT or TPOT SLO (``slo_ms``: ``ttft`` / ``tpot`` ->
        model -> ms), from the rollups: ``model``; for each of ``ttft`` and ``tpot``:
        ``{ind}_minutes`` (minutes whose rollup holds that p99) and ``{ind}_met`` (of those,
        the minutes whose p99 — the max over the model's GPUs — is within the SLO; 0 where the
        model has no SLO for it). Models with neither SLO or no such minute are left out."""
        ttft, tpot = dict(slo_ms.get("ttft", {})), dict(slo_ms.get("tpot", {}))
        names = sorted(set(ttft) | set(tpot))
        if not names:
            return []
        return self._rows(
            """
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
                   count(*) FILTER (WHERE ttft <= ttft_slo) AS ttft_met,
                   count(tpot) AS tpot_minutes,
                   count(*) FILTER (WHERE tpot <= tpot_slo) AS tpot_met
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

    def cause_matrix(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Victim x culprit minutes (known causes only), largest first. Keys: ``victim``,
        ``culprit``, ``minutes`` (the incidents' minutes times the cause's share)."""
        return self._rows(
            f"""SELECT victim, culprit, sum(minutes) AS minutes FROM ({_CAUSES})
                WHERE kind <> 'unknown' GROUP BY ALL ORDER BY 3 DESC, 1, 2""",
            {"lo": lo, "hi": hi},
        )

    def culprit_impacts(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Per culprit (known causes only), most victim-minutes first. Keys: ``culprit``;
        ``kinds``, ``victims``, ``gpus`` (distinct, unsorted lists); ``victim_minutes``;
        ``incidents`` (how many); ``main_kind`` and ``main_resource`` (of its largest kind)."""
        return self._rows(
            f"""WITH c AS (SELECT * FROM ({_CAUSES}) WHERE kind <> 'unknown'),
                k AS (SELECT culprit, kind, any_value(resource) AS res, sum(minutes) AS m
                      FROM c GROUP BY culprit, kind),
                main AS (SELECT culprit, arg_max(kind, m) AS main_kind,
                                arg_max(res, m) AS main_res FROM k GROUP BY culprit)
                SELECT c.culprit AS culprit, list(DISTINCT kind) AS kinds,
                       sum(minutes) AS victim_minutes, list(DISTINCT victim) AS victims,
                       list(DISTINCT gpu) AS gpus, count(DISTINCT id) AS incidents,
                       main_kind, main_res AS main_resource
                FROM c JOIN main USING (culprit)
                GROUP BY c.culprit, main_kind, main_res ORDER BY 3 DESC, 1""",
            {"lo": lo, "hi": hi},
        )

    def cause_minutes(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Per victim and cause kind (``unknown`` included): keys ``victim``, ``kind``,
        ``minutes``; by victim, then most minutes first."""
        return self._rows(
            f"SELECT victim, kind, sum(minutes) AS minutes FROM ({_CAUSES}) "
            "GROUP BY ALL ORDER BY 1, 3 DESC",
            {"lo": lo, "hi": hi},
        )

    def worst_incidents(self, lo: int, hi: int, limit: int = 10) -> list[dict[str, Any]]:
        """The ``limit`` incidents with the most minutes in the range (then the highest
        peak / baseline). Keys: ``id``, ``model``, ``gpu``, ``start_ns``, ``end_ns``,
        ``minutes``, ``peak_p99_ms``, ``baseline_p99_ms``, ``slo_ms``, ``top_cause``,
        ``top_culprit``, ``top_share``, ``replica`` (None unless the model's requests name
        replicas)."""
        return self._rows(
            f"""SELECT id, model, gpu, replica, start_ns, end_ns, minutes, peak_p99_ms,
                       baseline_p99_ms, slo_ms, top_cause, top_culprit, top_share
                FROM ({_INCIDENTS})
                ORDER BY minutes DESC, peak_p99_ms / nullif(baseline_p99_ms, 0) DESC NULLS LAST,
                         id
                LIMIT {int(limit)}""",
            {"lo": lo, "hi": hi},
        )

    def gpu_weeks(
        self,
        lo: int,
        hi: int,
        *,
        sm_saturated: float,
        dram_saturated: float,
        pcie_saturated_bps: float,
        memory_full: float,
        throttle_bits: int,
    ) -> list[dict[str, Any]]:
        """Per GPU (and host), from the rollups: hours with rollup rows (``hours_sampled``)
        and with the minute's mean at or over each threshold — ``sm_h`` (SM util %),
        ``dram_h`` (DRAM active, else memory-controller util / 100, as a fraction), ``pcie_h``
        (TX + RX bytes/s), ``throttled_h`` (any of ``throttle_bits`` in the clock-event
        reasons), ``memory_full_h`` (peak used / total); ``models`` and ``processes`` (sorted
        names of its tenants: models with requests, unlabelled processes over 1 % SM) and
        ``cotenancy_h`` (hours with two tenants or more). Keys also ``gpu`` and ``host``."""
        return self._rows(
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
                "sm": sm_saturated,
                "dram": dram_saturated,
                "pcie": pcie_saturated_bps,
                "bits": throttle_bits,
                "mem": memory_full,
            },
        )

    def actions(self, lo: int, hi: int, window_ns: int) -> list[dict[str, Any]]:
        """Actions created in ``[lo, hi)``, oldest first, with the victim's p99 before and
        after: the control loop's own verification numbers (``params.verification``) where it
        measured them, else the rollups' count-weighted p99 over ``window_ns`` before creation
        and from the time it was applied (``params.applied_ns``, else the audit's ``applied``
        event, else its creation). Keys: ``id``, ``incident_id``, ``kind``, ``target``,
        ``state``, ``created_ns``, ``victim`` (the incident's model; None when it is gone),
        ``p99_before_ms``, ``p99_after_ms`` (None without requests in the window) and
        ``held_back`` (a guardrail held it at least once)."""
        p99 = quantile_estimate_sql("p99_ms", "count")
        return self._rows(
            f"""
            WITH a AS (
                SELECT a.id, a.incident_id, a.kind, a.target, a.state, a.created_ns,
                       i.model AS victim,
                       TRY_CAST(json_extract(a.params_json,
                                             '$.verification.victim_p99_before_ms')
                                AS DOUBLE) AS v_before,
                       TRY_CAST(json_extract(a.params_json, '$.verification.victim_p99_after_ms')
                                AS DOUBLE) AS v_after,
                       coalesce(TRY_CAST(json_extract(a.params_json, '$.applied_ns') AS BIGINT),
                                (SELECT min(ts_ns) FROM audit u
                                 WHERE u.action_id = a.id AND u.event = 'applied'),
                                a.created_ns) AS applied_ns,
                       EXISTS (SELECT 1 FROM audit u
                               WHERE u.action_id = a.id AND u.event = 'held') AS held_back
                FROM actions a LEFT JOIN incidents i ON i.id = a.incident_id
                WHERE a.created_ns >= $lo AND a.created_ns < $hi)
            SELECT id, incident_id, kind, target, state, created_ns, victim,
                coalesce(v_before, (SELECT {p99} FROM request_rollup_1m r
                 WHERE r.model = a.victim AND r.minute_ns >= a.created_ns - $w
                   AND r.minute_ns < a.created_ns)) AS p99_before_ms,
                coalesce(v_after, (SELECT {p99} FROM request_rollup_1m r
                 WHERE r.model = a.victim AND r.minute_ns >= a.applied_ns
                   AND r.minute_ns < a.applied_ns + $w)) AS p99_after_ms,
                held_back
            FROM a ORDER BY created_ns, id""",
            {"lo": lo, "hi": hi, "w": window_ns},
        )
