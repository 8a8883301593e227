"""A co-tenant's recurring bursts are ordinary contention, counted, not paged.

Seen from outside: two LLMs replaying the bundled Azure conversation and code traces on one
GPU, no fault, opened 5 incidents an hour, each chat slowed within its SLO by a code burst like
the ones code had every few minutes. Such slowdowns get the verdict ``recurring``
(:mod:`analysis.detector.verdicts`): recorded as ordinary contention, which the weekly report
shows beside the incidents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from diagnoses import diagnosis

from cotenant.analysis.attribution import Cause
from cotenant.analysis.detector.verdicts import mark_recurring, verdict
from cotenant.analysis.diagnosis import NEWS, RECURRING, Diagnosis
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.recurring import earlier_bursts
from cotenant.analysis.windows import GpuWindows
from cotenant.core.slos import Slos
from cotenant.evaluation.live import START_NS, replay
from cotenant.reports.compute import ReportBuilder
from cotenant.reports.html import render_html
from cotenant.reports.isoweek import week_of
from cotenant.reports.markdown import render_markdown
from cotenant.simulator.scenario_load import load_scenario
from cotenant.store.contention_rows import find_contention
from cotenant.store.db import Store

S = 1_000_000_000


def _bursts(n: int, at: list[int], height: list[float], base: float = 0.5) -> np.ndarray:
    """Arrivals per 1-s window: ``base`` req/s with 120-s bursts of each height."""
    a = np.full(n, base)
    for t, h in zip(at, height, strict=True):
        a[t : t + 120] = h
    return a


def test_a_burst_like_two_earlier_ones_is_recurring_a_second_or_a_bigger_one_is_not() -> None:
    a = _bursts(1500, [200, 600, 1000], [8.0, 7.0, 8.0])
    got = earlier_bursts(a, 1030, 1090, 1.0)
    assert got is not None and got["earlier_bursts"] == 2 and got["peak_rps"] == 8.0
    # the second: one earlier burst is not yet a pattern
    assert earlier_bursts(a, 630, 690, 1.0) is None
    # twice as high as anything seen: news
    b = _bursts(1500, [200, 600, 1000], [4.0, 4.0, 9.0])
    assert earlier_bursts(b, 1030, 1090, 1.0) is None
    # a co-tenant whose rate did not rise is not bursting (something else slowed the victim)
    assert earlier_bursts(np.full(1500, 3.0), 1030, 1090, 1.0) is None
    # earlier bursts older than the memory (30 min) are forgotten
    c = _bursts(4000, [200, 600, 3000], [8.0, 8.0, 8.0])
    assert earlier_bursts(c, 3030, 3090, 1.0) is None


def test_a_capacity_the_gpu_lost_in_a_neighbours_usual_burst_is_news() -> None:
    """Seen on the development population (dev 0066): a neighbour that bursts every few
    minutes had its memory grow into a full GPU (memory pressure) during one of its bursts; the
    LLM beside it, 1.7x slower for two minutes, got the verdict ``recurring`` because the
    neighbour's rate was like its earlier bursts. Its rate was; its memory was not: a capacity
    lost is no burst's doing, so only its traffic's causes are marked as usual."""
    w = GpuWindows("gpu0", 0, S, 1500)
    w.models["code"] = {"arrival_rps": _bursts(1500, [200, 600, 1000], [8.0, 7.0, 8.0])}
    share = Cause("cotenant", "code", 0.4, 0.3, {})
    memory = Cause("memory", "code", 0.6, 0.9, {})
    notes: list[str] = []
    mark_recurring([memory, share], w, "chat", 1030, 1090, notes)
    assert "recurring" in share.evidence and "recurring" not in memory.evidence
    assert notes == []  # its top cause is no usual burst: nothing said of one
    d = _diag("degradation", [memory, share])
    assert d.verdict == NEWS


def _diag(severity: str, causes: list[Cause], start_s: int = 1000, **kw: Any) -> Diagnosis:
    d = diagnosis(
        "chat",
        severity,
        causes,
        start_s,
        start_s + kw.get("length_s", 60),
        indicator="ttft",
        slo=kw.get("slo"),
        peak=1500.0,
        base=400.0,
        phases={"queue_ms": 900.0},
    )
    d.verdict = verdict(d, []) or NEWS
    return d


SEEN = {"recurring": {"peak_rps": 8.0, "typical_rps": 0.5, "earlier_bursts": 2, "memory_s": 900}}
BURST = Cause("bandwidth", "code", 0.5, 0.3, SEEN)
NEW_BURST = Cause("bandwidth", "code", 0.9, 0.9, {})
UNKNOWN = Cause("unknown", "—", 0.5, 0.0, {})


def test_which_slowdowns_are_ordinary() -> None:
    assert _diag("degradation", [BURST, UNKNOWN]).verdict == RECURRING
    # with the model's own traffic beside it, still ordinary
    mix = Cause("mix", "chat", 0.2, 0.5, {})
    assert _diag("degradation", [BURST, mix, UNKNOWN]).verdict == RECURRING
    # a breach always is an incident; a named cause of another kind is news
    assert _diag("breach", [BURST], slo=1000.0).verdict == NEWS
    throttle = Cause("throttle", "gpu0", 0.4, 0.9, {})
    assert _diag("degradation", [BURST, throttle]).verdict == NEWS
    assert _diag("degradation", [NEW_BURST]).verdict == NEWS
    # explaining too little of the excess is no explanation
    small = Cause("bandwidth", "code", 0.2, 0.3, SEEN)
    assert _diag("degradation", [small, Cause("unknown", "—", 0.8, 0.0, {})]).verdict == NEWS


def test_the_book_records_ordinary_contention_and_opens_no_incident(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        book = IncidentBook(store)
        now = START_NS + 1100 * S
        assert book.update([_diag("degradation", [BURST, UNKNOWN])], "chat", "gpu0", 0, now) == []
        # the next pass sees it longer: the same row, extended
        later = _diag("degradation", [BURST, UNKNOWN], length_s=90)
        assert book.update([later], "chat", "gpu0", 0, now + 5 * S) == []
        assert book.find() == []
        [row] = find_contention(store, "chat", "gpu0", 0)
        assert (row.reason, row.top_cause, row.top_culprit) == ("recurring", "bandwidth", "code")
        assert row.end_ns == START_NS + 1090 * S  # extended by the second pass
        assert row.causes[0]["evidence"]["recurring"]["earlier_bursts"] == 2
        # ... until it crosses the SLO: then it is an incident
        events = book.update(
            [_diag("breach", [BURST], slo=1000.0, length_s=120)], "chat", "gpu0", 0, now + 10 * S
        )
        assert [e.kind for e in events] == ["opened"]
    finally:
        store.close()


def test_the_weekly_report_counts_ordinary_contention(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    try:
        book = IncidentBook(store)
        for k in range(3):  # three slowdowns of 60 s, half of each explained by code's bursts
            d = _diag("degradation", [BURST, UNKNOWN], start_s=1000 + 600 * k)
            book.update([d], "chat", "gpu0", 0, d.end_ns + 5 * S)
        week = week_of(START_NS + 1000 * S)
        s = ReportBuilder(store, slos=Slos.of_maps({"chat": 1000.0})).build(week)
    finally:
        store.close()
    [cell] = s.ordinary
    assert (cell.victim, cell.culprit, cell.slowdowns, cell.reasons) == (
        "chat",
        "code",
        3,
        ["recurring"],
    )
    assert abs(cell.minutes - 3 * 1.0 * 0.5) < 1e-6  # 3 x 1 min x its 0.5 share
    assert s.totals.incidents == 0
    md = render_markdown(s)
    assert "Ordinary contention" in md and "| chat | code | 1.5 | 3 | recurring bursts |" in md
    assert "Ordinary contention" in render_html(s)


SCENARIOS = Path(__file__).resolve().parents[1] / "cotenant" / "simulator" / "scenarios"


def test_a_voice_model_slowed_by_three_image_campaigns_is_recorded_each_time() -> None:
    """Seen from outside (issue 25): a voice model at 2 requests/s and an embedding model
    beside it, slowed by three one-minute image campaigns four minutes apart, within their
    SLOs. Every campaign is an incident or recorded as ordinary contention, and nothing names
    anything but the image generator."""
    s = load_scenario(SCENARIOS / "low-rate-voice-within-slo-three-image-bursts-timeslice.yaml")
    events, _, store, _, _ = replay(s, with_truth=False)
    try:
        rows = {m: find_contention(store, m, "gpu0", 0) for m in ("asr", "embed")}
    finally:
        store.close()
    campaigns = [(240, 300), (480, 540), (720, 780)]

    def hit(lo_s: int, hi_s: int, start_ns: int, end_ns: int) -> bool:
        return start_ns < START_NS + (hi_s + 30) * S and end_ns > START_NS + lo_s * S

    for model in ("asr", "embed"):
        published = [e for e in events if e.model == model and e.kind == "opened"]
        assert all(e.cause == "cotenant:imagegen" for e in published)
        assert all(r.top_culprit == "imagegen" for r in rows[model])
        told = [any(hit(*c, e.start_ns, e.end_ns) for e in published) for c in campaigns]
        kept = [any(hit(*c, r.start_ns, r.end_ns) for r in rows[model]) for c in campaigns]
        assert told[0], model
        assert all(t or k for t, k in zip(told, kept, strict=True)), (model, told, kept)
