"""Attribution on generated frames with known answers, and diagnosis end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from analysis_frames import FAULT, N, _refresh, masks, slow_compute, windows
from prometheus_client import CollectorRegistry, generate_latest

from cotenant.analysis.attribution import attribute
from cotenant.analysis.diagnose import diagnose
from cotenant.analysis.incident_record import Incident
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.loop import AnalysisLoop
from cotenant.analysis.windows import GpuWindows
from cotenant.core.errors import SourceError
from cotenant.core.slos import Slos
from cotenant.core.timerange import TimeRange
from cotenant.evaluation.accuracy import load_outputs
from cotenant.simulator.output import run
from cotenant.simulator.scenario_load import find_scenario, load_scenario
from cotenant.store.bulk_load import append_tables
from cotenant.store.db import Store
from cotenant.store.source import StoreSource

ROOT = Path(__file__).resolve().parent.parent


def _culprit(inc: Incident) -> str | None:
    """The culprit of an incident's top cause (None: no cause named)."""
    return None if inc.top is None else inc.top.culprit


def top(att):  # type: ignore[no-untyped-def]
    return [(c.kind, c.culprit) for c in att.causes if c.kind != "unknown"]


def test_cotenant_rise_explains_compute_inflation() -> None:
    w = windows()
    w.processes["sdxl"]["sm_util"][FAULT] = 80.0
    slow_compute(w)
    att = attribute(w, "tts", *masks())
    assert top(att)[0] == ("cotenant", "sdxl")
    c = att.causes[0]
    assert c.share > 0.8 and c.confidence > 0.9
    assert c.evidence["during"] > c.evidence["before"]
    assert att.phases_ms["compute_ms"] == pytest.approx(10, abs=0.5)


def test_clock_drop_is_throttle_and_two_causes_share_the_excess() -> None:
    w = windows()
    w.counters["sm_clock_mhz"][FAULT] = 1188.0  # 0.6 x
    w.counters["clock_event_reasons"][FAULT] = 0x40
    w.processes["sdxl"]["sm_util"][FAULT] = 50.0
    slow_compute(w, 2.2)
    att = attribute(w, "tts", *masks())
    assert set(top(att)[:2]) == {("throttle", "gpu0"), ("cotenant", "sdxl")}
    thr = next(c for c in att.causes if c.kind == "throttle")
    assert thr.evidence["clock_event_reasons"] == 0x40
    assert sum(c.share for c in att.causes) == pytest.approx(1.0)


def test_dram_traffic_without_sm_is_bandwidth() -> None:
    w = windows()
    w.processes["copy"] = {
        "sm_util": np.full(N, 1.0),
        "mem_util": np.full(N, 1.0),
        "mem_used_bytes": np.full(N, 1e9),
    }
    w.process_model["copy"] = None
    w.processes["copy"]["mem_util"][FAULT] = 90.0
    slow_compute(w, 1.5)
    att = attribute(w, "tts", *masks())
    assert att.causes[0].kind == "bandwidth" and att.causes[0].culprit == "copy"
    assert att.causes[0].resource == "dram"


def test_a_copy_loop_started_before_the_slowdown_was_located_is_still_named() -> None:
    """Seen on dev scenario 128: a DRAM hog began 11 s before the victim's slowdown was
    located, so a quarter of the before windows held its rows (NVML lists a process from its
    start). Averaged over its own rows it had not risen (0.80 -> 0.80), and the slowdown went
    to the victim's own heavier work (`mix`). Where the poller read the GPU's processes and the
    hog had no row, it was idle."""
    w = windows()
    w.processes["copy"] = {k: np.full(N, np.nan) for k in ("sm_util", "mem_util", "mem_used_bytes")}
    w.process_model["copy"] = None
    w.processes["copy"]["sm_util"][100:170] = 0.0
    w.processes["copy"]["mem_util"][100:170] = 80.0
    w.processes["copy"]["mem_used_bytes"][100:170] = 1e9
    slow_compute(w, 1.5)
    att = attribute(w, "tts", *masks())
    c = att.causes[0]
    assert (c.kind, c.culprit, c.resource) == ("bandwidth", "copy", "dram")
    assert c.evidence["before"] == pytest.approx(80.0 * 20 / 60, abs=0.01)
    assert c.evidence["during"] == pytest.approx(80.0)


