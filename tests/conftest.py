from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import pytest

# A runner started in the background (`make test &`, nohup, some CI shells) ignores SIGINT, and
# every process it starts inherits that: a `cotenant demo` started by a test would not hear the
# Ctrl-C the test sends it, and wait forever. Children of the suite hear Ctrl-C as a terminal's
# would.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
DATA = ROOT.parent / "shared" / "data"


@dataclass
class Served:
    """A running ``cotenant serve`` subprocess on free loopback ports."""

    proc: subprocess.Popen[str]
    api: str
    otlp_http: str
    otlp_grpc: str
    store: Path
    log: Path
    _errf: IO[str]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the process, wait for it, release its pipes; returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._errf.close()


def start_serve(tmp: Path, store: Path, env_extra: dict[str, str] | None = None) -> Served:
    env = {
        **os.environ,
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_PORT": "0",
        "COTENANT_OTLP_GRPC_PORT": "0",
        **(env_extra or {}),
    }
    log = tmp / f"serve-{time.monotonic_ns()}.log"
    errf = log.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cotenant", "serve", "--store", str(store)],
        stdout=subprocess.PIPE,
        stderr=errf,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("listening "):
            break
    m = re.match(r"listening api=(\S+) otlp_http=(\S+) otlp_grpc=(\S+)", line)
    if not m:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
        errf.close()
        raise RuntimeError(f"cotenant serve did not start: {log.read_text()}")
    served = Served(proc, m.group(1), m.group(2), m.group(3), store, log, errf)
    # poll readiness rather than sleeping
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{served.api}/readyz", timeout=2).status_code == 200:
                return served
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    served.close()
    raise RuntimeError(f"cotenant serve never became ready: {log.read_text()}")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Served]:
    s = start_serve(tmp_path, tmp_path / "store.duckdb")
    yield s
    s.stop()
