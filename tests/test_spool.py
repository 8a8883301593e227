"""The durable-ack spool (``store.spool``): acknowledged once in the fsync'd log, loaded into
DuckDB at the flush interval with its mark in the same transaction, and recovered at start
exactly once (a crash before the load, after it, or in the middle of a record)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from test_group_commit import BrokenStore
from test_store import count, make_requests

from cotenant.core.errors import StoreError
from cotenant.store.db import Store
from cotenant.store.spool import MARK_KEY, Spool
from cotenant.store.writer import Writer


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store(tmp_path / "store.duckdb")
    yield s
    s.close()


def _logs(d: Path) -> list[Path]:
    return sorted(d.glob("*.log"))


def test_a_durable_submit_is_acknowledged_from_the_spool_and_loaded_at_the_flush(
    store: Store, tmp_path: Path
) -> None:
    spool = Spool(tmp_path / "spool")
    w = Writer(store, flush_interval_s=3600, spool=spool)
    receipt = w.submit("requests", make_requests(np.random.default_rng(1), 40), durable=True)
    assert receipt.wait(10)
    assert count(store, "requests") == 0  # acknowledged: in the log, not in DuckDB yet
    assert w.queued_rows == 40  # still counted against the queue's bounds
    assert [p.stat().st_size > 0 for p in _logs(spool.directory)] == [True]
    assert w.flush(10)
    assert count(store, "requests") == 40
    assert _logs(spool.directory) == []  # loaded: the log file is gone
    assert store.get_meta(MARK_KEY) == f"{spool.end[0]}:{spool.end[1]}"
    again = w.submit("requests", make_requests(np.random.default_rng(2), 5), durable=True)
    assert again.wait(10)
    w.close()  # close loads what is spooled
    assert count(store, "requests") == 45
    assert _logs(spool.directory) == []


def _crashed_with_spooled_rows(directory: Path, groups: list[int]) -> Spool:
    """A spool as a killed process leaves it: groups appended (acknowledged), never loaded."""
    spool = Spool(directory)
    for i, n in enumerate(groups):
        spool.append([("requests", make_requests(np.random.default_rng(10 + i), n))])
    spool.close()
    return spool


def test_a_restart_loads_what_was_spooled_once(tmp_path: Path) -> None:
    _crashed_with_spooled_rows(tmp_path / "spool", [7, 11])
    with Store(tmp_path / "s.duckdb") as store:
        Writer(store, spool=Spool(tmp_path / "spool")).close()
        assert count(store, "requests") == 18
    assert _logs(tmp_path / "spool") == []
    with Store(tmp_path / "s.duckdb") as store:  # and again: nothing loaded twice
        Writer(store, spool=Spool(tmp_path / "spool")).close()
        assert count(store, "requests") == 18


def test_a_crash_between_the_load_and_the_log_deletion_loads_nothing_twice(
    tmp_path: Path,
) -> None:
    spool = _crashed_with_spooled_rows(tmp_path / "spool", [6])
    with Store(tmp_path / "s.duckdb") as store:
        # the load committed (rows and mark together) but the process died before loaded()
        with store.cursor() as cur:
            batches, _ = spool.recover(cur)
            cur.execute("BEGIN TRANSACTION")
            rows = pa.concat_tables([b for _, b in batches])  # noqa: F841  # read by DuckDB
            cur.execute("INSERT INTO requests BY NAME SELECT * FROM rows")
            spool.mark_loaded(cur, spool.end)
            cur.execute("COMMIT")
        assert len(_logs(tmp_path / "spool")) == 1
        Writer(store, spool=Spool(tmp_path / "spool")).close()
        assert count(store, "requests") == 6
    assert _logs(tmp_path / "spool") == []


def test_a_record_cut_short_by_the_crash_is_dropped(tmp_path: Path) -> None:
    _crashed_with_spooled_rows(tmp_path / "spool", [3, 4])
    (log,) = _logs(tmp_path / "spool")
    whole = log.read_bytes()
    Spool(tmp_path / "spool2")  # a fresh directory for the cut copy
    cut = tmp_path / "spool2" / log.name
    cut.write_bytes(whole[:-10])  # the second group's write was under way
    with Store(tmp_path / "s.duckdb") as store:
        Writer(store, spool=Spool(tmp_path / "spool2")).close()
        assert count(store, "requests") == 3
    corrupt = bytearray(whole)
    corrupt[-5] ^= 0xFF  # a CRC mismatch ends the log too
    Spool(tmp_path / "spool3")
    (tmp_path / "spool3" / log.name).write_bytes(bytes(corrupt))
    with Store(tmp_path / "t.duckdb") as store:
        Writer(store, spool=Spool(tmp_path / "spool3")).close()
        assert count(store, "requests") == 3


def test_new_records_after_a_restart_go_to_a_newer_log(store: Store, tmp_path: Path) -> None:
    _crashed_with_spooled_rows(tmp_path / "spool", [2])
    spool = Spool(tmp_path / "spool")
    w = Writer(store, flush_interval_s=3600, spool=spool)
    gen = spool.end[0]
    assert w.submit("requests", make_requests(np.random.default_rng(3), 4), durable=True).wait(10)
    assert spool.end[0] == gen + 1
    w.close()
    assert count(store, "requests") == 6


class _FullDisk(Spool):
    def append(self, batches: Any) -> None:
        raise StoreError("could not spool: No space left on device")


def test_a_spool_that_cannot_write_falls_back_to_the_commit(store: Store, tmp_path: Path) -> None:
    w = Writer(store, flush_interval_s=3600, spool=_FullDisk(tmp_path / "spool"))
    assert w.submit("requests", make_requests(np.random.default_rng(4), 9), durable=True).wait(10)
    assert count(store, "requests") == 9  # committed before the answer, as without a spool
    w.close()


def test_spooled_rows_whose_load_fails_are_kept_for_the_next(tmp_path: Path) -> None:
    store = BrokenStore(tmp_path / "s.duckdb")
    spool = Spool(tmp_path / "spool")
    w = Writer(store, flush_interval_s=3600, spool=spool)
    assert w.submit("requests", make_requests(np.random.default_rng(5), 8), durable=True).wait(10)
    store.broken = True
    assert not w.flush(0.3)  # the load fails: still queued, still in the log
    assert len(_logs(spool.directory)) == 1
    store.broken = False
    assert w.flush(10)
    w.close()
    assert count(store, "requests") == 8
    assert _logs(spool.directory) == []
    store.close()
