"""The incident record through the store: an incident read back is the one written (typed,
and the same JSON the API and the dashboard serve), and one stored by an earlier version of
the detector still loads and is continued by the next pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
from diagnoses import S, diagnosis

from cotenant.analysis.attribution import Cause
from cotenant.analysis.detector.normal import Normal
from cotenant.analysis.detector.verdicts import corroborator, incident_causes
from cotenant.analysis.diagnosis import Diagnosis, Judged
from cotenant.analysis.incident_record import CauseStep, Incident, to_stored
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.cause_kinds import CauseKind
from cotenant.evaluation.live import START_NS
from cotenant.store.db import Store
from cotenant.store.incident_rows import StoredIncident, upsert_incidents

NORMAL = Normal(
    4.25, 0.0125, 0.5, (-2.0, -1.0, 0.0, 1.0, 2.0), 1.25, (1.0, 1.5, 2.0, 2.5), 1.0, 600
)

# what an incident's JSON holds, in order: its diagnosis (Diagnosis.to_dict), then the book's
JSON_KEYS = [
    "id",
    "model",
    "gpu",
    "start_ns",
    "end_ns",
    "open",
    "detected_ns",
    "incident",
    "verdict",
    "peak_p99_ms",
    "baseline_p99_ms",
    "slo_ms",
    "severity",
    "indicator",
    "resolved_p99_ms",
    "phases_ms",
    "causes",
    "notes",
    "replica",
    "siblings",
    "judged_on",
    "cause_history",
    "indicators",
    "resolved_at_end_ns",
    "state",
    "updated_ns",
]


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store(":memory:")
    yield s
    s.close()


def _cause(kind: CauseKind, culprit: str, share: float, **kw: str) -> Cause:
    evidence = {"series": "sm_util", "before": 4.0, "during": 61.5}
    return Cause(kind, culprit, share, 0.875, evidence, excess_ms=212.5, **kw)


def _judged(d: Diagnosis, delta: float = 3.5) -> Diagnosis:
    d.judged = Judged("tail", delta, 0.875, NORMAL, True, 1.8, 1)
    d.notes = ["judged on its slow tail (p99)"]
    return d


def _story(book: IncidentBook) -> Incident:
    """An incident a person would follow: e2e slows (a co-tenant), TPOT joins and crosses
    its SLO (the cause changes), every indicator recovers: resolved. Times in s."""
    sdxl = [_cause(CauseKind.BANDWIDTH, "sdxl", 0.625, resource="dram")]
    etl = [_cause(CauseKind.CPU, "etl", 0.75), _cause(CauseKind.UNKNOWN, "—", 0.25)]
    at = START_NS + 150 * S
    book.update([_judged(diagnosis("chat", "degradation", sdxl, 100, 140))], "chat", "gpu0", 0, at)
    both = [
        _judged(diagnosis("chat", "degradation", sdxl, 100, 170)),
        _judged(diagnosis("chat", "breach", etl, 150, 175, indicator="tpot", slo=50.0, peak=60.0)),
    ]
    book.update(both, "chat", "gpu0", 0, START_NS + 180 * S)
    over = [
        _judged(diagnosis("chat", "degradation", sdxl, 100, 205, open=False)),
        _judged(diagnosis("chat", "breach", etl, 150, 204, indicator="tpot", slo=50.0, open=False)),
    ]
    over[1].after_p99_ms = 21.5
    [event] = book.update(over, "chat", "gpu0", 0, START_NS + 260 * S)
    assert event.kind == "resolved"
    return event.incident


def test_an_incident_read_back_from_the_store_is_the_one_written(store: Store) -> None:
    book = IncidentBook(store)
    inc = _story(book)
    back = book.get(inc.id)
    assert back is not None
    # what the API and the dashboard serve is the same, key for key
    assert back.to_dict() == inc.to_dict()
    assert list(back.to_dict()) == JSON_KEYS
    # ... and so is the typed record, but for what the store does not keep of the diagnosis
    # (how many windows attribution had)
    assert back == replace(inc, told=replace(inc.told, during_windows=0))
    assert back.indicator == "tpot" and back.indicators == ["tpot", "e2e"]
    assert back.top == _cause(CauseKind.CPU, "etl", 0.75)
    assert isinstance(back.top, Cause) and back.top.kind is CauseKind.CPU
    assert [(s.kind, s.culprit) for s in back.cause_history] == [
        (CauseKind.BANDWIDTH, "sdxl"),
        (CauseKind.CPU, "etl"),
    ]
    e2e = back.by_indicator["e2e"]
    assert e2e.baseline_p99_ms == 500.0 and e2e.severity == "degradation" and not e2e.open
    assert e2e.judged is not None and e2e.judged.normal == NORMAL
    assert back.resolved_p99_ms == 21.5 and back.resolved_at_end_ns == back.end_ns
    # written again, it reads back the same
    upsert_incidents(store, [to_stored(back)])
    assert book.get(inc.id) == back


# an incident as the previous detector stored it: a threshold, a judged_on without the normal
# it was judged against, no verdict, siblings as a plain list
OLD_JUDGED = {"channel": "typical", "delta": 0.42, "threshold_ms": 610.0, "windows": 12}
OLD_DETAIL = {
    "id": "inc-old",
    "model": "chat",
    "gpu": "gpu0",
    "start_ns": START_NS + 100 * S,
    "end_ns": START_NS + 160 * S,
    "open": True,
    "detected_ns": START_NS + 130 * S,
    "incident": True,
    "peak_p99_ms": 900.0,
    "baseline_p99_ms": 500.0,
    "slo_ms": None,
    "severity": "degradation",
    "indicator": "e2e",
    "threshold_ms": 610.0,
    "resolved_p99_ms": None,
    "phases_ms": {"compute_ms": 400.0},
    "causes": [
        {"kind": "cotenant", "culprit": "sdxl", "share": 0.8, "confidence": 0.9, "evidence": {}},
        {"kind": "unknown", "culprit": "—", "share": 0.2, "confidence": 0.0, "evidence": {}},
    ],
    "notes": [],
    "replica": None,
    "siblings": [{"replica": "chat-1", "gpu": "gpu1", "fine": True}],
    "judged_on": OLD_JUDGED,
    "cause_history": [
        {"at_ns": START_NS + 150 * S, "kind": "cotenant", "culprit": "sdxl", "share": 0.8}
    ],
    "indicators": {
        "e2e": {
            "start_ns": START_NS + 100 * S,
            "end_ns": START_NS + 160 * S,
            "open": True,
            "severity": "degradation",
            "baseline_p99_ms": 500.0,
            "peak_p99_ms": 900.0,
            "slo_ms": None,
            "threshold_ms": 610.0,
            "judged_on": OLD_JUDGED,
            "carried": False,
        }
    },
    "state": "open",
    "updated_ns": START_NS + 160 * S,
}


def _old(store: Store) -> IncidentBook:
    row = StoredIncident(
        "inc-old",
        "chat",
        "gpu0",
        "open",
        START_NS + 100 * S,
        START_NS + 160 * S,
        START_NS + 160 * S,
        900.0,
        500.0,
        None,
        "cotenant",
        "sdxl",
        0.8,
        json.loads(json.dumps(OLD_DETAIL)),
        "degradation",
        None,
        "e2e",
    )
    upsert_incidents(store, [row])
    return IncidentBook(store)


def test_an_incident_stored_by_the_previous_detector_loads(store: Store) -> None:
    book = _old(store)
    inc = book.get("inc-old")
    assert inc is not None
    assert inc.top == Cause(CauseKind.COTENANT, "sdxl", 0.8, 0.9)
    assert inc.cause_history == [CauseStep(START_NS + 150 * S, CauseKind.COTENANT, "sdxl", 0.8)]
    # judged by a detector that kept no normal: nothing to continue the episode against
    assert inc.told.judged is None and inc.by_indicator["e2e"].judged is None
    assert corroborator(inc) is None
    assert [(c.kind, c.culprit) for c in incident_causes([inc])] == [("cotenant", "sdxl")]
    assert inc.told.siblings == {"listed": [{"replica": "chat-1", "gpu": "gpu1", "fine": True}]}
    served = inc.to_dict()
    assert json.loads(json.dumps(served))["causes"][0]["culprit"] == "sdxl"
    assert served["judged_on"] is None and "threshold_ms" not in served
    assert [k for k in JSON_KEYS if k not in served] == ["resolved_at_end_ns"]  # not resolved


def test_an_incident_stored_by_the_previous_detector_is_continued(store: Store) -> None:
    """The next pass's diagnosis of the same slowdown continues it: its baseline stays as
    frozen, and it is judged from now on against the normal the new detector learnt."""
    book = _old(store)
    cause = [_cause(CauseKind.COTENANT, "sdxl", 0.75)]
    later = _judged(diagnosis("chat", "degradation", cause, 110, 190, base=520.0), delta=4.0)
    book.update([later], "chat", "gpu0", 0, START_NS + 195 * S)
    inc = book.get("inc-old")
    assert inc is not None and inc.state == "open" and inc.end_ns == START_NS + 190 * S
    assert len(book.find()) == 1
    e2e = inc.by_indicator["e2e"]
    assert e2e.baseline_p99_ms == 500.0 and e2e.start_ns == START_NS + 100 * S
    assert e2e.judged is not None and e2e.judged.delta == 4.0
    assert inc.told.judged == e2e.judged
    assert len(inc.cause_history) == 1  # the same cause: no change to tell
