"""Ingest throughput and memory on one core: OTLP protobuf -> normalize -> DuckDB.

Run ``.venv/bin/python bench/ingest.py`` (``--help`` for sizes). Three measurements:

* **decode only** — ``ExportTraceServiceRequest.ParseFromString`` over the pre-encoded
  payloads: the ceiling any ingest path in this process can reach.
* **end to end** — per payload :func:`collectors.otlp.decode.decode` then
  :meth:`collectors.otlp.ingest.IngestPipeline.export`, then :meth:`store.writer.Writer.flush`: the
  clock stops when every row is committed to the DuckDB file on disk. One store per
  ``store.ack`` mode (``--acks``, both by default) runs through an untimed warm-up and all
  repeats, as a server's does (rollups, retention, checkpoints); the modes take turns within
  each repeat, so both see the same machine. Under ``durable`` each export returns only once
  its rows are committed: with ``--senders 1`` (the default) every export is its own commit,
  the worst case of group commit; ``--senders N`` sends from N threads, as a server's
  concurrent exporters do.
* **RSS** — a child process ingests until ``--requests`` requests are stored in one store and
  reports its resident set then (``VmRSS``) and at its peak (``ru_maxrss``).

Rates are spans (request roots and their children) per second of wall clock and per second of
the process's CPU time, medians over ``--repeats``.
"Per core": the process (and so the writer thread and DuckDB's, created later) is pinned to
one CPU and DuckDB runs with ``threads=1``. Payloads are 512 requests of eight serving
processes (four models on two hosts, eight GPUs) built with the OpenTelemetry SDK from a seeded
generator; ``--payloads`` distinct ones are made by re-stamping a few SDK-built templates
(timestamps shifted forward, trace ids changed) directly in their protobuf bytes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import platform
import pstats
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from google.protobuf import __version__ as protobuf_version  # noqa: E402
from google.protobuf.internal import api_implementation  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402
from spans import SpanFactory  # noqa: E402

from cotenant.collectors.gpu_resolve import GpuResolver  # noqa: E402
from cotenant.collectors.ingest_metrics import IngestMetrics  # noqa: E402
from cotenant.collectors.otlp.decode import PROTOBUF, decode  # noqa: E402
from cotenant.collectors.otlp.ingest import IngestPipeline  # noqa: E402
from cotenant.collectors.otlp.normalize import Normalizer  # noqa: E402
from cotenant.core.errors import Overloaded  # noqa: E402
from cotenant.store.db import Store  # noqa: E402
from cotenant.store.maintenance import Maintenance  # noqa: E402
from cotenant.store.settings import StoreSettings  # noqa: E402
from cotenant.store.writer import Writer  # noqa: E402

REQUESTS_PER_PAYLOAD = 512
TEMPLATES = 8  # SDK-built payloads; the rest are re-stamped copies
FLEET_RATE_RPS = 4000.0  # simulated arrival rate: sets how far each payload moves the clock
GOAL_SPANS_PER_S = 100_000
GOAL_RSS_MB = 300.0
SEED = 20240611
TEMPLATES_FILE = "payload-templates.bin"


@dataclass(frozen=True)
class Process:
    host: str
    pid: int
    gpu: str
    model: str
    compute_ms: float  # median compute time of one batch


MODELS = (("llama-3.1-8b", 38.0), ("mistral-7b", 30.0), ("sdxl-turbo", 85.0), ("bge-m3", 6.0))
PROCESSES = tuple(
    Process(
        host=f"gpu-node-{h}",
        pid=4100 + 10 * h + g,
        gpu=f"GPU-{h:02x}{g:02x}c0de-0000-4000-8000-00000000000{g}",
        model=MODELS[(g + h) % len(MODELS)][0],
        compute_ms=MODELS[(g + h) % len(MODELS)][1],
    )
    for h in range(2)
    for g in range(4)
)
LOCKS = ("kv_cache.alloc", "cuda.graph_pool", "tokenizer")


class _SeededIds(IdGenerator):
    """Trace and span ids from a seeded generator, so every run builds the same payloads."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def generate_span_id(self) -> int:
        return self._rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self._rng.getrandbits(128) or 1


