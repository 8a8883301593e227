"""A real Triton 2.51 ensemble's spans (tests/fixtures/engines/triton-2.51.0/ensemble, see
PROVENANCE.md): ``InferRequest`` -> ``pipeline`` (the ensemble) -> ``matmul`` and ``double``
(its steps, each with a ``compute`` span). Every step gets a row of its own and the ensemble's
row carries their phases; no span is left waiting. Expectations are read from the raw JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.decode import JSON, decode
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.core.phases import PHASE_COLUMNS

DIR = Path(__file__).parent / "fixtures" / "engines" / "triton-2.51.0" / "ensemble"


def raw_spans() -> list[dict]:
    return [
        s
        for p in sorted(DIR.glob("v1_traces_*.json"))
        for rs in json.loads(p.read_text())["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def normalized() -> tuple[list[dict], Normalizer]:
    clock = Clock()
    norm = Normalizer(GpuResolver(), clock=clock)
    rows = []
    for p in sorted(DIR.glob("v1_traces_*.json")):
        res = norm.normalize(decode(p.read_bytes(), JSON))
        assert res.rejected == {} and res.ignored == {}
        rows += res.requests.to_pylist()
    clock.now = 3600.0  # past every wait: anything still held would expire now
    norm.normalize(ExportTraceServiceRequest())
    return rows, norm


def test_every_step_of_the_ensemble_gets_a_row_and_nothing_is_orphaned() -> None:
    spans = raw_spans()
    rows, norm = normalized()
    models = {
        s["spanId"]: a["value"]["stringValue"]
        for s in spans
        for a in s.get("attributes", [])
        if a["key"] == "triton.model_name"
    }
    want = sorted(models.values())  # pipeline, matmul, double per request
    assert sorted(r["model"] for r in rows) == want and len(want) == 9
    assert norm.pending_spans == 0 and dict(norm.expired) == {}
    by_span = {s["spanId"]: s for s in spans}
    for r in rows:
        assert sum(r[c] for c in PHASE_COLUMNS) == pytest.approx(r["latency_ms"])
        if r["model"] == "pipeline":
            continue
        s = by_span[r["span_id"]]  # a step's row is its model span
        assert models[r["span_id"]] == r["model"]
        assert r["latency_ms"] == pytest.approx(
            (int(s["endTimeUnixNano"]) - int(s["startTimeUnixNano"])) / 1e6
        )
        assert r["compute_ms"] > 0 and r["trace_id"] == s["traceId"]


def test_the_ensembles_row_is_its_steps_not_all_other() -> None:
    rows, _ = normalized()
    for trace in {r["trace_id"] for r in rows}:
        mine = [r for r in rows if r["trace_id"] == trace]
        [ens] = [r for r in mine if r["model"] == "pipeline"]
        steps = [r for r in mine if r["model"] != "pipeline"]
        cols = ("queue_ms", "h2d_ms", "compute_ms", "d2h_ms")
        summed = {c: sum(r[c] for r in steps) for c in cols}
        # a step's span ends after it handed its output on, so consecutive steps overlap a
        # little: their sum may pass the ensemble's latency, and is then scaled down to it
        k = min(1.0, ens["latency_ms"] / sum(summed.values()))
        for c in cols:
            assert ens[c] == pytest.approx(k * summed[c])
        assert ens["compute_ms"] > 0
