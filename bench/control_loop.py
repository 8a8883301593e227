"""Cost of one pass of the actuators' control loop (``ActionController.step``).

A real DuckDB file holds two minutes of requests for ``2 x N`` models (a victim and a culprit per
incident, 10 rps each) and ``N`` open incidents, each blaming its own culprit. For each ``N`` in
``--incidents`` and each mode it measures, after the first pass (which proposes and, in
``auto``, applies), ``--passes`` steady passes: the loop re-reads the incidents and the open
actions, checks each incident, and — in ``auto`` — looks at each applied change (settle time not
reached, so no verification reads), then the verification pass (each change's victim windows
read once). Prints medians in ms and the share of one core at ``[actuators] interval_s`` = 5 s.

The backend is the bundled gateway: a ``cotenant gateway`` subprocess (fresh for each run, on
free loopback ports) whose control API the loop drives over real HTTP, so ``auto``'s first pass
includes its calls (read the state, put the limit, read it back: three per change).

    .venv/bin/python bench/control_loop.py                 # about 1 minute
    .venv/bin/python bench/control_loop.py --incidents 1 10 --passes 5
    .venv/bin/python bench/control_loop.py --call-cost 30   # one control call, side by side
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa

from cotenant.actuators.backends.gateway import GatewayBackend
from cotenant.actuators.backends.http import HttpCaller
from cotenant.actuators.controller import ActionController
from cotenant.actuators.policy import load_policy
from cotenant.actuators.settings import ActuatorSettings as Settings
from cotenant.analysis.incidents import IncidentBook
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.store.db import Store
from cotenant.store.schema import arrow_schema
from cotenant.store.source import StoreSource

S = 1_000_000_000
T0 = 1_700_000_000 * S
ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-control-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway(log: Path) -> Iterator[tuple[GatewayBackend, str]]:
    """A ``cotenant gateway`` subprocess (its output in ``log``); yields the backend on its
    control API and that API's URL. Its upstream is a port nobody listens on: the loop changes
    limits, no model traffic goes through."""
    control = _free_port()
    cmd = [
        sys.executable, "-m", "cotenant", "gateway",
        "--upstream", f"http://127.0.0.1:{_free_port()}",
        "--listen", f"127.0.0.1:{_free_port()}",
        "--control", f"127.0.0.1:{control}",
        "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "COTENANT_GATEWAY_TOKEN": TOKEN}
    out = log.open("w")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"cotenant gateway exited with {proc.returncode}: {log.read_text()[-2000:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", control), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cotenant gateway did not listen on {control}") from None
                time.sleep(0.05)
        url = f"http://127.0.0.1:{control}"
        http = HttpCaller("gateway", url, headers={"Authorization": f"Bearer {TOKEN}"})
        yield GatewayBackend(http), url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        out.close()


def fill(store: Store, n: int) -> None:
    schema = arrow_schema("requests")
    models = [f"victim{i}" for i in range(n)] + [f"culprit{i}" for i in range(n)]
    per = 1200  # 10 rps for 120 s
    rows = len(models) * per
    starts = np.tile(T0 + (np.arange(per) * S) // 10, len(models)).astype(np.int64)
    lat = np.full(rows, 50.0)
    cols: dict[str, Any] = {c: pa.nulls(rows, schema.field(c).type) for c in schema.names}
    cols.update(
        ts_start_ns=pa.array(starts),
        ts_end_ns=pa.array(starts + 50_000_000),
        latency_ms=pa.array(lat),
        trace_id=pa.array([f"t{i}" for i in range(rows)]),
        span_id=pa.array([f"s{i}" for i in range(rows)]),
        model=pa.array(np.repeat(models, per).tolist()),
        gpu=pa.array(["gpu0"] * rows),
        status=pa.array(["ok"] * rows),
        source=pa.array(["bench"] * rows),
    )
    for c in PHASE_COLUMNS:
        cols[c] = pa.array(lat if c == "compute_ms" else np.zeros(rows))
    tbl = pa.table([cols[c] for c in schema.names], schema=schema)  # noqa: F841
    incidents = [
        (
            f"inc{i}",
            f"victim{i}",
            "gpu0",
            "open",
            T0 + 40 * S,
            T0 + 60 * S,
            T0 + 60 * S,
            300.0,
            50.0,
            100.0,
            "cotenant",
            f"culprit{i}",
            0.8,
            json.dumps(
                {
                    "causes": [
                        {
                            "kind": "cotenant",
                            "culprit": f"culprit{i}",
                            "share": 0.8,
                            "confidence": 0.9,
                        }
                    ]
                }
            ),
        )
        for i in range(n)
    ]
    with store.cursor() as cur:
        cur.execute("INSERT INTO requests SELECT * FROM tbl")
        cols = (
            "id, model, gpu, state, start_ns, end_ns, updated_ns, peak_p99_ms, baseline_p99_ms, "
            "slo_ms, top_cause, top_culprit, top_share, detail_json"
        )
        cur.executemany(f"INSERT INTO incidents ({cols}) VALUES ({', '.join('?' * 14)})", incidents)


def run(n: int, mode: str, passes: int, tmp: Path) -> dict[str, float]:
    store = Store(tmp / f"bench-{n}-{mode}.duckdb")
    try:
        with gateway(tmp / f"gateway-{n}-{mode}.log") as (backend, _):
            fill(store, n)
            settings = Settings(
                mode=mode,
                settle_s=30.0,
                max_actions_per_hour=10 * n,
                max_actions_per_target_per_hour=10,
                min_rate_rps=0.1,
            )
            c = ActionController(
                settings=settings,
                policy=load_policy(),
                incidents=IncidentBook(store),
                source=StoreSource(store),
                backend=backend,
                store=store,
            )
            now = T0 + 60 * S
            t = time.perf_counter()
            c.step(now)
            first = time.perf_counter() - t
            steady = []
            for k in range(passes):
                t = time.perf_counter()
                c.step(now + (k + 1) * S)
                steady.append(time.perf_counter() - t)
            out = {"first_ms": first * 1e3, "steady_ms": statistics.median(steady) * 1e3}
            limited = sum(backend.current(f"culprit{i}")["rate_rps"] is not None for i in range(n))
            assert limited == (n if mode == "auto" else 0), (mode, limited)
            if mode == "auto":
                t = time.perf_counter()
                c.step(now + 31 * S)  # settle_s passed: every change verified
                out["verify_ms"] = (time.perf_counter() - t) * 1e3
                states = {a["state"] for a in c.list_actions(limit=10_000)}
                assert states <= {"verified", "rolled_back"}, states
            return out
    finally:
        store.close()


def call_cost(samples: int, tmp: Path) -> None:
    """Medians of one control call: through ``GatewayBackend`` (``HttpCaller`` opens a client
    per call), creating an ``httpx.Client`` alone, and the same GET on one kept client."""
    with gateway(tmp / "gateway-calls.log") as (backend, control):
        url = f"{control}/control/v1/state"
        timings: dict[str, list[float]] = {"backend": [], "client": [], "kept": []}
        with httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}) as kept:
            for _ in range(samples):
                t = time.perf_counter()
                backend.current("x")
                timings["backend"].append(time.perf_counter() - t)
                t = time.perf_counter()
                httpx.Client().close()
                timings["client"].append(time.perf_counter() - t)
                t = time.perf_counter()
                kept.get(url).raise_for_status()
                timings["kept"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in timings.items()}
    print(f"GatewayBackend.current (a client per call): {med['backend']:.1f} ms")
    print(f"httpx.Client() alone: {med['client']:.1f} ms")
    print(f"GET /control/v1/state on one kept client: {med['kept']:.1f} ms")
    print(f"per-call client / kept client: {med['backend'] / med['kept']:.0f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--incidents", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--passes", type=int, default=20)
    ap.add_argument(
        "--call-cost",
        type=int,
        metavar="N",
        help="instead, time N control calls to the gateway three ways (medians)",
    )
    args = ap.parse_args()
    if args.call_cost:
        with tempfile.TemporaryDirectory() as d:
            call_cost(args.call_cost, Path(d))
        return
    print(
        "| open incidents | mode | first pass | steady pass (median) | verification pass "
        "| steady share of a core at 5 s |"
    )
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for n in args.incidents:
            for mode in ("dry-run", "auto"):
                r = run(n, mode, args.passes, Path(d))
                verify = f"{r['verify_ms']:.1f} ms" if "verify_ms" in r else "—"
                print(
                    f"| {n} | {mode} | {r['first_ms']:.1f} ms | {r['steady_ms']:.1f} ms | "
                    f"{verify} | {r['steady_ms'] / 5000:.2%} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