def _add_request(f: SpanFactory, rng: random.Random, proc: Process, t0: int) -> None:
    phases: list[tuple[str, float, float]] = []
    t = 0.0

    def phase(name: str, dur_ms: float) -> None:
        nonlocal t
        phases.append((name, t, t + dur_ms))
        t += dur_ms + rng.uniform(0.01, 0.08)  # scheduling gaps land in other_ms

    phase("queue", rng.lognormvariate(math.log(2.0), 0.9))
    lock = None
    if rng.random() < 0.3:
        holder = rng.choice([m for m, _ in MODELS if m != proc.model])
        lock = (rng.choice(LOCKS), holder)
        phase("lock.wait", rng.expovariate(1 / 1.5))
    phase("preprocess", rng.lognormvariate(math.log(1.2), 0.4))
    phase("transfer.h2d", rng.lognormvariate(math.log(0.6), 0.5))
    phase("compute", proc.compute_ms * rng.lognormvariate(0.0, 0.3))
    phase("transfer.d2h", rng.lognormvariate(math.log(0.3), 0.5))
    phase("postprocess", rng.lognormvariate(math.log(0.8), 0.4))
    attrs: dict[str, Any] = {
        "cotenant.tenant": f"team-{rng.randrange(6)}",
        "cotenant.gpu": proc.gpu,
        "cotenant.batch_size": rng.choice((1, 2, 4, 8, 16, 32)),
        "cotenant.priority": rng.randrange(3),
        "gen_ai.usage.prompt_tokens": rng.randrange(16, 2048),
        "gen_ai.usage.completion_tokens": rng.randrange(1, 512),
    }
    latency = t + rng.uniform(0.05, 0.3)
    f.ours(proc.model, t0, latency, phases, attrs=attrs, lock=lock, error=rng.random() < 0.01)


def build_templates(n: int, base_ns: int, window_ns: int) -> list[bytes]:
    """``n`` encoded payloads of REQUESTS_PER_PAYLOAD requests starting in
    ``[base_ns, base_ns + window_ns)``, one ``resource_spans`` per serving process."""
    rng = random.Random(SEED)
    factories = []
    for p in PROCESSES:
        f = SpanFactory(
            {
                "host.name": p.host,
                "process.pid": p.pid,
                "service.name": f"serve-{p.model}",
                "service.instance.id": f"{p.host}-{p.pid}",
            },
            scope="bench",
        )
        # SpanFactory takes no id generator; the SDK's tracer reads this attribute per span
        f.tracer.id_generator = _SeededIds(rng)
        factories.append(f)
    per_proc = REQUESTS_PER_PAYLOAD // len(PROCESSES)
    out = []
    for _ in range(n):
        msg = ExportTraceServiceRequest()
        for f, proc in zip(factories, PROCESSES, strict=True):
            for _ in range(per_proc):
                _add_request(f, rng, proc, base_ns + rng.randrange(window_ns))
            msg.resource_spans.extend(f.otlp().resource_spans)
        out.append(msg.SerializeToString())
    return out


# -- re-stamping encoded payloads ------------------------------------------------------------


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    v = shift = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, i
        shift += 7


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """``(field number, wire type, value start, value end)`` of the message in buf[start:end]."""
    i = start
    while i < end:
        key, i = _varint(buf, i)
        wire = key & 7
        if wire == 0:
            j = _varint(buf, i)[1]
        elif wire == 1:
            j = i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            j = i + n
        elif wire == 5:
            j = i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} at byte {i}")
        yield key >> 3, wire, i, j
        i = j