def test_lock_wait_names_the_lock_and_holder() -> None:
    w = windows()
    w.models["tts"]["lock_wait_ms"][FAULT] = 25.0
    _refresh(w)
    att = attribute(w, "tts", *masks(), locks=[("tokenizer", "chat", 900.0)])
    assert att.causes[0].kind == "lock" and att.causes[0].culprit == "tokenizer"
    assert att.causes[0].evidence["holder"] == "chat"


def test_own_arrival_surge_is_load_and_queue_growth_alone_is_not() -> None:
    w = windows()
    w.models["tts"]["arrival_rps"][FAULT] *= 3
    w.models["tts"]["queue_ms"][FAULT] += 30
    _refresh(w)
    att = attribute(w, "tts", *masks())
    assert top(att)[0] == ("load", "tts")
    quiet = windows()
    quiet.models["tts"]["queue_ms"][FAULT] += 30  # no more arrivals, no slower service
    _refresh(quiet)
    att2 = attribute(quiet, "tts", *masks())
    assert top(att2) == [] and att2.causes[0].kind == "unknown"


def test_host_cpu_culprit_for_preprocess_growth() -> None:
    w = windows()
    w.models["tts"]["preprocess_ms"][FAULT] = 20.0
    _refresh(w)
    cpu = {"etl": np.full(N, 0.1), "tts": np.full(N, 0.5)}
    cpu["etl"][FAULT] = 12.0
    att = attribute(w, "tts", *masks(), host_cpu=cpu)
    assert top(att)[0] == ("cpu", "etl")


def test_a_burner_started_before_the_slowdown_shows_its_rise_in_the_evidence() -> None:
    """Seen on a real vLLM (make engines): silent burners started 30 s before the LLM slowed,
    so the incident's before windows held some of their samples. The cause named them, but its
    evidence averaged their own samples only (0.85 cores before, 0.82 during) with confidence
    0: a reader saw no rise. Where the sampler ran and the burner had no row it was idle."""
    w = windows()
    slow_compute(w, 1.5)
    cpu = {"vllm": np.full(N, 1.0), "burner": np.full(N, np.nan)}
    cpu["burner"][90:160] = 0.85  # half the before windows (60-120) and all of the slowdown
    att = attribute(w, "tts", *masks(), host_cpu=cpu)
    c = att.causes[0]
    assert (c.kind, c.culprit) == ("cpu", "burner")
    assert c.evidence["before"] == pytest.approx(0.425) and c.evidence["during"] == 0.85
    assert c.confidence > 0.5


def test_nothing_changed_means_nothing_blamed() -> None:
    w = windows()
    att = attribute(w, "tts", *masks())
    assert all(c.share < 0.2 for c in att.causes if c.kind != "unknown")


@pytest.fixture(scope="module")
def demo_store() -> Store:
    s = load_scenario(find_scenario("demo"))
    return load_outputs(run(s, start_ns=0))


@pytest.fixture
def fresh_book(demo_store: Store) -> IncidentBook:
    """An incident book on the shared demo store with no incidents from other tests."""
    with demo_store.cursor() as cur:
        cur.execute("DELETE FROM incidents")
    return IncidentBook(demo_store)


def test_diagnose_the_demo_names_each_fault(demo_store: Store) -> None:
    src = StoreSource(demo_store)
    diags = diagnose(src, "tts", TimeRange(0, 900_000_000_000), slo_ms=100.0)

    def first(lo: int, hi: int):  # type: ignore[no-untyped-def]
        d = next(d for d in diags if lo * 10**9 <= d.start_ns < hi * 10**9)
        return (d.causes[0].kind, d.causes[0].culprit)

    assert first(95, 150) == ("lock", "tokenizer")
    assert first(295, 365) == ("cotenant", "sdxl")
    # (an SDXL burst just before the throttle may begin the slowdown that the throttle carries on)
    assert first(570, 650) == ("throttle", "gpu0")


