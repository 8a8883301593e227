"""Test helpers for suites that need a real Prometheus: free ports, a tiny exporter serving a
text exposition, and a Prometheus server started on a temporary config and data directory.

Usage::

    with TextExporter(render) as exp, start_prometheus(tmp_path, [exp.target]) as prom:
        wait_until(lambda: prom.query("up"), "the first scrape")

Skip a module when the server is absent with ``pytestmark = needs_prometheus``.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
needs_prometheus = pytest.mark.skipif(
    not Path(PROMETHEUS).exists(),
    reason="the Prometheus server is not installed (`make system-deps` installs Debian's "
    "`prometheus` package)",
)

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(probe: Callable[[], T | None], what: str, timeout_s: float = 30.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout_s} s waiting for {what}")
        time.sleep(0.05)  # between polls, not a wait for a result


class TextExporter:
    """A stdlib HTTP server on a free loopback port answering ``GET /metrics`` with
    ``render()`` (a Prometheus text exposition), computed at each scrape. With ``path=None`` it
    answers every path with ``status`` (a stand-in for a broken server)."""

    def __init__(
        self,
        render: Callable[[], str],
        *,
        path: str | None = "/metrics",
        status: int = 200,
        content_type: str = "text/plain; version=0.0.4",
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render().encode()
                ok = path is None or self.path.split("?")[0] == path
                self.send_response(status if ok else 404)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        self.url = f"http://{self.target}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)

    def __enter__(self) -> TextExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class PromServer:
    """A running Prometheus; ``url`` is its API root."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    _logf: Any = field(repr=False)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's ``data.result`` (raw JSON), for polling in tests."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        result: list[dict[str, Any]] = r.json()["data"]["result"]
        return result

    def stop(self) -> None:
        """SIGTERM, wait for the exit, release the log file."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._logf.close()


def _config(
    targets: list[str],
    scrape_interval_s: float,
    rule_files: list[Path],
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    lines = [
        "global:",
        f"  scrape_interval: {int(scrape_interval_s * 1000)}ms",
        f"  evaluation_interval: {int(scrape_interval_s * 1000)}ms",
    ]
    if rule_files:
        lines += ["rule_files:", *[f"  - {p}" for p in rule_files]]
    if not targets:
        return "\n".join([*lines, "scrape_configs: []"]) + "\n"
    labels = labels or {}
    plain = [t for t in targets if t not in labels]
    lines += ["scrape_configs:", "  - job_name: test", "    static_configs:"]
    if plain:
        lines.append("      - targets: [" + ", ".join(f"'{t}'" for t in plain) + "]")
    for t in targets:
        if t in labels:
            lines += [f"      - targets: ['{t}']", "        labels:"]
            lines += [f"          {k}: '{v}'" for k, v in labels[t].items()]
    return "\n".join(lines) + "\n"


def zeroed(page: str) -> str:
    """A text exposition as it was before anything happened: every sample 0."""
    return (
        "\n".join(
            line if line.startswith("#") or not line else re.sub(r" \S+$", " 0", line)
            for line in page.splitlines()
        )
        + "\n"
    )


@contextlib.contextmanager
def start_prometheus(
    tmp: Path,
    targets: list[str],
    *,
    scrape_interval_s: float = 1.0,
    rule_files: list[Path] | None = None,
    ready_timeout_s: float = 30.0,
    blocks: Path | None = None,
    extra_args: tuple[str, ...] = (),
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[PromServer]:
    """Run Prometheus on a free loopback port, a config scraping ``targets`` every
    ``scrape_interval_s`` and a data directory under ``tmp``; yields once ``/-/ready`` answers
    200, stops it on exit. Tries a few ports in case one was taken meanwhile. ``blocks``: a
    directory of TSDB blocks (from ``promtool tsdb create-blocks-from``) copied into the data
    directory first, so history exists at once. ``extra_args``: more flags (e.g.
    ``--enable-feature=exemplar-storage``). ``labels``: target -> labels Prometheus adds to
    its series (as a scrape config's target labels)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "prometheus.yml"
    cfg.write_text(_config(targets, scrape_interval_s, rule_files or [], labels))
    server: PromServer | None = None
    for attempt in range(3):
        port = free_port()
        log = tmp / f"prometheus-{attempt}.log"
        if blocks is not None:
            shutil.copytree(blocks, tmp / f"data-{attempt}", dirs_exist_ok=True)
        logf = log.open("wb")
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={cfg}",
                f"--storage.tsdb.path={tmp / f'data-{attempt}'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
                *extra_args,
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
        )
        server = PromServer(proc, f"http://127.0.0.1:{port}", log, logf)

        def ready(s: PromServer = server) -> bool | None:
            if s.proc.poll() is not None:
                return True  # exited: stop waiting, handled below
            try:
                return httpx.get(f"{s.url}/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return None

        wait_until(ready, f"Prometheus to be ready (log: {log})", ready_timeout_s)
        if proc.poll() is None:
            break
        server.stop()
        if "address already in use" not in log.read_text():
            raise RuntimeError(f"Prometheus exited at start: {log.read_text()}")
    else:
        raise RuntimeError("Prometheus found no free port in 3 tries")
    try:
        yield server
    finally:
        server.stop()


VICTORIA = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
needs_victoria = pytest.mark.skipif(
    not Path(VICTORIA).exists(),
    reason="VictoriaMetrics is not installed (`make system-deps` installs Debian's "
    "`victoria-metrics`)",
)


@dataclass
class VictoriaServer:
    """A running VictoriaMetrics; ``url`` is its Prometheus-compatible API root."""

    proc: subprocess.Popen[bytes]
    url: str


@contextlib.contextmanager
def start_victoria(
    tmp: Path, targets: list[str], *, scrape_interval_s: float = 1.0
) -> Iterator[VictoriaServer]:
    """VictoriaMetrics scraping ``targets`` every ``scrape_interval_s``, data under ``tmp``;
    yields once ``/health`` answers. ``-search.latencyOffset=0s``: queries see the newest
    samples, as Prometheus' do (its default hides the last 30 s)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = tmp / "scrape.yml"
    cfg.write_text(_config(targets, scrape_interval_s, []))
    port = free_port()
    with (tmp / "vm.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                VICTORIA,
                f"-storageDataPath={tmp / 'data'}",
                f"-httpListenAddr=127.0.0.1:{port}",
                f"-promscrape.config={cfg}",
                "-promscrape.config.strictParse=false",  # the shared config's rule keys
                "-search.latencyOffset=0s",
                "-loggerLevel=ERROR",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        server = VictoriaServer(proc, f"http://127.0.0.1:{port}")

        def healthy() -> bool | None:
            if proc.poll() is not None:
                raise RuntimeError(f"VictoriaMetrics exited: {(tmp / 'vm.log').read_text()}")
            try:
                return httpx.get(f"{server.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return None

        try:
            wait_until(healthy, "VictoriaMetrics to answer /health")
            yield server
        finally:
            proc.terminate()
            proc.wait(30)
