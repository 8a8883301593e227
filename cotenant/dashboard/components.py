"""Small building blocks the pages share: tiles, empty states, tables, time axes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from dash import dcc, html

from cotenant.analysis.incident_record import Incident
from cotenant.analysis.indicators import UNITS
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.timespec import format_ns
from cotenant.dashboard.timerange import incident_range


def times(ts_ns: Sequence[int]) -> list[str]:
    """Nanosecond timestamps as the date strings plotly draws on a time axis (UTC)."""
    out: list[str] = np.datetime_as_string(
        np.asarray(ts_ns, dtype="datetime64[ns]"), unit="ms"
    ).tolist()
    return out


def at(ts_ns: int) -> str:
    """One timestamp as a string plotly reads as a date (shapes and axis ranges need this:
    a numpy datetime scalar there is serialised as a bare number)."""
    return str(np.datetime_as_string(np.datetime64(int(ts_ns), "ns"), unit="ms"))


def empty(message: str, *, id_: str | None = None) -> html.Div:
    """What a chart area shows when its data is missing: says what is missing and why."""
    kw: dict[str, Any] = {} if id_ is None else {"id": id_}
    return html.Div(message, className="empty-state", **kw)


def error(message: str) -> html.Div:
    return html.Div(message, className="error-state", role="alert")


def tile(
    title: str, rows: list[tuple[str, str]], *, alert: bool = False, colour: str | None = None
) -> html.Div:
    style = {"borderTopColor": colour} if colour else {}
    return html.Div(
        [
            html.Div(title, className="tile-title"),
            html.Table([html.Tr([html.Td(k), html.Td(v, className="num")]) for k, v in rows]),
        ],
        className="tile tile-alert" if alert else "tile",
        style=style,
    )


def fmt(v: float | None, unit: str = "", digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{v:,.{digits}f}{(' ' + unit) if unit else ''}"


def table(
    header: Sequence[str], rows: Sequence[Sequence[Any]], *, id_: str | None = None
) -> html.Table:
    kw: dict[str, Any] = {} if id_ is None else {"id": id_}
    return html.Table(
        [
            html.Thead(html.Tr([html.Th(h) for h in header])),
            html.Tbody([html.Tr([html.Td(c) for c in r]) for r in rows]),
        ],
        className="data-table",
        **kw,
    )


def incident_table(incidents: Sequence[Incident], *, id_: str) -> html.Table:
    """Open and recent incidents: victim, when, peak vs SLO, top cause, culprit and share;
    each links to its page with the range around it (a link that can be pasted)."""
    rows = []
    for i in incidents:
        top = i.top
        around = incident_range(i.start_ns, i.end_ns).text
        link = dcc.Link(i.id, href=f"/incident?id={i.id}&range={around}")
        rows.append(
            [
                link,
                html.Span(i.state, className=f"state state-{i.state}"),
                html.Span(i.severity, className=f"severity severity-{i.severity}"),
                ", ".join(i.indicators),
                i.model,
                i.gpu,
                format_ns(i.start_ns),
                f"{(i.end_ns - i.start_ns) / 1e9:.0f} s",
                fmt(i.peak_p99_ms, UNITS.get(i.indicator, "ms"))
                + (f" (SLO {fmt(i.slo_ms, UNITS.get(i.indicator, 'ms'), 0)})" if i.slo_ms else ""),
                str(top.kind) if top is not None else CauseKind.UNKNOWN.value,
                top.culprit if top is not None else "–",
                fmt(100 * top.share, "%", 0) if top is not None else "–",
            ]
        )
    header = (
        "incident",
        "state",
        "severity",
        "indicators",
        "victim",
        "GPU",
        "start (UTC)",
        "length",
        "peak p99",
        "top cause",
        "culprit",
        "share",
    )
    return table(header, rows, id_=id_)
