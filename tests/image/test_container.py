"""The container image, run: ``make image`` builds it, ``make image-test`` runs this (it is not
part of ``make test``: the first build takes minutes).

The agent runs as the image's own non-root user with a read-only root filesystem, every
capability dropped, no privilege escalation, the host's pids and the host's ``/proc`` mounted
read-only at ``/host/proc`` (what deploy/k8s/agent-daemonset.yaml gives it), on spans only (no
GPU here): it must say it is ready, take spans, expose them and the host CPU it reads on
``/metrics`` and answer a drill-down. Central ``cotenant serve`` runs under the same
restrictions and must take spans and answer a diagnosis of them. Every test is skipped, saying
why, where podman is missing, cannot start a container, or the image was not built.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from spans import MS, SpanFactory  # noqa: E402

VERSION = next(
    line.split('"')[1]
    for line in (ROOT / "pyproject.toml").read_text().splitlines()
    if line.startswith("version = ")
)
IMAGE = os.environ.get("IMAGE", f"cotenant:{VERSION}")
pytestmark = pytest.mark.timeout(600)


def _podman() -> list[str]:
    """podman with the runtime and limits scripts/podman-env.sh finds for this host."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (make image installs it; apt-get install podman)")
    if subprocess.run(["podman", "image", "exists", IMAGE]).returncode != 0:
        pytest.skip(f"image {IMAGE} is not built: run `make image` first")
    probe = subprocess.run(
        [
            "bash",
            "-c",
            'source scripts/podman-env.sh && podman_probe "$0" && '
            'printf "%s\\n" "${PODMAN[@]}" -- "${PODMAN_LIMITS[@]}"',
            IMAGE,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {probe.stderr.strip()[-500:]}")
    words = probe.stdout.split("\n")[:-1]
    cut = words.index("--")
    return [*words[:cut], "run", *words[cut + 1 :]]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


RESTRICTED = [
    "--read-only",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--tmpfs=/tmp",
    "--network=host",
]


class Container:
    def __init__(self, name: str, proc: subprocess.Popen[str], log: Path, api: str) -> None:
        self.name, self.proc, self.log, self.api = name, proc, log, api

    def ready(self) -> dict[str, object]:
        deadline = time.monotonic() + 120
        last = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                r = httpx.get(self.api + "/readyz", timeout=3)
                last = r.text
                if r.status_code == 200:
                    return dict(r.json())
            except httpx.HTTPError as exc:
                last = str(exc)
            time.sleep(0.5)
        pytest.fail(f"{self.name} not ready ({last}):\n{self.log.read_text()[-3000:]}")

    def exec(self, *cmd: str) -> str:
        r = subprocess.run(["podman", "exec", self.name, *cmd], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout


@pytest.fixture
def run_image(tmp_path: Path) -> Iterator[object]:
    base = _podman()
    started: list[Container] = []

    def start(name: str, args: list[str], env: dict[str, str], mounts: list[str]) -> Container:
        cname = f"cotenant-image-test-{name}-{os.getpid()}"
        data = tmp_path / name
        data.mkdir()
        data.chmod(0o777)  # the image's user (10001) writes its store here
        flags = [f"--env={k}={v}" for k, v in env.items()]
        cmd = [*base, "--rm", f"--name={cname}", *RESTRICTED, *flags, *mounts]
        cmd += [f"--volume={data}:/var/lib/cotenant", IMAGE, *args]
        log = tmp_path / f"{name}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        c = Container(cname, proc, log, f"http://127.0.0.1:{env['COTENANT_SERVER_PORT']}")
        started.append(c)
        return c

    yield start
    for c in started:
        subprocess.run(["podman", "stop", "--time=20", c.name], capture_output=True)
        try:
            c.proc.wait(60)
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait()


def _send(otlp: str, model: str, latencies_ms: list[float], start_ns: int) -> None:
    f = SpanFactory({"service.name": model, "host.name": "node-a"})
    for i, lat in enumerate(latencies_ms):
        t0 = start_ns + i * 200 * MS
        f.ours(model, t0, lat, [("queue", 0, lat / 5), ("compute", lat / 5, lat)],
               attrs={"cotenant.gpu": "gpu0"})  # fmt: skip
    exporter = OTLPSpanExporter(endpoint=otlp, timeout=30)
    spans = f.take()
    for i in range(0, len(spans), 500):
        assert exporter.export(spans[i : i + 500]).name == "SUCCESS"
    exporter.shutdown()


def test_the_agent_runs_non_root_on_host_proc_and_takes_spans(run_image: object) -> None:
    api_port, otlp_port = _free_ports(2)
    env = {
        "COTENANT_SERVER_PORT": str(api_port),
        "COTENANT_OTLP_HTTP_PORT": str(otlp_port),
        "COTENANT_OTLP_GRPC_ENABLED": "false",
        "COTENANT_AGENT_NODE": "node-a",
        "COTENANT_NVML_ENABLED": "false",  # spans only: no GPU on this machine
        "COTENANT_PROCFS_ROOT": "/host/proc",
        "COTENANT_PROCFS_INTERVAL_S": "0.5",
        "COTENANT_AGENT_STORE": "/var/lib/cotenant/agent.duckdb",
    }
    mounts = ["--pid=host", "--volume=/proc:/host/proc:ro"]
    agent = run_image("agent", ["agent"], env, mounts)  # type: ignore[operator]
    assert agent.ready()["status"] == "ready"
    assert agent.exec("id", "-u").strip() == "10001"
    # the root filesystem and the host's /proc are read-only to it
    assert (
        "Read-only file system"
        in subprocess.run(
            ["podman", "exec", agent.name, "touch", "/host/proc/x", "/usr/x"],
            capture_output=True,
            text=True,
        ).stderr
    )
    now = time.time_ns()
    _send(f"http://127.0.0.1:{otlp_port}/v1/traces", "tts", [20.0, 250.0, 30.0], now - 10**10)
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(agent.api + "/metrics", timeout=10).text
        if 'model="tts"' in text and "cotenant_process_cpu_cores{" in text:
            break
        time.sleep(0.5)
    assert "cotenant_request_duration_seconds_count{" in text and 'model="tts"' in text, text[
        -2000:
    ]
    assert "cotenant_process_cpu_cores{" in text  # the host's processes, from /host/proc
    assert 'cotenant_build_info{python="3.11' in text and 'role="agent"' in text
    slow = httpx.get(
        agent.api + "/api/v1/slowest",
        params={"model": "tts", "since": "5m", "until": "now"},
        timeout=30,
    ).json()
    assert slow["node"] == "node-a" and slow["requests"][0]["latency_ms"] == pytest.approx(250)


def test_an_agent_without_nvml_says_it_is_not_ready(run_image: object) -> None:
    (api_port,) = _free_ports(1)
    env = {
        "COTENANT_SERVER_PORT": str(api_port),
        "COTENANT_OTLP_HTTP_ENABLED": "false",
        "COTENANT_OTLP_GRPC_ENABLED": "false",
        "COTENANT_PROCFS_ENABLED": "false",
        "COTENANT_AGENT_STORE": "/var/lib/cotenant/agent.duckdb",
    }
    agent = run_image("agent-nvml", ["agent"], env, [])  # type: ignore[operator]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            r = httpx.get(agent.api + "/readyz", timeout=3)
            break
        except httpx.HTTPError:
            time.sleep(0.5)
    assert r.status_code == 503 and "NVML is enabled but unavailable" in r.json()["error"]


def test_central_takes_spans_and_answers_a_diagnosis(run_image: object) -> None:
    api_port, otlp_port = _free_ports(2)
    env = {
        "COTENANT_SERVER_PORT": str(api_port),
        "COTENANT_OTLP_HTTP_PORT": str(otlp_port),
        "COTENANT_OTLP_GRPC_ENABLED": "false",
        "COTENANT_NVML_ENABLED": "false",
        "COTENANT_PROCFS_ENABLED": "false",
        "COTENANT_STORE_PATH": "/var/lib/cotenant/cotenant.duckdb",
        "COTENANT_LOG_FORMAT": "json",
    }
    central = run_image("central", ["serve"], env, [])  # type: ignore[operator]
    assert central.ready()["status"] == "ready"
    # ten minutes of chat at 20-30 ms, then a minute at 10x
    now = time.time_ns()
    start = now - 11 * 60 * 10**9
    normal = [20.0 + (i % 10) for i in range(3000)]
    slow = [200.0 + (i % 10) * 10 for i in range(300)]
    _send(f"http://127.0.0.1:{otlp_port}/v1/traces", "chat", normal + slow, start)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = httpx.get(central.api + "/api/v1/requests", params={"model": "chat", "limit": 1})
        if got.json()["count"]:
            break
        time.sleep(0.5)
    r = httpx.post(
        central.api + "/api/v1/diagnose",
        json={"model": "chat", "start": "15m", "end": "now"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    diagnosis = r.json()
    assert diagnosis["model"] == "chat", diagnosis
    slow_found = [d for d in diagnosis["diagnoses"] if d["incident"]]
    assert slow_found and slow_found[0]["peak_p99_ms"] > 150, diagnosis
    # its log is JSON lines
    import json

    lines = [x for x in central.log.read_text().splitlines() if x.startswith("{")]
    assert lines and all(json.loads(x)["level"] for x in lines)


def test_the_image_size_is_recorded() -> None:
    _podman()
    size = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", IMAGE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    mb = int(size) / 1e6
    print(f"\nimage {IMAGE}: {mb:.0f} MB")
    assert 100 < mb < 2000, mb
