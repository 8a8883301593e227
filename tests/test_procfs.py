"""collectors/procfs/collector.py against a fake /proc tree: who used the host's CPUs, and how
much."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from cotenant.analysis.cpu_causes import read_host_cpu as host_cpu
from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.procfs.collector import (
    ProcfsCollector,
    ProcfsMetrics,
    parse_stat,
    program_name,
)
from cotenant.core.errors import Overloaded
from cotenant.core.timerange import TimeRange
from cotenant.store.db import Store
from cotenant.store.source import StoreSource
from cotenant.store.writer import Writer

TICKS = 100  # clock ticks per second
T0 = 1_767_225_600_000_000_000


class FakeProc:
    """A /proc tree with ``stat`` and ``cmdline`` per pid, and a clock to advance."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.now = 0.0

    def process(
        self,
        pid: int,
        comm: str,
        cpu_s: float,
        *,
        cmdline: str = "",
        start: int = 1000,
        ppid: int = 1,
    ) -> None:
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        ticks = round(cpu_s * TICKS)
        utime, stime = ticks - ticks // 4, ticks // 4
        fields = ["S", str(ppid), "1", "0", "0", "-1", "0", "0", "0", "0", "0"]
        fields += [str(utime), str(stime), "0", "0", "20", "0", "1", "0", str(start), "1000"]
        (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)} 0 0 0\n")
        (d / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")

    def gone(self, pid: int) -> None:
        for f in (self.root / str(pid)).iterdir():
            f.unlink()
        (self.root / str(pid)).rmdir()

    def tick(self, seconds: float = 1.0) -> None:
        self.now += seconds


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    (tmp_path / "self").mkdir()  # non-numeric entries are not processes
    (tmp_path / "uptime").write_text("1.0 1.0\n")
    return FakeProc(tmp_path)


class Sink:
    def __init__(self) -> None:
        self.tables: list[pa.Table] = []

    def __call__(self, table: str, batch: pa.Table) -> None:
        assert table == "process_samples"
        self.tables.append(batch)

    def rows(self) -> list[dict[str, object]]:
        return [r for t in self.tables for r in t.to_pylist()]


def collector(
    proc: FakeProc, sink: Sink, resolver: GpuResolver | None = None, **kw: object
) -> ProcfsCollector:
    return ProcfsCollector(
        sink=sink,
        resolver=resolver or GpuResolver(),
        host="node-1",
        proc=proc.root,
        clock=lambda: T0 + int(proc.now * 1e9),
        monotonic=lambda: proc.now,
        clock_ticks=TICKS,
        **kw,  # type: ignore[arg-type]
    )


def test_a_cpu_burner_that_emits_no_spans_is_recorded_with_its_cores(proc: FakeProc) -> None:
    proc.process(10, "sshd", 5.0, cmdline="/usr/sbin/sshd -D")
    proc.process(20, "python3", 100.0, cmdline="python3 -u burn.py --cores 1")
    sink = Sink()
    c = collector(proc, sink)
    c.poll_once()
    assert sink.rows() == []  # the first read gives no rate
    proc.tick(2.0)
    proc.process(10, "sshd", 5.0)  # idle
    proc.process(20, "python3", 103.0, cmdline="python3 -u burn.py --cores 1")  # 1.5 cores
    c.poll_once()
    (row,) = sink.rows()
    assert row["pid"] == 20 and row["process_name"] == "python3 burn.py"
    assert row["cpu_cores"] == pytest.approx(1.5)
    assert row["host"] == "node-1" and row["ts_ns"] == T0 + 2_000_000_000
    # a host-level row: no GPU, no GPU columns, no model
    assert row["gpu"] is None and row["model"] is None and row["sm_util"] is None


def test_cotenants_own_process_is_never_recorded(proc: FakeProc) -> None:
    # seen in `make demo`: the demo's own process (simulator, load and service in one) got
    # busier with every simulated burst and was named "cpu: cotenant" for tts's slowdowns
    proc.process(20, "python3", 100.0, cmdline="python3 -u burn.py --cores 1")
    proc.process(30, "cotenant", 100.0, cmdline="/venv/bin/python /venv/bin/cotenant demo")
    sink = Sink()
    c = collector(proc, sink, own_pid=30)
    c.poll_once()
    proc.tick(1.0)
    proc.process(20, "python3", 101.0, cmdline="python3 -u burn.py --cores 1")
    proc.process(30, "cotenant", 102.0, cmdline="/venv/bin/python /venv/bin/cotenant demo")
    c.poll_once()
    assert [r["process_name"] for r in sink.rows()] == ["python3 burn.py"]


def test_only_the_top_n_by_cpu_are_recorded(proc: FakeProc) -> None:
    for pid in range(100, 120):
        proc.process(pid, f"worker{pid}", 0.0)
    sink = Sink()
    c = collector(proc, sink, top_n=3)
    c.poll_once()
    proc.tick()
    for pid in range(100, 120):
        proc.process(pid, f"worker{pid}", (pid - 100) * 0.05)  # 0 .. 0.95 cores
    c.poll_once()
    assert sorted(r["pid"] for r in sink.rows()) == [117, 118, 119]


def test_the_processes_of_one_program_are_one_row_with_their_cores_summed(
    proc: FakeProc,
) -> None:
    for pid in (200, 201, 202, 203):  # eight burners would be eight of these
        proc.process(pid, "python3", 0.0, cmdline="python3 burn.py")
    proc.process(300, "mypy", 0.0, cmdline="/usr/bin/mypy")
    sink = Sink()
    c = collector(proc, sink, top_n=1)
    c.poll_once()
    proc.tick()
    for pid, used in ((200, 0.4), (201, 0.5), (202, 0.3), (203, 0.3)):
        proc.process(pid, "python3", used, cmdline="python3 burn.py")
    proc.process(300, "mypy", 0.9)  # busier than any one burner, not than all of them
    c.poll_once()
    (row,) = sink.rows()
    assert row["process_name"] == "python3 burn.py" and row["pid"] == 201
    assert row["cpu_cores"] == pytest.approx(1.5)


def test_a_process_that_served_spans_is_always_recorded_under_its_model(proc: FakeProc) -> None:
    resolver = GpuResolver()
    resolver.note_model("", 30, "tts")  # a span without host.name counts as this host's
    resolver.note_model("other-node", 40, "chat")  # not this host
    proc.process(30, "python3", 1.0, cmdline="python3 tts_server.py")
    proc.process(40, "python3", 1.0)
    proc.process(50, "python3", 10.0, cmdline="python3 burn.py")
    sink = Sink()
    c = collector(proc, sink, resolver=resolver, top_n=1)
    c.poll_once()
    proc.tick()
    proc.process(30, "python3", 1.0)  # idle this second
    proc.process(40, "python3", 1.0)
    proc.process(50, "python3", 11.0, cmdline="python3 burn.py")
    c.poll_once()
    rows = {r["pid"]: r for r in sink.rows()}
    assert set(rows) == {30, 50}
    assert rows[30]["process_name"] == "tts" and rows[30]["model"] == "tts"
    assert rows[30]["cpu_cores"] == 0.0
    assert rows[50]["process_name"] == "python3 burn.py" and rows[50]["cpu_cores"] == 1.0


def test_a_reused_pid_starts_over(proc: FakeProc) -> None:
    proc.process(60, "make", 50.0, start=1000)
    sink = Sink()
    c = collector(proc, sink)
    c.poll_once()
    proc.tick()
    proc.process(60, "cc1", 0.5, start=5000)  # another process, same pid: no rate yet
    c.poll_once()
    assert sink.rows() == []
    proc.tick()
    proc.process(60, "cc1", 1.3, start=5000)
    c.poll_once()
    ((name, cores),) = [(r["process_name"], r["cpu_cores"]) for r in sink.rows()]
    assert name == "cc1" and cores == pytest.approx(0.8)


def test_bad_input_and_a_full_store_never_raise_and_are_counted(proc: FakeProc) -> None:
    registry = CollectorRegistry()
    metrics = ProcfsMetrics(registry)
    proc.process(70, "busy", 0.0)
    proc.process(71, "exits", 0.0)
    refused = []

    def full(table: str, batch: pa.Table) -> None:
        refused.append(batch.num_rows)
        raise Overloaded("queue full", 1.0)

    c = collector(proc, full, metrics=metrics)  # type: ignore[arg-type]
    c.poll_once()
    proc.tick()
    proc.process(70, "busy", 1.0)
    (proc.root / "71" / "stat").write_text("garbage")
    c.poll_once()
    assert refused == [1]
    assert registry.get_sample_value("cotenant_procfs_dropped_rows_total") == 1
    assert registry.get_sample_value("cotenant_procfs_errors_total", {"kind": "stat"}) == 1
    proc.gone(70)  # exited: skipped silently
    proc.tick()
    c.poll_once()
    assert registry.get_sample_value("cotenant_procfs_processes") == 0


@pytest.mark.parametrize(
    ("stat", "want"),
    [
        ("1 (systemd) S 0 1 1 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 42 0", ("systemd", 10, 42)),
        (
            "9 (my (odd) name) R 1 1 1 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 77 0",
            ("my (odd) name", 2, 77),
        ),
    ],
)
def test_stat_lines_with_odd_command_names_parse(stat: str, want: tuple[str, int, int]) -> None:
    assert parse_stat(stat) == want


@pytest.mark.parametrize(
    ("comm", "cmdline", "want"),
    [
        ("python3", b"python3\0-u\0burn.py\0--cores\0" + b"1\0", "python3 burn.py"),
        (
            "python3.11",
            b"/usr/bin/python3.11\0-m\0vllm.entrypoints\0",
            "python3.11 vllm.entrypoints",
        ),
        ("java", b"java\0-jar\0/opt/etl/etl.jar\0", "java etl.jar"),
        ("stress-ng", b"stress-ng\0--cpu\0" + b"8\0", "stress-ng"),
        ("python3", b"", "python3"),
        ("python3", b"python3\0-c\0while True: pass\0", "python3 -c"),
    ],
)
def test_interpreters_are_named_by_their_script(comm: str, cmdline: bytes, want: str) -> None:
    assert program_name(comm, cmdline) == want


def test_the_rows_are_what_diagnosis_reads_as_host_cpu(proc: FakeProc, tmp_path: Path) -> None:
    store = Store(tmp_path / "s.duckdb")
    writer = Writer(store, flush_interval_s=0.01)
    proc.process(80, "python3", 0.0, cmdline="python3 burn.py")
    c = collector(proc, writer.submit)  # type: ignore[arg-type]
    for k in range(6):
        c.poll_once()
        proc.tick()
        proc.process(80, "python3", (k + 1) * 0.5, cmdline="python3 burn.py")
    writer.close()
    cpu = host_cpu(StoreSource(store), TimeRange(T0, T0 + 6 * 1_000_000_000), 1.0, 6)
    store.close()
    assert list(cpu) == ["python3 burn.py"]
    np.testing.assert_allclose(cpu["python3 burn.py"][1:], 0.5)


def test_a_fleet_reads_host_cpu_of_the_gpus_own_node_only(tmp_path: Path) -> None:
    """Two nodes' host rows in one source (as Prometheus holds a cluster's): node-b's CPU hog
    must not reach the windows of node-a's GPU."""
    from cotenant.analysis.windows import gpu_windows
    from cotenant.store.bulk_load import append_tables
    from cotenant.store.schema import arrow_schema

    def rows(table: str, n: int, **cols: list[object]) -> pa.Table:
        schema = arrow_schema(table)
        return pa.table(
            [pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type)
             for f in schema], schema=schema,
        )  # fmt: skip

    ts = [T0 + k * 1_000_000_000 for k in range(6)]
    store = Store(tmp_path / "s.duckdb")
    append_tables(
        store,
        {
            "gpu_samples": rows("gpu_samples", 6, ts_ns=ts, host=["node-a"] * 6, gpu=["G"] * 6,
                                sm_util=[50.0] * 6),
            "process_samples": rows(
                "process_samples", 12, ts_ns=ts + ts, host=["node-a"] * 6 + ["node-b"] * 6,
                pid=[1] * 6 + [2] * 6, process_name=["etl-a"] * 6 + ["hog-b"] * 6,
                cpu_cores=[0.2] * 6 + [3.0] * 6,
            ),
        },
    )  # fmt: skip
    src, rng = StoreSource(store), TimeRange(T0, T0 + 6 * 1_000_000_000)
    w = gpu_windows(src, "G", rng, 1.0)
    assert w.hosts == {"node-a"}
    assert list(host_cpu(src, rng, 1.0, 6, w.hosts)) == ["etl-a"]
    assert sorted(host_cpu(src, rng, 1.0, 6)) == ["etl-a", "hog-b"]  # unfiltered: both
    store.close()


