"""A plain, non-editable install runs everything: the wheel holds one root package ``cotenant``
with its data files (policy, rule files, scenarios, traces, dashboard assets), and the CLI
installed from it, with pip into an empty virtual environment, runs the demo, serve, the
agent, the gateway and the rule renderer from outside the repository.

pip resolves the dependencies itself, from the package index (pip's own configuration, as a
user's ``pip install`` would): the fresh environment borrows nothing from the test's, so a
dependency the code imports at run time but ``pyproject.toml`` lists only for tests fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import venv
import zipfile
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import ROOT

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # a copy of the source tree: setuptools builds in the source folder (build/), and a
    # stale build/lib of an earlier layout must not leak into the wheel
    src = build / "src"
    top = {".git", ".venv", "build", "tests", "bench", ".cotenant"}

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__" or n.endswith((".egg-info", "_cache"))}
        return skip | (top & set(names) if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, src, ignore=ignore)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        cwd=build,
        capture_output=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(build)},
    )
    (whl,) = out.glob("cotenant-*.whl")
    return whl


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with pip, the wheel installed into it by pip (not
    editable), every dependency resolved by pip from the index: its ``bin``."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    check = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "check"], capture_output=True, text=True, env=env
    )
    assert check.returncode == 0, check.stdout + check.stderr
    return bin_dir


def _env(installed: Path) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_PORT": "0",
        "COTENANT_OTLP_GRPC_PORT": "0",
        "PATH": f"{installed}:{os.environ.get('PATH', '')}",
    }


def _start(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """Start a long-running command, its output to a file; wait for its ``listening …`` line
    (returned)."""
    log = cwd / f"{Path(args[0]).name}-{args[1]}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"^listening .*$", log.read_text(), re.M)
        if found:
            return proc, found[0]
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    pytest.fail(f"{args[:2]} did not start:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_wheel_holds_one_root_package_and_its_data(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"cotenant"}, tops
    for data in (
        "cotenant/rules/policy.yaml",
        "cotenant/rules/cotenant.rules.yml",
        "cotenant/rules/fleet.rules.yml",
        "cotenant/rules/exporters.rules.yml",
        "cotenant/rules/tests/cotenant.test.yml",
        "cotenant/simulator/scenarios/demo.yaml",
        "cotenant/dashboard/assets/style.css",
        "cotenant/core/py.typed",
    ):
        assert data in names, data
    assert any(n.startswith("cotenant/simulator/traces/") and n.endswith(".csv") for n in names)


def test_the_installed_cli_runs_the_demo_and_renders_rules(installed: Path, tmp_path: Path) -> None:
    env = _env(installed)
    where = subprocess.run(
        [str(installed / "python"), "-c", "import cotenant, sys; print(cotenant.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert not Path(where).resolve().is_relative_to(ROOT), where  # the wheel's, not the checkout
    policy = subprocess.run(
        [
            str(installed / "python"),
            "-c",
            "from cotenant.actuators.policy import BUNDLED_POLICY, load_policy\n"
            "load_policy()\nprint(BUNDLED_POLICY)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert policy.returncode == 0, policy.stderr[-2000:]
    assert Path(policy.stdout.strip()).resolve().is_relative_to(installed.parent)

    rules = subprocess.run(
        [str(installed / "cotenant"), "rules", "render", "--out", str(tmp_path / "rules")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rules.returncode == 0, rules.stderr[-2000:]
    for name in ("cotenant.rules.yml", "exporters.rules.yml", "fleet.rules.yml"):
        rendered = (tmp_path / "rules" / name).read_text()
        assert rendered == (ROOT / "cotenant" / "rules" / name).read_text()
        assert yaml.safe_load(rendered)["groups"]

    demo = subprocess.run(
        [
            str(installed / "cotenant"),
            "demo",
            "--speed",
            "40",
            "--duration",
            "10s",
            "--store",
            str(tmp_path / "demo.duckdb"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "cotenant demo: scenario 'demo'" in demo.stdout
    assert "requests sent" in demo.stdout
    assert (tmp_path / "demo.duckdb").exists()


def _ready(api: str) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while True:
        r = httpx.get(f"{api}/readyz", timeout=5)
        if r.status_code == 200 or time.monotonic() > deadline:
            assert r.status_code == 200, r.text
            return dict(r.json())
        time.sleep(0.2)


def test_the_installed_cli_runs_serve_and_the_agent(installed: Path, tmp_path: Path) -> None:
    env = _env(installed) | {"COTENANT_NVML_ENABLED": "false", "COTENANT_PROCFS_ENABLED": "0"}
    for args in (
        ["serve", "--store", str(tmp_path / "serve.duckdb")],
        ["agent", "--store", str(tmp_path / "agent.duckdb")],
    ):
        proc, line = _start([str(installed / "cotenant"), *args], tmp_path, env)
        try:
            api = re.search(r"api=(\S+)", line)
            assert api, line
            assert _ready(api[1])["status"] == "ready"
            metrics = httpx.get(f"{api[1]}/metrics", timeout=10).text
            assert "cotenant_build_info{" in metrics
        finally:
            assert _stop(proc) == 0


def test_the_installed_cli_runs_the_gateway_with_the_sdk_exporter(
    installed: Path, tmp_path: Path
) -> None:
    args = [
        str(installed / "cotenant"),
        *("gateway", "--upstream", "http://127.0.0.1:9"),
        *("--listen", "127.0.0.1:0", "--control", "127.0.0.1:0"),
        *("--otlp-endpoint", "http://127.0.0.1:9/v1/traces", "--otlp-exporter", "sdk"),
    ]
    env = _env(installed) | {"COTENANT_GATEWAY_TOKEN": "wheel-test-token"}
    proc, line = _start(args, tmp_path, env)
    try:
        control = re.search(r"control=(\S+)", line)
        assert control, line
        assert httpx.get(f"{control[1]}/healthz", timeout=10).status_code == 200
    finally:
        assert _stop(proc) == 0
