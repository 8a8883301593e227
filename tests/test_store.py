"""store/: the DuckDB store, its writer, rollups, retention, queries and time parsing.

Everything runs against real DuckDB files under ``tmp_path``; the only fakes are clocks.
"""

from __future__ import annotations

import calendar
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cotenant.core.errors import (
    CotenantError,
    Overloaded,
    QueryError,
    SchemaVersionError,
    StoreError,
)
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.core.timerange import TimeRange
from cotenant.core.timespec import format_ns, parse_duration_ns, parse_time_ns
from cotenant.store import queries
from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance
from cotenant.store.schema import SCHEMA_VERSION, arrow_schema
from cotenant.store.writer import Writer

ROOT = Path(__file__).resolve().parent.parent
SEC = 1_000_000_000
MIN = 60 * SEC
HOUR = 60 * MIN
DAY = 24 * HOUR
# a fixed "now" on a minute boundary: 2026-12-02T12:00:00Z
NOW = calendar.timegm((2026, 12, 2, 12, 0, 0)) * SEC


def fixed_clock(ns: int = NOW) -> Callable[[], int]:
    return lambda: ns


def frozen_monotonic() -> float:
    """A writer clock that never advances: the writer only writes on a full batch or close."""
    return 0.0


# --- building Arrow tables ------------------------------------------------------------------