def test_incident_book_keeps_one_incident_while_it_grows(
    demo_store: Store, fresh_book: IncidentBook
) -> None:
    src = StoreSource(demo_store)
    book = fresh_book
    ids = set()
    for now_s in (320, 340, 380, 420):
        now = now_s * 10**9
        rng = TimeRange(now - 300 * 10**9, now)
        diags = [d for d in diagnose(src, "tts", rng, slo_ms=100.0) if d.gpu == "gpu0"]
        for e in book.update(diags, "tts", "gpu0", rng.since_ns or 0, now):
            inc = e.incident
            if 280e9 <= inc.start_ns < 320e9:
                ids.add(inc.id)
    assert len(ids) == 1
    [inc] = [i for i in book.find(model="tts") if i.id in ids]
    assert inc.state == "resolved" and inc.top is not None and inc.top.culprit == "sdxl"


def test_loop_publishes_incident_metrics(demo_store: Store, fresh_book: IncidentBook) -> None:
    reg = CollectorRegistry()
    seen = []
    loop = AnalysisLoop(
        StoreSource(demo_store),
        fresh_book,
        slos=Slos.of_maps({"tts": 100}),
        horizon_s=120,
        registry=reg,
        clock_ns=lambda: 330 * 10**9,
        on_incident=lambda e: seen.append((e.incident.model, e.kind)),
    )
    loop.run_once()
    text = generate_latest(reg).decode()
    assert (
        'cotenant_incident_active{cause="cotenant",culprit="sdxl",gpu="gpu0",'
        'indicator="e2e",severity="breach",victim="tts"} 1.0' in text
    )
    assert ("tts", "opened") in seen


class _Counting:
    """A StoreSource that counts its window reads."""

    def __init__(self, inner: StoreSource) -> None:
        self._inner = inner
        self.reads = 0
        self.has_spans = True

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)

        def counted(*args: Any, **kw: Any) -> Any:
            if name.endswith("_windows"):
                self.reads += 1
            return fn(*args, **kw)

        return counted


def test_batched_reads_give_the_loop_the_same_incidents_with_one_read_per_frame(
    demo_store: Store,
) -> None:
    got = {}
    for batch in (False, True):
        with demo_store.cursor() as cur:
            cur.execute("DELETE FROM incidents")
        src = _Counting(StoreSource(demo_store))
        clock = [300 * 10**9]
        loop = AnalysisLoop(
            src,  # type: ignore[arg-type]
            IncidentBook(demo_store),
            slos=Slos.of_maps({"tts": 100}),
            horizon_s=120,
            clock_ns=lambda c=clock: c[0],  # type: ignore[misc]
            batch_reads=batch,
        )
        events = []
        for now_s in (300, 330, 360, 400):
            clock[0] = now_s * 10**9
            events += [
                (e.kind, e.incident.model, e.incident.gpu, _culprit(e.incident))
                for e in loop.run_once()
            ]
        got[batch] = (events, src.reads)
    assert got[True][0] == got[False][0] and ("opened", "tts", "gpu0", "sdxl") in got[True][0]
    # the demo has two GPUs: per-GPU reads are 3 frames x 2 GPUs a pass, batched 3
    assert got[True][1] < got[False][1]


class _Spans(_Counting):
    """Keeps the start of every request-window read, in seconds."""

    def __init__(self, inner: StoreSource) -> None:
        super().__init__(inner)
        self.starts: list[float] = []

    def request_windows(self, rng: TimeRange, *args: Any, **kw: Any) -> Any:
        self.starts.append((rng.since_ns or 0) / 1e9)
        return self._inner.request_windows(rng, *args, **kw)


