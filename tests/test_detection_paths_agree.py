"""One detector everywhere: over a range, the live loop's incidents, an on-demand diagnosis
(the API's, the CLI's and the alert receiver's :class:`Analyzer`) and the batch bench's
(:func:`evaluation.accuracy.diagnose_models`) are the same incidents."""

from __future__ import annotations

from typing import Any

import pytest

from cotenant.analysis.analyzer import Analyzer
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.timerange import TimeRange
from cotenant.evaluation.accuracy import diagnose_models
from cotenant.evaluation.live import START_NS, replay
from cotenant.simulator.scenario_load import SCENARIOS_DIR, load_scenario
from cotenant.store.source import StoreSource

S = 1_000_000_000
SCENARIOS = (
    "cotenant-burst-sdxl-slows-tts-timeslice",
    "throttle-power-cap-h200-mps",
    "cpu-hog-silent-burner-bystander-imagegen-flat",
)


def _top(causes: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    named = [c for c in causes if c["kind"] != "unknown"]
    return (named[0]["kind"], named[0]["culprit"]) if named else (None, None)


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("name", SCENARIOS)
def test_live_on_demand_and_batch_find_the_same_incidents(name: str) -> None:
    s = load_scenario(SCENARIOS_DIR / f"{name}.yaml")
    _, _, store, _, _ = replay(s, with_truth=False)
    try:
        end = START_NS + int(s.duration_s * S)
        live = {
            (i.model, i.start_ns, i.end_ns, *_top([c.to_dict() for c in i.causes]))
            for i in IncidentBook(store).find(limit=10_000)
        }
        assert live, "the scenario's fault opened nothing live"
        # on demand, beside the incidents stored (which may lend fellow victims their causes)
        analyzer = Analyzer(StoreSource(store), IncidentBook(store), slos=s.slos())
        asked = {
            (d["model"], d["start_ns"], d["end_ns"], *_top(d["causes"]))
            for m in s.models
            for d in analyzer.diagnose(m.name, START_NS, end)["diagnoses"]
            if d["incident"] and d["verdict"] in ("news", "fellow")
        }
        batch = {
            (d.model, d.start_ns, d.end_ns, *_top([c.to_dict() for c in d.causes]))
            for d in diagnose_models(StoreSource(store), s, TimeRange(START_NS, end))
        }
    finally:
        store.close()
    for got in (asked, batch):
        assert len(got) == len(live), (live, got)
        for model, lo, hi, kind, culprit in live:
            same = [g for g in got if g[0] == model and _overlap((lo, hi), (g[1], g[2]))]
            assert len(same) == 1, (model, lo, hi, got)
            assert (same[0][3], same[0][4]) == (kind, culprit)