def test_serve_records_host_cpu_from_the_configured_procfs(proc: FakeProc, tmp_path: Path) -> None:
    (proc.root / "self" / "stat").write_text("1 (cotenant) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 0\n")
    proc.process(90, "java", 0.0, cmdline="java -jar etl.jar")
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_ENABLED": "false",
            "COTENANT_STORE_PATH": str(tmp_path / "s.duckdb"),
            "COTENANT_STORE_FLUSH_INTERVAL_S": "0.05",
            "COTENANT_NVML_ENABLED": "false",
            "COTENANT_DASHBOARD_ENABLED": "false",
            "COTENANT_ANALYSIS_ENABLED": "false",
            "COTENANT_PROCFS_ROOT": str(proc.root),
            "COTENANT_PROCFS_INTERVAL_S": "0.1",
        }
    )
    svc = Service(cfg)
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(30) and svc.procfs is not None
    deadline = time.monotonic() + 30
    rows: list[tuple[object, ...]] = []
    cpu_s = 0.0
    while not rows and time.monotonic() < deadline:
        cpu_s += 1.0  # the ETL job burns CPU between polls
        proc.process(90, "java", cpu_s, cmdline="java -jar etl.jar")
        time.sleep(0.05)
        with svc.store.cursor() as cur:
            rows = cur.execute(
                "SELECT pid, process_name, gpu FROM process_samples WHERE cpu_cores > 0"
            ).fetchall()
    svc.stop()
    t.join(60)
    assert rows and rows[0] == (90, "java etl.jar", None)


