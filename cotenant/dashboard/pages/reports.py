"""Reports (``/reports?week=YYYY-Www``): the weekly contention reports on disk, newest first,
the chosen one shown in the page (``{report.dir}/{week}/report.html``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dash import Dash, Input, Output, dcc, html

from cotenant.dashboard.components import empty, error
from cotenant.dashboard.context import PageContext
from cotenant.dashboard.pages import register_page

WEEK = re.compile(r"^\d{4}-W(0[1-9]|[1-4]\d|5[0-3])$")
MAX_REPORT_BYTES = 20 * 1024 * 1024


def weeks(report_dir: Path) -> list[str]:
    """Weeks with a ``report.html``, newest first."""
    if not report_dir.is_dir():
        return []
    found = [
        d.name for d in report_dir.iterdir() if WEEK.match(d.name) and (d / "report.html").is_file()
    ]
    return sorted(found, reverse=True)


def layout(week: str | None = None, range: str | None = None, **_: Any) -> html.Div:
    return html.Div(
        [
            dcc.Store(id="rep-params", data={"week": week, "range": range}),
            html.H2("Weekly reports"),
            html.Div(id="rep-list"),
            html.Div(id="rep-view"),
        ]
    )


def register(app: Dash, pc: PageContext) -> None:
    register_page(__name__, path="/reports", name="Reports", order=4, layout=layout)

    @app.callback(
        Output("rep-list", "children"), Output("rep-view", "children"), Input("rep-params", "data")
    )
    def render(params: dict[str, Any]) -> tuple[Any, Any]:
        have = weeks(pc.report_dir)
        if not have:
            return None, empty(
                f"no weekly reports in {pc.report_dir} yet — run 'cotenant report' or set "
                "[report] schedule (e.g. 'mon 06:00') to write one every week"
            )
        want = params.get("week")
        rng = f"&range={params['range']}" if params.get("range") else ""
        links = html.Ul(
            [
                html.Li(
                    dcc.Link(
                        w,
                        href=f"/reports?week={w}{rng}",
                        className="active" if w == (want or have[0]) else "",
                    )
                )
                for w in have
            ],
            id="rep-weeks",
            className="week-list",
        )
        if want and not WEEK.match(str(want)):
            return links, error(f"week {want!r} is not a week like 2026-W49")
        week = str(want or have[0])
        if week not in have:
            return links, error(f"no report for week {week} in {pc.report_dir}")
        path = pc.report_dir / week / "report.html"
        try:
            size = path.stat().st_size
            if size > MAX_REPORT_BYTES:
                return links, error(f"{path} is {size / 2**20:.0f} MiB, too large to show here")
            body = path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return links, error(f"cannot read {path}: {exc.strerror}")
        frame = html.Iframe(
            id="rep-frame",
            srcDoc=body,
            title=f"weekly report {week}",
            style={"width": "100%", "height": "80vh", "border": "1px solid #ddd"},
        )
        return links, html.Div([html.H3(f"Week {week}"), frame])
