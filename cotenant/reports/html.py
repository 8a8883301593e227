"""The weekly report as one self-contained HTML page (plotly.js inlined once; opens offline)."""

from __future__ import annotations

from html import escape

import plotly.graph_objects as go

from cotenant.reports.recommend import nothing_to_recommend
from cotenant.reports.summary import WeekSummary
from cotenant.reports.text import (
    ORDINARY_HEAD,
    ORDINARY_NOTE,
    SECTIONS,
    delta,
    headline,
    hours,
    loads_note,
    ms,
    num,
    ordinary_cells,
    pct,
    when,
)

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #555; } .evidence { color: #555; font-size: 0.9em; }
@media print { section { break-inside: avoid; } }
"""


def _table(head: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    h = "".join(f"<th>{escape(x)}</th>" for x in head)
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


class _Figures:
    """plotly figures as HTML divs; the first carries plotly.js, the rest reuse it."""

    def __init__(self) -> None:
        self._first = True

    def div(self, fig: go.Figure, div_id: str) -> str:
        out: str = fig.to_html(
            full_html=False,
            include_plotlyjs=self._first,
            div_id=div_id,
            config={"displaylogo": False, "responsive": True},
        )
        self._first = False
        return out


def _heatmap(s: WeekSummary) -> go.Figure:
    victims = sorted({c.victim for c in s.matrix})
    culprits = [c.culprit for c in s.culprits if any(m.culprit == c.culprit for m in s.matrix)]
    z = [[0.0] * len(culprits) for _ in victims]
    for c in s.matrix:
        z[victims.index(c.victim)][culprits.index(c.culprit)] = round(c.minutes, 1)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=culprits,
            y=victims,
            colorscale="Reds",
            colorbar={"title": "victim-min"},
            hovertemplate="%{y} hurt by %{x}: %{z} min<extra></extra>",
        )
    )
    fig.update_layout(
        title="Impacted minutes: victim (rows) x culprit (columns)",
        xaxis_title="culprit",
        yaxis_title="victim",
        height=120 + 60 * len(victims),
        margin={"l": 80, "r": 20, "t": 50, "b": 60},
    )
    return fig


def _causes_bar(s: WeekSummary) -> go.Figure:
    fig = go.Figure()
    for kind in sorted({c.kind for c in s.causes}):
        rows = [c for c in s.causes if c.kind == kind]
        fig.add_bar(name=kind, x=[c.model for c in rows], y=[round(c.minutes, 1) for c in rows])
    fig.update_layout(
        barmode="stack",
        title="Impacted minutes by cause kind",
        yaxis_title="minutes",
        height=360,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig


def _token_table(s: WeekSummary) -> str:
    """TTFT / TPOT SLO attainment of the generative models that have those SLOs ("" when
    none has)."""
    rows = [
        [
            escape(m.model),
            ms(m.ttft_slo_ms),
            pct(m.ttft_attainment),
            "–" if m.tpot_slo_ms is None else f"{m.tpot_slo_ms:g} ms/token",
            pct(m.tpot_attainment),
        ]
        for m in s.models
        if m.ttft_slo_ms is not None or m.tpot_slo_ms is not None
    ]
    if not rows:
        return ""
    head = ["model", "TTFT SLO p99", "TTFT attainment", "TPOT SLO p99", "TPOT attainment"]
    return "<h3>Generative models: time to first token and per output token</h3>" + _table(
        head, rows, {1, 2, 3, 4}
    )


def render_html(s: WeekSummary) -> str:
    """The whole report as an HTML document with every section and its charts."""
    figs = _Figures()
    title = dict(SECTIONS)
    parts: list[str] = []
    t = s.totals
    rows = [
        [
            escape(m.model),
            num(m.requests),
            ms(m.slo_ms),
            pct(m.slo_attainment),
            str(m.incidents),
            num(m.impacted_minutes),
        ]
        for m in s.models
    ]
    wow = [
        [
            escape(c.scope),
            c.metric.replace("_", " "),
            pct(c.this_week) if c.metric == "slo_attainment" else num(c.this_week),
            pct(c.last_week) if c.metric == "slo_attainment" else num(c.last_week),
            delta(c),
        ]
        for c in s.changes
    ]
    parts.append(
        f'<section id="summary"><h2>{title["summary"]}</h2><p>{escape(headline(s))}</p>'
        f"<p>Requests {num(t.requests)}, incidents {t.incidents}, impacted minutes "
        f"{num(t.impacted_minutes)}, SLO attainment {pct(t.slo_attainment)}.</p>"
        + (
            _table(
                ["model", "requests", "SLO p99", "SLO attainment", "incidents", "impacted min"],
                rows,
                {1, 2, 3, 4, 5},
            )
            if rows
            else ""
        )
        + _token_table(s)
        + "<h3>Week over week</h3>"
        + _table(["scope", "metric", "this week", "last week", "change"], wow, {2, 3, 4})
        + "</section>"
    )
    if s.matrix:
        cul = [
            [
                escape(c.culprit),
                c.culprit_type,
                num(c.victim_minutes, 1),
                escape(", ".join(c.victims)),
                escape(", ".join(c.kinds)),
            ]
            for c in s.culprits
        ]
        body = (
            figs.div(_heatmap(s), "matrix")
            + "<h3>Top culprits</h3>"
            + _table(["culprit", "type", "victim-minutes", "victims", "kinds"], cul, {2})
        )
    else:
        body = '<p class="note">No co-tenant, process or GPU caused an incident this week.</p>'
    if s.ordinary:
        rows = [[escape(x) for x in ordinary_cells(o)] for o in s.ordinary]
        body += f"<h3>Ordinary contention</h3><p>{escape(ORDINARY_NOTE)}</p>" + _table(
            ORDINARY_HEAD, rows, {2, 3}
        )
    parts.append(f'<section id="who-hurt-whom"><h2>{title["who-hurt-whom"]}</h2>{body}</section>')
    if s.causes:
        worst = [
            [
                f'<a href="{escape(i.url)}">{escape(i.id)}</a>',
                escape(i.model),
                escape(i.gpu + (f" ({i.replica})" if i.replica else "")),
                when(i.start_ns),
                num(i.minutes),
                ms(i.peak_p99_ms),
                ms(i.baseline_p99_ms),
                escape(f"{i.top_kind} by {i.top_culprit}" if i.top_kind else "unknown"),
            ]
            for i in s.worst
        ]
        body = (
            figs.div(_causes_bar(s), "causes-chart")
            + "<h3>Worst incidents</h3>"
            + _table(
                ["incident", "model", "GPU", "start", "min", "peak p99", "baseline p99", "top"],
                worst,
                {4, 5, 6},
            )
        )
    else:
        body = '<p class="note">No incidents this week.</p>'
    parts.append(f'<section id="causes"><h2>{title["causes"]}</h2>{body}</section>')
    parts.append(f'<section id="loads"><h2>{title["loads"]}</h2>{_loads(s)}</section>')
    g_rows = [
        [
            escape(g.gpu),
            num(g.hours_sampled, 1),
            num(g.sm_saturated_h, 1),
            num(g.dram_saturated_h, 1),
            num(g.pcie_saturated_h, 1),
            num(g.throttled_h, 1),
            num(g.memory_full_h, 1),
            num(g.cotenancy_h, 1),
            escape(", ".join(g.models)),
            escape(", ".join(g.processes)),
        ]
        for g in s.gpus
    ]
    body = (
        _table(
            [
                "GPU",
                "hours sampled",
                "SM saturated h",
                "DRAM saturated h",
                "PCIe saturated h",
                "throttled h",
                "memory full h",
                "co-tenancy h",
                "models",
                "other processes",
            ],
            g_rows,
            {1, 2, 3, 4, 5, 6, 7},
        )
        if g_rows
        else '<p class="note">No GPU counters this week.</p>'
    )
    parts.append(f'<section id="gpus"><h2>{title["gpus"]}</h2>{body}</section>')
    a = s.action_counts
    if s.actions:
        body = (
            f"<p>{a.proposed} proposed, {a.applied} applied, {a.held} held, "
            f"{a.rolled_back} rolled back, {a.failed} failed; {a.held_back} held back by "
            "guardrails.</p>"
            + _table(
                ["action", "target", "state", "victim", "p99 before", "p99 after", "created"],
                [
                    [
                        escape(x.kind),
                        escape(x.target),
                        escape(x.state),
                        escape(x.victim or "–"),
                        ms(x.p99_before_ms),
                        ms(x.p99_after_ms),
                        when(x.created_ns),
                    ]
                    for x in s.actions
                ],
                {4, 5},
            )
        )
    else:
        body = '<p class="note">No actions were proposed this week.</p>'
    parts.append(f'<section id="actions"><h2>{title["actions"]}</h2>{body}</section>')
    if s.recommendations:
        items = "".join(
            f"<li><strong>{escape(r.title)}</strong> — {escape(r.because)}."
            f'<div class="evidence">evidence: {escape(_evidence(r.evidence))}</div></li>'
            for r in s.recommendations
        )
        body = f"<ul>{items}</ul>"
    else:
        body = f'<p class="note">{escape(nothing_to_recommend(s))}</p>'
    parts.append(
        f'<section id="recommendations"><h2>{title["recommendations"]}</h2>{body}</section>'
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Contention report {escape(s.week)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Contention report {escape(s.week)}</h1>"
        f'<p class="note">{when(s.start_ns)} to {when(s.end_ns)}; generated '
        f"{when(s.generated_ns)}</p>" + "".join(parts) + "</body></html>\n"
    )


def _loads(s: WeekSummary) -> str:
    """The "Model loads" section's body: the note, the waits, per kind, top replicas."""
    body = f'<p class="note">{escape(loads_note(s))}</p>'
    if s.load_waits:
        body += _table(
            ["model", "requests", "waited for loads", "share of latency", "mean wait"],
            [
                [
                    escape(w.model),
                    num(w.requests),
                    hours(w.wait_h),
                    "–" if w.latency_share is None else f"{w.latency_share * 100:.1f}%",
                    ms(w.mean_wait_ms),
                ]
                for w in s.load_waits
            ],
            {1, 2, 3, 4},
        )
    if s.load_kinds:
        body += _table(
            ["model", "kind", "loads", "load time", "mean", "longest", "replicas", "most on"],
            [
                [
                    escape(k.model),
                    escape(k.kind),
                    num(k.loads),
                    hours(k.load_h),
                    ms(k.mean_ms),
                    ms(k.max_ms),
                    str(k.replicas),
                    escape(k.top_replica),
                ]
                for k in s.load_kinds
            ],
            {2, 3, 4, 5, 6},
        )
        kinds = sorted({k.kind for k in s.load_kinds})
        body += "<p>Replicas that spent the most time loading:</p>" + _table(
            ["replica", "model", "loads", "load time", *kinds],
            [
                [
                    escape(r.replica),
                    escape(r.model),
                    num(r.loads),
                    hours(r.load_h),
                    *(hours(r.by_kind_ms[k] / 3.6e6) if k in r.by_kind_ms else "–" for k in kinds),
                ]
                for r in s.load_replicas
            ],
            set(range(2, 4 + len(kinds))),
        )
    return body


def _evidence(ev: dict[str, object]) -> str:
    return "; ".join(
        f"{k.replace('_', ' ')} {', '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in ev.items()
    )
