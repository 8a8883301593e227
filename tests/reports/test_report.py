"""The weekly report on a simulated fortnight: sections, numbers, culprits, formats."""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

import pytest

from cotenant.core.errors import ReportError
from cotenant.core.slos import Slos
from cotenant.reports.compute import ReportBuilder
from cotenant.reports.html import render_html
from cotenant.reports.isoweek import parse_week
from cotenant.reports.markdown import render_markdown
from cotenant.reports.pdf import ChromiumPrinter
from cotenant.reports.summary import Thresholds, WeekSummary
from cotenant.reports.text import SECTIONS
from cotenant.reports.writer import write_report
from tests.reports.conftest import PREV, SLO, WEEK, Fortnight

BASE = "http://dash.example:8050"


@pytest.fixture(scope="module")
def summary(fortnight: Fortnight) -> WeekSummary:
    store = fortnight.open()
    try:
        return ReportBuilder(store, slos=Slos.of_maps(SLO), dashboard_url=BASE).build(WEEK)
    finally:
        store.close()


def _sql(fortnight: Fortnight, q: str, params: list[object]) -> list[tuple[object, ...]]:
    store = fortnight.open()
    try:
        with store.cursor() as cur:
            return cur.execute(q, params).fetchall()
    finally:
        store.close()


def test_every_section_is_present_in_html_and_markdown(summary: WeekSummary) -> None:
    html, md = render_html(summary), render_markdown(summary)
    for anchor, title in SECTIONS:
        assert f'id="{anchor}"' in html and f"<h2>{title}</h2>" in html
        assert f"## {title}" in md
    assert html.count("<script") >= 1 and html.count("Plotly.newPlot") == 2  # heatmap + causes
    assert 'id="matrix"' in html and '<script src="http' not in html  # plotly.js inline
    assert len(summary.worst) == 8 and all(escape(i.url) in html for i in summary.worst)
    assert summary.recommendations and "Recommendations" in md
    # the simulated week's 0.2 ms of uncovered time per request is no model load
    assert summary.load_waits == [] and summary.load_kinds == []
    assert "No request waited for a model, adapter or pipeline load this week." in md


def test_numbers_equal_the_store(fortnight: Fortnight, summary: WeekSummary) -> None:
    lo, hi = WEEK.start_ns, WEEK.end_ns
    requests = dict(
        _sql(
            fortnight,
            "SELECT model, sum(count) FROM request_rollup_1m "
            "WHERE minute_ns >= ? AND minute_ns < ? GROUP BY model",
            [lo, hi],
        )
    )
    assert {m.model: m.requests for m in summary.models} == requests
    assert summary.totals.requests == sum(int(v) for v in requests.values())  # type: ignore[call-overload]
    assert summary.totals.requests > 40_000_000  # a week of ~85 rps, through rollups
    for m in summary.models:
        per_minute = _sql(
            fortnight,
            "SELECT minute_ns, max(p99_ms) FROM request_rollup_1m WHERE model = ? "
            "AND minute_ns >= ? AND minute_ns < ? AND count > 0 GROUP BY minute_ns",
            [m.model, lo, hi],
        )
        met = sum(1 for _, p99 in per_minute if p99 <= SLO[m.model])  # type: ignore[operator]
        assert m.slo_attainment == pytest.approx(met / len(per_minute))
        assert m.slo_attainment is not None and 0.95 < m.slo_attainment < 1.0
    incs = _sql(
        fortnight,
        "SELECT model, start_ns, end_ns, top_cause, top_culprit FROM incidents "
        "WHERE start_ns < ? AND end_ns > ?",
        [hi, lo],
    )
    # one per victim of the week's four faults, and embed's own: its steady traffic rose 4x
    # for an hour (the burst that slows chat), an incident naming its own load
    assert summary.totals.incidents == len(incs) == 8
    assert [(m, k, c) for m, _, _, k, c in incs if c == m] == [("embed", "load", "embed")]
    minutes = sum((min(e, hi) - max(s, lo)) / 60e9 for _, s, e, _, _ in incs)  # type: ignore[operator]
    assert summary.totals.impacted_minutes == pytest.approx(minutes)
    g1 = next(g for g in summary.gpus if g.gpu == "gpu-1")
    (throttled,) = _sql(
        fortnight,
        "SELECT count(*) FROM gpu_rollup_1m WHERE gpu = 'gpu-1' AND minute_ns >= ? "
        "AND minute_ns < ? AND clock_event_reasons <> 0",
        [lo, hi],
    )[0]
    assert g1.throttled_h == pytest.approx(throttled / 60) and g1.throttled_h == 0.75  # type: ignore[operator]
    assert g1.models == ["rerank", "tts"] and g1.processes == ["train-job"]
    assert next(g for g in summary.gpus if g.gpu == "gpu-0").dram_saturated_h >= 1.0
    a = summary.action_counts
    assert (a.proposed, a.applied, a.held, a.rolled_back, a.held_back) == (2, 2, 1, 1, 1)
    held = next(x for x in summary.actions if x.state == "verified")
    assert (held.victim, held.p99_before_ms, held.p99_after_ms) == ("chat", 180.0, 80.0)
    back = next(x for x in summary.actions if x.state == "rolled_back")
    ((created,),) = _sql(fortnight, "SELECT created_ns FROM actions WHERE id = 'act-1'", [])
    rows = _sql(
        fortnight,
        "SELECT minute_ns, count, p99_ms FROM request_rollup_1m WHERE model = 'chat'",
        [],
    )
    win = 15 * 60 * 10**9
    pre = [(n, p) for m, n, p in rows if created - win <= m < created]  # type: ignore[operator]
    post = [(n, p) for m, n, p in rows if created + 10**9 <= m < created + 10**9 + win]  # type: ignore[operator]
    assert back.p99_before_ms == pytest.approx(sum(n * p for n, p in pre) / sum(n for n, _ in pre))  # type: ignore[misc]
    assert back.p99_after_ms == pytest.approx(sum(n * p for n, p in post) / sum(n for n, _ in post))  # type: ignore[misc]


