"""The span-shape contract (collectors/shapes/base.py), run over every shape in SHAPES.

Each shape claims its own spans and refuses every other shape's; alone in a Normalizer it turns
its own export into exactly one row whose phases sum to latency_ms, and other shapes' exports
into none. A new shape fails ``test_every_shape_has_cases`` until it is given cases here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from spans import MS, SpanFactory

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.collectors.shapes import SHAPES
from cotenant.collectors.shapes.attributes import attributes
from cotenant.collectors.shapes.base import PHASE_SPANS, Claim, SpanShape
from cotenant.collectors.shapes.ours import OursShape
from cotenant.collectors.shapes.vllm import VllmShape
from cotenant.core.errors import UsageError
from cotenant.core.phases import PHASE_COLUMNS

T0 = 1_764_000_000_000_000_000

Emit = Callable[[SpanFactory], None]


def _ours_plain(f: SpanFactory) -> None:
    f.ours("llama", T0, 50.0, [("queue", 0, 10), ("compute", 10, 45)])


def _ours_overlapping(f: SpanFactory) -> None:
    # children overlap each other and run past the root: still one split of the latency
    f.ours(
        "llama",
        T0,
        20.0,
        [("lock.wait", 0, 8), ("transfer.h2d", 5, 9), ("compute", 8, 25), ("postprocess", 19, 30)],
        lock=("kv", "sdxl"),
    )


def _vllm_plain(f: SpanFactory) -> None:
    f.vllm(T0, e2e_s=1.0, queue_s=0.2, inference_s=0.7)


def _vllm_overshoot(f: SpanFactory) -> None:
    # timers that disagree: queue + inference > e2e, scaled down to fit
    f.vllm(T0, e2e_s=1.0, queue_s=0.6, inference_s=0.9)


def _triton_plain(f: SpanFactory) -> None:
    f.triton(T0, "resnet50", queue_ms=3.0, input_ms=1.0, infer_ms=8.0, output_ms=2.0)


def _triton_no_queue(f: SpanFactory) -> None:
    f.triton(T0, "resnet50", queue_ms=0.0, input_ms=0.5, infer_ms=30.0, output_ms=0.5)


def _rayserve_plain(f: SpanFactory) -> None:
    f.rayserve(T0, "MatMul", latency_ms=12.0, queue_ms=2.0, compute_ms=6.0)


def _rayserve_replica_elsewhere(f: SpanFactory) -> None:
    # the replica runs in another process: its span comes with its own resource (pid 9)
    other = SpanFactory({"service.name": "served-model", "host.name": "h", "process.pid": 9})
    f.rayserve(T0, "MatMul", latency_ms=12.0, queue_ms=2.0, compute_ms=6.0, replica=other)
    f.exporter.export(other.take())


CASES: dict[str, list[Emit]] = {
    "ours": [_ours_plain, _ours_overlapping],
    "vllm": [_vllm_plain, _vllm_overshoot],
    "triton": [_triton_plain, _triton_no_queue],
    "rayserve": [_rayserve_plain, _rayserve_replica_elsewhere],
}
BY_SOURCE = {s.source: s for s in SHAPES}
PAIRS = [(src, emit) for src, emits in CASES.items() for emit in emits]
IDS = [f"{src}-{emit.__name__.lstrip('_')}" for src, emit in PAIRS]


def _export(emit: Emit) -> Any:
    f = SpanFactory({"service.name": "served-model", "host.name": "h", "process.pid": 7})
    emit(f)
    return f.otlp()


def _sortable_spans(req: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The spans a shape is asked about, with their resource's attributes: all but phase
    children (the normalizer's own)."""
    return [
        (span, attributes(rs.resource.attributes))
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        if span.name not in PHASE_SPANS
    ]


def _claims(shape: SpanShape, span: Any, resource: dict[str, Any]) -> bool:
    return span.name in shape.root_names or (
        shape.claim(span, attributes(span.attributes), resource) is not Claim.NONE
    )


def test_every_shape_has_cases() -> None:
    assert sorted(BY_SOURCE) == sorted(CASES)
    assert len(BY_SOURCE) == len(SHAPES), "two shapes share a source label"


