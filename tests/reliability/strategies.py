"""Hypothesis strategies for every input the service takes from outside: OTLP exports
(structured, so the normalizer's every branch is reached, and raw), JSON documents with the
values JSON parsers let through (NaN, infinities, huge integers, lone surrogates, deep
nesting), time arguments, ISO weeks and URL paths."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

U64 = 2**64 - 1
I64 = 2**63 - 1

edge_ints = st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, -(2**31), 2**62, I64, -(2**63), 2**53 + 1])
ints64 = st.one_of(edge_ints, st.integers(-(2**63), I64))
times = st.one_of(
    st.sampled_from([0, 1, I64, I64 + 1, U64, 1_700_000_000_000_000_000]),
    st.integers(0, U64),
    st.integers(1_700_000_000 * 10**9, 1_900_000_000 * 10**9),
)
floats = st.one_of(
    st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"), -float("inf")]),
    st.floats(allow_nan=True, allow_infinity=True),
)
text = st.text(max_size=40)  # valid Unicode: protobuf string fields refuse lone surrogates

ATTR_KEYS = [
    "cotenant.model",
    "cotenant.tenant",
    "cotenant.gpu",
    "cotenant.batch_size",
    "cotenant.priority",
    "cotenant.lock.name",
    "cotenant.lock.holder",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.latency.time_in_queue",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.latency.time_in_model_inference",
    "gen_ai.latency.time_in_model_prefill",
    "gen_ai.latency.time_in_model_decode",
    "gen_ai.usage.prompt_tokens",
    "gen_ai.usage.completion_tokens",
    "triton.model_name",
    "process.pid",
    "host.name",
    "service.name",
]
SPAN_NAMES = [
    "request",
    "llm_request",
    "InferRequest",
    "queue",
    "lock.wait",
    "preprocess",
    "transfer.h2d",
    "compute",
    "transfer.d2h",
    "postprocess",
    "",
]
EVENT_NAMES = [
    "QUEUE_START",
    "REQUEST_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
]


@st.composite
def any_values(draw: st.DrawFn, depth: int = 0) -> AnyValue:
    v = AnyValue()
    kinds = ["s", "i", "d", "b", "y", "num_s"] + (["a", "k"] if depth < 3 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "s":
        v.string_value = draw(text)
    elif kind == "num_s":
        v.string_value = draw(st.one_of(ints64.map(str), floats.map(repr), st.just("1e308")))
    elif kind == "i":
        v.int_value = draw(ints64)
    elif kind == "d":
        v.double_value = draw(floats)
    elif kind == "b":
        v.bool_value = draw(st.booleans())
    elif kind == "y":
        v.bytes_value = draw(st.binary(max_size=16))
    elif kind == "a":
        for x in draw(st.lists(any_values(depth + 1), max_size=3)):
            v.array_value.values.append(x)
    else:
        for x in draw(st.lists(key_values(depth + 1), max_size=3)):
            v.kvlist_value.values.append(x)
    return v


@st.composite
def key_values(draw: st.DrawFn, depth: int = 0) -> KeyValue:
    return KeyValue(
        key=draw(st.one_of(st.sampled_from(ATTR_KEYS), text)), value=draw(any_values(depth))
    )


ids16 = st.one_of(st.binary(min_size=16, max_size=16), st.binary(max_size=20))
ids8 = st.one_of(st.binary(min_size=8, max_size=8), st.binary(max_size=10))


@st.composite
def spans(draw: st.DrawFn, trace: bytes, parents: list[bytes]) -> Span:
    s = Span(
        trace_id=draw(st.one_of(st.just(trace), ids16)),
        span_id=draw(ids8),
        parent_span_id=draw(st.one_of(st.sampled_from(parents or [b""]), ids8)),
        name=draw(st.one_of(st.sampled_from(SPAN_NAMES), text)),
        start_time_unix_nano=draw(times),
        end_time_unix_nano=draw(times),
    )
    for kv in draw(st.lists(key_values(), max_size=6)):
        s.attributes.append(kv)
    for name in draw(st.lists(st.sampled_from(EVENT_NAMES), max_size=4)):
        s.events.add(name=name, time_unix_nano=draw(times))
    s.status.code = draw(st.integers(0, 2))
    return s


@st.composite
def exports(draw: st.DrawFn) -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest of 0-3 resources, each with spans sharing trace ids and
    parents often enough to make roots find their children."""
    msg = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rs = msg.resource_spans.add()
        for kv in draw(st.lists(key_values(), max_size=4)):
            rs.resource.attributes.append(kv)
        ss = rs.scope_spans.add()
        trace = draw(ids16)
        parents: list[bytes] = []
        for _ in range(draw(st.integers(0, 8))):
            span = draw(spans(trace, parents))
            parents.append(span.span_id)
            ss.spans.append(span)
    return msg


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**64, -(2**70), 10**30]),
    floats,
    st.text(max_size=30),
    st.sampled_from(["\ud800", "a\udfffb", "now", "15m", "1e400", "9999-12-31T23:59:59Z"]),
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=12), kids, max_size=4)
    ),
    max_leaves=12,
)

time_args = st.one_of(
    st.sampled_from(
        [
            "now",
            "15m",
            "-2h",
            "0",
            "-1",
            "1e11",
            "1e400",
            "nan",
            "inf",
            "0001-01-01T00:00:00+01:00",
            "1677-09-21T00:12:43Z",
            "2262-04-11T23:47:17Z",
            "9999-12-31T23:59:59Z",
            "99999999999999999999w",
            "1.5e3s",
            "",
        ]
    ),
    st.text(max_size=30),
    st.integers().map(str),
)
weeks = st.one_of(
    st.from_regex(r"\A[0-9]{4}-W[0-9]{2}\Z"),
    st.sampled_from(["0000-W01", "9999-W52", "2261-W52", "2262-W01", "1969-W01", "2026-W53"]),
    st.text(max_size=12),
)
path_segments = st.one_of(
    st.sampled_from(
        ["..", ".", "%2e%2e", "assets", "_dash-component-suites", "dash", "api", "v1", "%00"]
    ),
    st.text(alphabet=st.characters(codec="ascii", exclude_characters="/?#"), max_size=12),
)
