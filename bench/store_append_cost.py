"""CPU of one small append to the store's ``requests`` table, and what it is made of.

Run ``.venv/bin/python bench/store_append_cost.py`` (``--help`` for sizes). Appends
``--appends`` batches of ``--rows`` rows (one OTLP export's requests in
``bench/agent_metrics.py``'s load) the way :mod:`store.writer` does (one ``INSERT`` through a
replacement scan, one transaction each) and reports the CPU time (``time.thread_time``: the
calling thread, DuckDB's work included at ``threads = 1``) per append, median of ``--repeats``
means, for:

* ``file``: a DuckDB file, as the store runs (the commit is fsync'ed to the write-ahead log);
* ``file_no_fsync``: the same with ``fsync_mode = 'NONE'`` (what the fsync costs; never
  used by cotenant: an acknowledged export must survive a crash);
* ``memory``: an in-memory database (no write-ahead log at all);
* ``file_7_columns``: a file table with 7 of the 31 columns (the per-column cost of a commit).

Prints one JSON object; docs/performance.md ("Fleet agent") records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotenant.store.schema import arrow_schema, ddl

SEVEN = ["ts_start_ns", "ts_end_ns", "latency_ms", "trace_id", "model", "gpu", "status"]


def _batches(n: int, rows: int) -> list[pa.Table]:
    schema = arrow_schema("requests")
    rng = np.random.default_rng(1)
    out = []
    now = time.time_ns()
    for k in range(n):
        cols: dict[str, Any] = {
            "ts_start_ns": np.full(rows, now + k, np.int64),
            "ts_end_ns": np.full(rows, now + k + 20_000_000, np.int64),
            "latency_ms": rng.random(rows) * 20,
            "trace_id": [f"{k * rows + i:032x}" for i in range(rows)],
            "span_id": [f"{i:016x}" for i in range(rows)],
            "model": [f"model-{i % 4}" for i in range(rows)],
            "gpu": [f"GPU-{i % 8}" for i in range(rows)],
            "host": ["bench-node"] * rows,
            "status": ["ok"] * rows,
            "source": ["ours"] * rows,
            "lock_name": ["kv"] * rows,
            "lock_holder": ["batcher"] * rows,
        }
        for f in schema:
            if f.name.endswith("_ms") and f.name not in cols and f.name != "ttft_ms":
                cols[f.name] = rng.random(rows)
        arrays = [
            pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(rows, f.type)
            for f in schema
        ]
        out.append(pa.Table.from_arrays(arrays, schema=schema))
    return out


def _case(path: str, batches: list[pa.Table], settings: tuple[str, ...], seven: bool) -> float:
    con = duckdb.connect(path, config={"threads": 1})
    try:
        for s in settings:
            con.execute(s)
        if seven:
            schema = arrow_schema("requests")
            kinds = {pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR"}
            body = ", ".join(f"{c} {kinds[schema.field(c).type]}" for c in SEVEN)
            con.execute(f"CREATE TABLE requests ({body})")
            batches = [b.select(SEVEN) for b in batches]
        else:
            for stmt in ddl():
                con.execute(stmt)
        warm = max(1, len(batches) // 10)
        for b in batches[:warm]:
            _append(con, b)
        t0 = time.thread_time()
        for b in batches[warm:]:
            _append(con, b)
        return (time.thread_time() - t0) / (len(batches) - warm)
    finally:
        con.close()


def _append(con: duckdb.DuckDBPyConnection, data: pa.Table) -> None:
    _batch = data  # read by DuckDB's replacement scan, as store.writer does
    con.execute("INSERT INTO requests BY NAME SELECT * FROM _batch")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=40)
    p.add_argument("--appends", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    batches = _batches(args.appends, args.rows)
    cases: dict[str, tuple[tuple[str, ...], bool, bool]] = {
        "file": ((), False, True),
        "file_no_fsync": (("SET fsync_mode = 'NONE'",), False, True),
        "memory": ((), False, False),
        "file_7_columns": ((), True, True),
    }
    got: dict[str, list[float]] = {k: [] for k in cases}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.repeats):  # cases interleaved: the machine's noise hits all alike
            for name, (settings, seven, on_file) in cases.items():
                path = os.path.join(d, f"{name}-{r}.duckdb") if on_file else ":memory:"
                got[name].append(_case(path, batches, settings, seven))
    print(
        json.dumps(
            {
                "nproc": os.cpu_count(),
                "duckdb": duckdb.__version__,
                "date": time.strftime("%Y-%m-%d"),
                "rows_per_append": args.rows,
                "cpu_ms_per_append_median": {
                    k: round(1e3 * statistics.median(v), 3) for k, v in got.items()
                },
                "runs_ms": {k: [round(1e3 * x, 3) for x in v] for k, v in got.items()},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
