"""Compute a :class:`reports.summary.WeekSummary`: a week reduced where it is stored.

The per-minute rollups are read through :class:`store.week_rollups.WeekRollups` (DuckDB over
the store's rollup tables in embedded mode, PromQL over the recording rules in fleet mode);
incidents, actions and the audit through :class:`store.report_queries.ReportQueries`; where
model-load latency went through the same rollups (:mod:`reports.loads`). Neither
reads raw requests, so a week costs the same at 1 or 1,000 requests per second; each section
is one aggregation, and Python only shapes the (small) results.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from cotenant.core.slos import E2E, TPOT, TTFT, Slos
from cotenant.core.week_reads import WeekRollups
from cotenant.reports.isoweek import IsoWeek
from cotenant.reports.loads import load_section
from cotenant.reports.operations import action_rows, count_actions, gpu_weeks
from cotenant.reports.recommend import recommend
from cotenant.reports.summary import (
    CauseMinutes,
    CulpritImpact,
    IncidentRow,
    MatrixCell,
    ModelWeek,
    OrdinaryCell,
    Thresholds,
    Totals,
    WeekOverWeek,
    WeekSummary,
)
from cotenant.store.db import Store
from cotenant.store.report_queries import ReportQueries
from cotenant.store.week_rollups import StoreWeekRollups

MINUTE_NS = 60_000_000_000


def _with_tokens(m: ModelWeek, row: Mapping[str, Any] | None, slos: Slos) -> ModelWeek:
    """``m`` with its TTFT / TPOT SLO attainment (from a ``token_slo_weeks`` row)."""
    if row is None:
        return m
    got: dict[str, Any] = {}
    for ind in (TTFT, TPOT):
        slo = slos.of(m.model, ind)
        n = int(row[f"{ind}_minutes"])
        if slo is not None and n:
            got[f"{ind}_slo_ms"] = float(slo)
            got[f"{ind}_attainment"] = int(row[f"{ind}_met"]) / n
    return dataclasses.replace(m, **got)


class ReportBuilder:
    """Builds the summary of one ISO week from ``store``.

    ``slos``: every model's SLOs (:class:`cotenant.core.slos.Slos`: explicit, the default for
    the others, TTFT / TPOT of generative models). ``dashboard_url`` is the base of incident
    links (contract: ``{base}/incident?id=...``)."""

    def __init__(
        self,
        store: Store,
        *,
        slos: Slos | None = None,
        dashboard_url: str = "",
        thresholds: Thresholds | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        rollups: WeekRollups | None = None,
    ) -> None:
        """``rollups``: where the
        week's minutes are reduced (default: ``store``'s rollup tables; fleet mode passes
        Prometheus')."""
        self._store = store
        self._rollups: WeekRollups = rollups or StoreWeekRollups(store)
        self._slos = slos or Slos()
        self._base = dashboard_url.rstrip("/")
        self._t = thresholds or Thresholds()
        self._clock_ns = clock_ns

    def build(self, week: IsoWeek) -> WeekSummary:
        """The week's summary. Raises ReportError when the store cannot be read."""
        q = ReportQueries(self._store)
        lo, hi = week.start_ns, week.end_ns
        prev = week.previous()
        models = self._models(q, lo, hi)
        before = self._models(q, prev.start_ns, prev.end_ns, detail=False)
        totals, last = _totals(models), _totals(before)
        matrix, culprits, causes = _causes(q, lo, hi, {m.model for m in models})
        waits, kinds, replicas = load_section(self._rollups, lo, hi)
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
            gpus=gpu_weeks(self._rollups, lo, hi, self._t),
            actions=(actions := action_rows(q, self._rollups, lo, hi)),
            action_counts=count_actions(actions),
            recommendations=[],
            load_waits=waits,
            load_kinds=kinds,
            load_replicas=replicas,
            ordinary=[
                OrdinaryCell(
                    str(r["victim"]),
                    str(r["culprit"]),
                    float(r["minutes"]),
                    int(r["slowdowns"]),
                    [str(x) for x in r["reasons"]],
                )
                for r in q.ordinary_matrix(lo, hi)
            ],
        )
        return _with(s, recommend(s))

    @property
    def slos(self) -> Slos:
        """The SLOs this builder judges attainment against."""
        return self._slos

    def _models(
        self, q: ReportQueries, lo: int, hi: int, *, detail: bool = True
    ) -> list[ModelWeek]:
        """Every model with requests or incidents in ``[lo, hi)``, sorted; TTFT / TPOT
        attainment only with ``detail`` (the week before's totals need neither)."""
        slos = self._slos.table(E2E)
        minutes = self._rollups.model_weeks(lo, hi, slos, detail=detail)
        incidents = q.incident_totals(lo, hi)
        tokens = (
            {
                str(r["model"]): r
                for r in self._rollups.token_slo_weeks(
                    lo, hi, {ind: self._slos.explicit(ind) for ind in (TTFT, TPOT)}
                )
            }
            if detail
            else {}
        )
        out = []
        for name in sorted(set(minutes) | set(q.incident_models(lo, hi))):
            r = minutes.get(name, {})
            slo, n, met = slos.of(name), int(r.get("minutes", 0)), int(r.get("met", 0))
            k, impacted = incidents.get(name, (0, 0.0))
            burst = r.get("burst")
            m = ModelWeek(
                model=name,
                requests=int(r.get("requests", 0)),
                errors=int(r.get("errors", 0)),
                minutes=n,
                slo_ms=slo,
                slo_minutes_met=met if slo is not None else 0,
                slo_attainment=None if slo is None or not n else met / n,
                incidents=k,
                impacted_minutes=impacted,
                peak_to_median_rate=None if burst is None else float(burst),
            )
            out.append(_with_tokens(m, tokens.get(name), self._slos))
        return out

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
