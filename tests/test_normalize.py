from __future__ import annotations

import time

import pytest
from spans import MS, SpanFactory

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.core.phases import PHASE_COLUMNS

T0 = 1_764_000_000_000_000_000


def rows(norm: Normalizer, req: object) -> list[dict]:
    return norm.normalize(req).requests.to_pylist()


def test_ours_decomposes_on_the_critical_path_and_phases_sum_to_latency() -> None:
    f = SpanFactory({"host.name": "node1", "process.pid": 42})
    trace_id, span_id = f.ours(
        "llama",
        T0,
        100.0,
        [
            ("queue", 0, 30),
            ("lock.wait", 30, 40),
            ("transfer.h2d", 40, 45),
            ("compute", 45, 90),
            ("transfer.d2h", 88, 95),
        ],
        attrs={
            "cotenant.gpu": "GPU-abc",
            "cotenant.batch_size": 8,
            "cotenant.tenant": "acme",
            "cotenant.priority": 2,
        },
        lock=("kv-cache", "sdxl"),
    )
    [r] = rows(Normalizer(GpuResolver()), f.otlp())
    assert r["trace_id"] == trace_id and r["span_id"] == span_id
    assert r["model"] == "llama" and r["gpu"] == "GPU-abc" and r["tenant"] == "acme"
    assert r["batch_size"] == 8 and r["priority"] == 2 and r["host"] == "node1"
    assert r["pid"] == 42 and r["status"] == "ok" and r["source"] == "ours"
    assert r["latency_ms"] == pytest.approx(100.0)
    assert r["queue_ms"] == pytest.approx(30.0)
    assert r["lock_wait_ms"] == pytest.approx(10.0)
    assert r["h2d_ms"] == pytest.approx(5.0)
    # compute runs until 90 but d2h starts at 88: the overlap counts once, for d2h
    assert r["compute_ms"] == pytest.approx(43.0)
    assert r["d2h_ms"] == pytest.approx(7.0)
    assert r["other_ms"] == pytest.approx(5.0)
    assert sum(r[c] for c in PHASE_COLUMNS) == pytest.approx(r["latency_ms"])
    assert (r["lock_name"], r["lock_holder"]) == ("kv-cache", "sdxl")


def test_lock_attributes_are_read_as_the_other_attributes_are() -> None:
    # the lock.wait child's two keys are read without decoding its other attributes: the
    # same values as attributes() + as_str give (last of a repeated key, scalars as text,
    # arrays None)
    f = SpanFactory({})
    f.ours("llama", T0, 10.0, [("lock.wait", 1, 4)], lock=("kv", "sdxl"))
    req = f.otlp()
    [wait] = [s for s in req.resource_spans[0].scope_spans[0].spans if s.name == "lock.wait"]
    del wait.attributes[:]
    wait.attributes.add(key="cotenant.lock.holder", value={"string_value": "first"})
    wait.attributes.add(key="other", value={"int_value": 3})
    wait.attributes.add(key="cotenant.lock.name", value={"int_value": 7})
    wait.attributes.add(key="cotenant.lock.holder", value={"bool_value": True})
    [r] = rows(Normalizer(GpuResolver()), req)
    assert (r["lock_name"], r["lock_holder"], r["lock_wait_ms"]) == ("7", "True", 3.0)
    wait.attributes.add(key="cotenant.lock.name", value={"array_value": {}})
    [r] = rows(Normalizer(GpuResolver()), req)
    assert (r["lock_name"], r["lock_holder"]) == (None, "True")


def test_children_exported_before_their_root_are_joined() -> None:
    f = SpanFactory()
    root = f.tracer.start_span("request", attributes={"cotenant.model": "m"}, start_time=T0)
    from opentelemetry.trace import set_span_in_context

    child = f.tracer.start_span(
        "compute", context=set_span_in_context(root), start_time=T0 + 2 * MS
    )
    child.end(end_time=T0 + 9 * MS)
    norm = Normalizer(GpuResolver())
    first = norm.normalize(f.otlp())  # only the child
    assert first.requests.num_rows == 0 and norm.pending_spans == 1
    root.end(end_time=T0 + 10 * MS)
    [r] = norm.normalize(f.otlp()).requests.to_pylist()
    assert r["compute_ms"] == pytest.approx(7.0) and r["other_ms"] == pytest.approx(3.0)
    assert norm.pending_spans == 0