class _Windows:
    """A MetricSource that only has process windows (all host_cpu reads)."""

    def __init__(self, rows: list[tuple[int, str | None, int | None, str | None, float]]) -> None:
        from cotenant.core.frames import PROCESS_WINDOWS

        cols: dict[str, list[object]] = {n: [] for n in PROCESS_WINDOWS.names}
        for w, gpu, pid, name, cores in rows:
            for k, v in (
                ("ts_ns", T0 + w * 1_000_000_000), ("host", "h1"), ("gpu", gpu), ("pid", pid),
                ("process_name", name), ("model", None), ("sm_util", None), ("mem_util", None),
                ("mem_used_bytes", None), ("cpu_cores", cores), ("cpu_freq_mhz", None),
                ("cpu_max_freq_mhz", None),
            ):  # fmt: skip
                cols[k].append(v)
        self._t = pa.table(cols, schema=PROCESS_WINDOWS)

    def process_windows(
        self,
        rng: TimeRange,
        step_s: float,
        gpu: str | None = None,
        hosts: list[str] | None = None,
    ) -> pa.Table:
        return self._t


def test_host_cpu_sums_processes_of_one_name_and_counts_a_two_gpu_process_once() -> None:
    rows = [
        # eight burners are named alike: the name's use is their sum, not the last one read
        *[(w, None, 100 + k, "python burn.py", 0.5) for w in range(3) for k in range(4)],
        # a trainer with rows on two GPUs uses 1.5 cores, not 3
        *[(w, g, 7, "train", 1.5) for w in range(3) for g in ("gpu0", "gpu1")],
        (1, None, None, None, 0.25),  # no name nor pid: still its own series, not dropped
    ]
    cpu = host_cpu(_Windows(rows), TimeRange(T0, T0 + 3_000_000_000), 1.0, 3)  # type: ignore[arg-type]
    np.testing.assert_allclose(cpu["python burn.py"], [2.0, 2.0, 2.0])
    np.testing.assert_allclose(cpu["train"], [1.5, 1.5, 1.5])
    assert sorted(cpu) == ["pid None", "python burn.py", "train"]


