"""Install plotly.js's cartesian partial bundle for the dashboard, from the npm registry.

The dashboard draws only scatter, bar and heatmap traces. plotly.py ships plotly.js's full
bundle (4.8 MB), and compiling it is most of the time a first visit to the Overview takes;
plotly.js's ``cartesian`` partial bundle (1.5 MB, same version) has every trace type the pages
draw. It is published on npm only, so ``make install`` runs this script:

* it fetches ``plotly.js-cartesian-dist-min`` at the plotly.js version plotly.py carries (with
  ``npm pack`` when npm is on PATH, so npm's registry settings apply; otherwise straight from
  the registry over HTTPS),
* checks the tarball against the sha512 pinned below (the registry's ``dist.integrity``),
* and writes ``dashboard/vendor/plotly-cartesian.min.js`` (ignored by git), which
  ``dashboard/plotlyjs.py`` serves when its version matches plotly.py's.

Without it the dashboard serves the full bundle and works the same, only slower to open; so a
failure here is a warning (exit 0) unless ``--strict``.

    .venv/bin/python scripts/fetch-plotly-bundle.py [--strict] [--force]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cotenant.dashboard.plotlyjs import VENDORED as TARGET  # noqa: E402 (where the dashboard looks)
from cotenant.dashboard.plotlyjs import full_bundle, version_of  # noqa: E402

PACKAGE = "plotly.js-cartesian-dist-min"
MEMBER = "package/plotly-cartesian.min.js"
REGISTRY = "https://registry.npmjs.org"

# plotly.js version -> the npm tarball's dist.integrity (`npm view PACKAGE@VERSION dist.integrity`)
PINNED = {
    "4.1.1": (
        "sha512-o8GrFeusncwBIxbBynRJpY4pkgVB6caM+JLpwrLYbbsO7dZ8FJ+SVN2Fr+L7kiG/Z6w4P5O0Jus/"
        "Qr5EefHVeg=="
    ),
}


class FetchError(Exception):
    """The bundle could not be installed; the message says why and what to do."""


def plotly_version() -> str:
    """The plotly.js version in plotly.py's own bundle."""
    version = version_of(full_bundle())
    if version is None:
        raise FetchError("plotly.py's plotly.min.js has no version header")
    return version


def installed_version() -> str | None:
    return version_of(TARGET) if TARGET.is_file() else None


def tarball_with_npm(spec: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(
            ["npm", "pack", spec, "--json", "--pack-destination", tmp],
            capture_output=True, text=True, timeout=180, check=False, cwd=tmp,
        )  # fmt: skip
        if r.returncode != 0:
            raise FetchError(f"npm pack {spec} failed: {r.stderr.strip()[-400:]}")
        name = json.loads(r.stdout)[0]["filename"]
        return (Path(tmp) / name).read_bytes()


def tarball_over_https(version: str) -> bytes:
    url = f"{REGISTRY}/{PACKAGE}/-/{PACKAGE}-{version}.tgz"
    try:
        with urllib.request.urlopen(url, timeout=120) as resp:
            data: bytes = resp.read()
            return data
    except OSError as exc:
        raise FetchError(f"GET {url}: {exc}") from exc


def check_integrity(data: bytes, expected: str) -> None:
    algo, _, want = expected.partition("-")
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != want:
        raise FetchError(
            f"{PACKAGE} tarball has {algo} {got}, expected {want}: refusing to install it"
        )


def fetch(version: str) -> bytes:
    """The bundle's bytes for ``version``, integrity-checked."""
    expected = PINNED.get(version)
    if expected is None:
        raise FetchError(
            f"no pinned integrity for {PACKAGE}@{version} (plotly.py's plotly.js); add "
            f"`npm view {PACKAGE}@{version} dist.integrity` to PINNED in {Path(__file__).name}"
        )
    spec = f"{PACKAGE}@{version}"
    data = tarball_with_npm(spec) if shutil.which("npm") else tarball_over_https(version)
    check_integrity(data, expected)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile(MEMBER)
        if member is None:
            raise FetchError(f"{spec} has no {MEMBER}")
        return member.read()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--strict", action="store_true", help="exit 1 when it cannot be installed")
    ap.add_argument("--force", action="store_true", help="fetch even when already installed")
    args = ap.parse_args()
    try:
        version = plotly_version()
        if not args.force and installed_version() == version:
            return 0
        body = fetch(version)
    except (FetchError, OSError, subprocess.SubprocessError) as exc:
        print(
            f"warning: plotly.js cartesian bundle not installed ({exc}); the dashboard will "
            "serve plotly's full bundle (slower first visit)",
            file=sys.stderr,
        )
        return 1 if args.strict else 0
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    tmp = TARGET.with_suffix(".part")
    tmp.write_bytes(body)
    os.replace(tmp, TARGET)
    print(f"installed {PACKAGE}@{version} -> {TARGET.relative_to(ROOT)} ({len(body):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