@pytest.mark.parametrize("full_read_s", [60.0, 600.0])
def test_the_loop_reads_its_whole_range_once_while_no_request_lands_late(
    demo_store: Store, full_read_s: float
) -> None:
    """Every full_read_s the loop looks for rows that landed late; none did in a store that
    does not change, so the requests are read in full only on the first pass."""
    full_reads = 1
    src = _Spans(StoreSource(demo_store))
    clock = [300 * 10**9]
    loop = AnalysisLoop(
        src,  # type: ignore[arg-type]
        IncidentBook(Store(":memory:")),
        horizon_s=120,
        reread_s=10.0,
        clock_ns=lambda: clock[0],
        full_read_s=full_read_s,
    )
    for now_s in (300, 315, 330, 345, 360, 375):
        clock[0] = now_s * 10**9
        src.starts.clear()
        loop.run_once()
        full = min(src.starts) < now_s - 60  # the horizon and its history, not the last 10 s
        full_reads -= full
    assert full_reads == 0


class _Limited(_Counting):
    """Refuses fleet-wide window reads as a PromQL engine over its sample limit does."""

    def __getattr__(self, name: str) -> Any:
        fn = super().__getattr__(name)

        def limited(*args: Any, **kw: Any) -> Any:
            gpu = kw.get("gpu")  # PassReads and the windows pass the GPU by keyword
            fleet_wide = gpu is None and kw.get("hosts") is None and kw.get("model") is None
            if name in ("request_windows", "gpu_windows", "process_windows") and fleet_wide:
                raise SourceError("query processing would load too many samples into memory")
            return fn(*args, **kw)

        return limited


def test_batched_reads_fall_back_to_one_gpu_at_a_time_past_the_engines_limit(
    demo_store: Store,
) -> None:
    with demo_store.cursor() as cur:
        cur.execute("DELETE FROM incidents")
    loop = AnalysisLoop(
        _Limited(StoreSource(demo_store)),  # type: ignore[arg-type]
        IncidentBook(demo_store),
        slos=Slos.of_maps({"tts": 100}),
        horizon_s=120,
        clock_ns=lambda: 330 * 10**9,
        batch_reads=True,
    )
    kinds = {(e.kind, e.incident.model, _culprit(e.incident)) for e in loop.run_once()}
    assert ("opened", "tts", "sdxl") in kinds


class _Lagging:
    """A source whose newest rows have not landed yet: nothing after ``frontier_ns``."""

    def __init__(self, inner: StoreSource, frontier_ns: int) -> None:
        self._inner = inner
        self._frontier = frontier_ns
        self.has_spans = True

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._inner, name)

        def clipped(rng: TimeRange, *args: Any, **kw: Any) -> Any:
            until = min(rng.until_ns or self._frontier, self._frontier)
            return fn(TimeRange(min(rng.since_ns or 0, until), until), *args, **kw)

        return clipped


def test_rows_still_in_flight_do_not_resolve_an_open_incident(
    demo_store: Store, fresh_book: IncidentBook
) -> None:
    # the loop's clock is at 330 s but rows have landed only up to 322 s (ingest lag): the
    # sdxl burst is still going on, so the incident stays open instead of flapping resolved
    book = fresh_book
    loop = AnalysisLoop(
        _Lagging(StoreSource(demo_store), 322 * 10**9),  # type: ignore[arg-type]
        book,
        slos=Slos.of_maps({"tts": 100}),
        horizon_s=120,
        clock_ns=lambda: 330 * 10**9,
        reread_s=30,
    )
    loop.run_once()
    open_ = [i for i in book.find(model="tts", state="open") if i.start_ns >= 290 * 10**9]
    assert open_ and open_[0].top is not None and open_[0].top.culprit == "sdxl"


