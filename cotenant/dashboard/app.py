"""The Dash app factory: the shell (navigation, time-range picker, refresh tick) and the pages.

The shell keeps the URL and the picker in step: choosing a range rewrites ``?range=`` (keeping
``id`` / ``week``), so any view can be pasted into a chat; opening such a link sets the picker.
Pages (``dashboard/pages/``) render a static skeleton from their URL and fill it through
callbacks bound to this app instance, so two apps in one process never share state.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import dash
from dash import Dash, Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import DependencyException

from cotenant.core.actions import ActionControl
from cotenant.core.errors import ConfigError, QueryError
from cotenant.dashboard import plotlyjs
from cotenant.dashboard.context import PageContext
from cotenant.dashboard.data import DashboardData
from cotenant.dashboard.pages import actions, gpus, incident, overview, reports
from cotenant.dashboard.settings import DashboardSettings
from cotenant.dashboard.timerange import PRESETS, parse_range

log = logging.getLogger(__name__)

PAGES = (overview, incident, gpus, actions, reports)
_NAV = (
    ("/", "Overview"),
    ("/incident", "Incident"),
    ("/gpus", "GPUs"),
    ("/actions", "Actions"),
    ("/reports", "Reports"),
)
_KEEP = {"/incident": "id", "/reports": "week"}  # what a nav link keeps besides range
_CHART_PATHS = ("/", "/incident", "/gpus")  # pages that always draw charts: fetch plotly early


def create_app(
    data: DashboardData,
    *,
    actions_control: ActionControl | None = None,
    report_dir: str | Path = "./.cotenant/reports",
    refresh_s: float = DashboardSettings.refresh_s,
    default_range: str = DashboardSettings.default_range,
    plotly_js: str | Path | None = None,
    eager_loading: bool = False,
) -> Dash:
    """A Dash app over ``data``; serve ``app.server`` (Flask, WSGI).

    ``actions_control``: the action log and its approve/rollback (None: actions are off);
    ``refresh_s``: how often live pages re-read what changed; ``default_range``: the range a
    page opens with when its URL has none (ConfigError when it is not a range);
    ``plotly_js``: the plotly.js bundle to serve (None: ``dashboard.plotlyjs.choose``'s pick).
    A page loads only the scripts it uses (``dcc.Graph``'s and plotly's only where a chart is
    drawn); ``eager_loading=True`` loads every component's script and plotly.py's full
    plotly.js with every page instead (the first version's way; bench/dashboard.py compares)."""
    try:
        parse_range(default_range, 0)
    except QueryError as exc:
        raise ConfigError(f"config key dashboard.default_range: {exc}") from exc
    bundle = None if eager_loading else plotlyjs.choose(plotly_js)
    app = Dash(
        __name__,
        use_pages=True,
        pages_folder="",
        assets_folder=str(Path(__file__).with_name("assets")),
        suppress_callback_exceptions=True,
        title="cotenant",
        update_title="",
        serve_locally=True,
        eager_loading=eager_loading,
        on_error=_on_error,
    )
    if bundle is not None:
        plotlyjs.install(app, bundle, _CHART_PATHS)
    pc = PageContext(data, actions_control, Path(report_dir), default_range)
    for page in PAGES:
        page.register(app, pc)
    app.layout = _shell(refresh_s, default_range)
    _shell_callbacks(app, default_range)
    app.server.register_error_handler(DependencyException, _no_such_asset)
    return app


def _no_such_asset(exc: DependencyException) -> tuple[dict[str, str], int]:
    """A script path Dash does not serve (``/_dash-component-suites/<unknown>/…``) is a 404
    for the client, not a server error."""
    return {"error": f"path: no such dashboard asset ({exc})"}, 404


def _on_error(exc: Exception) -> None:
    """A failing callback (e.g. the store closing under it) is logged and leaves the page as
    it was; the service keeps serving."""
    log.error("dashboard callback failed: %s", exc, exc_info=exc)


def _shell(refresh_s: float, default_range: str) -> html.Div:
    options = [{"label": f"last {p}", "value": p} for p in PRESETS]
    return html.Div(
        [
            dcc.Location(id="shell-url", refresh="callback-nav"),
            dcc.Interval(id="shell-tick", interval=int(refresh_s * 1000)),
            html.Header(
                [
                    html.Span("cotenant", className="brand"),
                    html.Nav(
                        [
                            dcc.Link(
                                name,
                                href=path,
                                id=f"shell-nav-{name.lower()}",
                                className="nav-link",
                            )
                            for path, name in _NAV
                        ]
                    ),
                    html.Div(
                        [
                            html.Label("time range", htmlFor="shell-range"),
                            dcc.Dropdown(
                                id="shell-range",
                                options=options,
                                value=default_range,
                                clearable=False,
                                searchable=True,
                                style={"width": "260px"},
                            ),
                        ],
                        className="range-picker",
                    ),
                ],
                className="shell-header",
            ),
            html.Main(dash.page_container, className="shell-main"),
        ]
    )


def _query(search: str | None) -> dict[str, str]:
    return dict(parse_qsl((search or "").lstrip("?")))


def _shell_callbacks(app: Dash, default_range: str) -> None:
    @app.callback(
        Output("shell-url", "search"),
        Output("shell-range", "value"),
        Output("shell-range", "options"),
        Input("shell-url", "search"),
        Input("shell-range", "value"),
        State("shell-range", "options"),
    )
    def sync_range(
        search: str | None, picked: str | None, options: list[dict[str, Any]]
    ) -> tuple[Any, Any, Any]:
        q = _query(search)
        if ctx.triggered_id == "shell-range" and picked:
            if q.get("range", default_range) == picked:
                return no_update, no_update, no_update
            q["range"] = picked
            return "?" + urlencode(q, safe=":.,"), no_update, no_update
        current = q.get("range") or default_range
        if not any(o["value"] == current for o in options):  # a pasted custom range
            options = [*options, {"label": current, "value": current}]
            return no_update, current, options
        return no_update, current, no_update

    @app.callback(
        [Output(f"shell-nav-{name.lower()}", "href") for _, name in _NAV],
        Input("shell-url", "search"),
    )
    def nav_links(search: str | None) -> list[str]:
        q = _query(search)
        keep = {"range": q["range"]} if "range" in q else {}
        out = []
        for path, _ in _NAV:
            own = _KEEP.get(path)
            extra = {own: q[own]} if own is not None and own in q else {}
            qs = urlencode({**keep, **extra}, safe=":.,")
            out.append(path + ("?" + qs if qs else ""))
        return out
