"""A real Triton 2.51 BLS model's spans (tests/fixtures/engines/triton-2.51.0/bls, see
PROVENANCE.md): ``bls_pipeline`` (Python backend) sends ``matmul`` then ``double`` from its
``execute``. With ``trace=request.trace()`` Triton nests the children's model spans under the
BLS model's span, beside its ``compute`` span and inside it in time; without it (the last file)
the children send no span at all.

What a user should see: one row per child request, with its own queue and compute; a row for
the BLS model whose phases count each instant once (its script's own compute, its own and its
children's queue and compute; only Triton's overheads as ``other``); no span left waiting.
Expectations are computed from the raw JSON, not from the normalizer."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.decode import JSON, decode
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.core.phases import PHASE_COLUMNS

DIR = Path(__file__).parent / "fixtures" / "engines" / "triton-2.51.0" / "bls"
BLS = "bls_pipeline"
CHILDREN = ("matmul", "double")
BUSY = ("queue_ms", "h2d_ms", "compute_ms", "d2h_ms")


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def bodies() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(DIR.glob("v1_traces_*.json"))]


def spans_of(body: dict) -> list[dict]:
    return [s for rs in body["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def normalized(payloads: list[dict]) -> tuple[list[dict], Normalizer]:
    clock = Clock()
    norm = Normalizer(GpuResolver(), clock=clock)
    rows = []
    for body in payloads:
        res = norm.normalize(decode(json.dumps(body).encode(), JSON))
        assert res.rejected == {} and res.ignored == {}
        rows += res.requests.to_pylist()
    clock.now = 3600.0  # past every wait: anything still held would expire now
    norm.normalize(ExportTraceServiceRequest())
    return rows, norm


def model_of(span: dict) -> str | None:
    for a in span.get("attributes", []):
        if a["key"] == "triton.model_name":
            return str(a["value"]["stringValue"])
    return None


def events(span: dict) -> dict[str, int]:
    return {e["name"]: int(e["timeUnixNano"]) for e in span.get("events", [])}


def ms(ns: int) -> float:
    return ns / 1e6


def duration(span: dict) -> float:
    return ms(int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"]))


class Trace:
    """One request's raw spans: the root, the BLS model span and its compute, the children."""

    def __init__(self, spans: list[dict]) -> None:
        by_parent: dict[str, list[dict]] = {}
        for s in spans:
            by_parent.setdefault(s.get("parentSpanId", ""), []).append(s)
        [self.root] = [s for s in spans if s["name"] == "InferRequest"]
        [self.bls] = by_parent[self.root["spanId"]]
        under = by_parent.get(self.bls["spanId"], [])
        [self.compute] = [s for s in under if s["name"] == "compute"]
        self.children = sorted(
            (s for s in under if model_of(s) is not None), key=lambda s: s["startTimeUnixNano"]
        )

    def own_queue_ms(self) -> float:
        return ms(events(self.compute)["COMPUTE_START"] - events(self.bls)["QUEUE_START"])


def traces(payloads: list[dict]) -> dict[str, Trace]:
    spans = [s for body in payloads for s in spans_of(body)]
    ids = {s["traceId"] for s in spans}
    return {t: Trace([s for s in spans if s["traceId"] == t]) for t in ids}


def test_each_child_request_gets_its_own_row_and_nothing_is_orphaned() -> None:
    payloads = bodies()
    rows, norm = normalized(payloads)
    assert norm.pending_spans == 0 and dict(norm.expired) == {}
    want = sorted(m for body in payloads for s in spans_of(body) if (m := model_of(s)))
    assert sorted(r["model"] for r in rows) == want
    assert want.count(BLS) == 5 and want.count("matmul") == want.count("double") == 3
    raw = {s["spanId"]: s for body in payloads for s in spans_of(body)}
    for r in rows:
        assert sum(r[c] for c in PHASE_COLUMNS) == pytest.approx(r["latency_ms"])
        if r["model"] in CHILDREN:  # its model span, its own queue and compute
            s = raw[r["span_id"]]
            assert (model_of(s), s["traceId"]) == (r["model"], r["trace_id"])
            assert r["latency_ms"] == pytest.approx(duration(s))
            ev = events(s) | events(
                next(c for c in raw.values() if c.get("parentSpanId") == s["spanId"])
            )
            assert r["queue_ms"] == pytest.approx(ms(ev["COMPUTE_START"] - ev["QUEUE_START"]))
            assert r["compute_ms"] == pytest.approx(
                ms(ev["COMPUTE_OUTPUT_START"] - ev["COMPUTE_INPUT_END"])
            )