def _spans(body: bytes) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of every Span in an encoded ExportTraceServiceRequest."""
    for f1, _, s1, e1 in _fields(body, 0, len(body)):
        if f1 != 1:  # resource_spans
            continue
        for f2, _, s2, e2 in _fields(body, s1, e1):
            if f2 != 2:  # scope_spans
                continue
            for f3, _, s3, e3 in _fields(body, s2, e2):
                if f3 == 2:  # spans
                    yield s3, e3


class Stamper:
    """Distinct copies of one encoded payload: each copy's span and event times moved forward
    and its trace ids changed (consistently, so children still find their root), by patching
    the fixed-width fields in place: no decode, no re-encode."""

    def __init__(self, body: bytes) -> None:
        times: list[int] = []
        traces: list[int] = []
        self.spans = 0
        for span in _spans(body):
            self.spans += 1
            for f, wire, s, e in _fields(body, *span):
                if f == 1 and e - s == 16:  # trace_id
                    traces.append(s)
                elif f in (7, 8) and wire == 1:  # start/end_time_unix_nano
                    times.append(s)
                elif f == 11:  # Event: time_unix_nano
                    times.extend(s2 for f2, w2, s2, _ in _fields(body, s, e) if f2 == w2 == 1)
        self.template = body
        self._body = np.frombuffer(body, dtype=np.uint8)
        lanes = np.arange(8, dtype=np.int32)
        self._times = np.asarray(times, dtype=np.int32)[:, None] + lanes
        self._traces = np.asarray(traces, dtype=np.int32)[:, None] + lanes

    def stamp(self, shift_ns: int, salt: int) -> bytes:
        buf = self._body.copy()
        t = buf[self._times].view("<u8") + np.uint64(shift_ns)
        buf[self._times] = t.view(np.uint8).reshape(-1, 8)
        ids = buf[self._traces].view("<u8") + np.uint64(salt & 0xFFFF_FFFF_FFFF_FFFF)
        buf[self._traces] = ids.view(np.uint8).reshape(-1, 8)
        return buf.tobytes()


WINDOW_NS = int(REQUESTS_PER_PAYLOAD / FLEET_RATE_RPS * 1e9)  # simulated time per payload


class PayloadStream:
    """Payload ``k`` is template ``k % TEMPLATES`` shifted by ``k`` payload windows."""

    def __init__(self, templates: list[bytes]) -> None:
        self._stampers = [Stamper(b) for b in templates]

    @classmethod
    def build(cls) -> PayloadStream:
        """Templates an hour old, well inside the store's raw retention."""
        return cls(build_templates(TEMPLATES, time.time_ns() - 3600 * 10**9, WINDOW_NS))

    def save(self, path: Path) -> None:
        """Write the templates (length-prefixed) for another process to :meth:`load`."""
        with path.open("wb") as f:
            for st in self._stampers:
                body = st.template
                f.write(struct.pack("<Q", len(body)) + body)

    @classmethod
    def load(cls, path: Path) -> PayloadStream:
        data, templates, i = path.read_bytes(), [], 0
        while i < len(data):
            (n,) = struct.unpack_from("<Q", data, i)
            templates.append(data[i + 8 : i + 8 + n])
            i += 8 + n
        return cls(templates)

    def spans(self, k: int) -> int:
        """Spans in payload ``k``."""
        return self._stampers[k % len(self._stampers)].spans

    def payload(self, k: int) -> bytes:
        st = self._stampers[k % len(self._stampers)]
        return st.stamp(k * WINDOW_NS, k * 0x9E3779B97F4A7C15)


# -- measurements ----------------------------------------------------------------------------


def pin_to_one_core(cpu: int) -> None:
    """Pin every thread of this process (and so every thread it starts later) to ``cpu``."""
    os.sched_setaffinity(0, {cpu})
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {cpu})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)


