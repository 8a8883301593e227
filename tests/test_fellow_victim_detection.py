"""Fellow victims: a model slowed by the cause another model's incident names is an incident
on less evidence (:mod:`analysis.detector.verdicts`).

Seen from outside: a batch job that emits no spans takes 7 of the host's 8 cores; the voice
model beside it crosses its SLO and is found, but the image model, which pre-processes on the
same host, slowed 1.22x at its p99 and 1.12x at its median, had no incident."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from diagnoses import diagnosis

from cotenant.analysis.analyzer import Analyzer
from cotenant.analysis.attribution import Cause
from cotenant.analysis.detector.normal import Normal
from cotenant.analysis.detector.verdicts import (
    FirstCause,
    diagnosis_causes,
    fellow_of,
    incident_causes,
    judge,
)
from cotenant.analysis.diagnosis import FELLOW, NEWS, Diagnosis, Judged
from cotenant.analysis.incident_record import Incident
from cotenant.analysis.incidents import IncidentBook
from cotenant.evaluation.live import START_NS, Seen, replay
from cotenant.simulator.scenario_load import load_scenario
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

S = 1_000_000_000
SCENARIOS = Path(__file__).resolve().parents[1] / "cotenant" / "simulator" / "scenarios"
CPU_HOG = SCENARIOS / "cpu-hog-silent-burner-bystander-imagegen-flat.yaml"


def _cause(kind: str, culprit: str) -> Cause:
    return Cause(kind=kind, culprit=culprit, share=0.8, confidence=0.9)


NORMAL = Normal(4.25, 0.01, 0.0, tuple(range(-6, 7)), 1.0, (1.0,) * 4, 1.0, 600)


def _judged(
    model: str, causes: list[Cause], start_s: int = 250, end_s: int = 320, strong: bool = False
) -> Diagnosis:
    """A slowdown of ``model`` found on a fellow victim's evidence (weak) unless ``strong``."""
    d = diagnosis(model, "degradation", causes, start_s, end_s, peak=80.0, base=70.0)
    d.judged = Judged("typical", 1.0, 1.0, NORMAL, strong, 1.12)
    return d


def _incident(model: str, kind: str, culprit: str, fellow_of: str | None = None) -> Incident:
    told = diagnosis(model, "breach", [_cause(kind, culprit)], 240, 330, peak=90.0, base=50.0)
    told.judged = Judged("typical", 3.0, 1.0, NORMAL, fellow_of=fellow_of)
    return Incident(
        id=f"inc-{model}",
        model=model,
        gpu="gpu0",
        state="open",
        start_ns=START_NS + 240 * S,
        end_ns=START_NS + 330 * S,
        updated_ns=START_NS + 330 * S,
        peak_p99_ms=90.0,
        baseline_p99_ms=50.0,
        slo_ms=60.0,
        told=told,
    )


def test_a_slowdown_is_a_fellow_victim_only_of_an_incident_with_its_first_cause() -> None:
    now = START_NS + 330 * S
    hog = incident_causes([_incident("tts", "cpu", "etl-burner")], now)
    assert hog == [FirstCause("tts", "gpu0", "cpu", "etl-burner", START_NS + 240 * S, now)]
    same = _judged("imagegen", [_cause("cpu", "etl-burner")])
    assert fellow_of(same, hog) == "tts"
    # another cause, or none named, is not corroborated
    assert fellow_of(_judged("imagegen", [_cause("burst", "asr")]), hog) is None
    assert fellow_of(_judged("imagegen", []), hog) is None
    # nor is a slowdown on another GPU, or before or after that incident
    elsewhere = [replace(hog[0], gpu="gpu1")]
    assert fellow_of(same, elsewhere) is None
    later = _judged("imagegen", [_cause("cpu", "etl-burner")], start_s=400, end_s=460)
    assert fellow_of(later, hog) is None
    # a model is not its own fellow victim, nor the fellow of an incident blaming it
    assert fellow_of(_judged("tts", [_cause("cpu", "etl-burner")]), hog) is None
    blamed = [replace(hog[0], kind="burst", culprit="imagegen")]
    assert fellow_of(_judged("imagegen", [_cause("burst", "imagegen")]), blamed) is None
    # an incident still diagnosing names nothing yet; the live loop asks open ones only
    diagnosing = replace(_incident("tts", "cpu", "etl-burner"), state="diagnosing")
    assert incident_causes([diagnosing], now) == []
    resolved = replace(_incident("tts", "cpu", "etl-burner"), state="resolved")
    assert incident_causes([resolved], now) == []
    assert len(incident_causes([resolved])) == 1  # ... an on-demand diagnosis, any
    # an open incident whose slowdown is over (its cool-down) lasts no longer than it did
    cooling = _incident("tts", "cpu", "etl-burner")
    cooling.told.open = False
    assert incident_causes([cooling], now)[0].end_ns == cooling.end_ns


