"""Resident memory of ``cotenant serve`` under an OTLP/HTTP flood, and nothing acknowledged
lost.

Run ``.venv/bin/python bench/flood.py`` (``--help`` for sizes). A real ``cotenant serve`` on a
fresh store, default settings (``--env KEY=VALUE`` to change one); ``--clients`` threads (24)
each POST distinct protobuf exports of about ``--kib`` KiB (645: 768 requests of eight spans
each, re-stamped so every request is new) back to back for ``--seconds`` (30), honouring a
503's ``Retry-After`` (capped at 1 s, as an exporter's backoff starts); then it idles for
``--after`` seconds and stops with SIGTERM. The server's ``VmRSS`` is read every 0.25 s from
``/proc``. Afterwards the store file is opened and every request of every export that got a
200 is counted in it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from conftest import start_serve  # noqa: E402
from ingest import Stamper, build_templates  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

from cotenant.store.db import Store  # noqa: E402

GOAL_RSS_MB = 400.0


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def templates(kib: int) -> tuple[list[Stamper], int]:
    """Encoded exports of about ``kib`` KiB (whole serving processes of 64 requests each, taken
    from SDK-built payloads) and the requests in each."""
    base = build_templates(8, time.time_ns() - 1800 * 10**9, 10**9)
    msgs = [ExportTraceServiceRequest.FromString(b) for b in base]
    pool = [rs for m in msgs for rs in m.resource_spans]
    out, per = [], 0
    for i in range(4):
        msg = ExportTraceServiceRequest()
        j = i * 3
        while msg.ByteSize() < kib * 1024:
            msg.resource_spans.append(pool[j % len(pool)])
            j += 1
        out.append(Stamper(msg.SerializeToString()))
        per = sum(
            1
            for rs in msg.resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
            if s.name == "request"
        )
    return out, per


class Flood:
    def __init__(self, url: str, stampers: list[Stamper], per_export: int) -> None:
        u = urlsplit(url)
        self.host, self.port, self.path = u.hostname or "127.0.0.1", u.port or 80, u.path
        self.stampers = stampers
        self.per_export = per_export
        self.lock = threading.Lock()
        self.k = 0
        self.status: dict[int, int] = {}
        self.retry_after: list[str] = []
        self.acked_requests = 0
        self.errors = 0

    def next_body(self) -> bytes:
        with self.lock:
            k = self.k
            self.k += 1
        st = self.stampers[k % len(self.stampers)]
        return st.stamp(k * 10**9, (k + 1) * 0x9E3779B97F4A7C15)

    def client(self, until: float) -> None:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        body = self.next_body()
        while time.monotonic() < until:
            try:
                conn.request("POST", self.path, body, {"Content-Type": "application/x-protobuf"})
                resp = conn.getresponse()
                resp.read()
            except (OSError, http.client.HTTPException):
                with self.lock:
                    self.errors += 1
                conn.close()
                conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
                time.sleep(0.2)
                continue
            with self.lock:
                self.status[resp.status] = self.status.get(resp.status, 0) + 1
                if resp.status == 200:
                    self.acked_requests += self.per_export
                elif resp.getheader("Retry-After") is not None:
                    self.retry_after.append(resp.getheader("Retry-After") or "")
            if resp.status == 200:
                body = self.next_body()
            else:  # the same export again, after the hint (an exporter's first backoff)
                hint = resp.getheader("Retry-After") or "1"
                time.sleep(min(1.0, float(hint)) if hint.isdigit() else 1.0)
        conn.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--kib", type=int, default=645, help="size of one export (KiB)")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the flood")
    ap.add_argument("--after", type=float, default=10.0, help="idle seconds measured after it")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    env = dict(e.split("=", 1) for e in args.env)
    stampers, per_export = templates(args.kib)
    size = len(stampers[0].template)
    res: dict[str, Any] = {"nproc": os.cpu_count(), "clients": args.clients, "env": env}
    with tempfile.TemporaryDirectory(prefix="cotenant-flood-") as tmp:
        store = Path(tmp) / "store.duckdb"
        served = start_serve(Path(tmp), store, env)
        pid = served.proc.pid
        idle_rss = rss_mb(pid)
        flood = Flood(served.otlp_http, stampers, per_export)
        samples: list[tuple[float, float]] = []
        t0 = time.monotonic()
        until = t0 + args.seconds
        threads = [
            threading.Thread(target=flood.client, args=(until,), daemon=True)
            for _ in range(args.clients)
        ]
        for t in threads:
            t.start()
        end = until + args.after
        while time.monotonic() < end:
            samples.append((time.monotonic() - t0, rss_mb(pid)))
            time.sleep(0.25)
        for t in threads:
            t.join(60)
        rc = served.stop()
        with Store(store, read_only=True) as s, s.cursor() as cur:
            row = cur.execute("SELECT count(*) FROM requests").fetchone()
            stored = int(row[0]) if row else 0
    during = [r for t, r in samples if t <= args.seconds]
    after = [r for t, r in samples if t > args.seconds]
    res.update(
        {
            "export_bytes": size,
            "requests_per_export": per_export,
            "idle_rss_mb": idle_rss,
            "peak_rss_mb": max(during + after),
            "median_rss_mb_during": statistics.median(during),
            "rss_mb_after": after[-1] if after else float("nan"),
            "status": flood.status,
            "retry_after_values": sorted(set(flood.retry_after)),
            "connection_errors": flood.errors,
            "acked_requests": flood.acked_requests,
            "stored_requests": stored,
            "exit_code": rc,
            "rss_samples": samples,
        }
    )
    ok = "met" if res["peak_rss_mb"] <= GOAL_RSS_MB else "NOT met"
    lost = max(0, flood.acked_requests - stored)
    print(
        f"flood: {args.clients} clients x {size / 1024:.0f} KiB exports ({per_export} requests) "
        f"for {args.seconds:g} s, nproc={os.cpu_count()}, server env {env or 'defaults'}\n"
        f"  answers: {dict(sorted(flood.status.items()))}, Retry-After values "
        f"{res['retry_after_values']}, {flood.errors} connection errors\n"
        f"  RSS: idle {idle_rss:.0f} MiB, median during {res['median_rss_mb_during']:.0f} MiB, "
        f"peak {res['peak_rss_mb']:.0f} MiB (goal <= {GOAL_RSS_MB:.0f} MB {ok}), "
        f"{res['rss_mb_after']:.0f} MiB {args.after:g} s after\n"
        f"  requests acknowledged {flood.acked_requests:,}, stored {stored:,}, "
        f"acknowledged but lost {lost}; exit code {rc}"
    )
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
