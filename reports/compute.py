"""Compute a :class:`reports.summary.WeekSummary` from the store with DuckDB aggregations.

The aggregations are :class:`store.report_queries.ReportQueries`: they read only the per-minute
rollups, ``incidents``, ``actions`` and ``audit`` — never raw requests — so a week costs the
same at 1 or 1,000 requests per second. Each section is one aggregation query; Python only
shapes the (small) results.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from reports.isoweek import IsoWeek
from reports.operations import action_rows, count_actions, gpu_weeks
from reports.recommend import recommend
from reports.summary import (
    CauseMinutes,
    CulpritImpact,
    IncidentRow,
    MatrixCell,
    ModelWeek,
    Thresholds,
    Totals,
    WeekOverWeek,
    WeekSummary,
)
from store.db import Store
from store.report_queries import ReportQueries

MINUTE_NS = 60_000_000_000


def _with_tokens(
    m: ModelWeek, row: Mapping[str, Any] | None, slos: Mapping[str, Mapping[str, float]]
) -> ModelWeek:
    """``m`` with its TTFT / TPOT SLO attainment (from a ``token_slo_weeks`` row)."""
    if row is None:
        return m
    got: dict[str, Any] = {}
    for ind in ("ttft", "tpot"):
        slo = slos.get(ind, {}).get(m.model)
        n = int(row[f"{ind}_minutes"])
        if slo is not None and n:
            got[f"{ind}_slo_ms"] = float(slo)
            got[f"{ind}_attainment"] = int(row[f"{ind}_met"]) / n
    return dataclasses.replace(m, **got)


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
        indicator_slo_ms: Mapping[str, Mapping[str, float]] | None = None,
        prepare: Callable[[int, int], object] | None = None,
    ) -> None:
        """``indicator_slo_ms``: TTFT / TPOT SLOs of generative models, ``ttft`` / ``tpot``
        -> model -> ms (``AnalysisSettings.indicator_slos()``). ``prepare(lo_ns, hi_ns)`` is
        called before each build with the span the build reads (the week before and the
        week): fleet mode fills the rollups there from Prometheus' recording rules."""
        self._ind_slo = {k: dict(v) for k, v in (indicator_slo_ms or {}).items()}
        self._store = store
        self._prepare = prepare
        self._slo = dict(slo_ms or {})
        self._default_slo = default_slo_ms
        self._base = dashboard_url.rstrip("/")
        self._t = thresholds or Thresholds()
        self._clock_ns = clock_ns

    def build(self, week: IsoWeek) -> WeekSummary:
        """The week's summary. Raises ReportError when the store cannot be read."""
        q = ReportQueries(self._store)
        lo, hi = week.start_ns, week.end_ns
        prev = week.previous()
        if self._prepare is not None:
            self._prepare(prev.start_ns, hi)
        models = self._models(q, lo, hi)
        before = self._models(q, prev.start_ns, prev.end_ns)
        totals, last = _totals(models), _totals(before)
        matrix, culprits, causes = _causes(q, lo, hi, {m.model for m in models})
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
            worst=self._worst(q, lo, hi),
            gpus=gpu_weeks(q, lo, hi, self._t),
            actions=(actions := action_rows(q, lo, hi)),
            action_counts=count_actions(actions),
            recommendations=[],
        )
        return _with(s, recommend(s))

    @property
    def slo_ms(self) -> dict[str, float]:
        """The per-model SLOs (ms) this builder judges attainment against."""
        return dict(self._slo)

    def _slos(self, models: list[str]) -> dict[str, float]:
        """Model -> p99 SLO (ms) of those of ``models`` that have one (> 0)."""
        out: dict[str, float] = {}
        for m in models:
            v = self._slo.get(m, self._default_slo if self._default_slo > 0 else None)
            if v is not None and v > 0:
                out[m] = float(v)
        return out

    def _models(self, q: ReportQueries, lo: int, hi: int) -> list[ModelWeek]:
        names = q.model_names(lo, hi)
        tokens = {str(r["model"]): r for r in q.token_slo_weeks(lo, hi, self._ind_slo)}
        return [
            _with_tokens(m, tokens.get(m.model), self._ind_slo)
            for m in self._e2e_models(q, lo, hi, names)
        ]

    def _e2e_models(self, q: ReportQueries, lo: int, hi: int, names: list[str]) -> list[ModelWeek]:
        return [
            ModelWeek(
                model=str(r["model"]),
                requests=int(r["requests"]),
                errors=int(r["errors"]),
                minutes=int(r["minutes"]),
                slo_ms=r["slo_ms"],
                slo_minutes_met=int(r["met"]),
                slo_attainment=(
                    None if r["slo_ms"] is None or not r["minutes"] else r["met"] / r["minutes"]
                ),
                incidents=int(r["incidents"]),
                impacted_minutes=float(r["impacted_minutes"]),
                peak_to_median_rate=None if r["burst"] is None else float(r["burst"]),
            )
            for r in q.model_weeks(lo, hi, names, self._slos(names))
        ]

    def _worst(self, q: ReportQueries, lo: int, hi: int) -> list[IncidentRow]:
        return [
            IncidentRow(
                id=str(r["id"]),
                model=str(r["model"]),
                gpu=str(r["gpu"]),
                start_ns=int(r["start_ns"]),
                end_ns=int(r["end_ns"]),
                minutes=float(r["minutes"]),
                peak_p99_ms=r["peak_p99_ms"],
                baseline_p99_ms=r["baseline_p99_ms"],
                slo_ms=r["slo_ms"],
                top_kind=r["top_cause"],
                top_culprit=r["top_culprit"],
                top_share=r["top_share"],
                url=incident_url(self._base, str(r["id"]), int(r["start_ns"]), int(r["end_ns"])),
                replica=r["replica"],
            )
            for r in q.worst_incidents(lo, hi, limit=10)
        ]


