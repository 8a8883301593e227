"""An engine's own processes serve its model: vLLM's ``llm_request`` span names its API server
(``vllm.process_id``), while the ``EngineCore`` and ``Worker_0`` below it do the work and hold
the GPU. Their CPU, their GPU samples and the request's GPU must all be the model's
(collectors/procfs/tree.py, GpuResolver's families, the procfs collector), and a pid from a
pod's namespace or pid 1 must never lend its model to a host's processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from cotenant.collectors.gpu_resolve import MAX_FAMILY, GpuResolver
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.collectors.procfs.tree import descendants
from tests.test_procfs import FakeProc, Sink, collector


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path)


def test_descendants_follow_the_tree_and_stop_at_another_root() -> None:
    # 100 api -> 101 engine core -> 102 worker; 101 -> 103 helper; 200 another engine below 103
    parents = {1: 0, 100: 1, 101: 100, 102: 101, 103: 101, 200: 103, 201: 200, 300: 1}
    assert descendants(parents, [100]) == {101: 100, 102: 100, 103: 100, 200: 100, 201: 100}
    assert descendants(parents, [100, 200]) == {101: 100, 102: 100, 103: 100, 201: 200}
    assert descendants(parents, [999]) == {}  # exited: not in this poll
    assert descendants({5: 5, 6: 5}, [5]) == {6: 5}  # a pid its own parent (pid reuse race)


def vllm_export(pid: str, model: str = "tiny", pod: str | None = None) -> ExportTraceServiceRequest:
    """One ``llm_request`` as vLLM 0.32 sends it: no model on the span, ``vllm.process_id``
    (a string) and no ``process.pid`` on the resource."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    attrs = {"service.name": model, "vllm.process_id": pid}
    if pod is not None:
        attrs |= {"k8s.namespace.name": "ml", "k8s.pod.name": pod}
    for k, v in attrs.items():
        kv = rs.resource.attributes.add()
        kv.key, kv.value.string_value = k, v
    span = rs.scope_spans.add().spans.add()
    span.name = "llm_request"
    span.trace_id, span.span_id = bytes(range(1, 17)), bytes(range(1, 9))
    span.start_time_unix_nano, span.end_time_unix_nano = 1_000_000_000, 1_050_000_000
    for k, sec in (("gen_ai.latency.time_in_queue", 0.001), ("gen_ai.latency.e2e", 0.05)):
        kv = span.attributes.add()
        kv.key, kv.value.double_value = k, sec
    return req


def test_the_row_takes_vllms_process_id_and_the_gpu_of_the_engine_below_it() -> None:
    r = GpuResolver()
    norm = Normalizer(r)
    [row] = norm.normalize(vllm_export("4100")).requests.to_pylist()
    assert (row["model"], row["pid"], row["gpu"]) == ("tiny", 4100, "")
    # NVML lists the worker (a grandchild) on GPU-7; procfs found the tree
    r.set_process_gpu("", 4102, "GPU-7")
    r.set_families(("node", ""), {4101: 4100, 4102: 4100})
    [row] = norm.normalize(vllm_export("4100")).requests.to_pylist()
    assert row["gpu"] == "GPU-7"
    assert r.model_of("", 4102) == "tiny" and r.model_of("", 4101) == "tiny"
    assert r.served_pids(("node", "")) == {4100: "tiny", 4101: "tiny", 4102: "tiny"}
    # tensor parallel: workers on two GPUs name neither
    r.set_process_gpu("", 4101, "GPU-8")
    [row] = norm.normalize(vllm_export("4100")).requests.to_pylist()
    assert row["gpu"] == ""
    # the worker exits: forgotten with its GPU
    r.forget_process("", 4102)
    assert r.model_of("", 4102) is None


def test_a_descendant_that_spans_name_keeps_its_own_model() -> None:
    r = GpuResolver()
    r.note_model("", 10, "router")
    r.note_model("", 11, "llama")
    r.set_families(("",), {11: 10, 12: 10})
    assert r.model_of("", 11) == "llama" and r.model_of("", 12) == "router"
    assert r.served_pids(("",)) == {10: "router", 11: "llama", 12: "router"}


def test_pod_pids_pid_1_and_huge_families_lend_nothing() -> None:
    r = GpuResolver()
    norm = Normalizer(r)
    # a pod's pid is in the pod's namespace: on the host, pid 4100 is someone else
    norm.normalize(vllm_export("4100", pod="vllm-0"))
    assert r.family_roots(("",)) == set()
    # vLLM exec'd as a container's pid 1, seen without its pod attributes
    norm.normalize(vllm_export("1", model="other"))
    assert 1 not in r.family_roots(("",))
    r.set_families(("",), {2: 1, 3: 1})
    assert r.model_of("", 2) is None
    # a namespaced pid that happens to be a host daemon's with many children
    r.note_model("", 50, "m")
    r.set_families(("",), {p: 50 for p in range(1000, 1001 + MAX_FAMILY)})
    assert r.model_of("", 1000) is None
    r.set_families(("",), {p: 50 for p in range(1000, 1000 + MAX_FAMILY)})
    assert r.model_of("", 1000) == "m"


def test_procfs_books_the_engine_processes_cpu_to_the_model(proc: FakeProc) -> None:
    resolver = GpuResolver()
    proc.process(4100, "python3", 1.0, cmdline="python3 -m vllm.entrypoints.openai.api_server")
    proc.process(4101, "VLLM::EngineCor", 1.0, ppid=4100)
    proc.process(4102, "VLLM::Worker_0", 1.0, ppid=4101)
    proc.process(4200, "python3", 1.0, cmdline="python3 burn.py")
    sink = Sink()
    c = collector(proc, sink, resolver=resolver)
    c.poll_once()
    Normalizer(resolver).normalize(vllm_export("4100"))  # the first request's span
    for second in (1, 2, 3):
        proc.tick()
        proc.process(4100, "python3", 1.0 + 0.1 * second)
        proc.process(4101, "VLLM::EngineCor", 1.0 + 0.3 * second, ppid=4100)
        proc.process(4102, "VLLM::Worker_0", 1.0 + 0.9 * second, ppid=4101)
        proc.process(4200, "python3", 1.0 + 0.5 * second, cmdline="python3 burn.py")
        c.poll_once()
    last = [r for r in sink.rows() if r["ts_ns"] == max(x["ts_ns"] for x in sink.rows())]
    by_name = {r["process_name"]: r for r in last}
    # the engine's three processes are one row of the model, under the busiest (the worker)
    assert set(by_name) == {"tiny", "python3 burn.py"}
    assert by_name["tiny"]["model"] == "tiny" and by_name["tiny"]["pid"] == 4102
    assert by_name["tiny"]["cpu_cores"] == pytest.approx(1.3)
    assert by_name["python3 burn.py"]["model"] is None
    # the worker exits: its pid is no longer the model's after the next poll
    proc.gone(4102)
    proc.tick()
    c.poll_once()
    assert resolver.model_of("node-1", 4102) is None and resolver.model_of("", 4102) is None