def test_culprit_matrix_matches_the_injected_faults(
    fortnight: Fortnight, summary: WeekSummary
) -> None:
    cells = {(c.victim, c.culprit): c.minutes for c in summary.matrix}
    injected = {(v, t.culprit) for t in fortnight.truth for v in t.victims}
    for pair in injected:
        assert cells.get(pair, 0) >= 30, pair  # every fault's victims, over 30 minutes each
    others = {p for p in cells if p not in injected and p[0] != p[1]}
    assert not others  # nobody blamed who did nothing (a model's own load is on the diagonal)
    top = {c.culprit: c for c in summary.culprits}
    assert top["train-job"].culprit_type == "process" and top["memcopy"].culprit_type == "process"
    assert top["gpu-1"].culprit_type == "gpu" and top["gpu-1"].main_kind == "throttle"
    assert top["memcopy"].main_kind == "bandwidth" and top["memcopy"].resource == "dram"
    kinds = {(c.model, c.kind) for c in summary.causes}
    assert {("tts", "throttle"), ("chat", "bandwidth"), ("rerank", "cotenant")} <= kinds


def test_recommendations_follow_the_numbers(summary: WeekSummary) -> None:
    by_target = {r.target: r for r in summary.recommendations}
    assert by_target["gpu-1"].kind in ("mps", "cooling")
    assert any(r.kind == "mig" and r.target == "gpu-0" for r in summary.recommendations)
    assert any(r.kind == "cooling" for r in summary.recommendations)
    t = summary.thresholds
    for r in summary.recommendations:
        assert (
            r.evidence["victim_minutes"] >= t.min_victim_minutes
            or r.evidence["incidents"] >= t.min_incidents
        )
        assert r.because and "victim-minutes a week" in r.evidence["expected_gain"]


def test_week_over_week(summary: WeekSummary) -> None:
    ch = {(c.scope, c.metric): c for c in summary.changes}
    # (last week: its burst's own incident for embed; this week the same, and six more)
    assert ch[("all", "incidents")].last_week == 2 and ch[("all", "incidents")].this_week == 8
    assert ch[("all", "incidents")].delta == 6
    assert ch[("chat", "impacted_minutes")].delta == pytest.approx(60.0, abs=1.0)
    assert summary.last_week.requests > 0
    assert "last week" in render_markdown(summary)


def test_previous_week_has_only_its_own_fault(fortnight: Fortnight) -> None:
    store = fortnight.open()
    try:
        s = ReportBuilder(store, slos=Slos.of_maps(SLO)).build(PREV)
    finally:
        store.close()
    assert {c.culprit for c in s.culprits} == {"embed"}
    assert s.action_counts.proposed == 1


