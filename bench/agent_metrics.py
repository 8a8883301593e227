"""``cotenant agent``: the size and cost of ``/metrics``, and the agent's CPU at a steady load.

Run ``.venv/bin/python bench/agent_metrics.py`` (``--help`` for sizes). Two parts:

* **scrape** — a real agent (``Service(role="agent")`` on loopback) with a FakeNvml of
  ``--gpus`` GPUs and ``--processes`` GPU processes, host CPU rows for as many programs, and
  ``--models`` models on every GPU whose requests spent time in every phase and waited on two
  locks (the worst case for series: every phase series exists). ``/metrics`` is fetched over
  HTTP as Prometheus does (``Accept: application/openmetrics-text``) ``--scrapes`` times; the
  figures are the median wall time of one scrape, its bytes, and the number of samples
  (series) in it. Goals: <= 50 ms and <= 5,000 series at 8 GPUs x 4 models x 20 processes.
* **overhead** — the same agent receiving ``--rps`` requests per second as real OTLP/HTTP
  exports (the OpenTelemetry SDK's exporter, one export of ``--rps x --export-every-s``
  requests every ``--export-every-s``, default 200 ms; seven spans a request), NVML polled at
  1 Hz, procfs at 1 Hz, for ``--seconds``: the agent's CPU time (all its threads: receivers,
  normalizer, writer, DuckDB, pollers) per wall second, against an idle agent over the same
  time, with each thread's share and FakeNvml's own (its Python stands in for the driver).
  Goal: <= 2 % of a core at 200 req/s. The senders run in another process, so their cost is
  not counted. Each window ends with the request histogram's fold, which a scrape does
  (its cost counted; its rendering is ``--part scrape``'s). The agent's store runs as
  ``cotenant agent`` runs it (hourly rollups, samples appended every ``[agent]
  flush_interval_s``, durable exports spooled as ``[agent] spool`` says).

Prints one JSON object; docs/performance.md records the figures with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from cotenant.app.config import AgentSettings, load_config  # noqa: E402
from cotenant.app.service import Service  # noqa: E402
from cotenant.collectors.nvml.fake import FakeNvml  # noqa: E402
from cotenant.core.phases import PHASE_COLUMNS  # noqa: E402
from cotenant.store.schema import arrow_schema  # noqa: E402

GIB = 1 << 30


def _agent(
    tmp: Path, fake: FakeNvml, procfs: bool, ack: str = "durable"
) -> tuple[Service, threading.Thread]:
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_ENABLED": "false",
            "COTENANT_STORE_PATH": str(tmp / "agent.duckdb"),
            "COTENANT_STORE_RAW_RETENTION_H": "2",
            "COTENANT_NVML_POLL_INTERVAL_S": "1",
            "COTENANT_NVML_HOST": "bench-node",
            "COTENANT_AGENT_NODE": "bench-node",
            "COTENANT_PROCFS_ENABLED": "true" if procfs else "false",
            "COTENANT_LOG_LEVEL": "warning",
            "COTENANT_STORE_ACK": ack,
            # as `cotenant agent` runs it ([agent] rollups = false: hourly, [agent]
            # flush_interval_s; cotenant/cli/main.py)
            "COTENANT_STORE_ROLLUP_INTERVAL_S": "3600",
            "COTENANT_STORE_FLUSH_INTERVAL_S": str(AgentSettings.flush_interval_s),
            # (a revision before the spool has no such key: the bench runs against both)
            **(
                {"COTENANT_STORE_SPOOL": str(AgentSettings.spool).lower()}
                if hasattr(AgentSettings, "spool")
                else {}
            ),
            # any other key from the environment, e.g. COTENANT_STORE_ROLLUP_INTERVAL_S
            **{k: v for k, v in os.environ.items() if k.startswith("COTENANT_")},
        }
    )
    svc = Service(cfg, nvml=fake, role="agent")
    t = threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True)
    t.start()
    assert svc.started.wait(60) and svc.endpoints is not None
    return svc, t


def _fleet_nvml(gpus: int, processes: int, timed: bool = False) -> tuple[FakeNvml, list[str]]:
    fake = _TimedNvml() if timed else FakeNvml()
    uuids = [fake.model.add_gpu() for _ in range(gpus)]
    rng = np.random.default_rng(5)
    for u in uuids:
        fake.model.set_gpu(u, sm_util=60, mem_util=30, memory_used_bytes=40 * GIB, power_w=400)
    for p in range(processes):
        pid = 5000 + p
        fake.model.add_process(uuids[p % gpus], pid, f"worker-{p}", 2 * GIB)
        fake.model.record_process_util(pid, int(rng.integers(5, 60)), 10)
    return fake, uuids


def _requests(models: int, uuids: list[str], per_pair: int) -> pa.Table:
    """Requests of every (model, GPU) pair, time in every phase, two locks per model."""
    pairs = [(f"model-{m}", u) for m in range(models) for u in uuids]
    n = per_pair * len(pairs)
    rng = np.random.default_rng(3)
    schema = arrow_schema("requests")
    lat = 20 * np.exp(0.5 * rng.standard_normal(n))
    cols: dict[str, Any] = {
        "ts_start_ns": np.full(n, time.time_ns() - 10**9, np.int64),
        "ts_end_ns": np.full(n, time.time_ns(), np.int64),
        "latency_ms": lat,
        "trace_id": [f"{i:032x}" for i in range(n)],
        "span_id": [f"{i:016x}" for i in range(n)],
        "model": [pairs[i % len(pairs)][0] for i in range(n)],
        "gpu": [pairs[i % len(pairs)][1] for i in range(n)],
        "status": ["ok"] * n,
        "source": ["ours"] * n,
        "lock_name": [f"lock-{i % 2}" for i in range(n)],
        "lock_holder": [f"holder-{i % 2}" for i in range(n)],
    }
    for c in PHASE_COLUMNS:
        cols[c] = lat / len(PHASE_COLUMNS)
    arrays = [
        pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _host_cpu(programs: int) -> pa.Table:
    schema = arrow_schema("process_samples")
    n = programs
    cols: dict[str, Any] = {
        "ts_ns": np.full(n, time.time_ns(), np.int64),
        "host": ["bench-node"] * n,
        "pid": np.arange(7000, 7000 + n),
        "process_name": [f"program-{i}" for i in range(n)],
        "cpu_cores": np.linspace(0.01, 2.0, n),
    }
    arrays = [
        pa.array(cols[f.name], f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def scrape(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    fake, uuids = _fleet_nvml(args.gpus, args.processes)
    svc, t = _agent(tmp, fake, procfs=False)
    try:
        assert svc.host_cpu is not None and svc.endpoints is not None
        svc.metrics.durations.observe_requests(_requests(args.models, uuids, 50))
        svc.host_cpu.tee(lambda _n, _t: None)("process_samples", _host_cpu(args.processes))
        url = f"{svc.endpoints.api}/metrics"
        om = {"Accept": "application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4"}
        with httpx.Client() as c:
            while "DCGM_FI_DEV_GPU_UTIL{" not in c.get(url).text:  # first NVML poll
                time.sleep(0.05)
            for _ in range(3):
                c.get(url, headers=om)  # warm-up
            times, sizes = [], []
            for _ in range(args.scrapes):
                t0 = time.perf_counter()
                body = c.get(url, headers=om).text
                times.append(time.perf_counter() - t0)
                sizes.append(len(body))
            plain = c.get(url).text
        samples = sum(len(f.samples) for f in text_string_to_metric_families(plain))
        by_family: dict[str, int] = {}
        for f in text_string_to_metric_families(plain):
            by_family[f.name] = len(f.samples)
        top = sorted(by_family.items(), key=lambda kv: -kv[1])[:6]
        return {
            "gpus": args.gpus,
            "models": args.models,
            "processes": args.processes,
            "scrape_ms_median": round(1e3 * statistics.median(times), 2),
            "scrape_ms_p90": round(1e3 * sorted(times)[int(0.9 * len(times))], 2),
            "bytes_openmetrics": int(statistics.median(sizes)),
            "series": samples,
            "largest_families": top,
            "exemplars": body.count("# {trace_id="),
        }
    finally:
        svc.stop()
        t.join(60)


def _sender(otlp: str, rps: int, seconds: float, every: float) -> subprocess.Popen[bytes]:
    code = f"""
