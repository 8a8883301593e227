"""collectors/procfs/pod_identity.py on fake /proc trees of each cgroup layout: processes named
as pods."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from analysis_frames import FAULT, N, _refresh, masks, windows

from cotenant.analysis.attribution import attribute
from cotenant.analysis.cpu_causes import read_host_cpu as host_cpu
from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.procfs.collector import ProcfsCollector
from cotenant.collectors.procfs.pod_identity import (
    ContainerRef,
    KubeletPods,
    PodIdentity,
    PodName,
    StaticPods,
    parse_cgroup,
    pods_from_json,
)
from cotenant.core.errors import SourceError
from cotenant.core.timerange import TimeRange
from cotenant.store.db import Store
from cotenant.store.source import StoreSource
from cotenant.store.writer import Writer

PODS_JSON = Path(__file__).resolve().parent / "fixtures" / "kubelet" / "pods.json"
T0 = 1_767_225_600_000_000_000

# the pods of fixtures/kubelet/pods.json
VLLM_UID = "8d2b6c1e-3f4a-4b5c-9d6e-7f8a9b0c1d2e"
VLLM = "a3f1c2d4e5b6a7980123456789abcdef0123456789abcdef0123456789abcdef"
ENVOY = "b4e2d3c5f6a7b8091234567890abcdef1234567890abcdef1234567890abcdef"
ETL_UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
ETL = "c5f3e4d6a7b8c9012345678901abcdef2345678901abcdef2345678901abcdef"
STARTING_UID = "11112222-3333-4444-5555-666677778888"
NEW = "d" * 64  # a container the kubelet has not reported yet
VLLM_NAME = "serving/vllm-llama-7d9f8c6b5-x2k4p (vllm)"
ETL_NAME = "batch/etl-nightly-28461930-qz7wd (etl)"


def _slice(uid: str) -> str:
    return uid.replace("-", "_")


V1_HIERARCHIES = ("memory", "cpu,cpuacct", "pids", "devices", "name=systemd")

LAYOUTS: dict[str, tuple[str, str | None]] = {
    # cgroup v2, systemd driver: the UID's dashes as underscores, the runtime as a scope prefix
    "containerd-v2-systemd": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{_slice(VLLM_UID)}"
        f".slice/cri-containerd-{VLLM}.scope\n",
        VLLM_NAME,
    ),
    "containerd-v2-guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{_slice(VLLM_UID)}.slice/cri-containerd-{ENVOY}.scope\n",
        "serving/vllm-llama-7d9f8c6b5-x2k4p (envoy)",
    ),
    "crio-v2-systemd": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{_slice(ETL_UID)}"
        f".slice/crio-{ETL}.scope\n",
        ETL_NAME,
    ),
    "docker-v2-systemd": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{_slice(VLLM_UID)}"
        f".slice/docker-{VLLM}.scope\n",
        VLLM_NAME,
    ),
    # read from inside a container with its own cgroup namespace (the agent's, on v2): the
    # path is relative to the agent's cgroup
    "containerd-v2-from-a-cgroup-namespace": (
        f"0::/../../kubepods-burstable-pod{_slice(VLLM_UID)}.slice/cri-containerd-{VLLM}.scope",
        VLLM_NAME,
    ),
    "containerd-v2-cgroupfs": (f"0::/kubepods/burstable/pod{VLLM_UID}/{VLLM}\n", VLLM_NAME),
    "v1-cgroupfs": (
        "".join(
            f"{12 - i}:{h}:/kubepods/besteffort/pod{ETL_UID}/{ETL}\n"
            for i, h in enumerate(V1_HIERARCHIES)
        )
        + "0::/\n",
        ETL_NAME,
    ),
    "v1-systemd": (
        "".join(
            f"{12 - i}:{h}:/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{_slice(ETL_UID)}.slice/crio-{ETL}.scope\n"
            for i, h in enumerate(V1_HIERARCHIES)
        ),
        ETL_NAME,
    ),
    # the pod is listed, its new container not yet: the pod's name without the container
    "container-not-yet-reported": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
        f"{_slice(STARTING_UID)}.slice/cri-containerd-{NEW}.scope\n",
        "serving/starting-0",
    ),
    "pod-not-on-this-kubelet": (
        f"0::/kubepods/pod{'9' * 8}-aaaa-bbbb-cccc-{'d' * 12}/{NEW}\n",
        None,
    ),
    "docker-outside-kubernetes": (f"0::/docker/{VLLM}\n", None),
    "docker-systemd-outside-kubernetes": (f"0::/system.slice/docker-{VLLM}.scope\n", None),
    "systemd-service": ("0::/system.slice/nvidia-persistenced.service\n", None),
    "user-session": ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
    "v1-host-process": ("".join(f"{12 - i}:{h}:/\n" for i, h in enumerate(V1_HIERARCHIES)), None),
    "empty": ("", None),
    "garbage": ("kubepods pod and a container\n\x00\xff", None),
}


class FakeProc:
    """A /proc tree with ``stat``, ``cmdline`` and ``cgroup`` per pid."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.now = 0.0
        (root / "self").mkdir()
        (root / "self" / "stat").write_text("1 (cotenant) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 0\n")

    def process(
        self, pid: int, comm: str, cpu_s: float, *, cmdline: str = "", cgroup: str = "0::/\n"
    ) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        ticks = round(cpu_s * 100)
        fields = ["S", "1", "1", "0", "0", "-1", "0", "0", "0", "0", "0", str(ticks), "0"]
        fields += ["0", "0", "20", "0", "1", "0", "1000", "1000"]
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)} 0 0 0\n")
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
        (d / "cgroup").write_text(cgroup)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    (tmp_path / "proc").mkdir()
    return FakeProc(tmp_path / "proc")