def test_a_fellow_victim_corroborates_nobody() -> None:
    """Only an incident found on full evidence lowers the bar: an image model found as the
    voice model's fellow victim does not make a third model's smaller slowdown one."""
    fellow = _incident("imagegen", "cpu", "etl-burner", fellow_of="tts")
    assert incident_causes([fellow], START_NS + 330 * S) == []
    assert incident_causes([fellow]) == []
    weak = _judged("ocr", [_cause("cpu", "etl-burner")])
    strong = _judged("tts", [_cause("cpu", "etl-burner")], strong=True)
    assert [d.verdict for d in judge([strong], [])] == [NEWS]
    fellows = judge([weak], diagnosis_causes([strong]))
    assert [(d.verdict, d.judged and d.judged.fellow_of) for d in fellows] == [(FELLOW, "tts")]
    assert diagnosis_causes(fellows) == []


def test_a_weak_slowdown_is_kept_only_as_a_fellow_victim() -> None:
    weak = _judged("imagegen", [_cause("cpu", "etl-burner")])
    assert judge([weak], []) == []  # nobody corroborates: nothing to record
    hog = [FirstCause("tts", "gpu0", "cpu", "etl-burner", START_NS + 240 * S, START_NS + 330 * S)]
    [d] = judge([_judged("imagegen", [_cause("cpu", "etl-burner")])], hog)
    assert d.verdict == FELLOW and "tts, on the same GPU, had an incident" in d.notes[-1]
    # while its own incident is a fellow victim, what continues it stays one
    mine = ("tts", START_NS + 240 * S, START_NS + 330 * S)
    [d] = judge([_judged("imagegen", [_cause("pcie", "tts")])], [], fellow=mine)
    assert d.verdict == FELLOW
    # ... but not a slowdown after it
    assert judge([_judged("imagegen", [], start_s=400, end_s=460)], [], fellow=mine) == []


@pytest.fixture(scope="module")
def hog() -> Iterator[tuple[list[Seen], Store]]:
    events, _, store, _, _ = replay(load_scenario(CPU_HOG), with_truth=False)
    yield events, store
    store.close()


def test_an_image_model_slowed_beside_a_voice_model_by_a_cpu_hog_is_found(
    hog: tuple[list[Seen], Store],
) -> None:
    """The reproduction: the image model has one incident, naming the CPU hog, within the
    fault; the voice model's own incident names it too."""
    events, _ = hog
    image = [e for e in events if e.model == "imagegen" and e.kind not in ("diagnosing",)]
    assert [e.kind for e in image] == ["opened", "resolved"]
    assert {e.cause for e in image} == {"cpu:etl-burner"}
    assert 230 <= (image[0].start_ns - START_NS) / S <= 300  # the hog ran 240-360 s
    assert (image[-1].end_ns - START_NS) / S <= 400
    tts = [e for e in events if e.model == "tts" and e.kind == "opened"]
    assert [e.cause for e in tts] == ["cpu:etl-burner"]


def test_an_on_demand_diagnosis_finds_what_the_live_loop_found(
    hog: tuple[list[Seen], Store],
) -> None:
    """``cotenant diagnose`` (the API's, the alert receiver's) over the fault finds the image
    model's slowdown, naming the hog, as the live loop did."""
    _, store = hog
    lo, hi = START_NS + 200 * S, START_NS + 420 * S
    slos = load_scenario(CPU_HOG).slos()
    analyzer = Analyzer(StoreSource(store), IncidentBook(store), slos=slos)
    got = analyzer.diagnose("imagegen", lo, hi)["diagnoses"]
    assert [(d["incident"], d["causes"][0]["kind"], d["causes"][0]["culprit"]) for d in got] == [
        (True, "cpu", "etl-burner")
    ]