import sys, time
sys.path.insert(0, {str(ROOT / "tests")!r})
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from spans import SpanFactory, MS
f = SpanFactory({{"service.name": "m", "host.name": "bench-node"}})
ex = OTLPSpanExporter(endpoint={otlp!r}, timeout=10)
per = max(1, round({rps} * {every}))
end = time.monotonic() + {seconds}
phases = [("preprocess", 0, 1), ("queue", 1, 3), ("lock.wait", 3, 4), ("transfer.h2d", 4, 5),
          ("compute", 5, 15), ("transfer.d2h", 15, 16)]
while time.monotonic() < end:
    t = time.monotonic()
    now = time.time_ns()
    for i in range(per):
        f.ours("model-%d" % (i % 4), now - 20 * MS, 18.0, phases,
               attrs={{"cotenant.gpu": "GPU-%d" % (i % 8)}}, lock=("kv", "batcher"))
    ex.export(f.take())
    time.sleep(max(0.0, {every} - (time.monotonic() - t)))
ex.shutdown()
"""
    return subprocess.Popen([sys.executable, "-c", code])


def _cpu_of_this_process() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class _TimedNvml(FakeNvml):
    """FakeNvml that adds up the CPU time its ``nvml*`` calls take (``time.thread_time``):
    what the real driver's ioctls would cost instead is not this, so the bench reports the
    agent's CPU with and without it."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu_s = 0.0
        for name in dir(FakeNvml):
            if name.startswith("nvml") and callable(getattr(FakeNvml, name)):
                setattr(self, name, self._timed(getattr(self, name)))

    def _timed(self, fn: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                self.cpu_s += time.thread_time() - t0

        return call


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_by_thread() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by Python thread name
    (``native:<tid>`` for threads Python did not start: DuckDB's, Arrow's)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        tid = int(task.name)
        name = names.get(tid, f"native:{tid}")
        name = "AnyIO worker thread" if name.startswith("AnyIO worker") else name
        name = "cotenant-otlp-http" if name.startswith("cotenant-otlp-http_") else name
        out[name] = out.get(name, 0.0) + cpu
    return out


def _thread_shares(
    before: dict[str, float], after: dict[str, float], wall: float
) -> dict[str, float]:
    shares = {k: (v - before.get(k, 0.0)) / wall for k, v in after.items()}
    return {k: round(v, 4) for k, v in sorted(shares.items(), key=lambda kv: -kv[1]) if v > 0}


def _fold(svc: Service) -> None:
    """What a scrape does to the request histogram before it renders it: fold the batches
    observed since the last read (FleetHistogram keeps them until then), here in the measured
    window so that its cost is counted (on the bench's main thread). The rendering itself is
    ``--part scrape``'s figure."""
    if svc.fleet_histogram is not None:
        _ = svc.fleet_histogram.series


def overhead(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    fake, _ = _fleet_nvml(args.gpus, args.processes, timed=True)
    assert isinstance(fake, _TimedNvml)
    svc, t = _agent(tmp, fake, procfs=True, ack=args.ack)
    try:
        assert svc.endpoints is not None and svc.endpoints.otlp_http is not None
        time.sleep(3)  # let start-up work settle
        c0, w0, f0, t0 = _cpu_of_this_process(), time.monotonic(), fake.cpu_s, _cpu_by_thread()
        time.sleep(args.seconds)
        _fold(svc)
        wall = time.monotonic() - w0
        idle = (_cpu_of_this_process() - c0) / wall
        idle_fake = (fake.cpu_s - f0) / wall
        idle_threads = _thread_shares(t0, _cpu_by_thread(), wall)
        sender = _sender(svc.endpoints.otlp_http, args.rps, args.seconds + 2, args.export_every_s)
        time.sleep(2)  # the sender's start-up (imports) is not load
        c0, w0, f0, t0 = _cpu_of_this_process(), time.monotonic(), fake.cpu_s, _cpu_by_thread()
        time.sleep(args.seconds)
        _fold(svc)
        wall = time.monotonic() - w0
        loaded = (_cpu_of_this_process() - c0) / wall
        loaded_fake = (fake.cpu_s - f0) / wall
        loaded_threads = _thread_shares(t0, _cpu_by_thread(), wall)
        sender.wait(60)
        n = httpx.get(f"{svc.endpoints.api}/metrics").text
        count = sum(
            s.value
            for f in text_string_to_metric_families(n)
            for s in f.samples
            if s.name == "cotenant_requests_ingested_total"
        )
        return {
            "rps": args.rps,
            "export_every_s": args.export_every_s,
            "ack": args.ack,
            "seconds": args.seconds,
            "requests_ingested": int(count),
            "cpu_share_idle": round(idle, 4),
            "cpu_share_loaded": round(loaded, 4),
            "cpu_share_of_the_load": round(loaded - idle, 4),
            # FakeNvml's own Python (stands in for the driver's ioctls), inside the figures above
            "fake_nvml_share_idle": round(idle_fake, 4),
            "fake_nvml_share_loaded": round(loaded_fake, 4),
            "cpu_share_loaded_without_fake_nvml": round(loaded - loaded_fake, 4),
            "threads_idle": idle_threads,
            "threads_loaded": loaded_threads,
        }
    finally:
        svc.stop()
        t.join(60)


def main() -> None:
    import prometheus_client

    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # as the CLI
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--models", type=int, default=4)
    p.add_argument("--processes", type=int, default=20)
    p.add_argument("--scrapes", type=int, default=50)
    p.add_argument("--rps", type=int, default=200)
    p.add_argument("--export-every-s", type=float, default=0.2, help="one export this often")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--ack", choices=("durable", "queued"), default="durable")
    p.add_argument("--part", choices=("scrape", "overhead", "both"), default="both")
    args = p.parse_args()
    import tempfile

    out: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    with tempfile.TemporaryDirectory() as d:
        if args.part in ("scrape", "both"):
            out["scrape"] = scrape(args, Path(d) / "s")
        if args.part in ("overhead", "both"):
            out["overhead"] = overhead(args, Path(d) / "o")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