def test_orphan_children_expire_and_are_counted() -> None:
    now = [100.0]
    f = SpanFactory()
    root = f.tracer.start_span("request", attributes={"cotenant.model": "m"}, start_time=T0)
    from opentelemetry.trace import set_span_in_context

    f.tracer.start_span("queue", context=set_span_in_context(root), start_time=T0).end(
        end_time=T0 + MS
    )
    norm = Normalizer(GpuResolver(), pending_ttl_s=5, clock=lambda: now[0])
    norm.normalize(f.otlp())
    now[0] += 10
    norm.normalize(SpanFactory().otlp())
    assert norm.pending_spans == 0 and norm.expired["orphan_child"] == 1


def test_pending_children_survive_export_and_import() -> None:
    f = SpanFactory()
    root = f.tracer.start_span("request", attributes={"cotenant.model": "m"}, start_time=T0)
    from opentelemetry.trace import set_span_in_context

    f.tracer.start_span("compute", context=set_span_in_context(root), start_time=T0 + MS).end(
        end_time=T0 + 4 * MS
    )
    a = Normalizer(GpuResolver())
    a.normalize(f.otlp())
    saved = a.export_pending()
    b = Normalizer(GpuResolver())
    assert b.import_pending(saved) == 1
    root.end(end_time=T0 + 5 * MS)
    [r] = b.normalize(f.otlp()).requests.to_pylist()
    assert r["compute_ms"] == pytest.approx(3.0)


@pytest.mark.parametrize("with_model", [True, False])
def test_vllm_llm_request_span(with_model: bool) -> None:
    # vLLM v1 does not set gen_ai.response.model: the service name is the fallback
    f = SpanFactory({"service.name": "llama-8b", "vllm.process_id": "7"}, "vllm.tracing.otel")
    f.vllm(
        T0,
        e2e_s=2.0,
        queue_s=0.5,
        inference_s=1.2,
        ttft_s=0.7,
        model="meta-llama/Llama-3.1-8B" if with_model else None,
    )
    [r] = rows(Normalizer(GpuResolver(model_gpu={"llama-8b": "1"}, default_gpu="0")), f.otlp())
    assert r["model"] == ("meta-llama/Llama-3.1-8B" if with_model else "llama-8b")
    assert r["source"] == "vllm"
    assert r["latency_ms"] == pytest.approx(2000.0)
    assert r["queue_ms"] == pytest.approx(500.0)
    assert r["compute_ms"] == pytest.approx(1200.0)
    assert r["other_ms"] == pytest.approx(300.0)
    assert r["ttft_ms"] == pytest.approx(700.0)
    assert (r["prompt_tokens"], r["output_tokens"]) == (100, 20)
    assert r["gpu"] == ("0" if with_model else "1")


def test_vllm_without_any_model_name_is_rejected_with_a_reason() -> None:
    f = SpanFactory()  # service.name defaults to unknown_service
    f.vllm(T0, 1.0, 0.1, 0.5, model=None)
    res = Normalizer(GpuResolver()).normalize(f.otlp())
    assert res.requests.num_rows == 0
    assert res.rejected == {"missing_model": 1}
    assert "names no model" in res.first_error


