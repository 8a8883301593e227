"""Incident (``/incident?id=…``): the victim's latency with the spike shaded, its latency by
phase, the ranked causes, the evidence for the top causes against the victim's excess, the
actions proposed or taken for it and, in fleet mode, the victim's slowest requests fetched from
the agent of its node (or why they could not be). Without ``id``: the incidents of the range to
pick from."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, dcc, html

from cotenant.analysis.attribution import Cause
from cotenant.analysis.incident_record import Incident
from cotenant.analysis.indicators import UNITS
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.errors import CotenantError, QueryError
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.core.slos import E2E
from cotenant.core.timespec import format_ns
from cotenant.dashboard import figures, theme
from cotenant.dashboard.components import at, empty, error, fmt, incident_table, table, times
from cotenant.dashboard.context import PageContext
from cotenant.dashboard.data import Cols
from cotenant.dashboard.figures import Fig
from cotenant.dashboard.pages import register_page
from cotenant.dashboard.timerange import Range, incident_range

_GRAPHS = ("inc-latency", "inc-tokens", "inc-phases", "inc-causes", "inc-evidence")


_TITLES = (
    "Victim latency",
    "Time to first token and per output token",
    "Latency by phase",
    "Ranked causes",
    "Evidence for the top causes",
)


def layout(id: str | None = None, range: str | None = None, **_: Any) -> html.Div:
    return html.Div(
        [
            dcc.Store(id="inc-params", data={"id": id, "range": range}),
            html.H2("Incident"),
            html.Div(id="inc-summary"),
            # graphs are created with their figure: plotly drawing into a hidden box logs errors
            *[html.Div(id=f"{g}-box") for g in _GRAPHS],
            html.H3("Actions for this incident"),
            html.Div(id="inc-actions"),
            html.Div(id="inc-drill"),
        ]
    )


def register(app: Dash, pc: PageContext) -> None:
    register_page(__name__, path="/incident", name="Incident", order=1, layout=layout)
    data = pc.data

    @app.callback(
        Output("inc-summary", "children"),
        *[Output(f"{g}-box", "children") for g in _GRAPHS],
        Output("inc-actions", "children"),
        Output("inc-drill", "children"),
        Input("inc-params", "data"),
    )
    def render(params: dict[str, Any]) -> tuple[Any, ...]:
        nothing = (None,) * len(_GRAPHS)
        try:
            page_rng = pc.range(params.get("range"))
        except QueryError as exc:
            return (error(str(exc)), *nothing, None, None)
        iid = params.get("id")
        if not iid:
            found = data.incidents(page_rng)
            pick = (
                incident_table(found, id_="inc-pick")
                if found
                else empty(f"no incidents between {page_rng.label()} — pick a longer range")
            )
            return (html.Div([html.P("Pick an incident:"), pick]), *nothing, None, None)
        inc = data.incident(str(iid))
        if inc is None:
            return (
                error(f"no incident {iid!r} in the store (expired, or a typo in the link?)"),
                *nothing,
                None,
                None,
            )
        rng = (
            pc.range(params["range"])
            if params.get("range")
            else incident_range(inc.start_ns, inc.end_ns)
        )
        data.learn_colours()
        unread = None
        try:
            w = data.latency(rng, model=inc.model, gpu=inc.gpu or None)
            tok = data.tokens(rng, model=inc.model, gpu=inc.gpu or None)
        except CotenantError as exc:  # fleet mode: Prometheus down; the diagnosis stands
            w, tok = Cols({}), Cols({})
            unread = error(f"the victim's series cannot be read now: {exc}")
        figs = (
            _latency(inc, w, data.colours(inc.model)),
            _tokens(inc, tok, pc),
            _phases(w),
            _causes(inc),
            _evidence(pc, inc, _indicator_windows(inc, w, tok), rng),
        )
        boxes = [
            None
            if f is None
            else [html.H3(t), dcc.Graph(id=g, figure=f, config={"displaylogo": False})]
            for g, t, f in zip(_GRAPHS, _TITLES, figs, strict=True)
        ]
        summary = _summary(inc) if unread is None else html.Div([_summary(inc), unread])
        return (summary, *boxes, _actions(pc, inc), _drill(pc, inc))


_INDICATOR_NAMES = {"e2e": "latency", "ttft": "time to first token", "tpot": "time per token"}


def _summary(inc: Incident) -> html.Div:
    top = inc.top
    unit = UNITS.get(inc.indicator, "ms")
    notes = inc.told.notes
    return html.Div(
        [
            html.P(
                [
                    html.Strong(inc.model),
                    f" on {inc.gpu or '–'}"
                    + (f" (replica {inc.replica})" if inc.replica else "")
                    + f" · {inc.state} · {format_ns(inc.start_ns)} for "
                    f"{(inc.end_ns - inc.start_ns) / 1e9:.0f} s · "
                    f"{_INDICATOR_NAMES[inc.indicator]} p99 peak {fmt(inc.peak_p99_ms, unit)} "
                    f"vs baseline {fmt(inc.baseline_p99_ms, unit)}"
                    + (f" (SLO {fmt(inc.slo_ms, unit, 0)})" if inc.slo_ms else ""),
                ]
            ),
            html.P(
                f"Top cause: {top.kind} — {top.culprit}, {100 * top.share:.0f} % of the excess"
                if top is not None
                else f"Top cause: {CauseKind.UNKNOWN} — not found",
                id="inc-top",
            ),
            *[html.P(n, className="note") for n in notes],
        ],
        id="inc-id",
        title=inc.id,
    )


def _latency(inc: Incident, w: Cols, colour: str) -> Fig | None:
    if not len(w):
        return None
    x = times(w["ts_ns"])
    fig = figures.figure(
        [
            figures.line(x, w["p99_ms"], f"{inc.model} p99", colour),
            figures.line(x, w["p50_ms"], f"{inc.model} p50", colour, dash="dot"),
        ],
        y_titles=["latency (ms)"],
    )
    if inc.slo_ms and inc.indicator == E2E:
        figures.hline(fig, inc.slo_ms, theme.SLO_COLOUR, "SLO")
    figures.shade(fig, at(inc.start_ns), at(inc.end_ns), theme.SPIKE_FILL, label="spike")
    return fig


def _tokens(inc: Incident, tok: Cols, pc: PageContext) -> Fig | None:
    """The victim's TTFT and TPOT p99 (generative models only), the spike shaded on the
    panel of the indicator that breached (both for an e2e incident)."""
    fig = figures.token_panels(tok, pc.data.colours, pc.data.indicator_slo_ms, to_time=times)
    if fig is None:
        return None
    rows = {"ttft": (1,), "tpot": (2,)}.get(inc.indicator, (1, 2))
    for row in rows:
        figures.shade(
            fig, at(inc.start_ns), at(inc.end_ns), theme.SPIKE_FILL, yaxis=figures.axis_ref(row)
        )
    return fig


def _indicator_windows(inc: Incident, w: Cols, tok: Cols) -> Cols:
    """Windows whose ``p99_ms`` is the incident's indicator (the excess the evidence chart
    sets each cause against)."""
    if inc.indicator == E2E or not len(tok):
        return w
    return Cols({"ts_ns": tok["ts_ns"], "p99_ms": tok[f"{inc.indicator}_p99_ms"]})


def _phases(w: Cols) -> Fig | None:
    if not len(w):
        return None
    cols = [c for c in PHASE_COLUMNS if any(v for v in w[c] if v is not None)]
    if not cols:
        return None
    x = times(w["ts_ns"])
    traces = [
        figures.line(
            x, w[c], c.removesuffix("_ms"), theme.PHASE_COLOURS[c], stackgroup="phases", width=0.5
        )
        for c in cols
    ]
    return figures.figure(traces, y_titles=["mean time per request (ms)"])


def _drill(pc: PageContext, inc: Incident) -> Any:
    """Fleet mode: the victim's slowest requests during the incident, from its node's agent."""
    drill = pc.data.drill
    if drill is None:
        return None
    end = inc.end_ns if inc.state == "resolved" else pc.data.clock_ns()
    got = drill.slowest(inc.model, inc.gpu or None, inc.start_ns, max(end, inc.start_ns + 1))
    agents = ", ".join(f"{a['node'] or a['url']} ({a['url']})" for a in got.get("agents", []))
    parts: list[Any] = [html.H3("Slowest requests" + (f" — from {agents}" if agents else ""))]
    if got.get("note"):
        parts.append(html.P(got["note"], className="note", id="inc-drill-note"))
    rows = [
        [
            format_ns(int(r["ts_end_ns"])),
            fmt(r.get("latency_ms"), "ms"),
            r.get("node") or r.get("host") or "",
            r.get("trace_id") or "",
            *[fmt(r.get(c), "ms") for c in ("queue_ms", "lock_wait_ms", "compute_ms")],
        ]
        for r in got.get("requests", [])
    ]
    if rows:
        parts.append(
            table(("ended", "latency", "node", "trace id", "queue", "lock wait", "compute"), rows)
        )
    elif not got.get("note"):
        parts.append(empty("the agent kept no request of this incident (retention?)"))
    return html.Div(parts, id="inc-drill-box")


def _label(rank: int, c: Cause) -> str:
    res = f" ({c.resource})" if c.resource else ""
    return f"{rank}. {c.kind}{res} · {c.culprit}"


def _causes(inc: Incident) -> Fig | None:
    causes = inc.causes
    if not causes:
        return None
    shares = [100 * c.share for c in causes]
    bar = {
        "type": "bar",
        "orientation": "h",
        "x": shares,
        "y": [_label(i + 1, c) for i, c in enumerate(causes)],
        "customdata": [c.culprit for c in causes],
        "name": "share of the excess (bar opacity: confidence)",
        "showlegend": True,
        "text": [
            f"{s:.0f} % · confidence {c.confidence:.2f}"
            for s, c in zip(shares, causes, strict=True)
        ],
        "textposition": "auto",
        "marker": {
            "color": [
                theme.PROCESS_COLOUR if c.kind == CauseKind.UNKNOWN else theme.SLO_COLOUR
                for c in causes
            ],
            "opacity": [0.4 + 0.6 * c.confidence for c in causes],
        },
    }
    fig = figures.figure(
        [bar],
        y_titles=["cause (rank · kind · culprit)"],
        x_title="share of the victim's excess latency (%)",
        x_type="linear",
        height=110 + 40 * len(causes),
    )
    fig["layout"]["yaxis"]["autorange"] = "reversed"
    fig["layout"]["xaxis"]["range"] = [0, 100]
    return fig


def _evidence(pc: PageContext, inc: Incident, w: Cols, rng: Range) -> Fig | None:
    """Each top cause's series (left axis, its unit) against the victim's excess p99 over its
    baseline (right axis, ms), one panel per cause."""
    top = [c for c in inc.causes if c.kind != CauseKind.UNKNOWN][:2]
    series: list[tuple[Cause, dict[str, Any]]] = []
    for c in top:
        s = pc.data.evidence(inc, c, rng)
        if s is not None and s["x"]:
            series.append((c, s))
    if not series or not len(w):
        return None
    base = inc.baseline_p99_ms or 0.0
    excess = [None if v is None else v - base for v in w["p99_ms"]]
    wx = times(w["ts_ns"])
    models = pc.data.colours.models()
    traces = []
    for row, (c, s) in enumerate(series, start=1):
        colour = pc.data.colours(c.culprit, model=c.culprit in models)
        left = figures.axis_ref(row, with_secondary=True)
        right = figures.axis_ref(row, secondary=True, with_secondary=True)
        traces.append(figures.line(times(s["x"]), s["y"], s["name"], colour, yaxis=left))
        traces.append(
            figures.line(
                wx,
                excess,
                f"{inc.model} {inc.indicator} p99 over baseline",
                theme.SLO_COLOUR,
                yaxis=right,
                dash="dot",
                showlegend=row == 1,
                legendgroup="excess",
            )
        )
    fig = figures.figure(
        traces,
        y_titles=[
            f"{s['name']} ({s['unit']})" if len(s["name"]) < 28 else s["unit"] for _, s in series
        ],
        secondary_titles=["excess p99 (ms)"] * len(series),
        height=80 + 230 * len(series),
        gap=0.16,
    )
    for row in range(1, len(series) + 1):
        figures.shade(
            fig,
            at(inc.start_ns),
            at(inc.end_ns),
            theme.SPIKE_FILL,
            yaxis=figures.axis_ref(row, with_secondary=True),
        )
    return fig


def _actions(pc: PageContext, inc: Incident) -> Any:
    if pc.actions is None:
        return empty('actions are off ([actuators] mode = "off"): nothing is proposed or applied')
    try:
        acts = pc.actions.list_actions(incident_id=inc.id)
    except CotenantError as exc:
        return error(f"could not read the action log: {exc}")
    if not acts:
        return empty(f"no action proposed for this incident (actuators mode: {pc.actions.mode})")
    rows = [
        [
            a.get("id"),
            html.Span(a.get("state"), className=f"state state-{a.get('state')}"),
            a.get("kind"),
            a.get("target"),
            fmt(a.get("victim_p99_before_ms"), "ms"),
            fmt(a.get("victim_p99_after_ms"), "ms"),
            a.get("reason") or "",
        ]
        for a in acts
    ]
    return table(
        ("action", "state", "kind", "target", "victim p99 before", "after", "reason"), rows
    )
