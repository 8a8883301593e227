"""Span resources' ``k8s.*`` attributes joined with the pods of GPU processes (cgroup + pod list).

vLLM's ``llm_request`` span comes from its API-server process and carries no ``process.pid``;
the GPU is held by its engine process, in the same pod. Through the pod, the engine process is
the model itself (never its own co-tenant) and the span's request lands on that GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from spans import SpanFactory

from cotenant.analysis.diagnose import diagnose
from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.nvml.collector import NvmlCollector
from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.collectors.procfs.collector import ProcfsCollector
from cotenant.collectors.procfs.pod_identity import PodIdentity, PodName, PodRef, StaticPods
from cotenant.collectors.procfs.pod_identity import pod_ref_of_resource as ref_of
from cotenant.core.timerange import TimeRange
from cotenant.store.db import Store
from cotenant.store.source import StoreSource
from cotenant.store.writer import Writer

T0 = 1_767_225_600_000_000_000
HOST = "gpu-node-1"
MODEL = "meta-llama/Llama-3.1-8B"
VLLM_UID = "8d2b6c1e-3f4a-4b5c-9d6e-7f8a9b0c1d2e"
VLLM_CID = "a" * 64
TRAIN_UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
TRAIN_CID = "b" * 64
VLLM_POD = "serving/vllm-0 (vllm)"
TRAIN_POD = "research/trainer-0 (trainer)"
K8S = {
    "host.name": HOST,
    "k8s.namespace.name": "serving",
    "k8s.pod.name": "vllm-0",
    "k8s.container.name": "vllm",
}
N, FAULT = 150, slice(100, 130)


def _cgroup(uid: str, cid: str) -> str:
    return (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope\n"
    )


@pytest.fixture
def pods(tmp_path: Path) -> PodIdentity:
    proc = tmp_path / "proc"
    for pid, uid, cid in ((80, VLLM_UID, VLLM_CID), (81, TRAIN_UID, TRAIN_CID)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(_cgroup(uid, cid))
    directory = StaticPods(
        [
            (VLLM_UID, "serving", "vllm-0", [("vllm", VLLM_CID)]),
            (TRAIN_UID, "research", "trainer-0", [("trainer", TRAIN_CID)]),
        ]
    )
    return PodIdentity(directory, proc=proc)


def test_a_span_resource_names_its_pod_by_names_or_uid_or_not_at_all() -> None:
    assert ref_of(K8S) == PodRef(None, PodName("serving", "vllm-0", "vllm"))
    assert ref_of({"k8s.pod.uid": VLLM_UID.upper()}) == PodRef(VLLM_UID, None)
    assert ref_of({"k8s.pod.name": "vllm-0"}) is None  # no namespace: not a pod's name
    assert ref_of({"k8s.namespace.name": "serving", "k8s.pod.name": 7}) is None
    assert ref_of({"host.name": HOST}) is None


@pytest.mark.parametrize(
    "resource",
    [
        K8S,
        {"k8s.pod.uid": VLLM_UID},  # the UID only (the k8sattributes processor's default)
        {"k8s.namespace.name": "serving", "k8s.pod.name": "vllm-0"},  # no container
    ],
    ids=["names", "uid", "pod-only"],
)
def test_the_engine_process_of_a_pod_that_sends_spans_is_its_model_and_places_them(
    pods: PodIdentity, resource: dict[str, str]
) -> None:
    """No pid in the span: the pod joins the request to the engine's GPU and the engine's
    NVML and host-CPU rows to the model; the other pod stays itself."""
    rows: list[tuple[str, dict[str, object]]] = []
    clock = [T0]
    fake = FakeNvml(clock=lambda: clock[0])
    gpu = fake.model.add_gpu()
    resolver = GpuResolver()
    nvml = NvmlCollector(
        fake,
        sink=lambda t, b: rows.extend((t, r) for r in b.to_pylist()),
        resolver=resolver,
        host=HOST,
        clock=lambda: clock[0],
        batch_interval_s=0.0,
        pods=pods,
    )
    nvml.open()
    fake.model.add_process(gpu, 80, "VLLM::EngineCore", 20 << 30)
    fake.model.add_process(gpu, 81, "python3", 10 << 30)
    norm = Normalizer(resolver)
    spans = SpanFactory(resource)
    clock[0] += 10**9
    nvml.poll_once()  # the pods of pids 80 and 81 are learnt
    spans.vllm(T0, 0.05, 0.0, 0.04)
    (req,) = norm.normalize(spans.otlp()).requests.to_pylist()
    assert (req["pid"], req["gpu"]) == (None, gpu)
    clock[0] += 10**9
    nvml.poll_once()
    nvml.stop()
    latest = max(r["ts_ns"] for t, r in rows if t == "process_samples")
    procs = {r["pid"]: r for t, r in rows if t == "process_samples" and r["ts_ns"] == latest}
    assert (procs[80]["process_name"], procs[80]["model"]) == (VLLM_POD, MODEL)
    assert (procs[81]["process_name"], procs[81]["model"]) == (TRAIN_POD, None)


def test_two_models_from_one_pod_label_its_unnamed_containers_with_neither() -> None:
    r = GpuResolver()
    pod = PodName("serving", "multi-0")
    r.note_pod(PodRef(None, PodName("serving", "multi-0", "a")), "m-a")
    r.note_pod(PodRef(None, PodName("serving", "multi-0", "b")), "m-b")
    assert r.model_of_pod(PodRef(VLLM_UID, PodName("serving", "multi-0", "a"))) == "m-a"
    assert r.model_of_pod(PodRef(VLLM_UID, PodName("serving", "multi-0", "sidecar"))) is None
    assert r.model_of_pod(PodRef(None, pod)) is None


def test_tensor_parallel_pods_place_no_request_by_pod() -> None:
    r = GpuResolver(model_gpu={"m": "GPU-configured"})
    ref = PodRef(VLLM_UID, PodName("serving", "vllm-0", "vllm"))
    for pid, g in ((80, "GPU-a"), (81, "GPU-b")):
        r.set_process_gpu(HOST, pid, g)
        r.set_process_pod(HOST, pid, ref)
    assert r.resolve(None, HOST, None, "m", ref) == "GPU-configured"
    r.forget_process(HOST, 81)
    assert r.resolve(None, HOST, None, "m", ref) == "GPU-a"
    r.forget_process(HOST, 80)
    assert r.resolve(None, HOST, None, "m", ref) == "GPU-configured"


def test_the_victims_own_pod_is_never_its_co_tenant_the_other_pod_is_the_culprit(
    pods: PodIdentity, tmp_path: Path
) -> None:
    """End to end: vLLM spans (no pid) with k8s.* resource attributes through the normalizer,
    NVML rows of both pods' processes through the collector, the store, the diagnosis. While
    the trainer pod bursts, the victim's own engine works harder too (its kernels take longer):
    the culprit is the trainer pod, and no cause names the victim's pod."""
    store = Store(tmp_path / "s.duckdb")
    writer = Writer(store, flush_interval_s=0.01)
    clock = [T0]
    fake = FakeNvml(clock=lambda: clock[0])
    gpu = fake.model.add_gpu()
    resolver = GpuResolver()
    nvml = NvmlCollector(
        fake,
        sink=writer.submit,
        resolver=resolver,
        host=HOST,
        clock=lambda: clock[0],
        batch_interval_s=0.0,
        pods=pods,
    )
    nvml.open()
    fake.model.add_process(gpu, 80, "VLLM::EngineCore", 20 << 30)
    fake.model.add_process(gpu, 81, "python3", 10 << 30)
    norm = Normalizer(resolver)
    spans = SpanFactory(K8S)
    rng = np.random.default_rng(7)
    nvml.poll_once()  # the processes' pods and GPUs are known before the first span
    for k in range(N):
        in_fault = FAULT.start <= k < FAULT.stop
        for i in range(20):
            t0 = clock[0] + i * 50_000_000
            infer = (0.09 if in_fault else 0.04) * (1 + 0.05 * rng.random())
            spans.vllm(t0, infer + 0.002, 0.001, infer, model=MODEL)
        writer.submit("requests", norm.normalize(spans.otlp()).requests)
        fake.model.record_process_util(80, 60 if in_fault else 40, 20)
        fake.model.record_process_util(81, 70 if in_fault else 5, 30 if in_fault else 2)
        clock[0] += 10**9
        nvml.poll_once()
    nvml.stop()
    writer.close()
    src = StoreSource(store)
    assert src.model_gpus(TimeRange(T0, clock[0])) == [(MODEL, gpu)]
    diags = diagnose(src, MODEL, TimeRange(T0, clock[0]), slo_ms=70.0)
    store.close()
    assert diags
    for d in diags:
        named = [(c.kind, c.culprit) for c in d.causes]
        assert not [n for n in named if VLLM_POD in str(n[1]) or n[1] == VLLM_POD], named
        assert d.causes[0].kind in ("cotenant", "bandwidth"), named
        assert d.causes[0].culprit == TRAIN_POD, named


