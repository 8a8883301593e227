"""Cost of one pass of the actuators' control loop (``ActionController.step``).

A real DuckDB file holds two minutes of requests for ``2 x N`` models (a victim and a culprit per
incident, 10 rps each) and ``N`` open incidents, each blaming its own culprit. For each ``N`` in
``--incidents`` and each mode it measures, after the first pass (which proposes and, in
``auto``, applies), ``--passes`` steady passes: the loop re-reads the incidents and the open
actions, checks each incident, and — in ``auto`` — looks at each applied change (settle time not
reached, so no verification reads), then the verification pass (each change's victim windows
read once). Prints medians in ms and the share of one core at ``[actuators] interval_s`` = 5 s.

    .venv/bin/python bench/control_loop.py                 # about 1 minute
    .venv/bin/python bench/control_loop.py --incidents 1 10 --passes 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from actuators.backends.memory import MemoryBackend
from actuators.controller import ActionController, Settings
from actuators.policy import load_policy
from analysis.incidents import IncidentBook
from store.db import Store
from store.schema import PHASE_COLUMNS, arrow_schema
from store.source import StoreSource

S = 1_000_000_000
T0 = 1_700_000_000 * S


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
        cur.executemany(f"INSERT INTO incidents VALUES ({', '.join('?' * 14)})", incidents)


def run(n: int, mode: str, passes: int, tmp: Path) -> dict[str, float]:
    store = Store(tmp / f"bench-{n}-{mode}.duckdb")
    try:
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
            backend=MemoryBackend(),
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
        if mode == "auto":
            t = time.perf_counter()
            c.step(now + 31 * S)  # settle_s passed: every change verified
            out["verify_ms"] = (time.perf_counter() - t) * 1e3
            states = {a["state"] for a in c.list_actions(limit=10_000)}
            assert states <= {"verified", "rolled_back"}, states
        return out
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--incidents", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--passes", type=int, default=20)
    args = ap.parse_args()
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