def _causes(
    q: ReportQueries, lo: int, hi: int, models: set[str]
) -> tuple[list[MatrixCell], list[CulpritImpact], list[CauseMinutes]]:
    matrix = [
        MatrixCell(str(r["victim"]), str(r["culprit"]), float(r["minutes"]))
        for r in q.cause_matrix(lo, hi)
    ]
    culprits = [
        CulpritImpact(
            culprit=str(r["culprit"]),
            culprit_type=_culprit_type(str(r["culprit"]), list(r["kinds"]), models),
            kinds=sorted(r["kinds"]),
            victim_minutes=float(r["victim_minutes"]),
            victims=sorted(r["victims"]),
            gpus=sorted(r["gpus"]),
            incidents=int(r["incidents"]),
            main_kind=str(r["main_kind"]),
            resource=r["main_resource"],
        )
        for r in q.culprit_impacts(lo, hi)
    ]
    causes = [
        CauseMinutes(str(r["victim"]), str(r["kind"]), float(r["minutes"]))
        for r in q.cause_minutes(lo, hi)
    ]
    return matrix, culprits, causes


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
) -> list[WeekOverWeek]:
    out = [
        WeekOverWeek("all", "requests", t.requests, last.requests),
        WeekOverWeek("all", "slo_attainment", t.slo_attainment, last.slo_attainment),
        WeekOverWeek("all", "incidents", t.incidents, last.incidents),
        WeekOverWeek("all", "impacted_minutes", t.impacted_minutes, last.impacted_minutes),
    ]
    prev = {m.model: m for m in before}
    for m in now:
        b = prev.get(m.model)
        out += [
            WeekOverWeek(m.model, "requests", m.requests, None if b is None else b.requests),
            WeekOverWeek(
                m.model, "slo_attainment", m.slo_attainment, None if b is None else b.slo_attainment
            ),
            WeekOverWeek(m.model, "incidents", m.incidents, None if b is None else b.incidents),
            WeekOverWeek(
                m.model,
                "impacted_minutes",
                m.impacted_minutes,
                None if b is None else b.impacted_minutes,
            ),
        ]
    return out


def _with(s: WeekSummary, recs: list[Any]) -> WeekSummary:
    return dataclasses.replace(s, recommendations=recs)
