"""Compute a :class:`reports.summary.WeekSummary` from the store with DuckDB aggregations.

Reads only the per-minute rollups (``request_rollup_1m``, ``gpu_rollup_1m``,
``process_rollup_1m``), ``incidents``, ``actions`` and ``audit`` — never raw requests — so a
week costs the same at 1 or 1,000 requests per second. Each section is one aggregation query;
Python only shapes the (small) results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import duckdb

from reports.isoweek import IsoWeek
from reports.operations import action_rows, count_actions, gpu_weeks
from reports.recommend import recommend
from reports.summary import (
    CauseMinutes,
    Change,
    CulpritImpact,
    IncidentRow,
    MatrixCell,
    ModelWeek,
    Thresholds,
    Totals,
    WeekSummary,
)
from store.db import Store
from store.errors import ReportError

MINUTE_NS = 60_000_000_000

_CAUSE_TYPE = '[{"kind":"VARCHAR","culprit":"VARCHAR","share":"DOUBLE","resource":"VARCHAR"}]'

_INCIDENTS = """
    SELECT id, model, gpu, start_ns, coalesce(end_ns, updated_ns) AS end_ns, peak_p99_ms,
           baseline_p99_ms, slo_ms, top_cause, top_culprit, top_share, detail_json,
           (least(coalesce(end_ns, updated_ns), $hi) - greatest(start_ns, $lo)) / 6e10 AS minutes
    FROM incidents WHERE start_ns < $hi AND coalesce(end_ns, updated_ns) > $lo"""

_CAUSES = f"""
    SELECT i.id, i.model AS victim, i.gpu, c.kind, c.culprit, c.resource,
           i.minutes * c.share AS minutes
    FROM ({_INCIDENTS}) i,
         unnest(from_json(json_extract(i.detail_json, '$.causes'), '{_CAUSE_TYPE}')) AS t(c)"""


class ReportBuilder:
    """Builds the summary of one ISO week from ``store``.

    ``slo_ms`` maps model -> p99 SLO (ms); ``default_slo_ms`` (> 0) applies to the others.
    ``dashboard_url`` is the base of incident links (contract: ``{base}/incident?id=...``)."""

    def __init__(
        self,
        store: Store,
        *,
        slo_ms: Mapping[str, float] | None = None,
        default_slo_ms: float = 0.0,
        dashboard_url: str = "",
        thresholds: Thresholds | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._store = store
        self._slo = dict(slo_ms or {})
        self._default_slo = default_slo_ms
        self._base = dashboard_url.rstrip("/")
        self._t = thresholds or Thresholds()
        self._clock_ns = clock_ns

    def build(self, week: IsoWeek) -> WeekSummary:
        """The week's summary. Raises ReportError when the store cannot be read."""
        try:
            with self._store.cursor() as cur:
                return self._build(cur, week)
        except duckdb.Error as exc:
            raise ReportError(f"cannot read the store {self._store.path}: {exc}") from exc

    def _build(self, cur: duckdb.DuckDBPyConnection, week: IsoWeek) -> WeekSummary:
        lo, hi = week.start_ns, week.end_ns
        prev = week.previous()
        models = self._models(cur, lo, hi)
        before = self._models(cur, prev.start_ns, prev.end_ns)
        totals, last = _totals(models), _totals(before)
        matrix, culprits, causes = self._causes(cur, lo, hi, {m.model for m in models})
        s = WeekSummary(
            week=str(week),
            start_ns=lo,
            end_ns=hi,
            generated_ns=self._clock_ns(),
            dashboard_url=self._base,
            thresholds=self._t,
            models=models,
            totals=totals,
            last_week=last,
            changes=_changes(models, before, totals, last),
            matrix=matrix,
            culprits=culprits,
            causes=causes,
            worst=self._worst(cur, lo, hi),
            gpus=gpu_weeks(cur, lo, hi, self._t),
            actions=(actions := action_rows(cur, lo, hi)),
            action_counts=count_actions(actions),
            recommendations=[],
        )
        return _with(s, recommend(s))

    def _slo_params(self, models: list[str]) -> dict[str, Any]:
        names, slos = [], []
        for m in models:
            v = self._slo.get(m, self._default_slo if self._default_slo > 0 else None)
            if v is not None and v > 0:
                names.append(m)
                slos.append(float(v))
        return {"names": names, "slos": slos}

    def _models(self, cur: duckdb.DuckDBPyConnection, lo: int, hi: int) -> list[ModelWeek]:
        p: dict[str, Any] = {"lo": lo, "hi": hi}
        names = [
            str(r[0])
            for r in cur.execute(
                "SELECT DISTINCT model FROM request_rollup_1m "
                "WHERE minute_ns >= $lo AND minute_ns < $hi UNION "
                "SELECT DISTINCT model FROM incidents WHERE start_ns < $hi "
                "AND coalesce(end_ns, updated_ns) > $lo ORDER BY 1",
                p,
            ).fetchall()
        ]
        p.update(self._slo_params(names))
        rows = cur.execute(
            f"""
            WITH m AS (
                SELECT minute_ns, model, sum(count) AS n, sum(errors) AS e, max(p99_ms) AS p99
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
            SELECT names.model, coalesce(requests, 0), coalesce(errors, 0),
                   coalesce(agg.minutes, 0), slo.slo_ms, coalesce(met, 0),
                   coalesce(k, 0), coalesce(inc.minutes, 0.0), burst
            FROM names LEFT JOIN agg USING (model) LEFT JOIN slo USING (model)
                 LEFT JOIN inc USING (model)
            ORDER BY names.model""",
            {**p, "all": names},
        ).fetchall()
        return [
            ModelWeek(
                model=str(r[0]),
                requests=int(r[1]),
                errors=int(r[2]),
                minutes=int(r[3]),
                slo_ms=r[4],
                slo_minutes_met=int(r[5]),
                slo_attainment=None if r[4] is None or not r[3] else r[5] / r[3],
                incidents=int(r[6]),
                impacted_minutes=float(r[7]),
                peak_to_median_rate=None if r[8] is None else float(r[8]),
            )
            for r in rows
        ]

    def _causes(
        self, cur: duckdb.DuckDBPyConnection, lo: int, hi: int, models: set[str]
    ) -> tuple[list[MatrixCell], list[CulpritImpact], list[CauseMinutes]]:
        p = {"lo": lo, "hi": hi}
        matrix = [
            MatrixCell(str(v), str(c), float(m))
            for v, c, m in cur.execute(
                f"""SELECT victim, culprit, sum(minutes) FROM ({_CAUSES})
                    WHERE kind <> 'unknown' GROUP BY ALL ORDER BY 3 DESC, 1, 2""",
                p,
            ).fetchall()
        ]
        culprits = [
            CulpritImpact(
                culprit=str(r[0]),
                culprit_type=_culprit_type(str(r[0]), list(r[1]), models),
                kinds=sorted(r[1]),
                victim_minutes=float(r[2]),
                victims=sorted(r[3]),
                gpus=sorted(r[4]),
                incidents=int(r[5]),
                main_kind=str(r[6]),
                resource=r[7],
            )
            for r in cur.execute(
                f"""WITH c AS (SELECT * FROM ({_CAUSES}) WHERE kind <> 'unknown'),
                    k AS (SELECT culprit, kind, any_value(resource) AS res, sum(minutes) AS m
                          FROM c GROUP BY culprit, kind),
                    main AS (SELECT culprit, arg_max(kind, m) AS main_kind,
                                    arg_max(res, m) AS main_res FROM k GROUP BY culprit)
                    SELECT c.culprit, list(DISTINCT kind), sum(minutes), list(DISTINCT victim),
                           list(DISTINCT gpu), count(DISTINCT id), main_kind, main_res
                    FROM c JOIN main USING (culprit)
                    GROUP BY c.culprit, main_kind, main_res ORDER BY 3 DESC, 1""",
                p,
            ).fetchall()
        ]
        causes = [
            CauseMinutes(str(m), str(k), float(x))
            for m, k, x in cur.execute(
                f"SELECT victim, kind, sum(minutes) FROM ({_CAUSES}) "
                "GROUP BY ALL ORDER BY 1, 3 DESC",
                p,
            ).fetchall()
        ]
        return matrix, culprits, causes

    def _worst(self, cur: duckdb.DuckDBPyConnection, lo: int, hi: int) -> list[IncidentRow]:
        rows = cur.execute(
            f"""SELECT id, model, gpu, start_ns, end_ns, minutes, peak_p99_ms, baseline_p99_ms,
                       slo_ms, top_cause, top_culprit, top_share
                FROM ({_INCIDENTS})
                ORDER BY minutes DESC, peak_p99_ms / nullif(baseline_p99_ms, 0) DESC NULLS LAST,
                         id
                LIMIT 10""",
            {"lo": lo, "hi": hi},
        ).fetchall()
        return [
            IncidentRow(
                id=str(r[0]),
                model=str(r[1]),
                gpu=str(r[2]),
                start_ns=int(r[3]),
                end_ns=int(r[4]),
                minutes=float(r[5]),
                peak_p99_ms=r[6],
                baseline_p99_ms=r[7],
                slo_ms=r[8],
                top_kind=r[9],
                top_culprit=r[10],
                top_share=r[11],
                url=incident_url(self._base, str(r[0]), int(r[3]), int(r[4])),
            )
            for r in rows
        ]