def test_cli_diagnose_reads_a_store_file(tmp_path: Path) -> None:
    s = load_scenario(find_scenario("lock-hog-tokenizer-held-by-chat"))
    path = tmp_path / "s.duckdb"
    Store(path).close()  # a real store file with the schema; then copy the simulated rows in
    mem = load_outputs(run(s, start_ns=1_700_000_000_000_000_000))
    with mem.cursor() as cur:
        cur.execute(f"ATTACH '{path}' AS f")
        for table in ("requests", "gpu_samples", "process_samples"):
            cur.execute(f"INSERT INTO f.{table} SELECT * FROM {table}")
        cur.execute("DETACH f")
    mem.close()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cotenant",
            "diagnose",
            "--store",
            str(path),
            "--model",
            "tts",
            "--since",
            "1700000000",
            "--until",
            str(1_700_000_000 + s.duration_s),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COTENANT_ANALYSIS_SLO_MS": "tts=60"},
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    causes = [(c["kind"], c["culprit"]) for d in result["diagnoses"] for c in d["causes"][:1]]
    assert ("lock", "tokenizer") in causes
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "cotenant",
            "diagnose",
            "--store",
            str(path),
            "--model",
            "nope",
            "--since",
            "1700000000",
            "--until",
            "1700000300",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "nope" in bad.stderr


def _same_windows(got: GpuWindows, want: GpuWindows) -> None:
    assert got.n == want.n and set(got.models) == set(want.models)
    for m in want.models:
        for f, arr in want.models[m].items():
            np.testing.assert_allclose(got.models[m][f], arr, equal_nan=True, err_msg=f)


def test_a_request_that_lands_late_is_read_within_full_read_s(demo_store: Store) -> None:
    """A request row landing long after its time (a backfill, a spool replayed after a
    restart) is in the loop's windows by the next full_read_s, and only then is the range
    read in full; until one lands, it never is after the first read."""
    from cotenant.analysis.windows import WindowCache, gpu_windows

    store = Store(":memory:")
    with demo_store.cursor() as cur:
        rows = cur.sql("SELECT * FROM requests WHERE ts_end_ns < 400e9").to_arrow_table()
    append_tables(store, {"requests": rows})
    src = StoreSource(store)
    cache = WindowCache(src, "gpu0", 1.0, overlap_s=10.0, refresh_s=60.0)

    def at(now_s: int) -> tuple[GpuWindows, GpuWindows]:
        rng = TimeRange((now_s - 200) * 10**9, now_s * 10**9)
        return cache.get(rng), gpu_windows(src, "gpu0", rng, 1.0)

    for now_s in (300, 305, 362):  # the last one is past full_read_s: nothing landed late
        _same_windows(*at(now_s))
    assert cache.full_reads == 1
    # a slow tts request that ended at 250 s lands now, 112 s late
    one = rows.filter(pc.equal(rows.column("model"), "tts")).slice(0, 1).to_pylist()[0]
    one.update(ts_start_ns=249 * 10**9, ts_end_ns=250 * 10**9, latency_ms=900.0)
    append_tables(store, {"requests": pa.Table.from_pylist([one], schema=rows.schema)})
    got, want = at(367)  # within full_read_s of the last full look: not seen yet
    i = got.index(250 * 10**9)
    assert got.models["tts"]["count"][i] == want.models["tts"]["count"][i] - 1
    _same_windows(*at(423))  # the next look finds it and reads the range in full
    assert cache.full_reads == 2
    store.close()


def test_window_cache_matches_a_full_read(demo_store: Store) -> None:
    from cotenant.analysis.windows import WindowCache, gpu_windows

    src = StoreSource(demo_store)
    cache = WindowCache(src, "gpu0", 1.0)
    for now_s in (300, 305, 312, 340, 341, 500):  # steps forward, then a jump past the range
        rng = TimeRange((now_s - 200) * 10**9, now_s * 10**9)
        got, want = cache.get(rng), gpu_windows(src, "gpu0", rng, 1.0)
        assert got.n == want.n and set(got.models) == set(want.models)
        for m in want.models:
            for f, arr in want.models[m].items():
                np.testing.assert_allclose(got.models[m][f], arr, equal_nan=True, err_msg=f)
        for name, ser in want.processes.items():
            np.testing.assert_allclose(
                got.processes[name]["sm_util"], ser["sm_util"], equal_nan=True
            )
        np.testing.assert_allclose(
            got.counters["sm_clock_mhz"], want.counters["sm_clock_mhz"], equal_nan=True
        )
