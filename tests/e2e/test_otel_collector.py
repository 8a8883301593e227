"""Spans through a per-node OpenTelemetry Collector (deploy/otel-collector/collector.yaml).

No Collector runs here (its contrib distribution is on no package registry this project
uses). What is tested instead:

* the example's own consistency: every component a pipeline names is defined, k8sattributes
  runs before batch and extracts the ``k8s.*`` attributes cotenant joins spans to pods with,
  and ``otlp/cotenant`` points at the agent Service deploy/k8s creates, node-local;
* the cotenant side, fed what that Collector sends: vLLM ``llm_request`` spans (no pid) whose
  resources k8sattributes has filled with the pod, two pods' resources batched into one
  export, over OTLP/gRPC gzip-compressed (the ``otlp`` exporter's default) with the ingest
  token in the ``authorization`` header. A real agent, its GPU a FakeNvml one held by the vLLM
  pod's engine process (the pod found by its cgroup and the node's pod list), must place that
  pod's requests on the GPU, and the other pod's (no GPU process) nowhere in particular.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import grpc
import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from spans import SpanFactory

from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.collectors.nvml.fake import FakeNvml
from cotenant.collectors.procfs.pod_identity import (
    K8S_CONTAINER,
    K8S_NAMESPACE,
    K8S_POD,
    K8S_POD_UID,
)

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "deploy" / "otel-collector" / "collector.yaml"
TOKEN = "ingest-token-3e9d"
VLLM_UID = "8d2b6c1e-3f4a-4b5c-9d6e-7f8a9b0c1d2e"
VLLM_CID = "a" * 64
MODEL = "meta-llama/Llama-3.1-8B"


def _docs() -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all(COLLECTOR.read_text()) if d]


def test_the_collector_example_fans_out_to_the_nodes_agent_after_k8sattributes() -> None:
    [cm] = [d for d in _docs() if d["kind"] == "ConfigMap"]
    cfg = yaml.safe_load(cm["data"]["collector.yaml"])
    [pipeline] = cfg["service"]["pipelines"].values()
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipeline[kind]) <= set(cfg[kind]), kind
    procs = pipeline["processors"]
    assert procs.index("k8sattributes") < procs.index("batch")
    extracted = set(cfg["processors"]["k8sattributes"]["extract"]["metadata"])
    assert {K8S_NAMESPACE, K8S_POD, K8S_POD_UID, K8S_CONTAINER} <= extracted
    assert set(pipeline["exporters"]) == {"otlp/cotenant", "otlp/traces"}
    host, _, port = cfg["exporters"]["otlp/cotenant"]["endpoint"].rpartition(":")
    name, namespace = host.split(".")[:2]
    agent_svc = next(
        d
        for d in yaml.safe_load_all((ROOT / "deploy/k8s/agent-daemonset.yaml").read_text())
        if d["kind"] == "Service"
    )
    assert (agent_svc["metadata"]["name"], agent_svc["metadata"]["namespace"]) == (
        name,
        namespace,
    )
    assert int(port) in {p["port"] for p in agent_svc["spec"]["ports"]}
    assert agent_svc["spec"]["internalTrafficPolicy"] == "Local"  # this node's agent
    [svc] = [d for d in _docs() if d["kind"] == "Service"]
    assert svc["spec"]["internalTrafficPolicy"] == "Local"
    # the node filter reads the variable the DaemonSet sets
    [ds] = [d for d in _docs() if d["kind"] == "DaemonSet"]
    env = {e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert cfg["processors"]["k8sattributes"]["filter"]["node_from_env_var"] in env


def _node(tmp: Path) -> tuple[Path, Path]:
    """A host /proc where pid 80 (vLLM's engine) is in the vLLM pod's container, and the
    node's pod list naming that pod."""
    proc = tmp / "proc"
    (proc / "80").mkdir(parents=True)
    (proc / "80" / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{VLLM_UID.replace('-', '_')}.slice/cri-containerd-{VLLM_CID}.scope\n"
    )
    pods = tmp / "pods.json"
    pods.write_text(
        json.dumps(
            {
                "items": [
                    {
                        "metadata": {"namespace": "serving", "name": "vllm-0", "uid": VLLM_UID},
                        "status": {
                            "containerStatuses": [
                                {"name": "vllm", "containerID": f"containerd://{VLLM_CID}"}
                            ]
                        },
                    }
                ]
            }
        )
    )
    return proc, pods


def _collector_batch() -> trace_service_pb2.ExportTraceServiceRequest:
    """What the Collector's batch processor sends on: the resources of two pods, each filled
    in by k8sattributes, in one request."""
    now = time.time_ns()
    out = trace_service_pb2.ExportTraceServiceRequest()
    for pod, uid, model, n in (
        ("vllm-0", VLLM_UID, MODEL, 30),
        ("embed-0", "11111111-2222-3333-4444-555555555555", "bge-small", 10),
    ):
        f = SpanFactory(
            {
                "service.name": "vllm",
                K8S_NAMESPACE: "serving",
                K8S_POD: pod,
                K8S_POD_UID: uid,
                K8S_CONTAINER: pod.split("-")[0],
                "k8s.node.name": "gpu-node-1",
                "k8s.deployment.name": pod.split("-")[0],
            }
        )
        for i in range(n):
            f.vllm(now - (60 - i) * 10**9, 0.2 + 0.01 * i, 0.02, 0.15, model=model)
        out.resource_spans.extend(f.otlp().resource_spans)
    return out


@pytest.mark.timeout(120)
def test_the_agent_takes_the_collectors_batches_and_places_spans_by_pod(tmp_path: Path) -> None:
    proc, pods = _node(tmp_path)
    fake = FakeNvml()
    gpu = fake.model.add_gpu()
    fake.model.add_process(gpu, 80, "python3", 20 * 2**30)
    fake.model.record_process_util(80, 60, 30)
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_ENABLED": "false",
            "COTENANT_OTLP_GRPC_PORT": "0",
            "COTENANT_STORE_PATH": str(tmp_path / "agent.duckdb"),
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.05",
            "COTENANT_NVML_POLL_INTERVAL_S": "0.05",
            "COTENANT_NVML_HOST": "gpu-node-1",
            "COTENANT_AGENT_NODE": "gpu-node-1",
            "COTENANT_PROCFS_ENABLED": "false",
            "COTENANT_PROCFS_ROOT": str(proc),
            "COTENANT_PROCFS_KUBELET_PODS": str(pods),
            "COTENANT_AUTH_OTLP_TOKEN": TOKEN,
        }
    )
    svc = Service(cfg, nvml=fake, role="agent")
    threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True).start()
    try:
        assert svc.started.wait(30) and svc.endpoints and svc.endpoints.otlp_grpc
        api = svc.endpoints.api
        # the GPU's processes are known (and named by pod) before the spans arrive
        deadline = time.monotonic() + 30
        while "serving/vllm-0" not in httpx.get(api + "/metrics", timeout=5).text:
            assert time.monotonic() < deadline, "the vLLM pod's process was never named"
            time.sleep(0.05)
        batch = _collector_batch()
        with grpc.insecure_channel(
            svc.endpoints.otlp_grpc, compression=grpc.Compression.Gzip
        ) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Export(batch, timeout=10)  # the Collector without its token header
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            resp = stub.Export(batch, metadata=(("authorization", f"Bearer {TOKEN}"),))
            assert resp.partial_success.rejected_spans == 0
        counts: dict[tuple[str, str], float] = {}
        deadline = time.monotonic() + 30
        while sum(counts.values()) < 40 and time.monotonic() < deadline:
            text = httpx.get(api + "/metrics", timeout=5).text
            counts = {
                (s.labels["model"], s.labels["gpu"]): s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "cotenant_request_duration_seconds_count"
                and s.labels.get("phase") == "total"
            }
            time.sleep(0.1)
        # vLLM's spans name no pid: the pod k8sattributes named places them on its GPU
        assert counts.get((MODEL, gpu)) == 30, counts
        assert sum(v for (m, _), v in counts.items() if m == "bge-small") == 10, counts
        assert ("bge-small", gpu) not in counts  # no process of its pod on that GPU
        slow = httpx.get(
            api + "/api/v1/slowest",
            params={"model": MODEL, "since": "5m", "until": "now", "limit": 1},
            timeout=10,
        ).json()
        assert slow["requests"][0]["gpu"] == gpu
    finally:
        svc.stop()