def rss_mb() -> float:
    """Current resident set (VmRSS) of this process, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def decode_only(bodies: list[bytes], passes: int = 5) -> float:
    """Seconds to parse every body once: the fastest of ``passes`` passes (the ceiling)."""
    best = math.inf
    for _ in range(passes):
        t0 = time.perf_counter()
        for body in bodies:
            ExportTraceServiceRequest().ParseFromString(body)
        best = min(best, time.perf_counter() - t0)
    return best


class Ingest:
    """The receiver's pipeline over a fresh store at ``path``, wired as ``cotenant serve``
    wires it (defaults of ``[store]``), with DuckDB on one thread."""

    def __init__(
        self,
        path: Path,
        memory_limit: str = StoreSettings.memory_limit,
        ack: str = StoreSettings.ack,
    ) -> None:
        for stale in (path, path.with_name(path.name + ".wal")):
            stale.unlink(missing_ok=True)
        self.store = Store(path, threads=1, memory_limit=memory_limit)
        self.metrics = IngestMetrics(CollectorRegistry())
        self.writer = Writer(self.store, maintenance=Maintenance(self.store), observer=self.metrics)
        self.pipeline = IngestPipeline(
            Normalizer(GpuResolver()), self.writer, self.metrics, ack=ack
        )
        self.retries = 0
        self.rejected = 0
        self._lock = threading.Lock()

    def export(self, msg: ExportTraceServiceRequest) -> None:
        while True:
            try:
                out = self.pipeline.export(msg, "http", "protobuf")
            except Overloaded:
                # a client backs off for Retry-After; waiting for the drain is the shortest
                # back-off that is still honest about the writer being the bottleneck
                with self._lock:
                    self.retries += 1
                self.writer.flush()
                continue
            with self._lock:
                self.rejected += out.rejected
            return

    def commits(self) -> int:
        """Appends of ``requests`` rows so far (one transaction each)."""
        v = self.metrics.registry.get_sample_value(
            "cotenant_store_write_seconds_count", {"table": "requests"}
        )
        return int(v or 0)

    def write_seconds(self) -> float:
        v = self.metrics.registry.get_sample_value(
            "cotenant_store_write_seconds_sum", {"table": "requests"}
        )
        return v or 0.0

    def stored(self) -> int:
        with self.store.cursor() as cur:
            row = cur.execute("SELECT count(*) FROM requests").fetchone()
        return int(row[0]) if row else 0

    def memory(self) -> dict[str, float]:
        """MiB resident (VmRSS), held by DuckDB's buffer manager, and in Arrow's pool."""
        with self.store.cursor() as cur:
            row = cur.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()
        duck = float(row[0]) if row and row[0] is not None else 0.0
        return {
            "rss_mb": rss_mb(),
            "duckdb_mb": duck / 2**20,
            "arrow_pool_mb": pa.total_allocated_bytes() / 2**20,
        }

    def close(self) -> None:
        self.writer.close()
        self.store.close()


def segment(ing: Ingest, bodies: list[bytes], senders: int = 1) -> dict[str, float]:
    """Send ``bodies`` through the pipeline (from ``senders`` threads, taking turns over the
    list) and wait until the writer has committed every row; seconds by part
    (``writer_append_s`` ran on the writer thread, inside ``total_s``; with several senders,
    ``decode_s`` and ``export_s`` add up their threads' time)."""
    parts = [0.0, 0.0]  # decode, export
    lock = threading.Lock()
    w0 = ing.write_seconds()
    c0 = ing.commits()

    def send(mine: list[bytes]) -> None:
        d = e = 0.0
        for body in mine:
            a = time.perf_counter()
            msg = decode(body, PROTOBUF)
            b = time.perf_counter()
            ing.export(msg)
            d += b - a
            e += time.perf_counter() - b
        with lock:
            parts[0] += d
            parts[1] += e

    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if senders == 1:
        send(bodies)
    else:
        threads = [
            threading.Thread(target=send, args=(bodies[i::senders],)) for i in range(senders)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    decode_s, export_s = parts
    t_sent = time.perf_counter()
    if not ing.writer.flush(timeout_s=600):
        raise RuntimeError("the writer did not drain within 600 s")
    t_end = time.perf_counter()
    cpu_s = time.process_time() - cpu0
    return {
        "cpu_s": cpu_s,
        "total_s": t_end - t0,
        "decode_s": decode_s,
        "export_s": export_s,
        "drain_s": t_end - t_sent,
        "writer_append_s": ing.write_seconds() - w0,
        "commits": ing.commits() - c0,
    }


def profile_run(stream: PayloadStream, path: Path, n: int, top: int) -> dict[str, Any]:
    """cProfile a warm-up and a measured segment of ``n`` payloads each into a fresh store.
    The receiving thread is profiled over the measured segment only, the writer thread over
    both (it starts with the store, so its one-off first retention pass is included)."""
    main_prof, writer_prof = cProfile.Profile(), cProfile.Profile()

    def start_writer_profile(*_: Any) -> None:
        sys.setprofile(None)
        writer_prof.enable()  # runs on the new writer thread, so it profiles that thread

    threading.setprofile(start_writer_profile)
    try:
        ing = Ingest(path)
    finally:
        threading.setprofile(None)
    segment(ing, [stream.payload(k) for k in range(n)])
    bodies = [stream.payload(k) for k in range(n, 2 * n)]
    main_prof.enable()
    segment(ing, bodies)
    main_prof.disable()
    ing.close()
    return {"receiver": _top(main_prof, top), "writer": _top(writer_prof, top)}


def _top(prof: cProfile.Profile, n: int) -> list[dict[str, Any]]:
    """The ``n`` functions with the most own time, lock waits (idle time) left out."""
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    busy = [kv for kv in stats.items() if "acquire' of '_thread" not in kv[0][2]]
    rows = sorted(busy, key=lambda kv: kv[1][2], reverse=True)[:n]
    return [
        {
            "function": f"{Path(f).name}:{line}({fn})" if line else fn,
            "ncalls": nc,
            "tottime_s": round(tt, 4),
            "cumtime_s": round(ct, 4),
        }
        for (f, line, fn), (_, nc, tt, ct, _) in rows
    ]


def throughput(args: argparse.Namespace, store_dir: Path, res: dict[str, Any]) -> None:
    """Decode-only and end-to-end rates per ``store.ack`` mode, interleaved per repeat over the
    same payloads, each mode into its own store that keeps running (as a server's does) after
    an untimed warm-up segment."""
    _progress(f"building payloads of {REQUESTS_PER_PAYLOAD} requests")
    stream = PayloadStream.build()
    stream.save(store_dir / TEMPLATES_FILE)
    n = args.payloads
    modes = args.acks.split(",")
    ings = {m: Ingest(store_dir / f"throughput-{m}.duckdb", args.memory_limit, m) for m in modes}
    for m, ing in ings.items():
        segment(ing, [stream.payload(k) for k in range(n)], args.senders)
        _progress(f"warm-up done ({m}): {n} payloads")
    dec: list[float] = []
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    parts: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for r in range(1, args.repeats + 1):
        ks = range(r * n, (r + 1) * n)  # distinct payloads in every repeat
        bodies = [stream.payload(k) for k in ks]
        spans = sum(stream.spans(k) for k in ks)
        dec.append(spans / decode_only(bodies))
        order = modes if r % 2 else modes[::-1]  # neither mode always runs first
        for m in order:
            parts[m].append(segment(ings[m], bodies, args.senders))
            wall[m].append(spans / parts[m][-1]["total_s"])
            cpu[m].append(spans / parts[m][-1]["cpu_s"])
        _progress(
            f"repeat {r}/{args.repeats}: decode only {dec[-1]:,.0f} spans/s; "
            + "; ".join(
                f"{m} end to end {wall[m][-1]:,.0f} spans/s ({cpu[m][-1]:,.0f} per CPU second)"
                for m in modes
            )
        )
    expected = (args.repeats + 1) * n * REQUESTS_PER_PAYLOAD
    for m, ing in ings.items():
        stored = ing.stored()
        ing.close()
        if stored != expected or ing.rejected:
            raise RuntimeError(
                f"{m}: stored {stored} requests of {expected} ({ing.rejected} rejected)"
            )
    res["payloads"] = {
        "count": n,
        "requests_each": REQUESTS_PER_PAYLOAD,
        "spans_each": spans / n,
        "bytes_each": statistics.mean(len(b) for b in bodies),
        "senders": args.senders,
    }
    res["decode_only"] = _summary(dec)
    res["modes"] = {}
    for m in modes:
        e2e = _summary(wall[m])
        e2e["median_seconds"] = {k: statistics.median(p[k] for p in parts[m]) for k in parts[m][0]}
        e2e["overload_retries"] = ings[m].retries
        res["modes"][m] = {
            "end_to_end": e2e,
            "end_to_end_per_cpu_second": _summary(cpu[m]),
            "ratio_end_to_end_to_decode": e2e["median"] / res["decode_only"]["median"],
        }
    res["peak_rss_mb_throughput_process"] = peak_rss_mb()
    if args.profile:
        _progress("profiling one end-to-end segment")
        res["profile"] = profile_run(stream, store_dir / "profile.duckdb", n, args.profile)


def rss_phase(
    stream: PayloadStream, path: Path, requests: int, memory_limit: str
) -> dict[str, Any]:
    """Ingest into one store until ``requests`` are stored; the resident set then, and how it
    moved on the way (``samples``: 50 points of :meth:`Ingest.memory`)."""
    ing = Ingest(path, memory_limit)
    base_rss = rss_mb()
    batches = math.ceil(requests / REQUESTS_PER_PAYLOAD)
    every = max(1, batches // 50)
    samples = []
    stamp_s = 0.0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for k in range(batches):
        a = time.perf_counter()
        body = stream.payload(k)
        if (k + 1) % every == 0:
            samples.append(
                {
                    "requests": (k + 1) * REQUESTS_PER_PAYLOAD,
                    **ing.memory(),
                    "queue_rows": ing.writer.queued_rows,
                }
            )
        if (k + 1) % (every * 5) == 0:
            _progress("rss: " + ", ".join(f"{key} {val:,.0f}" for key, val in samples[-1].items()))
        stamp_s += time.perf_counter() - a  # re-stamping and sampling are the bench's own
        ing.export(decode(body, PROTOBUF))
    if not ing.writer.flush(timeout_s=600):
        raise RuntimeError("the writer did not drain within 600 s")
    elapsed = time.perf_counter() - t0 - stamp_s
    cpu_s = time.process_time() - cpu0 - stamp_s
    spans = sum(stream.spans(k) for k in range(batches))
    at_end = ing.memory()
    out = {
        "requests_stored": ing.stored(),
        "spans": spans,
        "seconds": elapsed,
        "spans_per_s": spans / elapsed,
        "spans_per_cpu_s": spans / cpu_s,
        "rss_mb_at_end": at_end["rss_mb"],
        "duckdb_mb_at_end": at_end["duckdb_mb"],
        "arrow_pool_mb_at_end": at_end["arrow_pool_mb"],
        "peak_rss_mb": max(peak_rss_mb(), at_end["rss_mb"]),  # ru_maxrss can lag VmRSS
        "rss_mb_before_ingest": base_rss,
        "duckdb_memory_limit": memory_limit,
        "overload_retries": ing.retries,
        "rejected_spans": ing.rejected,
        "samples": samples,
    }
    ing.close()
    out["store_file_mb"] = path.stat().st_size / 2**20
    return out


# -- driver ----------------------------------------------------------------------------------


def _progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _run_rss_child(args: argparse.Namespace, store_dir: Path) -> dict[str, Any]:
    """The RSS phase in a fresh process, so its peak RSS is its own."""
    out = store_dir / "rss-result.json"
    cmd = [sys.executable, __file__, "--phase", "rss", "--requests", str(args.requests)]
    cmd += ["--store", str(store_dir), "--cpu", str(args.cpu), "--json", str(out)]
    cmd += ["--memory-limit", args.memory_limit, "--templates", str(store_dir / TEMPLATES_FILE)]
    subprocess.run(cmd, check=True)
    result: dict[str, Any] = json.loads(out.read_text())["rss"]
    return result


def _summary(xs: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def _revision() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "-uno"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted changes" if dirty else "")


def report(res: dict[str, Any]) -> str:
    env, lines = res["env"], []
    lines.append(
        f"cotenant ingest benchmark: cpu {env['cpu']} of nproc={env['nproc']}, "
        f"DuckDB {env['duckdb']} threads=1, protobuf {env['protobuf']} "
        f"({env['protobuf_backend']}), Python {env['python']}, at {env['revision']}"
    )
    if "modes" in res:
        p, d = res["payloads"], res["decode_only"]
        lines.append(
            f"{p['count']} payloads x {p['requests_each']} requests "
            f"({p['spans_each']:,.0f} spans, {p['bytes_each'] / 1024:.0f} KiB each) from "
            f"{p['senders']} sending thread(s), medians of {len(d['runs'])} repeats after a "
            "warm-up, each store.ack mode into its own running store, taking turns"
        )
        lines.append(f"{'':44}{'median':>12}{'min':>12}{'max':>12}")
        lines.append(
            f"{'decode only spans/s':44}{d['median']:>12,.0f}{d['min']:>12,.0f}{d['max']:>12,.0f}"
        )
        for mode, mr in res["modes"].items():
            e = mr["end_to_end"]
            for name, x in (
                (f"{mode}: end to end spans/s (wall clock)", e),
                (f"{mode}: end to end spans per CPU second", mr["end_to_end_per_cpu_second"]),
            ):
                lines.append(f"{name:44}{x['median']:>12,.0f}{x['min']:>12,.0f}{x['max']:>12,.0f}")
            per_cpu = mr["end_to_end_per_cpu_second"]["median"]
            ok = "met" if per_cpu >= GOAL_SPANS_PER_S else "NOT met"
            lines.append(f"{mode + ': goal >= 100,000 spans per CPU second':44}{ok:>12}")
            m = e["median_seconds"]
            lines.append(
                f"  {mode} seconds (median): total {m['total_s']:.2f} = decode "
                f"{m['decode_s']:.2f} + export (normalize, queue, count"
                f"{', wait for commit' if mode == 'durable' else ''}) {m['export_s']:.2f} + "
                f"drain {m['drain_s']:.2f}; DuckDB appends on the writer thread "
                f"{m['writer_append_s']:.2f} in {m['commits']:.0f} commits; "
                f"{e['overload_retries']} overload retries"
            )
        lines.append(f"peak RSS of this process: {res['peak_rss_mb_throughput_process']:.0f} MiB")
    if "rss" in res:
        r = res["rss"]
        ok = "met" if r["rss_mb_at_end"] <= GOAL_RSS_MB else "NOT met"
        lines.append(
            f"RSS phase: {r['requests_stored']:,} requests ({r['spans']:,} spans) "
            f"stored in {r['seconds']:.0f} s = {r['spans_per_s']:,.0f} spans/s sustained "
            f"({r['spans_per_cpu_s']:,.0f} per CPU second); {r['overload_retries']} overload "
            "retries"
        )
        lines.append(
            f"RSS with them stored: {r['rss_mb_at_end']:.0f} MiB (peak "
            f"{r['peak_rss_mb']:.0f} MiB, {r['rss_mb_before_ingest']:.0f} MiB before "
            f"ingest; store file {r['store_file_mb']:.0f} MiB); goal <= 300 MB {ok}"
        )
        lines.append(
            f"  of which DuckDB buffers {r['duckdb_mb_at_end']:.0f} MiB (memory_limit "
            f"{r['duckdb_memory_limit']}), Arrow pool {r['arrow_pool_mb_at_end']:.0f} MiB; "
            f"highest sampled RSS {max(x['rss_mb'] for x in r['samples']):.0f} MiB"
        )
    for thread, rows in res.get("profile", {}).items():
        lines.append(
            f"\ncProfile, {thread} thread, top {len(rows)} by own time (lock waits left out):"
        )
        lines.append(f"{'tottime s':>10}{'cumtime s':>10}{'ncalls':>10}  function")
        lines.extend(
            f"{x['tottime_s']:>10.3f}{x['cumtime_s']:>10.3f}{x['ncalls']:>10}  {x['function']}"
            for x in rows
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument(
        "--payloads",
        type=int,
        default=64,
        help="distinct payloads of 512 requests sent per repeat (default 64)",
    )
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    ap.add_argument(
        "--requests",
        type=int,
        default=1_000_000,
        help="requests stored by the RSS phase (default 1,000,000)",
    )
    ap.add_argument(
        "--store",
        type=Path,
        help="folder for the store files (default: a temporary folder, removed afterwards)",
    )
    ap.add_argument(
        "--cpu",
        type=int,
        default=max(os.sched_getaffinity(0)),
        help="the CPU to pin to (default: the highest allowed)",
    )
    ap.add_argument(
        "--memory-limit",
        default=StoreSettings.memory_limit,
        help=f"DuckDB memory_limit of the store, as [store] memory_limit (default "
        f"{StoreSettings.memory_limit})",
    )
    ap.add_argument(
        "--acks",
        default="durable,queued",
        help="store.ack modes measured side by side (default durable,queued)",
    )
    ap.add_argument(
        "--senders",
        type=int,
        default=1,
        help="threads sending exports concurrently (default 1: every durable export is its "
        "own commit)",
    )
    ap.add_argument("--phase", choices=("all", "throughput", "rss"), default="all")
    ap.add_argument(
        "--profile",
        type=int,
        default=15,
        metavar="N",
        help="cProfile one extra segment, show the top N functions per thread (0: skip)",
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--templates", type=Path, help=argparse.SUPPRESS)  # parent -> RSS child
    args = ap.parse_args(argv)
    for mode in args.acks.split(","):
        if mode not in ("durable", "queued"):
            ap.error(f"--acks: {mode!r} is not durable or queued")
    for key in ("payloads", "repeats", "requests", "senders"):
        if getattr(args, key) < 1:
            ap.error(f"--{key} must be at least 1, got {getattr(args, key)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_to_one_core(args.cpu)
    res: dict[str, Any] = {
        "env": {
            "cpu": args.cpu,
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "duckdb": duckdb.__version__,
            "pyarrow": pa.__version__,
            "protobuf": protobuf_version,
            "protobuf_backend": api_implementation.Type(),
            "revision": _revision(),
        }
    }
    with tempfile.TemporaryDirectory(prefix="cotenant-bench-") as tmp:
        store_dir = args.store or Path(tmp)
        store_dir.mkdir(parents=True, exist_ok=True)
        if args.phase in ("all", "throughput"):
            throughput(args, store_dir, res)
        if args.phase == "rss":
            _progress(f"rss: ingesting {args.requests:,} requests into one store")
            # under --phase all the parent built the templates: building them here would leave
            # the SDK's garbage in this process's heap and count it as ingest's
            stream = PayloadStream.load(args.templates) if args.templates else PayloadStream.build()
            res["rss"] = rss_phase(
                stream, store_dir / "rss.duckdb", args.requests, args.memory_limit
            )
        elif args.phase == "all":
            res["rss"] = _run_rss_child(args, store_dir)
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    if args.phase != "rss" or not args.json:
        print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