def table(name: str, cols: dict[str, Any]) -> pa.Table:
    """An Arrow table with ``name``'s schema; columns not given are null."""
    schema = arrow_schema(name)
    n = len(next(iter(cols.values())))
    arrays = [
        pa.array(cols[f.name], type=f.type) if f.name in cols else pa.nulls(n, type=f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def make_requests(
    rng: np.random.Generator,
    n: int,
    *,
    minute_ns: int = NOW - 10 * MIN,
    minutes: int = 1,
    models: tuple[str, ...] = ("llama",),
    gpus: tuple[str, ...] = ("0",),
) -> pa.Table:
    """``n`` plausible requests ending within ``minutes`` minutes from ``minute_ns``."""
    end = minute_ns + rng.integers(0, minutes * MIN, n)
    latency_ms = rng.lognormal(3.0, 0.8, n)
    share = rng.dirichlet(np.ones(len(PHASE_COLUMNS)), n)
    cols: dict[str, Any] = {
        "ts_end_ns": end,
        "ts_start_ns": end - (latency_ms * 1e6).astype(np.int64),
        "latency_ms": latency_ms,
        "trace_id": [f"{i:032x}" for i in rng.integers(0, 2**62, n)],
        "span_id": [f"{i:016x}" for i in rng.integers(0, 2**62, n)],
        "model": rng.choice(models, n),
        "tenant": rng.choice(["t1", "t2"], n),
        "host": ["node-1"] * n,
        "pid": rng.integers(100, 200, n),
        "gpu": rng.choice(gpus, n),
        "priority": rng.integers(0, 3, n).astype(np.int32),
        "batch_size": rng.integers(1, 33, n).astype(np.int32),
        "prompt_tokens": rng.integers(1, 2000, n).astype(np.int32),
        "output_tokens": rng.integers(1, 500, n).astype(np.int32),
        "status": rng.choice(["ok", "ok", "ok", "error"], n),
        "source": ["cotenant"] * n,
        "ttft_ms": latency_ms / 3,
    }
    for j, c in enumerate(PHASE_COLUMNS):
        cols[c] = latency_ms * share[:, j]
    return table("requests", cols)


def make_gpu_samples(rng: np.random.Generator, n: int, start_ns: int, gpus: list[str]) -> pa.Table:
    ts = start_ns + np.sort(rng.integers(0, 3 * MIN, n))
    return table(
        "gpu_samples",
        {
            "ts_ns": ts,
            "host": ["node-1"] * n,
            "gpu": rng.choice(gpus, n),
            "sm_util": rng.uniform(0, 100, n),
            "mem_util": rng.uniform(0, 100, n),
            "pcie_tx_bps": rng.uniform(0, 2e10, n),
            "mem_used_bytes": rng.integers(0, 80 * 2**30, n),
            "mem_total_bytes": [80 * 2**30] * n,
            "power_w": rng.uniform(50, 700, n),
            "temp_c": rng.uniform(30, 90, n),
            "sm_clock_mhz": rng.uniform(800, 1980, n),
            "max_sm_clock_mhz": [1980.0] * n,
            "clock_event_reasons": rng.choice([0, 1, 4, 32, 64], n),
        },
    )


def make_process_samples(rng: np.random.Generator, n: int, start_ns: int) -> pa.Table:
    pids = rng.choice([101, 202], n)
    return table(
        "process_samples",
        {
            "ts_ns": start_ns + rng.integers(0, 2 * MIN, n),
            "host": ["node-1"] * n,
            "gpu": ["0"] * n,
            "pid": pids,
            "process_name": [f"proc-{p}" for p in pids],
            "model": [f"model-{p}" for p in pids],
            "sm_util": rng.uniform(0, 100, n),
            "mem_util": rng.uniform(0, 100, n),
            "mem_used_bytes": rng.integers(0, 2**34, n),
        },
    )


def fetch(store: Store, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with store.cursor() as cur:
        return cur.execute(sql, params or []).fetchall()


def count(store: Store, tbl: str) -> int:
    return int(fetch(store, f"SELECT count(*) FROM {tbl}")[0][0])


def insert(store: Store, name: str, data: pa.Table) -> None:
    """Append directly, as a writer that crashed before any rollup would have."""
    with store.cursor() as cur:
        cur.register("_t", data)
        cur.execute(f"INSERT INTO {name} BY NAME SELECT * FROM _t")
        cur.unregister("_t")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store.duckdb")
    yield s
    s.close()


class RecordingObserver:
    def __init__(self) -> None:
        self.written: list[tuple[str, int]] = []
        self.failed: list[tuple[str, int]] = []

    def rows_written(self, table: str, rows: int, seconds: float) -> None:
        self.written.append((table, rows))

    def write_failed(self, table: str, rows: int) -> None:
        self.failed.append((table, rows))


# --- Store -----------------------------------------------------------------------------------


def test_new_store_creates_parent_folder_tables_and_version(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "s.duckdb"
    with Store(path) as s:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION)
        for t in ("requests", "gpu_samples", "process_samples", "request_rollup_1m", "audit"):
            assert count(s, t) == 0
    assert path.exists()


def test_meta_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    with Store(path) as s:
        assert s.get_meta("absent") is None
        s.set_meta("k", "v1")
        s.set_meta("k", "v2")
    with Store(path, read_only=True) as s:
        assert s.get_meta("k") == "v2"


def test_closed_store_refuses_cursors_and_closes_twice(store: Store) -> None:
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.cursor()


def _set_version(path: Path, version: str, drop: str | None = None) -> None:
    with Store(path) as s:
        s.set_meta("schema_version", version)
        if drop:
            fetch(s, f"DROP TABLE {drop}")


@pytest.mark.parametrize("read_only", [False, True])
def test_schema_version_mismatch_is_refused_with_advice(tmp_path: Path, read_only: bool) -> None:
    path = tmp_path / "old.duckdb"
    _set_version(path, "999")
    with pytest.raises(SchemaVersionError) as err:
        Store(path, read_only=read_only)
    msg = str(err.value)
    assert str(path) in msg
    assert "999" in msg
    assert str(SCHEMA_VERSION) in msg
    assert isinstance(err.value, StoreError)


def test_schema_version_mismatch_leaves_file_untouched_and_unlocked(tmp_path: Path) -> None:
    path = tmp_path / "future.duckdb"
    _set_version(path, "999", drop="audit")
    with pytest.raises(SchemaVersionError, match="point --store at a new file") as err:
        Store(path)
    assert err.value is not None  # the exception (and its traceback) is still alive here
    # The refused open neither created tables in the other version's file nor kept it open:
    # a connection with a different configuration is only possible once it is closed.
    con = duckdb.connect(str(path), read_only=True)
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    finally:
        con.close()
    assert "audit" not in tables
    assert "requests" in tables


def test_garbage_version_is_a_version_error(tmp_path: Path) -> None:
    path = tmp_path / "g.duckdb"
    _set_version(path, "one")
    with pytest.raises(SchemaVersionError, match="version one"):
        Store(path)


def test_read_only_on_foreign_duckdb_file(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(StoreError, match="not a cotenant store"):
        Store(path, read_only=True)


def test_foreign_meta_table_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE meta (name VARCHAR)")
    con.close()
    with pytest.raises(StoreError, match=str(path)):
        Store(path)


def test_not_a_database_file(tmp_path: Path) -> None:
    path = tmp_path / "notes.duckdb"
    path.write_text("these are not the bytes you are looking for\n" * 200)
    with pytest.raises(StoreError, match="cannot open store"):
        Store(path)


def test_read_only_missing_file(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="cannot open store"):
        Store(tmp_path / "absent.duckdb", read_only=True)


_OPEN_FROM_CHILD = """
import sys
from cotenant.store.db import Store
from cotenant.core.errors import StoreError
for ro in (False, True):
    try:
        Store(sys.argv[1], read_only=ro).close()
        print("opened")
    except StoreError as exc:
        print("StoreError:", exc)
"""


def test_second_process_is_told_the_store_is_in_use(store: Store) -> None:
    res = subprocess.run(
        [sys.executable, "-c", _OPEN_FROM_CHILD, store.path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 2
    for line in lines:
        assert line.startswith("StoreError:")
        assert "in use by another process" in line
        assert store.path in line
        assert "--url" in line


def test_file_is_free_for_another_process_after_close(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    Store(path).close()
    res = subprocess.run(
        [sys.executable, "-c", _OPEN_FROM_CHILD, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.stdout.splitlines() == ["opened", "opened"], res.stdout + res.stderr


# --- Writer ----------------------------------------------------------------------------------


def test_rows_are_written_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    rng = np.random.default_rng(1)
    batches = [make_requests(rng, int(k)) for k in rng.integers(1, 400, 12)]
    gpu = make_gpu_samples(rng, 50, NOW - 5 * MIN, ["0", "1"])
    observer = RecordingObserver()
    s = Store(path)
    w = Writer(s, batch_rows=500, flush_interval_s=0.05, observer=observer)
    for b in batches:
        w.submit("requests", b)
    w.submit("gpu_samples", gpu)
    w.close()
    assert w.queued_rows == 0
    assert not w.alive
    s.close()
    total = sum(b.num_rows for b in batches)
    assert sum(n for t, n in observer.written if t == "requests") == total
    assert observer.failed == []
    with Store(path, read_only=True) as again:
        assert count(again, "requests") == total
        assert count(again, "gpu_samples") == 50
        ids = sorted(r[0] for r in fetch(again, "SELECT span_id FROM requests"))
        expect = sorted(x for b in batches for x in b.column("span_id").to_pylist())
        assert ids == expect
        got_sum = fetch(again, "SELECT sum(latency_ms), sum(prompt_tokens) FROM requests")[0]
        assert got_sum[0] == pytest.approx(sum(pc.sum(b["latency_ms"]).as_py() for b in batches))
        assert got_sum[1] == sum(pc.sum(b["prompt_tokens"]).as_py() for b in batches)


def test_close_drains_everything_still_queued(store: Store) -> None:
    rng = np.random.default_rng(2)
    # neither a full batch nor a timer: only close() makes the writer write
    w = Writer(store, batch_rows=10_000, flush_interval_s=3600, clock=frozen_monotonic)
    sizes = [3, 70, 1, 250]
    for n in sizes:
        w.submit("requests", make_requests(rng, n))
    assert w.queued_rows == sum(sizes)
    assert count(store, "requests") == 0
    w.close()
    assert w.queued_rows == 0
    assert count(store, "requests") == sum(sizes)


def test_flush_writes_without_closing(store: Store) -> None:
    rng = np.random.default_rng(3)
    w = Writer(store, batch_rows=10_000, flush_interval_s=0.02)
    w.submit("requests", make_requests(rng, 42))
    assert w.flush(timeout_s=30)
    assert w.queued_rows == 0
    assert count(store, "requests") == 42
    assert w.alive
    w.submit("requests", make_requests(rng, 8))
    w.close()
    assert count(store, "requests") == 50


def test_full_batch_is_written_without_waiting_for_the_timer(store: Store) -> None:
    rng = np.random.default_rng(4)
    w = Writer(store, batch_rows=100, flush_interval_s=3600, clock=frozen_monotonic)
    w.submit("requests", make_requests(rng, 150))
    assert w.flush(timeout_s=30)  # the frozen clock means only the full batch can trigger it
    assert count(store, "requests") == 150
    w.close()


def test_submit_refuses_when_max_rows_would_be_exceeded(store: Store) -> None:
    rng = np.random.default_rng(5)
    w = Writer(
        store,
        max_rows=100,
        batch_rows=10_000,
        flush_interval_s=3600,
        retry_after_s=2.5,
        clock=frozen_monotonic,
    )
    w.submit("requests", make_requests(rng, 60))
    w.submit("requests", make_requests(rng, 40))  # exactly full is fine
    with pytest.raises(Overloaded) as err:
        w.submit("requests", make_requests(rng, 1))
    assert err.value.retry_after_s == 2.5
    assert "100" in str(err.value)
    assert w.queued_rows == 100
    w.close()
    assert count(store, "requests") == 100  # the refused row was never acknowledged


def test_batch_larger_than_the_queue_waits_for_an_empty_queue(store: Store) -> None:
    rng = np.random.default_rng(6)
    w = Writer(store, max_rows=10, batch_rows=1000, flush_interval_s=3600, clock=frozen_monotonic)
    assert w.has_room(25)  # an empty queue takes one batch of any size: slow, never stuck
    w.submit("requests", make_requests(rng, 25))
    assert not w.has_room(1)
    with pytest.raises(Overloaded):
        w.submit("requests", make_requests(rng, 1))
    w.close()
    assert count(store, "requests") == 25


def test_submit_after_close_is_refused(store: Store) -> None:
    w = Writer(store)
    w.close()
    with pytest.raises(Overloaded, match="shutting down"):
        w.submit("requests", make_requests(np.random.default_rng(7), 1))


def test_empty_batch_and_unknown_table(store: Store) -> None:
    w = Writer(store)
    w.submit("requests", make_requests(np.random.default_rng(8), 0))
    assert w.queued_rows == 0
    with pytest.raises(StoreError, match="request_rollup_1m"):
        w.submit("request_rollup_1m", make_requests(np.random.default_rng(8), 1))
    w.close()


def test_concurrent_producers_lose_nothing(store: Store) -> None:
    w = Writer(store, batch_rows=300, flush_interval_s=0.01)
    errors: list[BaseException] = []

    def produce(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(20):
                w.submit("requests", make_requests(rng, 25))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    assert errors == []
    assert count(store, "requests") == 6 * 20 * 25


def test_columns_in_another_order_and_narrower_types_are_accepted(store: Store) -> None:
    good = make_requests(np.random.default_rng(9), 5)
    shuffled = good.select(list(reversed(good.column_names)))
    narrow = shuffled.set_column(
        shuffled.column_names.index("pid"), "pid", shuffled["pid"].cast(pa.int32())
    )
    w = Writer(store)
    w.submit("requests", narrow)
    w.close()
    assert sorted(r[0] for r in fetch(store, "SELECT pid FROM requests")) == sorted(
        good["pid"].to_pylist()
    )


@pytest.mark.parametrize(
    ("mangle", "needle"),
    [
        (lambda t: t.drop_columns(["model"]), "model"),
        (lambda t: t.append_column("colour", pa.array(["red"] * t.num_rows)), "colour"),
        (
            lambda t: t.set_column(
                t.column_names.index("ts_end_ns"),
                "ts_end_ns",
                pa.array(["yesterday"] * t.num_rows),
            ),
            "requests",
        ),
    ],
)
def test_malformed_batch_is_refused_at_submit_and_spares_the_others(
    store: Store, mangle: Callable[[pa.Table], pa.Table], needle: str
) -> None:
    rng = np.random.default_rng(10)
    observer = RecordingObserver()
    w = Writer(
        store, batch_rows=10_000, flush_interval_s=3600, clock=frozen_monotonic, observer=observer
    )
    w.submit("requests", make_requests(rng, 7))
    with pytest.raises(StoreError) as err:
        w.submit("requests", mangle(make_requests(rng, 3)))
    assert needle in str(err.value)
    w.submit("requests", make_requests(rng, 5))
    w.close()
    # the acknowledged batches queued around the bad one are all written
    assert count(store, "requests") == 12
    assert observer.failed == []


def test_row_without_timestamp_does_not_stop_the_writer(store: Store) -> None:
    rng = np.random.default_rng(11)
    m = Maintenance(store, clock_ns=fixed_clock())
    w = Writer(
        store, maintenance=m, batch_rows=10_000, flush_interval_s=3600, clock=frozen_monotonic
    )
    good = make_requests(rng, 4)
    no_ts = good.slice(0, 1).set_column(
        good.column_names.index("ts_end_ns"), "ts_end_ns", pa.nulls(1, pa.int64())
    )
    w.submit("requests", no_ts)
    w.submit("requests", good)
    w.close()
    assert count(store, "requests") == 5
    # the four timestamped rows are rolled up; the one without an end has no minute
    assert fetch(store, "SELECT sum(count) FROM request_rollup_1m")[0][0] == 4


def test_failed_append_is_counted_and_the_writer_goes_on(store: Store) -> None:
    rng = np.random.default_rng(12)
    observer = RecordingObserver()
    w = Writer(store, flush_interval_s=0.01, observer=observer)
    fetch(store, "ALTER TABLE gpu_samples RENAME TO gpu_samples_moved")
    w.submit("gpu_samples", make_gpu_samples(rng, 10, NOW, ["0"]))
    assert w.flush(timeout_s=30)
    assert observer.failed == [("gpu_samples", 10)]
    assert w.alive
    w.submit("requests", make_requests(rng, 3))
    w.close()
    assert count(store, "requests") == 3


# --- rollups ---------------------------------------------------------------------------------


def expected_request_rollups(data: pa.Table) -> dict[tuple[int, str, str], dict[str, float]]:
    d = {c: data.column(c).to_numpy(zero_copy_only=False) for c in data.column_names}
    minute = d["ts_end_ns"] // MIN * MIN
    out: dict[tuple[int, str, str], dict[str, float]] = {}
    for key in {
        (int(m), str(a), str(g)) for m, a, g in zip(minute, d["model"], d["gpu"], strict=True)
    }:
        sel = (minute == key[0]) & (d["model"] == key[1]) & (d["gpu"] == key[2])
        lat = d["latency_ms"][sel]
        row = {
            "count": float(sel.sum()),
            "errors": float((d["status"][sel] == "error").sum()),
            "latency_sum_ms": float(lat.sum()),
            "latency_max_ms": float(lat.max()),
            "batch_size_mean": float(d["batch_size"][sel].mean()),
            "prompt_tokens_sum": float(d["prompt_tokens"][sel].sum()),
            "output_tokens_sum": float(d["output_tokens"][sel].sum()),
        }
        for q in (50, 90, 95, 99):
            row[f"p{q}_ms"] = float(np.quantile(lat, q / 100))  # linear, as quantile_cont
        for c in PHASE_COLUMNS:
            row[c] = float(d[c][sel].mean())
        out[key] = row
    return out


def actual_request_rollups(store: Store) -> dict[tuple[int, str, str], dict[str, Any]]:
    rows = queries.request_rollups(store, TimeRange()).to_pylist()
    return {(r["minute_ns"], r["model"], r["gpu"]): r for r in rows}


def assert_rollups_match(store: Store, raw: pa.Table) -> None:
    want = expected_request_rollups(raw)
    got = actual_request_rollups(store)
    assert set(got) == set(want)
    for key, exp in want.items():
        for col, value in exp.items():
            assert got[key][col] == pytest.approx(value, rel=1e-9), (key, col)


def test_request_rollups_equal_numpy(store: Store) -> None:
    rng = np.random.default_rng(20)
    data = make_requests(
        rng, 3000, minute_ns=NOW - 30 * MIN, minutes=4, models=("llama", "bert"), gpus=("0", "1")
    )
    m = Maintenance(store, clock_ns=fixed_clock())
    w = Writer(store, maintenance=m, batch_rows=700, flush_interval_s=0.05)
    for start in range(0, data.num_rows, 250):
        w.submit("requests", data.slice(start, 250))
    w.close()  # the final tick refreshes every dirty minute
    assert len(actual_request_rollups(store)) == 4 * 2 * 2
    assert_rollups_match(store, data)
    assert queries.models(store) == ["bert", "llama"]


def test_request_belongs_to_the_minute_it_completed(store: Store) -> None:
    base = make_requests(np.random.default_rng(21), 3)
    minute = NOW - 20 * MIN
    data = base.set_column(
        base.column_names.index("ts_end_ns"),
        "ts_end_ns",
        pa.array([minute - 1, minute, minute + MIN - 1], pa.int64()),
    ).set_column(
        base.column_names.index("ts_start_ns"),
        "ts_start_ns",
        pa.array([minute - 5 * SEC, minute - 5 * SEC, minute - 5 * SEC], pa.int64()),
    )
    m = Maintenance(store, clock_ns=fixed_clock())
    w = Writer(store, maintenance=m)
    w.submit("requests", data)
    w.close()
    counts = {k[0]: v["count"] for k, v in actual_request_rollups(store).items()}
    assert counts == {minute - MIN: 1, minute: 2}


def test_late_rows_update_their_minute(store: Store) -> None:
    rng = np.random.default_rng(22)
    first = make_requests(rng, 500, minute_ns=NOW - 10 * MIN, minutes=2)
    m = Maintenance(store, clock_ns=fixed_clock())
    w = Writer(store, maintenance=m)
    w.submit("requests", first)
    w.close()
    assert_rollups_match(store, first)
    before = actual_request_rollups(store)
    # slow spans for the first minute arrive after it was rolled up
    late = make_requests(rng, 40, minute_ns=NOW - 10 * MIN)
    late = late.set_column(
        late.column_names.index("latency_ms"), "latency_ms", pa.array(np.full(40, 5000.0))
    )
    w2 = Writer(store, maintenance=m)
    w2.submit("requests", late)
    w2.close()
    both = pa.concat_tables([first, late])
    assert_rollups_match(store, both)
    after = actual_request_rollups(store)
    key0 = (NOW - 10 * MIN, "llama", "0")
    key1 = (NOW - 9 * MIN, "llama", "0")
    assert after[key0]["count"] == before[key0]["count"] + 40
    assert after[key0]["p99_ms"] == pytest.approx(5000.0)
    assert after[key1] == before[key1]  # an untouched minute is unchanged


def test_gpu_rollups_equal_numpy(store: Store) -> None:
    rng = np.random.default_rng(23)
    data = make_gpu_samples(rng, 900, NOW - 15 * MIN, ["0", "1", "GPU-abc"])
    m = Maintenance(store, clock_ns=fixed_clock())
    w = Writer(store, maintenance=m, batch_rows=200, flush_interval_s=0.05)
    for start in range(0, 900, 100):
        w.submit("gpu_samples", data.slice(start, 100))
    w.close()
    d = {c: data.column(c).to_numpy(zero_copy_only=False) for c in data.column_names}
    minute = d["ts_ns"] // MIN * MIN
    rows = fetch(
        store,
        "SELECT minute_ns, gpu, samples, sm_util, sm_util_max, mem_used_bytes_max, "
        "sm_clock_mhz_min, power_w, temp_c_max, clock_event_reasons, dram_active "
        "FROM gpu_rollup_1m",
    )
    assert len(rows) == 3 * 3
    for mn, gpu, samples, sm, sm_max, mem_max, clk_min, power, temp_max, reasons, dram in rows:
        sel = (minute == mn) & (d["gpu"] == gpu)
        assert samples == sel.sum()
        assert sm == pytest.approx(d["sm_util"][sel].mean())
        assert sm_max == pytest.approx(d["sm_util"][sel].max())
        assert mem_max == d["mem_used_bytes"][sel].max()
        assert clk_min == pytest.approx(d["sm_clock_mhz"][sel].min())
        assert power == pytest.approx(d["power_w"][sel].mean())
        assert temp_max == pytest.approx(d["temp_c"][sel].max())
        assert reasons == int(np.bitwise_or.reduce(d["clock_event_reasons"][sel]))
        assert dram is None  # never reported -> unknown, not zero


def test_process_rollups_equal_numpy_and_follow_late_samples(store: Store) -> None:
    rng = np.random.default_rng(24)
    data = make_process_samples(rng, 400, NOW - 8 * MIN)
    m = Maintenance(store, clock_ns=fixed_clock())
    w = Writer(store, maintenance=m)
    w.submit("process_samples", data)
    w.close()
    late = make_process_samples(rng, 30, NOW - 8 * MIN)
    w2 = Writer(store, maintenance=m)
    w2.submit("process_samples", late)
    w2.close()
    both = pa.concat_tables([data, late])
    d = {c: both.column(c).to_numpy(zero_copy_only=False) for c in both.column_names}
    minute = d["ts_ns"] // MIN * MIN
    rows = fetch(
        store,
        "SELECT minute_ns, pid, process_name, model, samples, sm_util, sm_util_max, "
        "mem_util, mem_used_bytes_max FROM process_rollup_1m",
    )
    assert len(rows) == 2 * 2
    for mn, pid, name, model, samples, sm, sm_max, mem, mem_max in rows:
        sel = (minute == mn) & (d["pid"] == pid)
        assert name == f"proc-{pid}"
        assert model == f"model-{pid}"
        assert samples == sel.sum()
        assert sm == pytest.approx(d["sm_util"][sel].mean())
        assert sm_max == pytest.approx(d["sm_util"][sel].max())
        assert mem == pytest.approx(d["mem_util"][sel].mean())
        assert mem_max == d["mem_used_bytes"][sel].max()


def test_rollups_follow_the_rollup_interval(store: Store) -> None:
    now = [NOW]
    m = Maintenance(store, rollup_interval_s=10, clock_ns=lambda: now[0])
    insert(store, "requests", make_requests(np.random.default_rng(25), 20))
    m.mark_dirty("requests", [NOW - 10 * MIN])
    m.tick()
    assert count(store, "request_rollup_1m") == 0  # interval not yet passed
    now[0] += 10 * SEC
    m.tick()
    assert count(store, "request_rollup_1m") == 1
    assert m.refresh_rollups() == 0  # nothing left dirty


def test_recover_rolls_up_raw_rows_left_by_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "crashed.duckdb"
    rng = np.random.default_rng(26)
    early = make_requests(rng, 300, minute_ns=NOW - 40 * MIN, minutes=2, models=("a", "b"))
    later = make_requests(rng, 300, minute_ns=NOW - 20 * MIN, minutes=3, models=("a", "b"))
    gpu = make_gpu_samples(rng, 120, NOW - 20 * MIN, ["0"])
    with Store(path) as s:
        m = Maintenance(s, clock_ns=fixed_clock())
        w = Writer(s, maintenance=m)
        w.submit("requests", early)
        w.close()
        assert count(s, "request_rollup_1m") == 2 * 2
        # then raw rows land but the process dies before any rollup refresh
        insert(s, "requests", later)
        insert(s, "gpu_samples", gpu)
    with Store(path) as s:
        assert count(s, "request_rollup_1m") == 2 * 2
        assert count(s, "gpu_rollup_1m") == 0
        m = Maintenance(s, clock_ns=fixed_clock())
        # the 3 + 3 new minutes, and the newest rolled-up one, which the crash may have cut short
        assert m.refresh_rollups() == 3 + 3 + 1
        assert_rollups_match(s, pa.concat_tables([early, later]))
        assert count(s, "gpu_rollup_1m") == 3


def test_recover_on_empty_store_finds_nothing(store: Store) -> None:
    m = Maintenance(store, clock_ns=fixed_clock())
    assert m.refresh_rollups() == 0


# --- retention -------------------------------------------------------------------------------


def test_expire_deletes_raw_rows_but_keeps_rollups(store: Store) -> None:
    rng = np.random.default_rng(30)
    old = make_requests(rng, 50, minute_ns=NOW - 3 * HOUR)
    fresh = make_requests(rng, 60, minute_ns=NOW - 30 * MIN)
    insert(store, "requests", pa.concat_tables([old, fresh]))
    insert(store, "gpu_samples", make_gpu_samples(rng, 30, NOW - 3 * HOUR - 5 * MIN, ["0"]))
    insert(store, "gpu_samples", make_gpu_samples(rng, 20, NOW - 10 * MIN, ["0"]))
    insert(store, "process_samples", make_process_samples(rng, 10, NOW - 5 * HOUR))
    fetch(
        store,
        "INSERT INTO incidents (id, model, start_ns, end_ns, updated_ns) VALUES "
        "('old', 'a', ?, ?, ?), ('open', 'a', ?, NULL, ?)",
        [NOW - 100 * DAY, NOW - 95 * DAY, NOW - 95 * DAY, NOW - 100 * DAY, NOW - DAY],
    )
    fetch(
        store,
        "INSERT INTO alerts (fingerprint, received_ns) VALUES ('old', ?), ('new', ?)",
        [NOW - 91 * DAY, NOW - DAY],
    )
    fetch(
        store,
        "INSERT INTO contention (id, model, start_ns, end_ns) VALUES ('old', 'a', ?, ?), "
        "('new', 'a', ?, ?)",
        [NOW - 92 * DAY, NOW - 91 * DAY, NOW - 2 * DAY, NOW - DAY],
    )
    m = Maintenance(
        store,
        raw_retention_h=1,
        rollup_retention_days=2,
        incident_retention_days=90,
        clock_ns=fixed_clock(),
    )
    m.refresh_rollups()  # recover() found every raw minute
    rollups = actual_request_rollups(store)
    assert len(rollups) == 2

    deleted = m.expire(NOW)
    assert deleted["requests"] == 50
    assert deleted["gpu_samples"] == 30
    assert deleted["process_samples"] == 10
    assert deleted["request_rollup_1m"] == 0
    assert deleted["incidents"] == 1
    assert sorted(r[0] for r in fetch(store, "SELECT id FROM incidents")) == ["open"]
    assert deleted["alerts"] == 1
    assert [r[0] for r in fetch(store, "SELECT fingerprint FROM alerts")] == ["new"]
    assert deleted["contention"] == 1  # ordinary contention is kept as long as incidents
    assert [r[0] for r in fetch(store, "SELECT id FROM contention")] == ["new"]
    assert count(store, "requests") == 60
    assert fetch(store, "SELECT min(ts_end_ns) FROM requests")[0][0] >= NOW - HOUR
    assert actual_request_rollups(store) == rollups  # history outlives raw rows
    assert count(store, "gpu_rollup_1m") > 0

    deleted = m.expire(NOW + 2 * DAY - 40 * MIN)  # only the 3-hour-old minute is past 2 days
    assert deleted["request_rollup_1m"] == 1
    assert [k[0] for k in actual_request_rollups(store)] == [NOW - 30 * MIN]
    assert count(store, "requests") == 0

    assert m.expire(NOW + 3 * DAY)["request_rollup_1m"] == 1
    assert count(store, "request_rollup_1m") == 0


def test_expire_uses_the_injected_clock_and_runs_from_tick(store: Store) -> None:
    rng = np.random.default_rng(31)
    insert(store, "requests", make_requests(rng, 10, minute_ns=NOW - 2 * HOUR))
    now = [NOW - 2 * HOUR + 5 * MIN]
    m = Maintenance(store, raw_retention_h=1, retention_interval_s=300, clock_ns=lambda: now[0])
    m.tick()  # expires once soon after start, at the injected time: nothing is old yet
    assert count(store, "requests") == 10
    now[0] = NOW
    m.tick()
    assert count(store, "requests") == 0
    assert count(store, "request_rollup_1m") == 1  # rolled up before the raw rows went


def test_very_late_rows_do_not_replace_an_expired_minute(tmp_path: Path) -> None:
    path = tmp_path / "s.duckdb"
    rng = np.random.default_rng(32)
    minute = NOW - 3 * HOUR
    with Store(path) as s:
        m = Maintenance(s, raw_retention_h=1, clock_ns=fixed_clock())
        w = Writer(s, maintenance=m)
        w.submit("requests", make_requests(rng, 200, minute_ns=minute))
        w.close()
        m.expire(NOW)
        assert count(s, "requests") == 0
        before = actual_request_rollups(s)
        assert before[(minute, "llama", "0")]["count"] == 200
        w = Writer(s, maintenance=m)
        w.submit("requests", make_requests(rng, 1, minute_ns=minute))
        w.close()
        assert actual_request_rollups(s) == before
    with Store(path) as s:  # after a restart too
        m = Maintenance(s, raw_retention_h=1, clock_ns=fixed_clock())
        w = Writer(s, maintenance=m)
        w.submit("requests", make_requests(rng, 1, minute_ns=minute))
        w.close()
        assert actual_request_rollups(s) == before


def test_backfilled_old_minutes_without_rollups_are_rolled_up(store: Store) -> None:
    rng = np.random.default_rng(33)
    m = Maintenance(store, raw_retention_h=1, clock_ns=fixed_clock())
    m.expire(NOW)
    old = make_requests(rng, 30, minute_ns=NOW - 5 * HOUR)
    w = Writer(store, maintenance=m)
    w.submit("requests", old)
    w.close()
    assert_rollups_match(store, old)


# --- queries ---------------------------------------------------------------------------------


@pytest.fixture
def filled(store: Store) -> tuple[Store, pa.Table]:
    rng = np.random.default_rng(40)
    data = make_requests(
        rng, 400, minute_ns=NOW - 60 * MIN, minutes=60, models=("a", "b"), gpus=("0", "1")
    )
    w = Writer(store)
    w.submit("requests", data)
    w.close()
    return store, data


def _ends(data: pa.Table, pred: Callable[[dict[str, Any]], bool]) -> list[int]:
    return sorted((r["ts_end_ns"] for r in data.to_pylist() if pred(r)), reverse=True)


def test_requests_rows_newest_first_with_model_and_gpu_filters(
    filled: tuple[Store, pa.Table],
) -> None:
    store, data = filled
    rows = queries.requests_rows(store, TimeRange(), model="a", gpu="1", limit=100_000)
    assert [r["ts_end_ns"] for r in rows] == _ends(
        data, lambda r: r["model"] == "a" and r["gpu"] == "1"
    )
    assert {(r["model"], r["gpu"]) for r in rows} == {("a", "1")}
    only_b = queries.requests_rows(store, TimeRange(), model="b", limit=100_000)
    assert len(only_b) == sum(1 for m in data["model"].to_pylist() if m == "b")
    assert queries.requests_rows(store, TimeRange(), model="nope") == []


def test_requests_rows_time_range_is_half_open(filled: tuple[Store, pa.Table]) -> None:
    store, data = filled
    ends = sorted(data["ts_end_ns"].to_pylist())
    since, until = ends[100], ends[300]
    rows = queries.requests_rows(store, TimeRange(since, until), limit=100_000)
    got = [r["ts_end_ns"] for r in rows]
    assert got == _ends(data, lambda r: since <= r["ts_end_ns"] < until)
    assert since in got
    assert until not in got
    assert queries.request_count(store, TimeRange(since, until)) == len(got)
    open_start = queries.requests_rows(store, TimeRange(None, until), limit=100_000)
    assert len(open_start) == sum(1 for e in ends if e < until)


def test_requests_rows_limit_keeps_the_newest(filled: tuple[Store, pa.Table]) -> None:
    store, data = filled
    rows = queries.requests_rows(store, TimeRange(), limit=7)
    assert [r["ts_end_ns"] for r in rows] == _ends(data, lambda r: True)[:7]
    assert len(queries.requests_rows(store, TimeRange())) == 400  # default limit 1000


@pytest.mark.parametrize("limit", [0, -1, queries.MAX_LIMIT + 1])
def test_limit_out_of_range(filled: tuple[Store, pa.Table], limit: int) -> None:
    with pytest.raises(QueryError, match=f"limit {limit}"):
        queries.requests_rows(filled[0], TimeRange(), limit=limit)


def test_until_before_since_is_a_query_error() -> None:
    with pytest.raises(QueryError, match="until is before since"):
        TimeRange(NOW, NOW - 1)
    assert TimeRange(NOW, NOW).until_ns == NOW  # empty, but valid


def test_requests_rows_are_json_ready(store: Store) -> None:
    data = make_requests(np.random.default_rng(41), 2)
    data = data.set_column(
        data.column_names.index("ttft_ms"), "ttft_ms", pa.array([float("nan"), 12.5])
    )
    w = Writer(store)
    w.submit("requests", data)
    w.close()
    rows = queries.requests_rows(store, TimeRange())
    assert sorted((r["ttft_ms"] is None, r["lock_name"]) for r in rows) == [
        (False, None),
        (True, None),
    ]


def test_request_count_by_model(filled: tuple[Store, pa.Table]) -> None:
    store, data = filled
    assert queries.request_count(store) == 400
    assert queries.request_count(store, model="a") == data["model"].to_pylist().count("a")


def test_pending_spans_are_replaced_as_a_whole(store: Store) -> None:
    queries.replace_pending_spans(store, [("t1", b"\x00\x01"), ("t2", b"{}")], NOW)
    assert sorted(queries.pending_spans(store)) == [("t1", b"\x00\x01"), ("t2", b"{}")]
    queries.replace_pending_spans(store, [("t3", b"x")], NOW)
    assert queries.pending_spans(store) == [("t3", b"x")]
    queries.replace_pending_spans(store, [], NOW)
    assert queries.pending_spans(store) == []


# --- timespec --------------------------------------------------------------------------------


def utc_ns(*parts: int, micro: int = 0) -> int:
    return calendar.timegm((*parts, 0, 0, 0)[:6]) * SEC + micro * 1000  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("  now ", NOW),
        ("15m", NOW - 15 * MIN),
        ("-15m", NOW - 15 * MIN),
        ("-2h", NOW - 2 * HOUR),
        ("90s", NOW - 90 * SEC),
        ("250ms", NOW - 250_000_000),
        ("1.5h", NOW - 90 * MIN),
        ("7d", NOW - 7 * DAY),
        ("2w", NOW - 14 * DAY),
        ("2026-12-02T10:00:00Z", utc_ns(2026, 12, 2, 10, 0, 0)),
        ("2026-12-02T10:00:00", utc_ns(2026, 12, 2, 10, 0, 0)),  # naive means UTC
        ("2026-12-02 10:00:00+02:00", utc_ns(2026, 12, 2, 8, 0, 0)),
        ("2026-12-02", utc_ns(2026, 12, 2, 0, 0, 0)),
        ("2004-04-03T22:03:21.460857Z", utc_ns(2004, 4, 3, 22, 3, 21, micro=460857)),
        ("1764662400", 1764662400 * SEC),
        ("1764662400.5", 1764662400 * SEC + SEC // 2),
        ("0", 0),
    ],
)
def test_parse_time_ns(text: str, expected: int) -> None:
    assert parse_time_ns(text, "since", now_ns=NOW) == expected


@pytest.mark.parametrize(
    "text",
    ["", "   ", "yesterday", "15 minutes", "5x", "-5", "1e12", "nan", "inf", "2026-13-01", "--2h"],
)
def test_parse_time_ns_junk_names_the_parameter(text: str) -> None:
    with pytest.raises(QueryError) as err:
        parse_time_ns(text, "until", now_ns=NOW)
    assert str(err.value).startswith("until ")
    assert isinstance(err.value, CotenantError)


def test_parse_time_ns_defaults_to_the_system_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import cotenant.core.timespec

    monkeypatch.setattr(cotenant.core.timespec.time, "time_ns", lambda: NOW)
    assert parse_time_ns("now") == NOW
    assert parse_time_ns("15m") == NOW - 15 * MIN


def test_iso_times_with_microseconds_are_exact() -> None:
    rng = np.random.default_rng(50)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    for us in rng.integers(0, 4_000_000_000_000_000, 2000):
        text = (epoch + timedelta(microseconds=int(us))).isoformat().replace("+00:00", "Z")
        assert parse_time_ns(text) == int(us) * 1000, text


def test_format_ns_round_trips_to_the_millisecond() -> None:
    ts = NOW + 123_456_789
    text = format_ns(ts)
    assert text == "2026-12-02T12:00:00.123Z"
    assert parse_time_ns(text) == NOW + 123_000_000


def test_parse_duration_ns() -> None:
    assert parse_duration_ns("15m") == 15 * MIN
    assert parse_duration_ns(" 2h ") == 2 * HOUR
    with pytest.raises(QueryError, match="window '15'"):
        parse_duration_ns("15", "window")


def test_a_schema_2_store_gains_the_alerts_table_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "v2.duckdb"
    with Store(path) as s:
        fetch(s, "INSERT INTO incidents (id, model) VALUES ('inc-1', 'tts')")
    _set_version(path, "2", drop="alerts")
    with pytest.raises(SchemaVersionError):  # read-only never alters a file
        Store(path, read_only=True)
    with Store(path) as s:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert fetch(s, "SELECT count(*) FROM alerts") == [(0,)]
        assert fetch(s, "SELECT id, model FROM incidents") == [("inc-1", "tts")]


def test_a_schema_3_store_gains_incident_severity_and_its_incidents_read_as_breaches(
    tmp_path: Path,
) -> None:
    from cotenant.analysis.incidents import IncidentBook

    path = tmp_path / "v3.duckdb"
    with Store(path) as s:
        fetch(s, "ALTER TABLE incidents DROP COLUMN severity")
        fetch(
            s,
            "INSERT INTO incidents (id, model, gpu, state, start_ns, end_ns, updated_ns) "
            "VALUES ('inc-1', 'tts', 'gpu0', 'resolved', 1, 2, 2)",
        )
    _set_version(path, "3")
    with Store(path) as s:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION)
        [inc] = IncidentBook(s).find()
        assert (inc.id, inc.severity, inc.state) == ("inc-1", "breach", "resolved")
        assert IncidentBook(s).find(severity="degradation") == []


def test_a_schema_4_store_gains_incident_indicator_and_its_incidents_read_as_e2e(
    tmp_path: Path,
) -> None:
    from cotenant.analysis.incidents import IncidentBook

    path = tmp_path / "v4.duckdb"
    with Store(path) as s:
        fetch(s, "ALTER TABLE incidents DROP COLUMN indicator")
        fetch(
            s,
            "INSERT INTO incidents (id, model, gpu, state, start_ns, end_ns, updated_ns, severity) "
            "VALUES ('inc-1', 'chat', 'gpu0', 'resolved', 1, 2, 2, 'breach')",
        )
    _set_version(path, "4")
    with Store(path) as s:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION)
        [inc] = IncidentBook(s).find()
        assert (inc.id, inc.indicator, inc.severity) == ("inc-1", "e2e", "breach")
        assert [i.id for i in IncidentBook(s).find(indicator="e2e")] == ["inc-1"]
        assert IncidentBook(s).find(indicator="tpot") == []


def test_a_schema_6_store_gains_model_loads_and_their_rollup(tmp_path: Path) -> None:
    from cotenant.store.bulk_load import append_tables
    from cotenant.store.week_rollups import StoreWeekRollups

    path = tmp_path / "v6.duckdb"
    with Store(path) as s:
        fetch(s, "DROP TABLE model_loads")
        fetch(s, "DROP TABLE load_rollup_1m")
    _set_version(path, "6")
    with Store(path) as s:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION)
        # a row standing for 3 loads of 2 s mean, one single load of 30 s, in one minute
        append_tables(
            s,
            {
                "model_loads": table(
                    "model_loads",
                    {
                        "ts_ns": [NOW, NOW + SEC],
                        "host": ["h", "h"],
                        "gpu": ["g0", "g0"],
                        "replica": ["pod-a", "pod-a"],
                        "model": ["sdxl", "sdxl"],
                        "kind": ["lora", "base"],
                        "loads": [3, 1],
                        "duration_ms": [2000.0, 30000.0],
                    },
                )
            },
        )
        m = Maintenance(s, clock_ns=lambda: NOW)
        assert m.refresh_rollups() >= 1
        rows = StoreWeekRollups(s).load_weeks(NOW - 3600 * SEC, NOW + 3600 * SEC)
    assert [(r["kind"], r["loads"], r["load_ms"], r["max_ms"]) for r in rows] == [
        ("base", 1, 30000.0, 30000.0),
        ("lora", 3, 6000.0, 2000.0),
    ]
    assert {r["replica"] for r in rows} == {"pod-a"}


def test_request_windows_count_arrivals_where_nothing_completed(tmp_path: Path) -> None:
    from cotenant.store.source import StoreSource

    # a slow model: each request arrives in one second and completes 1.5 s later
    starts = [NOW + k * 10 * SEC + 200_000_000 for k in range(3)]
    reqs = table(
        "requests",
        {
            "ts_start_ns": starts,
            "ts_end_ns": [s + 1_500_000_000 for s in starts],
            "latency_ms": [1500.0] * 3,
            "model": ["sdxl"] * 3,
            "gpu": ["0"] * 3,
        },
    )
    with Store(tmp_path / "s.duckdb") as s:
        with s.cursor() as cur:
            cur.register("_t", reqs)
            cur.execute("INSERT INTO requests BY NAME SELECT * FROM _t")
        t = StoreSource(s).request_windows(TimeRange(NOW, NOW + 30 * SEC), 1.0)
    rows = {r["ts_ns"]: r for r in t.to_pylist()}
    assert sum(r["arrival_rps"] for r in rows.values()) == 3
    assert sum(r["count"] for r in rows.values()) == 3
    arrived = rows[NOW]  # the first request arrived here and completed a window later
    assert arrived["arrival_rps"] == 1 and arrived["count"] == 0 and arrived["p99_ms"] is None


def test_a_schema_7_store_gains_the_contention_table(tmp_path: Path) -> None:
    from cotenant.store.contention_rows import Contention, find_contention, upsert_contention

    path = tmp_path / "v7.duckdb"
    with Store(path) as s:
        fetch(s, "DROP TABLE contention")
    _set_version(path, "7")
    with Store(path) as s:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION)
        row = Contention("ctn-1", "chat", "g0", "ttft", NOW, NOW + 60 * SEC, NOW, "recurring")
        upsert_contention(s, [row, row])  # written twice: one row
        assert find_contention(s, "chat", "g0", NOW) == [row]
        assert find_contention(s, "chat", "g0", NOW + 61 * SEC) == []


def test_a_schema_8_store_gains_the_cpu_frequency_of_process_samples(tmp_path: Path) -> None:
    path = tmp_path / "v8.duckdb"
    with Store(path) as s:
        fetch(s, "ALTER TABLE process_samples DROP COLUMN cpu_freq_mhz")
        fetch(s, "ALTER TABLE process_samples DROP COLUMN cpu_max_freq_mhz")
        fetch(
            s,
            "INSERT INTO process_samples (ts_ns, host, pid, process_name, cpu_cores) "
            "VALUES (1, 'h', 7, 'etl', 2.0)",
        )
    _set_version(path, "8")
    with Store(path) as s:
        assert s.get_meta("schema_version") == str(SCHEMA_VERSION)
        rows = fetch(s, "SELECT process_name, cpu_cores, cpu_freq_mhz FROM process_samples")
        assert rows == [("etl", 2.0, None)]
