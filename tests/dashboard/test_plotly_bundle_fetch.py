"""scripts/fetch-plotly-bundle.py: what it refuses to install, offline."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import tarfile
from types import ModuleType

import pytest
from conftest import ROOT


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fetch_plotly_bundle", ROOT / "scripts" / "fetch-plotly-bundle.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def test_a_tarball_that_does_not_match_the_pinned_checksum_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = load()
    forged = tarball({mod.MEMBER: b"/* plotly.js (cartesian) v4.1.1 */ alert(1)"})
    monkeypatch.setattr(mod, "tarball_with_npm", lambda spec: forged)
    monkeypatch.setattr(mod, "tarball_over_https", lambda version: forged)
    with pytest.raises(mod.FetchError, match=r"expected .*refusing to install it"):
        mod.fetch("4.1.1")


def test_a_version_without_a_pinned_checksum_says_which_line_to_add() -> None:
    mod = load()
    with pytest.raises(mod.FetchError, match=r"no pinned integrity .*@0\.0\.1.*npm view"):
        mod.fetch("0.0.1")


def test_the_pinned_checksum_is_checked_with_the_registrys_algorithm() -> None:
    mod = load()
    body = tarball({mod.MEMBER: b"x"})
    mod.check_integrity(body, "sha512-" + base64.b64encode(hashlib.sha512(body).digest()).decode())
    with pytest.raises(mod.FetchError):
        mod.check_integrity(
            body + b"!", "sha512-" + base64.b64encode(hashlib.sha512(body).digest()).decode()
        )


def test_plotly_py_carries_a_version_the_script_has_pinned() -> None:
    """Upgrading plotly without pinning its cartesian bundle would quietly fall back to the
    4.8 MB full bundle (a 2x slower first visit): pin it in the same change."""
    mod = load()
    assert mod.plotly_version() in mod.PINNED