def incident_url(base: str, incident_id: str, start_ns: int, end_ns: int) -> str:
    """``{base}/incident?id=<id>&range=<from>..<to>`` (dashboard contract), ISO times."""
    import datetime as dt

    def iso(ns: int) -> str:
        return dt.datetime.fromtimestamp(ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    rng = f"{iso(start_ns - 15 * MINUTE_NS)}..{iso(end_ns + 15 * MINUTE_NS)}"
    return f"{base}/incident?id={quote(incident_id)}&range={quote(rng, safe=':.')}"


def _culprit_type(culprit: str, kinds: list[str], models: set[str]) -> str:
    if "throttle" in kinds:
        return "gpu"
    if "lock" in kinds:
        return "lock"
    if culprit in models:
        return "model"
    if culprit == "host":
        return "host"
    return "process"


def _totals(models: list[ModelWeek]) -> Totals:
    with_slo = [m for m in models if m.slo_ms is not None]
    minutes = sum(m.minutes for m in with_slo)
    return Totals(
        requests=sum(m.requests for m in models),
        incidents=sum(m.incidents for m in models),
        impacted_minutes=sum(m.impacted_minutes for m in models),
        slo_attainment=(sum(m.slo_minutes_met for m in with_slo) / minutes) if minutes else None,
    )


def _changes(
    now: list[ModelWeek], before: list[ModelWeek], t: Totals, last: Totals
) -> list[Change]:
    out = [
        Change("all", "requests", t.requests, last.requests),
        Change("all", "slo_attainment", t.slo_attainment, last.slo_attainment),
        Change("all", "incidents", t.incidents, last.incidents),
        Change("all", "impacted_minutes", t.impacted_minutes, last.impacted_minutes),
    ]
    prev = {m.model: m for m in before}
    for m in now:
        b = prev.get(m.model)
        out += [
            Change(m.model, "requests", m.requests, None if b is None else b.requests),
            Change(
                m.model, "slo_attainment", m.slo_attainment, None if b is None else b.slo_attainment
            ),
            Change(m.model, "incidents", m.incidents, None if b is None else b.incidents),
            Change(
                m.model,
                "impacted_minutes",
                m.impacted_minutes,
                None if b is None else b.impacted_minutes,
            ),
        ]
    return out


def _with(s: WeekSummary, recs: list[Any]) -> WeekSummary:
    import dataclasses

    return dataclasses.replace(s, recommendations=recs)