def test_the_bls_row_counts_its_script_and_its_children_once() -> None:
    payloads = bodies()
    rows, _ = normalized(payloads)
    traced = {t: tr for t, tr in traces(payloads).items() if tr.children}
    assert len(traced) == 3
    for trace_id, tr in traced.items():
        mine = {r["model"]: r for r in rows if r["trace_id"] == trace_id}
        bls, kids = mine[BLS], [mine[m] for m in CHILDREN]
        assert bls["span_id"] == tr.root["spanId"]
        assert bls["latency_ms"] == pytest.approx(duration(tr.root))
        # the children ran one after the other inside the BLS model's compute
        c = events(tr.compute)
        assert c["COMPUTE_INPUT_END"] <= int(tr.children[0]["startTimeUnixNano"])
        assert int(tr.children[0]["endTimeUnixNano"]) <= int(tr.children[1]["startTimeUnixNano"])
        assert int(tr.children[1]["endTimeUnixNano"]) <= c["COMPUTE_OUTPUT_START"]
        script = ms(c["COMPUTE_OUTPUT_START"] - c["COMPUTE_INPUT_END"]) - sum(
            duration(s) for s in tr.children
        )
        assert bls["compute_ms"] == pytest.approx(script + sum(k["compute_ms"] for k in kids))
        assert bls["queue_ms"] == pytest.approx(
            tr.own_queue_ms() + sum(k["queue_ms"] for k in kids)
        )
        # other: Triton's time outside the BLS compute and its own queue, and the children's
        # model spans outside their queue and compute; never the script's or the children's
        own_other = duration(tr.root) - duration(tr.compute) - tr.own_queue_ms()
        assert bls["other_ms"] == pytest.approx(own_other + sum(k["other_ms"] for k in kids))
        assert bls["other_ms"] < 0.15 * bls["latency_ms"]


def test_children_sent_at_once_are_not_counted_twice() -> None:
    # a traced request of the second file (all its spans in one body), its `double` moved to
    # start with `matmul`, as with async_exec: the BLS model's compute loses the union of
    # its children's spans, not their sum, and its row still sums to its latency
    payloads = bodies()
    body = copy.deepcopy(payloads[1])
    tr = next(t for t in traces([body]).values() if len(t.children) == 2)
    mm, dbl = tr.children
    shift = int(dbl["startTimeUnixNano"]) - int(mm["startTimeUnixNano"])
    moved = {dbl["spanId"]} | {
        s["spanId"] for s in spans_of(body) if s.get("parentSpanId") == dbl["spanId"]
    }
    for s in spans_of(body):
        if s["spanId"] in moved:
            for key in ("startTimeUnixNano", "endTimeUnixNano"):
                s[key] = str(int(s[key]) - shift)
            for e in s.get("events", []):
                e["timeUnixNano"] = str(int(e["timeUnixNano"]) - shift)
    rows, norm = normalized([payloads[0], body])
    assert norm.pending_spans == 0
    mine = {r["model"]: r for r in rows if r["trace_id"] == tr.root["traceId"]}
    kids = [mine[m] for m in CHILDREN]
    assert kids[1]["ts_start_ns"] == kids[0]["ts_start_ns"]
    union = max(kids[0]["latency_ms"], kids[1]["latency_ms"])
    c = events(tr.compute)
    own = {
        "queue_ms": tr.own_queue_ms(),
        "h2d_ms": ms(c["COMPUTE_INPUT_END"] - c["COMPUTE_START"]),
        "compute_ms": ms(c["COMPUTE_OUTPUT_START"] - c["COMPUTE_INPUT_END"]) - union,
        "d2h_ms": ms(c["COMPUTE_END"] - c["COMPUTE_OUTPUT_START"]),
    }
    want = {col: own[col] + sum(k[col] for k in kids) for col in BUSY}
    # overlapping children's phases may sum past the latency: then scaled down to it
    scale = min(1.0, mine[BLS]["latency_ms"] / sum(want.values()))
    for col in BUSY:
        assert mine[BLS][col] == pytest.approx(scale * want[col])
    assert sum(mine[BLS][col] for col in PHASE_COLUMNS) == pytest.approx(mine[BLS]["latency_ms"])


def test_children_sent_without_the_trace_leave_the_bls_row_all_its_own() -> None:
    payloads = bodies()
    rows, _ = normalized(payloads)
    untraced = {t: tr for t, tr in traces(payloads).items() if not tr.children}
    assert len(untraced) == 2
    for trace_id, tr in untraced.items():
        [row] = [r for r in rows if r["trace_id"] == trace_id]  # no child sent a span
        c = events(tr.compute)
        assert row["model"] == BLS
        assert row["compute_ms"] == pytest.approx(
            ms(c["COMPUTE_OUTPUT_START"] - c["COMPUTE_INPUT_END"])
        )
