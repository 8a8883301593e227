"""Plotly figures as plain dicts (``{"data": [...], "layout": {...}}``).

Building ``plotly.graph_objects`` figures validates every property in Python, which costs
100-600 ms for the dashboard's multi-panel charts; plotly.js needs none of it. These helpers
give the common look (titled axes with units, legend on top, stacked panels sharing a time
axis, optional right-hand axes) without that cost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Fig = dict[str, Any]
Trace = dict[str, Any]

_AXIS: dict[str, Any] = {
    "gridcolor": "#e8e8e8",
    "linecolor": "#c8c8c8",
    "zeroline": False,
    "automargin": True,
}


def axis_ref(row: int, *, secondary: bool = False, with_secondary: bool = False) -> str:
    """The y-axis id (``y``, ``y2``, …) of panel ``row`` (1 = top)."""
    idx = 2 * row - 1 + int(secondary) if with_secondary else row
    return "y" if idx == 1 else f"y{idx}"


def _layout_key(ref: str) -> str:
    return "yaxis" + ref[1:]


def figure(
    traces: Sequence[Trace],
    *,
    y_titles: Sequence[str],
    x_title: str = "time (UTC)",
    height: int = 280,
    secondary_titles: Sequence[str] | None = None,
    x_type: str = "date",
    gap: float = 0.1,
) -> Fig:
    """A figure of ``len(y_titles)`` panels stacked over one shared x axis; with
    ``secondary_titles`` each panel also has a right-hand axis (see :func:`axis_ref`)."""
    rows = len(y_titles)
    two = secondary_titles is not None
    layout: dict[str, Any] = {
        "height": height,
        "margin": {"l": 70, "r": 70 if two else 20, "t": 30, "b": 45},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
        "uirevision": "keep",
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "font": {"family": "system-ui, -apple-system, sans-serif", "size": 12},
        "xaxis": {
            **_AXIS,
            "type": x_type,
            "title": {"text": x_title},
            "anchor": axis_ref(rows, with_secondary=two),
        },
    }
    for r in range(1, rows + 1):
        top = 1 - (r - 1) / rows - (gap / 2 if r > 1 else 0)
        bottom = 1 - r / rows + (gap / 2 if r < rows else 0)
        ref = axis_ref(r, with_secondary=two)
        layout[_layout_key(ref)] = {
            **_AXIS,
            "domain": [bottom, top],
            "anchor": "x",
            "title": {"text": y_titles[r - 1]},
        }
        if two and secondary_titles is not None:
            layout[_layout_key(axis_ref(r, secondary=True, with_secondary=True))] = {
                **_AXIS,
                "overlaying": ref,
                "side": "right",
                "anchor": "x",
                "showgrid": False,
                "title": {"text": secondary_titles[r - 1]},
            }
    return {"data": list(traces), "layout": layout}


def line(
    x: Sequence[Any],
    y: Sequence[Any],
    name: str,
    colour: str,
    *,
    yaxis: str = "y",
    dash: str = "solid",
    **extra: Any,
) -> Trace:
    return {
        "type": "scatter",
        "mode": "lines",
        "x": list(x),
        "y": list(y),
        "name": name,
        "line": {"color": colour, "dash": dash, "width": extra.pop("width", 2)},
        "xaxis": "x",
        "yaxis": yaxis,
        **extra,
    }


def shade(fig: Fig, x0: str, x1: str, fill: str, *, yaxis: str = "y", label: str = "") -> None:
    """A band over the whole height of one panel (e.g. the spike)."""
    fig["layout"].setdefault("shapes", []).append(
        {
            "type": "rect",
            "xref": "x",
            "yref": f"{yaxis} domain",
            "x0": x0,
            "x1": x1,
            "y0": 0,
            "y1": 1,
            "fillcolor": fill,
            "line": {"width": 0},
            "layer": "below",
        }
    )
    if label:
        _note(
            fig, {"xref": "x", "x": x0, "xanchor": "left", "yref": f"{yaxis} domain", "y": 1}, label
        )


def hline(fig: Fig, y: float, colour: str, label: str, *, yaxis: str = "y") -> None:
    """A horizontal reference line (e.g. an SLO) across one panel."""
    fig["layout"].setdefault("shapes", []).append(
        {
            "type": "line",
            "xref": "paper",
            "x0": 0,
            "x1": 1,
            "yref": yaxis,
            "y0": y,
            "y1": y,
            "line": {"color": colour, "dash": "dot", "width": 1},
        }
    )
    _note(fig, {"xref": "paper", "x": 1, "xanchor": "right", "yref": yaxis, "y": y}, label, colour)


def _note(fig: Fig, where: dict[str, Any], text: str, colour: str = "#555") -> None:
    fig["layout"].setdefault("annotations", []).append(
        {
            **where,
            "text": text,
            "showarrow": False,
            "yanchor": "bottom",
            "font": {"color": colour, "size": 11},
        }
    )


def token_panels(
    t: Any,
    colour_of: Callable[[str], str],
    slos: Mapping[str, Mapping[str, float]],
    *,
    to_time: Callable[[Sequence[int]], list[str]],
) -> Fig | None:
    """TTFT p99 (top, ms) and TPOT p99 (bottom, ms per token) per generative model of ``t``
    (TOKEN_WINDOWS columns as lists, ``dashboard.data.Cols``), each model's SLO of that
    indicator as a dotted line; None when ``t`` holds no TTFT or TPOT (no generative model)."""
    if not len(t):
        return None

    def measured(values: Sequence[float | None]) -> bool:
        return any(v is not None and v == v for v in values)

    # a model without token timings (not generative) has windows but no value: no panel
    models = [
        m
        for m in sorted(set(t["model"]))
        if measured((mine := t.where("model", m))["ttft_p99_ms"]) or measured(mine["tpot_p99_ms"])
    ]
    if not models:
        return None
    traces = []
    for m in models:
        mine = t.where("model", m)
        x = to_time(mine["ts_ns"])
        colour = colour_of(m)
        traces.append(line(x, mine["ttft_p99_ms"], f"{m} TTFT p99", colour, yaxis="y"))
        traces.append(line(x, mine["tpot_p99_ms"], f"{m} TPOT p99", colour, yaxis="y2", dash="dot"))
    fig = figure(traces, y_titles=["TTFT p99 (ms)", "TPOT p99 (ms/token)"], height=380, gap=0.14)
    for row, name in ((1, "ttft"), (2, "tpot")):
        for m in models:
            slo = slos.get(name, {}).get(m)
            if slo:
                hline(fig, slo, colour_of(m), f"{m} {name.upper()} SLO", yaxis=axis_ref(row))
    return fig
