"""Actions (``/actions``): the action log with states and the victim's p99 before and after; in
``manual`` mode, approve and roll-back buttons.

The control token is typed into a password field, sent with the click, passed to
``ActionControl.authorize`` and cleared from the field; it is never rendered, kept in a
``dcc.Store`` or logged."""

from __future__ import annotations

import json
from typing import Any

from dash import ALL, Dash, Input, Output, State, ctx, dcc, html, no_update

from cotenant.core.errors import CotenantError, QueryError
from cotenant.core.timespec import format_ns
from cotenant.dashboard import theme
from cotenant.dashboard.components import empty, error, fmt, table
from cotenant.dashboard.context import PageContext
from cotenant.dashboard.pages import register_page

ACTOR = "dashboard"


def layout(range: str | None = None, **_: Any) -> html.Div:
    return html.Div(
        [
            dcc.Store(id="act-params", data={"range": range}),
            dcc.Store(id="act-changed", data=0),
            html.H2("Actions"),
            html.Div(id="act-mode"),
            html.Div(
                [
                    html.Label("control token", htmlFor="act-token"),
                    dcc.Input(
                        id="act-token",
                        type="password",
                        autoComplete="off",
                        placeholder="needed to approve or roll back",
                        debounce=False,
                    ),
                ],
                id="act-token-box",
                style={"display": "none"},
            ),
            html.Div(id="act-message", role="status"),
            html.Div(id="act-table"),
        ]
    )


def register(app: Dash, pc: PageContext) -> None:
    register_page(__name__, path="/actions", name="Actions", order=3, layout=layout)
    control = pc.actions

    @app.callback(
        Output("act-table", "children"),
        Output("act-mode", "children"),
        Output("act-token-box", "style"),
        Input("act-params", "data"),
        Input("act-changed", "data"),
        Input("shell-tick", "n_intervals"),
    )
    def render(params: dict[str, Any], _changed: int, _tick: int | None) -> tuple[Any, Any, Any]:
        hidden = {"display": "none"}
        try:
            rng = pc.range(params.get("range"))
        except QueryError as exc:
            return error(str(exc)), None, hidden
        if control is None:
            return (
                empty(
                    'actions are off — set [actuators] mode = "dry-run", "manual" or "auto" '
                    "to have causes turned into actions"
                ),
                html.P("mode: off"),
                hidden,
            )
        if ctx.triggered_id == "shell-tick" and not rng.live:
            return no_update, no_update, no_update
        mode = control.mode
        manual = mode == "manual"
        try:
            # a live range is open-ended: what happened since its end was computed belongs
            until = None if rng.live else rng.until_ns
            acts = control.list_actions(since_ns=rng.since_ns, until_ns=until)
        except CotenantError as exc:
            return error(f"could not read the action log: {exc}"), None, hidden
        banner = html.P(
            [f"mode: {mode}", " — proposed actions wait for approval here" if manual else ""],
            id="act-mode-text",
        )
        if not acts:
            return (
                empty(f"no actions between {rng.label()} (mode: {mode})"),
                banner,
                {"display": "block"} if manual else hidden,
            )
        return _table(acts, manual, rng.text), banner, {"display": "block"} if manual else hidden

    @app.callback(
        Output("act-message", "children"),
        Output("act-token", "value"),
        Output("act-changed", "data"),
        Input({"type": "act-approve", "index": ALL}, "n_clicks"),
        Input({"type": "act-rollback", "index": ALL}, "n_clicks"),
        State("act-token", "value"),
        State("act-changed", "data"),
        prevent_initial_call=True,
    )
    def click(
        _a: list[int | None], _r: list[int | None], token: str | None, changed: int
    ) -> tuple[Any, Any, Any]:
        trig = ctx.triggered_id
        if not isinstance(trig, dict) or not (ctx.triggered and ctx.triggered[0]["value"]):
            return no_update, no_update, no_update  # buttons (re)drawn, not clicked
        if control is None:
            return error("actions are off"), "", no_update
        action_id = str(trig["index"])
        try:
            control.authorize(token)
            if trig["type"] == "act-approve":
                after = control.approve(action_id, actor=ACTOR)
            else:
                after = control.rollback(
                    action_id, actor=ACTOR, reason="rolled back from the dashboard"
                )
        except CotenantError as exc:
            return error(f"{action_id}: {exc}"), "", (changed or 0) + 1
        return (
            html.P(f"{action_id} is now {after.get('state')}", className="ok-state"),
            "",
            (changed or 0) + 1,
        )


def _table(acts: list[dict[str, Any]], manual: bool, range_text: str) -> html.Table:
    rows = []
    for a in acts:
        aid = str(a.get("id"))
        state = str(a.get("state"))
        buttons = []
        if manual and state == "proposed":
            buttons.append(
                html.Button("approve", id={"type": "act-approve", "index": aid}, className="btn")
            )
        if manual and state == "applied":
            buttons.append(
                html.Button("roll back", id={"type": "act-rollback", "index": aid}, className="btn")
            )
        inc = a.get("incident_id")
        rows.append(
            [
                aid,
                format_ns(int(a["created_ns"])) if a.get("created_ns") else "–",
                dcc.Link(inc, href=f"/incident?id={inc}&range={range_text}") if inc else "–",
                a.get("kind"),
                a.get("target"),
                a.get("backend"),
                html.Span(
                    state,
                    className=f"state state-{state}",
                    style={"color": theme.STATE_COLOURS.get(state)},
                ),
                json.dumps(a.get("params") or {}, sort_keys=True),
                fmt(a.get("victim_p99_before_ms"), "ms"),
                fmt(a.get("victim_p99_after_ms"), "ms"),
                a.get("reason") or "",
                html.Div(buttons),
            ]
        )
    header = (
        "action",
        "created (UTC)",
        "incident",
        "kind",
        "target",
        "backend",
        "state",
        "params",
        "victim p99 before",
        "after",
        "reason",
        "",
    )
    return table(header, rows, id_="act-log")