@pytest.mark.parametrize(("source", "emit"), PAIRS, ids=IDS)
def test_a_shape_claims_its_own_spans_and_no_other_shape_does(source: str, emit: Emit) -> None:
    spans = _sortable_spans(_export(emit))
    assert spans
    for shape in SHAPES:
        claimed = [s.name for s, res in spans if _claims(shape, s, res)]
        if shape.source == source:
            assert len(claimed) == len(spans), f"{source} left some of its spans unclaimed"
        else:
            assert claimed == [], f"{shape.source} claims {source}'s spans {claimed}"


@pytest.mark.parametrize(("source", "emit"), PAIRS, ids=IDS)
def test_a_shape_alone_builds_one_row_whose_phases_sum_to_latency(source: str, emit: Emit) -> None:
    norm = Normalizer(GpuResolver(default_gpu="0"), shapes=(BY_SOURCE[source],))
    res = norm.normalize(_export(emit))
    assert (res.rejected, res.ignored) == ({}, {})
    [r] = res.requests.to_pylist()
    assert r["source"] == source and r["model"] and r["gpu"] == "0"
    assert r["latency_ms"] == pytest.approx((r["ts_end_ns"] - r["ts_start_ns"]) / MS)
    assert all(r[c] >= 0 for c in PHASE_COLUMNS)
    assert sum(r[c] for c in PHASE_COLUMNS) == pytest.approx(r["latency_ms"])
    assert norm.pending_spans == 0, "children left behind"


@pytest.mark.parametrize(("source", "emit"), PAIRS, ids=IDS)
def test_other_shapes_build_no_row_from_a_shapes_spans(source: str, emit: Emit) -> None:
    others = tuple(s for s in SHAPES if s.source != source)
    res = Normalizer(GpuResolver(), shapes=others).normalize(_export(emit))
    assert res.requests.num_rows == 0 and res.rejected == {}
    assert res.ignored["unrecognized"] >= 1


def test_the_default_tuple_gives_each_shape_its_own_rows() -> None:
    f = SpanFactory({"service.name": "served-model"})
    for emits in CASES.values():
        for emit in emits:
            emit(f)
    rows = Normalizer(GpuResolver()).normalize(f.otlp()).requests.to_pylist()
    assert sorted(r["source"] for r in rows) == sorted(s for s, _ in PAIRS)


class _ClaimsComputeByName:
    source = "bad"
    root_names = frozenset({"compute"})

    def claim(self, span: Any, attrs: dict[str, Any], resource: dict[str, Any]) -> Claim:
        return Claim.NONE

    def build_row(self, *args: Any) -> tuple[Any, ...]:
        raise AssertionError("never called")


def test_shapes_may_not_share_a_span_name_nor_take_a_phase_name() -> None:
    with pytest.raises(UsageError, match=r"'vllm' and 'vllm' both claim spans named 'llm_request'"):
        Normalizer(GpuResolver(), shapes=(VllmShape(), VllmShape()))
    with pytest.raises(UsageError, match="'compute', a phase child's name"):
        Normalizer(GpuResolver(), shapes=(OursShape(), _ClaimsComputeByName()))


def test_a_missing_triton_model_span_is_rejected_and_counted() -> None:
    f = SpanFactory()
    f.tracer.start_span("InferRequest", start_time=T0).end(end_time=T0 + MS)
    res = Normalizer(GpuResolver()).normalize(f.otlp())
    assert res.requests.num_rows == 0 and res.rejected == {"triton_incomplete": 1}


def test_request_row_puts_each_named_column_where_the_store_has_it() -> None:
    """Shapes build rows by name; the tuple's order is the ``requests`` table's."""
    from cotenant.collectors.shapes.base import request_row
    from cotenant.core.phases import PHASE_COLUMNS
    from cotenant.store.schema import REQUESTS

    names = [c for c, _ in REQUESTS]
    phases = [float(i) for i in range(len(PHASE_COLUMNS))]
    given = {
        "ts_start_ns": 1_000_000,
        "ts_end_ns": 3_000_000,
        "trace_id": "t",
        "span_id": "s",
        "model": "m",
        "host": "h",
        "pid": 7,
        "gpu": "g",
        "status": "ok",
        "source": "ours",
        "tenant": "te",
        "priority": 2,
        "batch_size": 3,
        "prompt_tokens": 4,
        "output_tokens": 5,
        "lock_name": "ln",
        "lock_holder": "lh",
        "ttft_ms": 0.5,
        "replica": "r",
    }
    row = dict(zip(names, request_row(**given, phases_ms=phases), strict=True))
    assert row == {**given, "latency_ms": 2.0, **dict(zip(PHASE_COLUMNS, phases, strict=True))}