def test_procfs_names_a_busy_process_in_a_span_pod_by_its_model(
    pods: PodIdentity, tmp_path: Path
) -> None:
    """The API server of the victim's pod burning host CPU is the model's own CPU use."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir()
    (proc / "self" / "stat").write_text("1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 0\n")
    resolver = GpuResolver()
    resolver.note_pod(PodRef(None, PodName("serving", "vllm-0", "vllm")), MODEL)
    got: list[dict[str, object]] = []
    now = [0.0]
    c = ProcfsCollector(
        sink=lambda _t, b: got.extend(b.to_pylist()),
        resolver=resolver,
        host=HOST,
        proc=proc,
        clock=lambda: T0 + int(now[0] * 1e9),
        monotonic=lambda: now[0],
        clock_ticks=100,
        pods=pods,
    )
    for k in range(3):
        for pid in (80, 81):
            ticks = 100 * k
            fields = ["S", "1", "1", "0", "0", "-1", "0", "0", "0", "0", "0", str(ticks), "0"]
            fields += ["0", "0", "20", "0", "1", "0", "1000", "1000"]
            (proc / str(pid) / "stat").write_text(f"{pid} (python3) {' '.join(fields)} 0 0 0\n")
            (proc / str(pid) / "cmdline").write_bytes(b"python3\0")
        c.poll_once()
        now[0] += 1.0
    c.stop()
    assert {(r["process_name"], r["model"]) for r in got} == {(MODEL, MODEL), (TRAIN_POD, None)}
