"""Benchmark: the gateway's connection caps and its slow-client deadline, from outside.

A real ``cotenant gateway`` subprocess (default settings unless given) in front of the raw
responder of bench/gateway.py:

1. **caps** — one client (127.0.0.1) opens ``--conns`` keep-alive connections (default 600,
   over the default per-client cap of 512), each sends a request: how many got 200 and how
   many 503 + ``Retry-After``, how long a refusal took (p50/p99), the gateway's resident
   memory holding its connections; then one more connection from 127.0.0.2 (its own
   per-client count) and, once all close, one normal request (the places are freed).
2. **slowloris** — ``--slow`` connections (default 150, the issue-15 report) each send a
   request head one byte every 0.5 s with ``--idle-timeout 5``: when each got its 408 and was
   closed (max and p50 seconds after its first byte), against the idle timeout.

::

    .venv/bin/python bench/gateway_limits.py            # ~15 s
    .venv/bin/python bench/gateway_limits.py --json out.json

Figures go to docs/performance.md ("Gateway") and docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway import ROOT, _free_port, _stop, _wait_port

REQUEST = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"


def _rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(text.split("VmRSS:")[1].split()[0]) / 1024


async def _one(port: int, source: str) -> tuple[int, float, asyncio.StreamWriter]:
    """Connect from ``source``, send a request; (status, seconds to the answer, writer)."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    if status == 503:
        assert b"retry-after: 1\r\n" in head.lower()
    return status, time.perf_counter() - t0, writer


async def caps(port: int, pid: int, conns: int) -> dict[str, Any]:
    rss0 = _rss_mib(pid)
    results = await asyncio.gather(*(_one(port, "127.0.0.1") for _ in range(conns)))
    rss = _rss_mib(pid)
    ok = [r for r in results if r[0] == 200]
    refused = sorted(r[1] * 1000 for r in results if r[0] == 503)
    other_status, _, other = await _one(port, "127.0.0.2")
    for _, _, w in results:
        w.close()
    other.close()
    await asyncio.sleep(0.5)
    after, _, w = await _one(port, "127.0.0.1")
    w.close()
    return {
        "connections": conns,
        "answered_200": len(ok),
        "answered_503": len(refused),
        "refusal_p50_ms": statistics.median(refused) if refused else None,
        "refusal_p99_ms": refused[int(len(refused) * 0.99)] if refused else None,
        "rss_before_mib": rss0,
        "rss_holding_mib": rss,
        "other_client_status": other_status,
        "after_close_status": after,
    }


async def _slow(port: int, head: bytes, gap_s: float) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.perf_counter()
    try:
        for i in range(len(head)):
            writer.write(head[i : i + 1])
            try:
                await asyncio.wait_for(reader.read(1), gap_s)
                break  # the gateway answered (408) or closed
            except TimeoutError:
                continue
        await reader.read()  # the rest of the 408, until the close
    except ConnectionError:
        pass
    writer.close()
    return time.perf_counter() - t0


async def slowloris(port: int, n: int) -> dict[str, Any]:
    head = b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 200 + b"\r\n\r\n"
    took = sorted(await asyncio.gather(*(_slow(port, head, 0.5) for _ in range(n))))
    return {"connections": n, "closed_p50_s": statistics.median(took), "closed_max_s": took[-1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--conns", type=int, default=600, help="connections from one client")
    ap.add_argument("--slow", type=int, default=150, help="slow-header connections")
    ap.add_argument("--gateway-args", default="", help="extra flags for cotenant gateway")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-gw-limits-"))
    token = tmp / "token"
    token.write_text("bench\n")
    up = _free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "gateway.py"), "--upstream-only", str(up)]
    )
    procs = [upstream]
    out: dict[str, Any] = {"nproc": os.cpu_count(), "gateway_args": args.gateway_args}
    try:
        _wait_port(up, upstream, "upstream")

        def gateway(extra: list[str]) -> tuple[int, subprocess.Popen[bytes]]:
            port = _free_port()
            cmd = [
                sys.executable, "-m", "cotenant", "gateway", "--upstream", f"http://127.0.0.1:{up}",
                "--listen", f"127.0.0.1:{port}", "--control", f"127.0.0.1:{_free_port()}",
                "--token-file", str(token), "--log-level", "warning", *extra,
            ]  # fmt: skip
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
            procs.append(proc)
            _wait_port(port, proc, "cotenant gateway")
            return port, proc

        port, proc = gateway(args.gateway_args.split())
        out["caps"] = asyncio.run(caps(port, proc.pid, args.conns))
        port, _ = gateway(["--idle-timeout", "5", *args.gateway_args.split()])
        out["slowloris"] = asyncio.run(slowloris(port, args.slow))
    finally:
        for p in reversed(procs):
            _stop(p)
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