def test_an_empty_week_says_so(fortnight: Fortnight, tmp_path: Path) -> None:
    store = fortnight.open()
    try:
        s = ReportBuilder(store, slos=Slos.of_maps(SLO)).build(parse_week("2026-W50"))
    finally:
        store.close()
    assert s.empty and not s.recommendations and not s.matrix
    paths = write_report(s, tmp_path, ("html", "md"))
    md = paths["md"].read_text()
    assert "No requests and no incidents were recorded in 2026-W50" in md
    assert "None: no incident this week, nothing calls for a change." in md
    html = paths["html"].read_text()
    assert "No requests and no incidents" in html and "Plotly.newPlot" not in html


def test_a_clean_week_gets_no_recommendations_and_says_why(fortnight: Fortnight) -> None:
    store = fortnight.open()
    try:
        strict = Thresholds(min_victim_minutes=10_000, min_incidents=10_000)
        s = ReportBuilder(store, slos=Slos.of_maps(SLO), thresholds=strict).build(WEEK)
    finally:
        store.close()
    assert s.culprits and not s.recommendations
    md = render_markdown(s)
    assert "None: no culprit hurt other models for 10000 victim-minutes" in md
    worst = max(s.culprits, key=lambda c: c.victim_minutes)
    assert f"the most was {worst.culprit}" in md


def test_a_repeat_offender_earns_a_recommendation_in_a_short_week(
    fortnight: Fortnight,
) -> None:
    # the demo's week: minutes of harm, but the same culprit named again and again
    store = fortnight.open()
    try:
        short = Thresholds(min_victim_minutes=10_000, min_incidents=2)
        s = ReportBuilder(store, slos=Slos.of_maps(SLO), thresholds=short).build(WEEK)
    finally:
        store.close()
    repeat = {c.culprit for c in s.culprits if c.incidents >= 2}
    assert repeat and repeat == {r.evidence["culprit"] for r in s.recommendations}


def test_files_follow_the_contract_layout(summary: WeekSummary, tmp_path: Path) -> None:
    paths = write_report(summary, tmp_path, ("html", "md"))
    d = tmp_path / "2026-W48"
    assert paths == {"json": d / "summary.json", "html": d / "report.html", "md": d / "report.md"}
    data = json.loads((d / "summary.json").read_text())
    assert data["week"] == "2026-W48" and data["totals"]["incidents"] == 8
    assert WeekSummary.from_dict(data) == summary
    assert data["worst"][0]["url"].startswith(f"{BASE}/incident?id=inc-")
    assert "&range=2026-11-" in data["worst"][0]["url"]


def test_pdf_is_printed_by_chromium(summary: WeekSummary, tmp_path: Path) -> None:
    paths = write_report(summary, tmp_path, ("pdf",))
    pdf = paths["pdf"].read_bytes()
    assert pdf.startswith(b"%PDF-") and len(pdf) > 20_000
    assert not (tmp_path / "2026-W48" / "report.html").exists()  # only what was asked


def test_pdf_without_chromium_is_a_clear_error(summary: WeekSummary, tmp_path: Path) -> None:
    missing = ChromiumPrinter(browser=str(tmp_path / "no-chromium"))
    with pytest.raises(ReportError, match=r"PDF needs headless Chromium .*apt-get install"):
        write_report(summary, tmp_path, ("html", "pdf"), printer=missing)
    assert not (tmp_path / "2026-W48").exists()  # nothing half-written


def test_load_induced_latency_is_a_cause_line_and_earns_prewarming(summary: WeekSummary) -> None:
    """A model slowed by its own model / adapter loads: the causes table lists the minutes
    under ``model_load`` and the recommendation is to keep adapters resident / pre-warm."""
    from dataclasses import replace

    from cotenant.reports.recommend import recommend
    from cotenant.reports.summary import CauseMinutes, CulpritImpact

    sdxl = CulpritImpact(
        "sdxl", "model", ["model_load"], 42.0, ["sdxl"], ["gpu-0"], 6, "model_load", None
    )
    s = replace(
        summary,
        culprits=[*summary.culprits, sdxl],
        causes=[*summary.causes, CauseMinutes("sdxl", "model_load", 42.0)],
    )
    [r] = [r for r in recommend(s) if r.target == "sdxl"]
    assert r.kind == "prewarm" and "resident or pre-warm" in r.title
    assert "42 minutes" in r.because
    assert "| sdxl | model_load | 42.0 |" in render_markdown(s)
