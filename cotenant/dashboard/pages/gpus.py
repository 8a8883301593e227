"""GPUs (``/gpus``): per-GPU heatmaps over time (SM, memory bandwidth, PCIe, power, clock) and
who shares each GPU — models and non-model processes with their SM and memory over time."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, ctx, dcc, html, no_update

from cotenant.core.errors import QueryError
from cotenant.dashboard import figures, theme
from cotenant.dashboard.components import empty, error, fmt, table, times
from cotenant.dashboard.context import PageContext
from cotenant.dashboard.data import Cols
from cotenant.dashboard.figures import Fig
from cotenant.dashboard.pages import register_page

_PANELS: tuple[tuple[str, str, str], ...] = (
    ("sm_util", "SM (%)", "%"),
    ("mem_util", "memory bw (%)", "%"),
    ("pcie", "PCIe (GB/s)", "GB/s"),
    ("power_w", "power (W)", "W"),
    ("sm_clock_mhz", "SM clock (MHz)", "MHz"),
)
"""Axis titles of the heatmap panels (the long names are in the hover text)."""
_METRICS: tuple[tuple[str, str, str], ...] = (
    ("sm_util", "SM utilisation", "%"),
    ("mem_util", "memory bandwidth (controller busy)", "%"),
    ("pcie", "PCIe throughput (tx + rx)", "GB/s"),
    ("power_w", "power", "W"),
    ("sm_clock_mhz", "SM clock", "MHz"),
)


def layout(range: str | None = None, **_: Any) -> html.Div:
    return html.Div(
        [
            dcc.Store(id="gpu-params", data={"range": range}),
            html.H2("GPUs"),
            html.H3("Counters per GPU over time"),
            html.Div(id="gpu-heatmaps"),
            html.H3("Who shares each GPU"),
            html.Div(id="gpu-sharing"),
        ]
    )


def register(app: Dash, pc: PageContext) -> None:
    register_page(__name__, path="/gpus", name="GPUs", order=2, layout=layout)
    data = pc.data

    @app.callback(
        Output("gpu-heatmaps", "children"),
        Output("gpu-sharing", "children"),
        Input("gpu-params", "data"),
        Input("shell-tick", "n_intervals"),
    )
    def render(params: dict[str, Any], _tick: int | None) -> tuple[Any, Any]:
        try:
            rng = pc.range(params.get("range"))
        except QueryError as exc:
            return error(str(exc)), None
        if ctx.triggered_id == "shell-tick" and not rng.live:
            return no_update, no_update
        g = data.gpus(rng)
        if not len(g):
            why = (
                "no GPU counters yet — enable [nvml] on the GPU host, or read a DCGM exporter "
                "through [prometheus]"
                if not data.has_gpu_samples()
                else f"no GPU counters between {rng.label()} — pick a longer range"
            )
            return empty(why), empty("no per-process GPU samples in this range")
        data.learn_colours()
        heat = dcc.Graph(id="gpu-heatmap-graph", figure=_heatmaps(g), config={"displaylogo": False})
        p = data.processes(rng)
        gpus = sorted({x for x in g["gpu"] if x is not None})
        sharing = [_sharing(pc, gpu, p.where("gpu", gpu)) for gpu in gpus]
        return heat, html.Div([_who(pc, p), *sharing])


def _heatmaps(g: Cols) -> Fig:
    """One panel per counter, GPUs down, time across; each panel has its own colour bar."""
    gpus = sorted({x for x in g["gpu"] if x is not None})
    ts = sorted(set(g["ts_ns"]))
    col = {t: i for i, t in enumerate(ts)}
    row = {x: i for i, x in enumerate(gpus)}
    n = len(_METRICS)
    x = times(ts)
    traces = []
    for k, (key, name, unit) in enumerate(_METRICS, start=1):
        z: list[list[float | None]] = [[None] * len(ts) for _ in gpus]
        for i in range(len(g)):
            gpu = g["gpu"][i]
            if gpu is None:
                continue
            if key == "pcie":
                tx, rx = g["pcie_tx_bps"][i], g["pcie_rx_bps"][i]
                v = None if tx is None and rx is None else ((tx or 0.0) + (rx or 0.0)) / 1e9
            else:
                v = g[key][i]
            z[row[gpu]][col[g["ts_ns"][i]]] = v
        top = 1 - (k - 1) / n
        traces.append(
            {
                "type": "heatmap",
                "x": x,
                "y": gpus,
                "z": z,
                "name": name,
                "xaxis": "x",
                "yaxis": figures.axis_ref(k),
                "colorscale": "Cividis" if key == "sm_clock_mhz" else "Viridis",
                "colorbar": {
                    "title": {"text": unit},
                    "len": 0.8 / n,
                    "y": top - 0.5 / n,
                    "yanchor": "middle",
                    "thickness": 12,
                },
                "hovertemplate": f"%{{y}} %{{x}}<br>{name}: %{{z:.1f}} {unit}<extra></extra>",
            }
        )
    return figures.figure(
        traces,
        y_titles=[short for _, short, _ in _PANELS],
        height=130 * n + 60,
        gap=0.05,
    )


def _who(pc: PageContext, p: Cols) -> html.Table:
    """One row per process seen on a GPU: its model, or that it is not a model."""
    seen: dict[tuple[Any, Any], dict[str, Any]] = {}
    for i in range(len(p)):
        if p["gpu"][i] is None:
            continue
        key = (p["gpu"][i], p["pid"][i])
        r = seen.setdefault(
            key, {"name": p["process_name"][i], "model": p["model"][i], "sm": [], "mem": 0.0}
        )
        if p["sm_util"][i] is not None:
            r["sm"].append(p["sm_util"][i])
        r["mem"] = max(r["mem"], p["mem_used_bytes"][i] or 0.0)
    rows = []
    for (gpu, pid), r in sorted(seen.items(), key=lambda kv: (str(kv[0][0]), str(kv[1]["name"]))):
        mean = sum(r["sm"]) / len(r["sm"]) if r["sm"] else None
        kind = f"model {r['model']}" if r["model"] else "non-model process"
        rows.append([gpu, r["name"], str(pid), kind, fmt(mean, "%"), fmt(r["mem"] / 2**30, "GiB")])
    return table(("GPU", "process", "pid", "what", "mean SM", "max memory"), rows, id_="gpu-who")


def _sharing(pc: PageContext, gpu: str, p: Cols) -> html.Div:
    if not len(p):
        return html.Div([html.H4(gpu), empty(f"no per-process samples on {gpu} in this range")])
    key = [n or str(pid) for n, pid in zip(p["process_name"], p["pid"], strict=True)]
    names = sorted(
        {(k, m) for k, m in zip(key, p["model"], strict=True)},
        key=lambda t: (t[1] is None, t[0]),
    )
    traces = []
    for name, model in names:
        sel = [i for i, k in enumerate(key) if k == name]
        x = times([p["ts_ns"][i] for i in sel])
        colour = pc.data.colours(model) if model else theme.PROCESS_COLOUR
        label = name if model else f"{name} (non-model)"
        style = "solid" if model else "dash"
        sm = [p["sm_util"][i] for i in sel]
        mem = [(p["mem_used_bytes"][i] or 0) / 2**30 for i in sel]
        traces.append(
            figures.line(x, sm, label, colour, dash=style, legendgroup=label, stackgroup="sm")
        )
        traces.append(
            figures.line(
                x, mem, label, colour, yaxis="y2", dash=style, legendgroup=label, showlegend=False
            )
        )
    fig = figures.figure(traces, y_titles=["SM utilisation (%)", "memory used (GiB)"], height=440)
    return html.Div(
        [
            html.H4(f"{gpu}: SM and memory by process"),
            dcc.Graph(figure=fig, config={"displaylogo": False}),
        ]
    )
