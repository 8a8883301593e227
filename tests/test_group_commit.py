"""Durable acknowledgement: the writer's receipts and group commit, and the ingest pipeline
that answers only once its rows are committed (``store.ack = "durable"``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from spans import SpanFactory
from test_store import (
    RecordingObserver,
    count,
    frozen_monotonic,
    make_gpu_samples,
    make_requests,
)

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.ingest_metrics import IngestMetrics
from cotenant.collectors.otlp.ingest import IngestPipeline
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.core.errors import Overloaded, StoreError, UsageError
from cotenant.store.db import Store
from cotenant.store.writer import Writer


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = Store(tmp_path / "store.duckdb")
    yield s
    s.close()


def test_a_durable_submit_is_committed_without_waiting_for_the_flush_timer(store: Store) -> None:
    # an hour-long flush interval: only the durable submit can make the writer write now
    w = Writer(store, batch_rows=100_000, flush_interval_s=3600, group_commit_s=0.001)
    receipt = w.submit("requests", make_requests(np.random.default_rng(1), 40), durable=True)
    assert receipt.wait(30)
    assert receipt.committed
    assert count(store, "requests") == 40
    queued = w.submit("requests", make_requests(np.random.default_rng(2), 5))
    assert not queued.wait(0.2)  # a plain submit still waits for a batch or the timer
    w.close()
    assert queued.committed and count(store, "requests") == 45


def test_concurrent_durable_submits_share_commits(store: Store) -> None:
    observer = RecordingObserver()
    # a long window: the commit waits for every producer still at work, then goes at once
    w = Writer(
        store, batch_rows=100_000, flush_interval_s=3600, group_commit_s=30, observer=observer
    )
    receipts = []
    lock = threading.Lock()
    all_in = threading.Barrier(8)

    def producer(seed: int) -> None:
        with w.producing():
            all_in.wait(30)  # eight exports at work at once
            r = w.submit("requests", make_requests(np.random.default_rng(seed), 10), durable=True)
        with lock:
            receipts.append(r)
        assert r.wait(30)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(receipts) == 8 and all(r.committed for r in receipts)
    assert count(store, "requests") == 80
    assert len(observer.written) == 1  # one commit for the eight of them
    w.close()


def test_a_lone_durable_submit_does_not_wait_for_the_window(store: Store) -> None:
    w = Writer(store, flush_interval_s=3600, group_commit_s=600)
    r = w.submit("requests", make_requests(np.random.default_rng(9), 3), durable=True)
    assert r.wait(30)  # nobody else at work: committed at once, not after 600 s
    w.close()


def test_a_durable_commit_leaves_samples_for_their_own_flush(store: Store) -> None:
    # samples nobody waits for do not ride along with each durable commit (an append each):
    # they wait for their flush interval, or a flush / close
    observer = RecordingObserver()
    w = Writer(store, flush_interval_s=3600, group_commit_s=0.001, observer=observer)
    samples = make_gpu_samples(np.random.default_rng(6), 8, time.time_ns(), ["GPU-0"])
    queued = w.submit("gpu_samples", samples)
    for seed in range(3):
        r = w.submit("requests", make_requests(np.random.default_rng(seed), 5), durable=True)
        assert r.wait(30)
    assert count(store, "requests") == 15
    assert count(store, "gpu_samples") == 0 and not queued.settled
    assert w.flush(30)
    assert queued.committed and count(store, "gpu_samples") == len(samples)
    assert [t for t, _ in observer.written] == ["requests"] * 3 + ["gpu_samples"]
    w.close()


def test_samples_are_written_within_their_interval_among_durable_commits(store: Store) -> None:
    # a steady stream of durable commits (an exporter every 20 ms) does not starve them
    w = Writer(store, flush_interval_s=0.2, group_commit_s=0.001)
    samples = make_gpu_samples(np.random.default_rng(7), 4, time.time_ns(), ["GPU-0"])
    queued = w.submit("gpu_samples", samples)
    deadline = time.monotonic() + 30
    seed = 0
    while not queued.settled and time.monotonic() < deadline:
        seed += 1
        r = w.submit("requests", make_requests(np.random.default_rng(seed), 2), durable=True)
        assert r.wait(30)
        time.sleep(0.02)
    assert queued.committed and count(store, "gpu_samples") == len(samples)
    assert count(store, "requests") == 2 * seed
    w.close()


class BrokenStore(Store):
    """A real store whose appends fail while ``broken`` is set (a full disk, on demand)."""

    broken = False

    def cursor(self) -> Any:
        if self.broken:
            raise OSError("No space left on device")
        return super().cursor()


def test_a_failed_append_fails_its_receipts_and_the_writer_goes_on(tmp_path: Path) -> None:
    store = BrokenStore(tmp_path / "s.duckdb")
    w = Writer(store, flush_interval_s=3600, group_commit_s=0.001)
    store.broken = True
    receipt = w.submit("requests", make_requests(np.random.default_rng(3), 7), durable=True)
    with pytest.raises(StoreError, match="No space left"):
        receipt.wait(30)
    store.broken = False
    again = w.submit("requests", make_requests(np.random.default_rng(4), 7), durable=True)
    assert again.wait(30)
    w.close()
    assert count(store, "requests") == 7
    store.close()


def test_the_queue_is_bounded_in_bytes_too(store: Store) -> None:
    rng = np.random.default_rng(5)
    one = make_requests(rng, 100)
    w = Writer(
        store,
        max_rows=1_000_000,
        max_bytes=one.nbytes * 2 + 1,
        batch_rows=1_000_000,
        flush_interval_s=3600,
        clock=frozen_monotonic,
    )
    w.submit("requests", one)
    w.submit("requests", make_requests(rng, 100))
    assert w.full or not w.has_room(100, one.nbytes)
    with pytest.raises(Overloaded, match="MiB"):
        w.submit("requests", make_requests(rng, 100))
    w.close()
    assert count(store, "requests") == 200  # the refused batch was never acknowledged


def _pipeline(w: Writer, ack: str, timeout_s: float = 10.0) -> IngestPipeline:
    return IngestPipeline(
        Normalizer(GpuResolver()),
        w,
        IngestMetrics(CollectorRegistry()),
        ack=ack,
        ack_timeout_s=timeout_s,
    )


def _export() -> Any:
    f = SpanFactory()
    t0 = time.time_ns() - 10**9
    for i in range(20):
        f.ours("m", t0 + i, 3.0)
    return f.otlp()


def test_a_durable_export_returns_with_its_rows_in_the_store(store: Store) -> None:
    w = Writer(store, flush_interval_s=3600)
    out = _pipeline(w, "durable").export(_export(), "http", "protobuf")
    assert out.requests == 20
    assert count(store, "requests") == 20  # no flush: already committed
    w.close()


def test_a_queued_export_returns_before_the_commit(store: Store) -> None:
    w = Writer(store, flush_interval_s=3600, clock=frozen_monotonic)
    _pipeline(w, "queued").export(_export(), "http", "protobuf")
    assert count(store, "requests") == 0 and w.queued_rows == 20
    w.close()
    assert count(store, "requests") == 20


def test_a_durable_export_whose_commit_fails_is_refused_for_a_retry(tmp_path: Path) -> None:
    store = BrokenStore(tmp_path / "s.duckdb")
    w = Writer(store, flush_interval_s=3600, retry_after_s=2.0)
    store.broken = True
    with pytest.raises(Overloaded, match="retry") as err:
        _pipeline(w, "durable").export(_export(), "grpc", "protobuf")
    assert err.value.retry_after_s == 2.0
    store.broken = False
    w.close()
    assert count(store, "requests") == 0
    store.close()


def test_a_durable_export_on_a_stalled_store_is_refused_after_the_timeout(
    tmp_path: Path,
) -> None:
    gate = threading.Event()

    class Stalled(Store):
        def cursor(self) -> Any:
            gate.wait(30)
            return super().cursor()

    store = Stalled(tmp_path / "s.duckdb")
    w = Writer(store, flush_interval_s=3600)
    with pytest.raises(Overloaded, match="not committed"):
        _pipeline(w, "durable", timeout_s=0.2).export(_export(), "http", "protobuf")
    gate.set()
    w.close()
    assert count(store, "requests") == 20  # written late: the client's retry may add a copy
    store.close()


def test_an_unknown_ack_mode_is_a_usage_error(store: Store) -> None:
    w = Writer(store)
    with pytest.raises(UsageError, match="ack"):
        _pipeline(w, "eventually")
    w.close()