def test_triton_infer_request_with_events() -> None:
    f = SpanFactory({"service.name": "triton-inference-server"}, "triton-server")
    f.triton(
        T0, "resnet50", queue_ms=4.0, input_ms=1.0, infer_ms=10.0, output_ms=2.0, overhead_ms=1.0
    )
    [r] = rows(Normalizer(GpuResolver(model_gpu={"resnet50": "2"})), f.otlp())
    assert r["model"] == "resnet50" and r["source"] == "triton" and r["gpu"] == "2"
    assert r["latency_ms"] == pytest.approx(18.0)
    assert r["queue_ms"] == pytest.approx(4.0)
    assert r["h2d_ms"] == pytest.approx(1.0)
    assert r["compute_ms"] == pytest.approx(10.0)
    assert r["d2h_ms"] == pytest.approx(2.0)
    assert r["other_ms"] == pytest.approx(1.0)


def test_gpu_resolution_order() -> None:
    resolver = GpuResolver(model_gpu={"m": "3"}, default_gpu="9")
    resolver.set_process_gpu("h", 11, "GPU-pid")
    f = SpanFactory({"host.name": "h", "process.pid": 11})
    f.ours("m", T0, 1.0, attrs={"cotenant.gpu": "GPU-span"})
    f.ours("m", T0, 1.0)
    g = SpanFactory({"host.name": "h", "process.pid": 12})
    g.ours("m", T0, 1.0)
    g.ours("other", T0, 1.0)
    norm = Normalizer(resolver)
    got = [r["gpu"] for r in rows(norm, f.otlp())] + [r["gpu"] for r in rows(norm, g.otlp())]
    assert got == ["GPU-span", "GPU-pid", "3", "9"]
    assert resolver.model_of("h", 11) == "m"


def test_other_shapes_are_ignored_and_bad_request_spans_rejected() -> None:
    f = SpanFactory()
    f.tracer.start_span("GET /health", start_time=T0).end(end_time=T0 + MS)
    f.ours("m", T0, 5.0, attrs={"cotenant.batch_size": "many"})
    f.ours("m", T0, 5.0)
    res = Normalizer(GpuResolver()).normalize(f.otlp())
    assert res.requests.num_rows == 1
    assert res.ignored == {"unrecognized": 1}
    assert res.rejected == {"bad_attribute": 1}
    assert "cotenant.batch_size" in res.first_error


def test_error_status_is_kept() -> None:
    f = SpanFactory()
    f.ours("m", T0, 5.0, error=True)
    [r] = rows(Normalizer(GpuResolver()), f.otlp())
    assert r["status"] == "error"


def test_real_clock_spans_from_instrument_helpers() -> None:
    from cotenant.collectors.instrument import request

    f = SpanFactory()
    with request("m", gpu=1, batch_size=2, tracer=f.tracer) as req:
        with req.phase("queue"):
            time.sleep(0.002)
        with req.lock_wait("l", holder="x"):
            pass
        with req.phase("compute"):
            time.sleep(0.003)
    [r] = rows(Normalizer(GpuResolver()), f.otlp())
    assert r["gpu"] == "1" and r["batch_size"] == 2 and r["lock_name"] == "l"
    assert r["queue_ms"] >= 2.0 and r["compute_ms"] >= 3.0
    assert sum(r[c] for c in PHASE_COLUMNS) == pytest.approx(r["latency_ms"])


def test_a_model_load_child_is_booked_as_other_and_not_ignored() -> None:
    f = SpanFactory()
    f.ours("sdxl", T0, 100.0, [("queue", 0, 10), ("model.load", 10, 70), ("compute", 70, 100)])
    res = Normalizer(GpuResolver()).normalize(f.otlp())
    [r] = res.requests.to_pylist()
    assert r["other_ms"] == pytest.approx(60.0) and r["queue_ms"] == pytest.approx(10.0)
    assert not res.ignored


def test_instrument_model_load_helper() -> None:
    from cotenant.collectors.instrument import request

    f = SpanFactory()
    with request("sdxl", gpu=0, tracer=f.tracer) as req:
        with req.model_load("lora", "pixel-art"):
            time.sleep(0.003)
        with pytest.raises(ValueError, match="load kind"), req.model_load("weights", "x"):
            pass
    [r] = rows(Normalizer(GpuResolver()), f.otlp())
    assert r["other_ms"] >= 3.0
