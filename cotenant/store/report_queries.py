"""The weekly report's reads of what only the store holds: ``incidents``, ``actions``, ``audit``.

One DuckDB query per section over one ``[lo, hi)`` range; the per-minute rollups are read
through :class:`store.week_rollups.WeekRollups` (the store's, or Prometheus' in fleet mode).
Each method returns small results as dicts whose keys are listed in its docstring;
:mod:`reports.compute` shapes them into the summary. Times are ns UTC, latencies ms,
durations in minutes as named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from cotenant.core.errors import ReportError
from cotenant.store.db import Store

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

_ORDINARY = f"""
    SELECT o.id, o.model AS victim, o.reason, c.kind, c.culprit,
           (least(o.end_ns, $hi) - greatest(o.start_ns, $lo)) / 6e10 * c.share AS minutes
    FROM contention o,
         unnest(from_json(o.causes_json, '{_CAUSE_TYPE}')) AS t(c)
    WHERE o.start_ns < $hi AND o.end_ns > $lo AND c.kind <> 'unknown'"""
"""One row per named cause of each ordinary-contention slowdown overlapping the range."""


def _dicts(
    cur: duckdb.DuckDBPyConnection, sql: str, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    cur.execute(sql, dict(params))
    names = [d[0] for d in cur.description or []]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def dict_rows(store: Store, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``sql``'s rows as dicts; ReportError naming the store when DuckDB cannot answer."""
    try:
        with store.cursor() as cur:
            return _dicts(cur, sql, params)
    except duckdb.Error as exc:
        raise ReportError(f"cannot read the store {store.path}: {exc}") from exc


class ReportQueries:
    """The report's reads of ``store``. Every method raises :class:`ReportError` naming the
    store when DuckDB cannot answer."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def _rows(self, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        return dict_rows(self._store, sql, params)

    def incident_models(self, lo: int, hi: int) -> list[str]:
        """Models with incidents overlapping ``[lo, hi)``, sorted."""
        rows = self._rows(
            "SELECT DISTINCT model FROM incidents WHERE start_ns < $hi "
            "AND coalesce(end_ns, updated_ns) > $lo ORDER BY 1",
            {"lo": lo, "hi": hi},
        )
        return [str(r["model"]) for r in rows]

    def incident_totals(self, lo: int, hi: int) -> dict[str, tuple[int, float]]:
        """Model -> (incidents overlapping the range, their minutes inside it)."""
        rows = self._rows(
            f"SELECT model, count(*) AS k, sum(minutes) AS minutes FROM ({_INCIDENTS}) "
            "GROUP BY model",
            {"lo": lo, "hi": hi},
        )
        return {str(r["model"]): (int(r["k"]), float(r["minutes"])) for r in rows}

    def cause_matrix(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Victim x culprit minutes (known causes only), largest first. Keys: ``victim``,
        ``culprit``, ``minutes`` (the incidents' minutes times the cause's share)."""
        return self._rows(
            f"""SELECT victim, culprit, sum(minutes) AS minutes FROM ({_CAUSES})
                WHERE kind <> 'unknown' GROUP BY ALL ORDER BY 3 DESC, 1, 2""",
            {"lo": lo, "hi": hi},
        )

    def ordinary_matrix(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Victim x culprit minutes of ordinary contention (slowdowns within the SLO that
        opened no incident: ``store.contention_rows``), largest first. Keys: ``victim``,
        ``culprit``, ``minutes``, ``slowdowns`` (how many), ``reasons`` (distinct, sorted:
        ``own_load``, ``recurring``, ``seen``)."""
        return self._rows(
            f"""SELECT victim, culprit, sum(minutes) AS minutes,
                       count(DISTINCT id) AS slowdowns, list_sort(list(DISTINCT reason)) AS reasons
                FROM ({_ORDINARY}) GROUP BY ALL ORDER BY 3 DESC, 1, 2""",
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

    def actions(self, lo: int, hi: int) -> list[dict[str, Any]]:
        """Actions created in ``[lo, hi)``, oldest first. Keys: ``id``, ``incident_id``,
        ``kind``, ``target``, ``state``, ``created_ns``, ``victim`` (the incident's model;
        None when it is gone), ``applied_ns`` (``params.applied_ns``, else the audit's
        ``applied`` event, else its creation), ``p99_before_ms`` and ``p99_after_ms`` (the
        control loop's own verification numbers, ``params.verification``; None where it did
        not measure them) and ``held_back`` (a guardrail held it at least once)."""
        return self._rows(
            """
            SELECT a.id, a.incident_id, a.kind, a.target, a.state, a.created_ns,
                   i.model AS victim,
                   coalesce(TRY_CAST(json_extract(a.params_json, '$.applied_ns') AS BIGINT),
                            (SELECT min(ts_ns) FROM audit u
                             WHERE u.action_id = a.id AND u.event = 'applied'),
                            a.created_ns) AS applied_ns,
                   TRY_CAST(json_extract(a.params_json, '$.verification.victim_p99_before_ms')
                            AS DOUBLE) AS p99_before_ms,
                   TRY_CAST(json_extract(a.params_json, '$.verification.victim_p99_after_ms')
                            AS DOUBLE) AS p99_after_ms,
                   EXISTS (SELECT 1 FROM audit u
                           WHERE u.action_id = a.id AND u.event = 'held') AS held_back
            FROM actions a LEFT JOIN incidents i ON i.id = a.incident_id
            WHERE a.created_ns >= $lo AND a.created_ns < $hi
            ORDER BY a.created_ns, a.id""",
            {"lo": lo, "hi": hi},
        )
