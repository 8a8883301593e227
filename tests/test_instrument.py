"""cotenant.collectors.instrument: what a serving process gets when it imports the helpers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from spans import SpanFactory

from cotenant.collectors.instrument import PHASE_NAMES, lock_wait, phase, request

ROOT = Path(__file__).resolve().parent.parent
OUR_PACKAGES = ["cotenant"]
HEAVY = ("duckdb", "pyarrow", "numpy", "pandas", "google.protobuf", "grpc", "opentelemetry.sdk")
ALLOWED_OF_OURS = {"cotenant", "cotenant.collectors", "cotenant.collectors.instrument"}


def _under(module: str, packages: tuple[str, ...] | list[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_importing_the_helpers_pulls_nothing_else_of_ours_and_nothing_heavy() -> None:
    code = (
        "import json, sys\n"
        "import cotenant.collectors.instrument as m\n"
        "print(json.dumps({'file': m.__file__, 'modules': sorted(sys.modules)}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout)
    assert Path(got["file"]).resolve() == ROOT / "cotenant" / "collectors" / "instrument.py"
    assert (ROOT / "cotenant" / "collectors" / "__init__.py").exists()
    ours = [m for m in got["modules"] if _under(m, OUR_PACKAGES) and m not in ALLOWED_OF_OURS]
    assert ours == [], f"cotenant.collectors.instrument pulls in {ours}"
    heavy = [m for m in got["modules"] if _under(m, HEAVY)]
    assert heavy == [], f"cotenant.collectors.instrument pulls in {heavy}"
    assert "opentelemetry.trace" in got["modules"]


def test_wrong_calls_raise_value_error_naming_the_mistake() -> None:
    f = SpanFactory()
    with pytest.raises(ValueError, match="needs a model name"), request("", tracer=f.tracer):
        pass
    with request("m", tracer=f.tracer) as req:
        with pytest.raises(ValueError, match=r"unknown phase 'gpu'.*lock_wait"), req.phase("gpu"):
            pass
        with pytest.raises(ValueError, match=r"ends \(5\) before it starts \(9\)"):
            req.record_phase("queue", 9, 5)
    with (
        pytest.raises(ValueError, match=r"unknown phase 'lock\.wait'"),
        phase("lock.wait", tracer=f.tracer),
    ):
        pass
    # nothing was recorded for the refused phases: only the request span
    assert [s.name for s in f.take()] == ["request"]


def test_helpers_emit_our_convention() -> None:
    f = SpanFactory()
    with request("m", tenant="acme", gpu=1, priority=2, tracer=f.tracer) as req:
        req.record_phase("lock.wait", 10, 20)
        for name in PHASE_NAMES:
            with req.phase(name):
                pass
        with lock_wait("kv", holder="other", tracer=f.tracer):
            pass
        req.set(batch_size=4)
    spans = {s.name: s for s in f.take()}
    root = spans["request"]
    assert dict(root.attributes or {}) == {
        "cotenant.model": "m",
        "cotenant.tenant": "acme",
        "cotenant.gpu": "1",
        "cotenant.priority": 2,
        "cotenant.batch_size": 4,
    }
    assert set(spans) == {"request", "lock.wait", *PHASE_NAMES}
    for name in ("lock.wait", *PHASE_NAMES):
        parent = spans[name].parent
        assert parent is not None and parent.span_id == root.context.span_id