@pytest.mark.parametrize("directory", ["static", "kubelet-file"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_cgroup_layout_names_the_pod_or_nothing(
    proc: FakeProc, layout: str, directory: str
) -> None:
    cgroup, expected = LAYOUTS[layout]
    proc.process(42, "python3", 1.0, cgroup=cgroup)
    pods = KubeletPods(str(PODS_JSON)) if directory == "kubelet-file" else static_pods()
    assert PodIdentity(pods, proc=proc.root).name_of(42) == expected


def static_pods() -> StaticPods:
    return StaticPods(
        [
            (VLLM_UID, "serving", "vllm-llama-7d9f8c6b5-x2k4p", [("vllm", VLLM), ("envoy", ENVOY)]),
            (ETL_UID, "batch", "etl-nightly-28461930-qz7wd", [("etl", ETL)]),
            (STARTING_UID, "serving", "starting-0", []),
        ]
    )


def test_a_container_outside_kubernetes_has_an_id_and_no_pod() -> None:
    assert parse_cgroup(f"0::/docker/{VLLM}\n") == ContainerRef(VLLM, None)
    assert parse_cgroup(LAYOUTS["crio-v2-systemd"][0]) == ContainerRef(ETL, ETL_UID)
    assert parse_cgroup("0::/system.slice/containerd.service\n") is None


def test_the_kubelet_pod_list_is_read_into_names_per_container() -> None:
    pods = KubeletPods(str(PODS_JSON)).containers()
    assert pods[(VLLM_UID, VLLM)] == PodName("serving", "vllm-llama-7d9f8c6b5-x2k4p", "vllm")
    assert str(pods[(VLLM_UID, "1" * 64)]) == "serving/vllm-llama-7d9f8c6b5-x2k4p (fetch-weights)"
    assert str(pods[(ETL_UID, ETL)]) == ETL_NAME  # cri-o://<id>
    assert str(pods[(STARTING_UID, "")]) == "serving/starting-0"
    # the malformed entries are skipped, not fatal
    assert {uid for uid, _ in pods} == {VLLM_UID, ETL_UID, STARTING_UID}
    assert pods == static_pods().containers() | {(VLLM_UID, "1" * 64): pods[(VLLM_UID, "1" * 64)]}


@pytest.mark.parametrize(
    ("body", "match"),
    [("{", "cannot read"), ('{"kind": "Status"}', "not a pod list"), ("[]", "not a pod list")],
)
def test_a_pod_list_that_is_not_one_is_refused_naming_the_source(
    tmp_path: Path, body: str, match: str
) -> None:
    (tmp_path / "pods.json").write_text(body)
    with pytest.raises(SourceError, match=match) as err:
        KubeletPods(str(tmp_path / "pods.json")).containers()
    assert "pods.json" in str(err.value)
    with pytest.raises(SourceError, match="not a pod list"):
        pods_from_json({"items": None})


class FailingPods:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def containers(self) -> Mapping[tuple[str, str], PodName]:
        raise self.exc


@pytest.mark.parametrize(
    "exc", [SourceError("kubelet http://node:10255/pods refused"), RuntimeError("bug")]
)
def test_a_failing_directory_names_no_pod_and_never_raises(
    proc: FakeProc, exc: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    proc.process(42, "python3", 1.0, cgroup=LAYOUTS["containerd-v2-systemd"][0])
    t = [0.0]
    ident = PodIdentity(FailingPods(exc), proc=proc.root, refresh_s=5.0, monotonic=lambda: t[0])
    with caplog.at_level(logging.WARNING):
        assert ident.name_of(42) is None
        t[0] = 10.0
        assert ident.name_of(42) is None
    assert ident.errors == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"processes named by program, not pod: {exc}"
    ]
    assert ident.name_of(999) is None  # no such process


class GrowingPods:
    """A kubelet whose pod list gains a pod when ``started`` is set; counts its reads."""

    def __init__(self) -> None:
        self.started = False
        self.reads = 0

    def containers(self) -> Mapping[tuple[str, str], PodName]:
        self.reads += 1
        return static_pods().containers() if self.started else {}


def test_a_pod_started_later_is_found_at_the_next_refresh_and_not_before(proc: FakeProc) -> None:
    proc.process(42, "python3", 1.0, cgroup=LAYOUTS["containerd-v2-systemd"][0])
    proc.process(43, "sshd", 1.0, cgroup=LAYOUTS["systemd-service"][0])
    t = [0.0]
    kubelet = GrowingPods()
    ident = PodIdentity(kubelet, proc=proc.root, refresh_s=10.0, monotonic=lambda: t[0])
    assert ident.name_of(42) is None and kubelet.reads == 1
    kubelet.started = True
    t[0] = 5.0
    assert ident.name_of(42) is None and kubelet.reads == 1  # within refresh_s: not re-read
    assert ident.name_of(43) is None and kubelet.reads == 1  # not in a pod: never asks
    t[0] = 10.0
    assert ident.name_of(42) == VLLM_NAME and kubelet.reads == 2
    t[0] = 100.0
    assert ident.name_of(42) == VLLM_NAME and kubelet.reads == 2  # known: no read


def test_only_a_fully_named_or_podless_process_has_a_final_name(proc: FakeProc) -> None:
    for pid, layout in enumerate(LAYOUTS, start=100):
        proc.process(pid, "python3", 1.0, cgroup=LAYOUTS[layout][0])
    ident = PodIdentity(static_pods(), proc=proc.root)
    final = {layout: ident.lookup(pid).final for pid, layout in enumerate(LAYOUTS, start=100)}
    pending = {"container-not-yet-reported", "pod-not-on-this-kubelet"}
    assert {layout for layout, f in final.items() if not f} == pending
    assert ident.lookup(99999).final  # exited: nothing to ask again


def test_procfs_names_a_pod_started_after_the_last_read_once_the_list_has_it(
    proc: FakeProc,
) -> None:
    cgroup = LAYOUTS["containerd-v2-systemd"][0]
    kubelet = GrowingPods()
    rows: list[dict[str, object]] = []
    c = ProcfsCollector(
        sink=lambda _t, batch: rows.extend(batch.to_pylist()),
        resolver=GpuResolver(),
        host="node-1",
        proc=proc.root,
        clock=lambda: T0 + int(proc.now * 1e9),
        monotonic=lambda: proc.now,
        clock_ticks=100,
        pods=PodIdentity(kubelet, proc=proc.root, refresh_s=10.0, monotonic=lambda: proc.now),
    )
    for k in range(16):
        proc.process(80, "python3", k * 0.5, cmdline="python3 serve.py", cgroup=cgroup)
        kubelet.started = k >= 3  # the pod is listed from t = 3 s, after the first read
        c.poll_once()
        proc.now += 1.0
    names = [r["process_name"] for r in rows]
    # the list is first read at t = 1 s (the first poll gives no rate, so names nothing):
    # named by program until it is read again (t = 11 s), then by pod, not stuck
    assert names == ["python3 serve.py"] * 10 + [VLLM_NAME] * 5
    assert kubelet.reads == 2


class ServePods(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        assert self.path == "/pods" and self.headers["Accept"] == "application/json"
        assert self.headers["Authorization"] is None  # the token goes over TLS only
        body = PODS_JSON.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_kubelet_read_only_port_is_read_over_http(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("secret-token\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), ServePods)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/pods"
        pods = KubeletPods(url, service_account=tmp_path).containers()
    finally:
        server.shutdown()
        server.server_close()
    assert str(pods[(VLLM_UID, VLLM)]) == VLLM_NAME
    # a port nobody listens on: refused, named, contained by PodIdentity
    with pytest.raises(SourceError, match="cannot read the kubelet's pod list http://127"):
        KubeletPods(url, timeout_s=1.0).containers()


def test_a_pod_burning_the_hosts_cpu_is_the_culprit_named_namespace_pod_container(
    proc: FakeProc, tmp_path: Path
) -> None:
    """The end-to-end path: a containerd cgroup and the pod list -> procfs' process_samples
    rows -> the host CPU series -> the cause diagnosis names, as incidents, the dashboard,
    alerts and the report show it."""
    store = Store(tmp_path / "s.duckdb")
    writer = Writer(store, flush_interval_s=0.01)
    cgroup = LAYOUTS["containerd-v2-systemd"][0]
    c = ProcfsCollector(
        sink=writer.submit,
        resolver=GpuResolver(),
        host="node-1",
        proc=proc.root,
        clock=lambda: T0 + int(proc.now * 1e9),
        monotonic=lambda: proc.now,
        clock_ticks=100,
        pods=PodIdentity(static_pods(), proc=proc.root),
    )
    serve_s = burn_s = 0.0
    for k in range(N + 1):  # the poll at k closes window k - 1
        proc.process(80, "python3", serve_s, cmdline="python3 serve.py", cgroup=cgroup)
        proc.process(81, "python3", burn_s, cmdline="python3 burn.py")  # on the host
        c.poll_once()
        proc.now += 1.0
        in_fault = FAULT.start <= k < FAULT.stop
        serve_s += 1.5 if in_fault else 0.0  # the pod's server burns 1.5 cores in the fault
        burn_s += 0.1  # a steady host process: never the culprit
    c.stop()
    writer.close()
    cpu = host_cpu(StoreSource(store), TimeRange(T0 + 1_000_000_000, T0 + (N + 1) * 10**9), 1.0, N)
    store.close()
    assert sorted(cpu) == ["python3 burn.py", VLLM_NAME]
    np.testing.assert_allclose(cpu[VLLM_NAME][FAULT], 1.5)
    w = windows()
    w.models["tts"]["preprocess_ms"][FAULT] = 20.0
    _refresh(w)
    att = attribute(w, "tts", *masks(), host_cpu=cpu)
    top = att.causes[0]
    assert (top.kind, top.culprit) == ("cpu", VLLM_NAME)


def test_serve_names_processes_from_the_configured_kubelet_pod_list(
    proc: FakeProc, tmp_path: Path
) -> None:
    """``procfs.kubelet_pods`` wired in serve: a pod's process recorded by its pod name."""
    cgroup = LAYOUTS["crio-v2-systemd"][0]
    proc.process(90, "java", 0.0, cmdline="java -jar etl.jar", cgroup=cgroup)
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_ENABLED": "false",
            "COTENANT_STORE_PATH": str(tmp_path / "s.duckdb"),
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.05",
            "COTENANT_NVML_ENABLED": "false",
            "COTENANT_DASHBOARD_ENABLED": "false",
            "COTENANT_ANALYSIS_ENABLED": "false",
            "COTENANT_PROCFS_ROOT": str(proc.root),
            "COTENANT_PROCFS_INTERVAL_S": "0.1",
            "COTENANT_PROCFS_KUBELET_PODS": str(PODS_JSON),
        }
    )
    svc = Service(cfg)
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(30)
    deadline = time.monotonic() + 30
    rows: list[tuple[object, ...]] = []
    cpu_s = 0.0
    while not rows and time.monotonic() < deadline:
        cpu_s += 1.0
        proc.process(90, "java", cpu_s, cmdline="java -jar etl.jar", cgroup=cgroup)
        time.sleep(0.05)
        with svc.store.cursor() as cur:
            rows = cur.execute(
                "SELECT pid, process_name FROM process_samples WHERE cpu_cores > 0"
            ).fetchall()
    svc.stop()
    t.join(60)
    assert rows and rows[0] == (90, ETL_NAME)
