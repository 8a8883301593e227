"""A plain, non-editable install runs everything: the wheel holds one root package ``cotenant``
with its data files (policy, rule files, scenarios, traces, dashboard assets), and the CLI
installed from it runs the demo and renders the rules from outside the repository.

The fresh environment gets the project's third-party dependencies from the test's own
environment (a path entry, no download) but not the project itself: ``cotenant`` must come
from the wheel.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

pytestmark = pytest.mark.timeout(600)


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
    """A fresh virtual environment with the wheel installed (not editable): its ``bin``."""
    env_dir = tmp_path_factory.mktemp("fresh") / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # third-party dependencies from this environment, as a plain path entry: the editable
    # finder of this checkout (a .pth of that folder) is not run for a path entry
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "deps-from-test-env.pth").write_text("\n".join(deps) + "\n")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(purelib)
    # the console script, as pip would write it
    script = env_dir / "bin" / "cotenant"
    script.write_text(
        f"#!{py}\nimport sys\nfrom cotenant.cli import main\nsys.exit(main())\n", encoding="utf-8"
    )
    script.chmod(0o755)
    return env_dir / "bin"


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
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | {
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_PORT": "0",
        "COTENANT_OTLP_GRPC_PORT": "0",
        "PATH": f"{installed}:{os.environ.get('PATH', '')}",
    }
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
