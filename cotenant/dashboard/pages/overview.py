"""Overview (``/``): a tile per model and per GPU, p99 per model over time, open and recent
incidents. Live: on each tick the tiles re-read the last minute, the chart reads only the
windows after those it has, and the incident list is re-read only when the table changed."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, Patch, State, ctx, dcc, html, no_update

from cotenant.core.errors import QueryError
from cotenant.core.slos import breach
from cotenant.dashboard import figures
from cotenant.dashboard.components import at, empty, error, fmt, incident_table, tile, times
from cotenant.dashboard.context import PageContext
from cotenant.dashboard.data import Cols, step_for
from cotenant.dashboard.pages import register_page
from cotenant.dashboard.timerange import Range

SAFETY_LAG_NS = {True: 20_000_000_000, False: 2_000_000_000}
"""How long after a window ends it is drawn (rollup steps wait for the minute's rollup)."""


def layout(range: str | None = None, **_: Any) -> html.Div:
    return html.Div(
        [
            dcc.Store(id="ov-params", data={"range": range}),
            dcc.Store(id="ov-drawn"),
            dcc.Store(id="ov-incidents-mark"),
            html.H2("Overview"),
            html.Div(id="ov-range-label", className="range-label"),
            html.H3("Models"),
            html.Div(id="ov-models", className="tiles"),
            html.H3("GPUs"),
            html.Div(id="ov-gpus", className="tiles"),
            html.H3("p99 latency per model"),
            html.Div(id="ov-p99-empty"),
            dcc.Graph(id="ov-p99", config={"displaylogo": False}, style={"display": "none"}),
            # generative models only: the box stays empty where no request carries tokens
            html.Div(id="ov-tokens-box"),
            html.H3("Open and recent incidents"),
            dcc.RadioItems(
                id="ov-severity",
                options=[
                    {"label": "all", "value": "all"},
                    {"label": "breaches (over the SLO)", "value": "breach"},
                    {
                        "label": "degradations (slower than usual, within the SLO)",
                        "value": "degradation",
                    },
                ],
                value="all",
                inline=True,
                className="severity-filter",
            ),
            html.Div(id="ov-incidents"),
        ]
    )


def register(app: Dash, pc: PageContext) -> None:
    register_page(__name__, path="/", name="Overview", order=0, layout=layout)
    data = pc.data

    @app.callback(
        Output("ov-models", "children"),
        Output("ov-gpus", "children"),
        Output("ov-range-label", "children"),
        Input("ov-params", "data"),
        Input("shell-tick", "n_intervals"),
    )
    def tiles(params: dict[str, Any], _tick: int | None) -> tuple[Any, Any, Any]:
        try:
            rng = pc.range(params.get("range"))
        except QueryError as exc:
            return error(str(exc)), None, None
        if ctx.triggered_id == "shell-tick" and not rng.live:
            return no_update, no_update, no_update
        data.learn_colours()
        models = [_model_tile(m, data.colours(m["model"])) for m in data.model_tiles(rng)]
        if not models:
            models = [empty(_no_requests(pc, rng))]
        gpus = [_gpu_tile(g) for g in data.gpu_tiles(rng)]
        if not gpus:
            gpus = [
                empty(
                    "no GPU counters in this range — enable [nvml] on the GPU host "
                    "(cotenant serve polls NVML) or read a DCGM exporter through [prometheus]"
                )
            ]
        return models, gpus, rng.label() + (" (live)" if rng.live else "")

    @app.callback(
        Output("ov-p99", "figure"),
        Output("ov-p99", "style"),
        Output("ov-p99-empty", "children"),
        Output("ov-drawn", "data"),
        Input("ov-params", "data"),
        Input("shell-tick", "n_intervals"),
        State("ov-drawn", "data"),
    )
    def p99(
        params: dict[str, Any], _tick: int | None, drawn: dict[str, Any] | None
    ) -> tuple[Any, ...]:
        try:
            rng = pc.range(params.get("range"))
        except QueryError as exc:
            return no_update, {"display": "none"}, error(str(exc)), None
        step = step_for(rng)
        ready = rng.until_ns - SAFETY_LAG_NS[step >= 60]
        if ctx.triggered_id == "shell-tick" and drawn:
            if not rng.live:
                return no_update, no_update, no_update, no_update
            patched = _extend(data.latency(rng, since_ns=drawn["next_ns"]), drawn, rng, step, ready)
            if patched is not None:
                return patched
        w = data.latency(rng)
        if not len(w):
            return {}, {"display": "none"}, empty(_no_requests(pc, rng)), None
        data.learn_colours()
        order = sorted(set(w["model"]))
        last = 0
        traces = []
        for m in order:
            x, y = _complete(w.where("model", m), step, ready)
            last = max([last, *x])
            traces.append(figures.line(times(x), y, m, data.colours(m)))
        fig = figures.figure(traces, y_titles=["p99 latency (ms)"])
        for m in order:
            slo = data.slos.of(m)
            if slo:
                figures.hline(fig, slo, data.colours(m), f"{m} SLO")
        fig["layout"]["xaxis"]["range"] = [at(rng.since_ns), at(rng.until_ns)]
        state = {"models": order, "next_ns": last + step * 1_000_000_000 if last else rng.since_ns}
        return fig, {"display": "block"}, None, state

    @app.callback(
        Output("ov-tokens-box", "children"),
        Input("ov-params", "data"),
        Input("shell-tick", "n_intervals"),
    )
    def tokens(params: dict[str, Any], _tick: int | None) -> Any:
        """TTFT and TPOT p99 per generative model (redrawn on each live tick)."""
        try:
            rng = pc.range(params.get("range"))
        except QueryError:
            return None  # the latency chart says what is wrong with the range
        if ctx.triggered_id == "shell-tick" and not rng.live:
            return no_update
        data.learn_colours()
        fig = figures.token_panels(
            data.tokens(rng), data.colours, data.indicator_slo_ms, to_time=times
        )
        if fig is None:
            return None
        fig["layout"]["xaxis"]["range"] = [at(rng.since_ns), at(rng.until_ns)]
        return [
            html.H3("Time to first token and per output token (generative models)"),
            dcc.Graph(id="ov-tokens", figure=fig, config={"displaylogo": False}),
        ]

    @app.callback(
        Output("ov-incidents", "children"),
        Output("ov-incidents-mark", "data"),
        Input("ov-params", "data"),
        Input("shell-tick", "n_intervals"),
        Input("ov-severity", "value"),
        State("ov-incidents-mark", "data"),
    )
    def incidents(
        params: dict[str, Any], _tick: int | None, severity: str | None, mark: int | None
    ) -> tuple[Any, Any]:
        try:
            rng = pc.range(params.get("range"))
        except QueryError as exc:
            return error(str(exc)), None
        changed = data.incidents_changed_ns()
        if ctx.triggered_id == "shell-tick" and (changed == mark or not rng.live):
            return no_update, no_update
        found = data.incidents(rng)
        if severity in ("breach", "degradation"):
            found = [i for i in found if i.severity == severity]
        if not found:
            what = {"breach": "breaches", "degradation": "degradations"}.get(severity or "")
            return empty(
                f"no {what} in this range"
                if what
                else "no incidents in this range — every model stayed within its baseline and SLO"
            ), changed
        return incident_table(found, id_="ov-incident-table"), changed


def _complete(w: Cols, step: int, ready_ns: int) -> tuple[list[int], list[float | None]]:
    """The windows of one series that have ended (a partial last window is drawn later)."""
    keep = [i for i, t in enumerate(w["ts_ns"]) if t + step * 1_000_000_000 <= ready_ns]
    return [w["ts_ns"][i] for i in keep], [w["p99_ms"][i] for i in keep]


def _extend(
    w: Cols, drawn: dict[str, Any], rng: Range, step: int, ready: int
) -> tuple[Any, ...] | None:
    """Append the new windows to the drawn traces (a Patch: only new points travel); None
    when a model appeared that has no trace yet (then the whole chart is drawn again)."""
    models = drawn["models"]
    if any(m not in models for m in set(w["model"])):
        return None
    patch = Patch()
    last = drawn["next_ns"] - step * 1_000_000_000
    for i, m in enumerate(models):
        x, y = _complete(w.where("model", m), step, ready)
        if x:
            patch["data"][i]["x"].extend(times(x))
            patch["data"][i]["y"].extend(y)
            last = max(last, x[-1])
    patch["layout"]["xaxis"]["range"] = [at(rng.since_ns), at(rng.until_ns)]
    return patch, no_update, no_update, {"models": models, "next_ns": last + step * 1_000_000_000}


def _no_requests(pc: PageContext, rng: Range) -> str:
    if not pc.data.has_requests():
        return f"no spans received yet — point your OTLP exporter at {pc.data.otlp_hint}"
    return f"no requests completed in this range ({rng.label()}) — pick a longer range"


def _model_tile(m: dict[str, Any], colour: str) -> html.Div:
    slo = m["slo_ms"]
    over = m["p99_ms"] is not None and bool(breach(m["p99_ms"], slo))
    rows = [
        ("p99 now", fmt(m["p99_ms"], "ms") + (f" / SLO {fmt(slo, 'ms', 0)}" if slo else "")),
        ("requests/s", fmt(m["rps"], "", 1)),
        ("open incidents", _live_incidents(m)),
    ]
    return tile(m["model"], rows, alert=over or m["open_incidents"] > 0, colour=colour)


def _live_incidents(m: dict[str, Any]) -> str:
    """``2``, or ``2 (1 diagnosing)`` while some are found but their cause is not settled."""
    n, diagnosing = m["open_incidents"], m.get("diagnosing", 0)
    return f"{n} ({diagnosing} diagnosing)" if diagnosing else str(n)


_CLOCK_REASONS = {
    0x20: "SW thermal",
    0x40: "HW thermal",
    0x80: "HW power brake",
    0x4: "SW power cap",
    0x8: "HW slowdown",
}


def _clock_state(g: dict[str, Any]) -> str:
    reasons = int(g["clock_event_reasons"] or 0)
    named = [n for bit, n in _CLOCK_REASONS.items() if reasons & bit]
    clock = g["sm_clock_mhz"]
    base = fmt(clock, "MHz", 0) + (
        f" of {fmt(g['max_sm_clock_mhz'], '', 0)}" if g["max_sm_clock_mhz"] else ""
    )
    return base + (f" ({', '.join(named)})" if named else "")


def _gpu_tile(g: dict[str, Any]) -> html.Div:
    pcie = g["pcie_bps"]
    throttled = bool(int(g["clock_event_reasons"] or 0) & sum(_CLOCK_REASONS))
    rows = [
        ("SM", fmt(g["sm_util"], "%", 0)),
        ("memory bandwidth", fmt(g["mem_util"], "%", 0)),
        ("PCIe", fmt(None if pcie is None else pcie / 1e9, "GB/s", 2)),
        ("power", fmt(g["power_w"], "W", 0)),
        ("SM clock", _clock_state(g)),
    ]
    return tile(str(g["gpu"]), rows, alert=throttled)