def test_a_process_that_ran_for_part_of_an_incident_is_less_busy_than_one_throughout() -> None:
    """Real-contention run (seed 41): burners took 0.85 cores for the first 60 s of a 100-s
    incident; another engineer's Prometheus started 70 s in and took 1.06. Averaged over its own
    samples only, Prometheus rose more and was named; where the sampler ran and a process had no
    row, it was below the sampler's floor: ~0 cores."""
    from cotenant.analysis.cpu_causes import cpu_risers

    n = 200
    before = np.zeros(n, dtype=bool)
    before[:100] = True
    during = ~before
    burners = np.full(n, np.nan)
    burners[100:160] = 0.85
    prom = np.full(n, np.nan)
    prom[170:] = 1.06
    other = np.full(n, 0.1)  # the sampler ran in every window
    risers = cpu_risers({"burn": burners, "prometheus": prom, "serve": other}, before, during)
    assert [r.name for r in risers] == ["burn", "prometheus"]
    assert risers[0].during == pytest.approx(0.51) and risers[1].during == pytest.approx(0.318)


def _open_fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


def test_the_real_proc_is_reread_through_held_descriptors_released_when_processes_go(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    sink = Sink()
    # a low bar: on a loaded shared machine the burner may get far less than a core
    c = ProcfsCollector(sink=sink, resolver=GpuResolver(), host="node-1", min_cores=0.02)
    before = _open_fds()
    # a script of its own name: a busier process of the same name (another `python -c`, such
    # as a pytest-xdist worker) would carry the row under its own pid
    script = tmp_path / "procfs_burner.py"
    script.write_text("while True:\n    pass\n")
    burner = subprocess.Popen([sys.executable, str(script)])
    try:
        c.poll_once()
        held = _open_fds() - before
        assert held >= 2  # this process's stat and the burner's, at least
        time.sleep(0.5)
        c.poll_once()  # re-read through the held descriptors: a rate
        (row,) = [r for r in sink.rows() if r["pid"] == burner.pid]
        assert str(row["process_name"]).endswith(" procfs_burner.py")
        assert 0.02 <= float(row["cpu_cores"]) <= 1.2  # type: ignore[arg-type]
    finally:
        burner.kill()
        burner.wait()
    c.poll_once()  # the burner's pid left the listing: its descriptor is closed
    assert _open_fds() - before < held
    c.stop()
    assert _open_fds() == before


def test_more_processes_than_max_pids_reads_the_first_and_says_so(proc: FakeProc) -> None:
    registry = CollectorRegistry()
    for pid in range(100, 105):
        proc.process(pid, "p", 0.0)
    c = collector(proc, Sink(), metrics=ProcfsMetrics(registry), max_pids=3)
    c.poll_once()
    assert registry.get_sample_value("cotenant_procfs_processes") == 3
    assert registry.get_sample_value("cotenant_procfs_errors_total", {"kind": "truncated"}) == 1


def fake_cpufreq(root: Path, cur_khz: list[int], max_khz: int = 3_500_000) -> Path:
    """A /sys tree with cpufreq for ``len(cur_khz)`` CPUs (and a cpu directory without it)."""
    cpus = root / "devices" / "system" / "cpu"
    for i, khz in enumerate(cur_khz):
        d = cpus / f"cpu{i}" / "cpufreq"
        d.mkdir(parents=True, exist_ok=True)
        (d / "scaling_cur_freq").write_text(f"{khz}\n")
        (d / "cpuinfo_max_freq").write_text(f"{max_khz}\n")
    (cpus / "cpuidle").mkdir(parents=True, exist_ok=True)  # not a CPU
    (cpus / f"cpu{len(cur_khz)}").mkdir(exist_ok=True)  # a CPU without cpufreq
    return root


def test_each_row_carries_the_hosts_cpu_frequency_and_a_clamp_shows(
    proc: FakeProc, tmp_path: Path
) -> None:
    sys_root = fake_cpufreq(tmp_path / "sys", [3_000_000, 3_400_000])
    sink = Sink()
    c = collector(proc, sink, sys=sys_root)
    proc.process(20, "python3", 0.0, cmdline="python3 burn.py")
    c.poll_once()
    proc.tick()
    proc.process(20, "python3", 1.0, cmdline="python3 burn.py")
    c.poll_once()
    fake_cpufreq(tmp_path / "sys", [1_200_000, 1_200_000])  # capped: rewrites the files
    proc.tick()
    proc.process(20, "python3", 2.0, cmdline="python3 burn.py")
    c.poll_once()
    c.stop()
    rows = sink.rows()
    assert [(r["cpu_freq_mhz"], r["cpu_max_freq_mhz"]) for r in rows] == [
        (3200.0, 3500.0),
        (1200.0, 3500.0),
    ]


def test_without_cpufreq_the_frequency_is_null_and_nothing_fails(proc: FakeProc) -> None:
    sink, metrics = Sink(), ProcfsMetrics(CollectorRegistry())
    c = collector(proc, sink, sys=proc.root / "no-sys", metrics=metrics)
    proc.process(20, "python3", 0.0, cmdline="python3 burn.py")
    c.poll_once()
    proc.tick()
    proc.process(20, "python3", 1.0, cmdline="python3 burn.py")
    c.poll_once()
    [row] = sink.rows()
    assert row["cpu_freq_mhz"] is None and row["cpu_cores"] == pytest.approx(1.0)
    assert metrics.errors.labels("cpufreq")._value.get() == 0


def test_a_clamped_host_is_named_for_the_preprocess_it_slowed(
    proc: FakeProc, tmp_path: Path
) -> None:
    """procfs rows through the store to diagnosis: the preprocess growth goes to ``cpu:host``
    with the frequency's fall as evidence, no process having taken more CPU."""
    from analysis_frames import FAULT, N, _refresh, masks, windows

    from cotenant.analysis.attribution import attribute

    store = Store(tmp_path / "s.duckdb")
    writer = Writer(store, flush_interval_s=0.01)
    sys_root = tmp_path / "sys"
    c = collector(proc, writer.submit, sys=sys_root)  # type: ignore[arg-type]
    for k in range(N + 1):
        clamped = FAULT.start <= k - 1 < FAULT.stop
        fake_cpufreq(sys_root, [1_300_000 if clamped else 3_300_000 + 10_000 * (k % 3)] * 4)
        proc.process(80, "tts", 0.5 * k, cmdline="python3 serve.py")
        c.poll_once()
        proc.tick()
    c.stop()
    writer.close()
    cpu = host_cpu(StoreSource(store), TimeRange(T0, T0 + N * 1_000_000_000), 1.0, N)
    store.close()
    freq = cpu.frequency  # type: ignore[attr-defined]
    assert freq is not None and freq.mhz[FAULT.start + 5] < 0.5 * freq.mhz[10]
    w = windows()
    w.models["tts"]["preprocess_ms"][FAULT] = 15.0
    _refresh(w)
    att = attribute(w, "tts", *masks(), host_cpu=cpu)
    top = att.causes[0]
    assert (top.kind, top.culprit) == ("cpu", "host")
    assert top.evidence["series"] == "host CPU frequency"
    assert top.evidence["during"] < 0.5 * top.evidence["before"]
    steady = dict(cpu)  # the same cores without the frequency: no culprit, little confidence
    att2 = attribute(w, "tts", *masks(), host_cpu=steady)
    assert att2.causes[0].confidence < top.confidence
