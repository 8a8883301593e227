"""The processes of ``bench/real_contention.py``: model servers that emit spans, and CPU burners
that emit none.

``python bench/contention_workers.py model --name tts --rate 40 --work-ms 1.5 --seconds 240
--otlp http://127.0.0.1:4318/v1/traces`` serves requests for ``--seconds``: Poisson arrivals
at ``--rate`` per second (open loop: arrivals do not wait for the server; ``--rate 0`` serves
back to back), one at a time in arrival order, each ``--work-ms`` of single-threaded NumPy work
measured on an idle core at start. Every request is one root span with our conventions
(``cotenant.model``, ``cotenant.gpu = gpu0``, ``cotenant.tenant``, ``cotenant.batch_size = 1``)
and the children ``queue`` (arrival to start) and ``compute``, exported with the plain
OpenTelemetry SDK (``BatchSpanProcessor`` + OTLP/HTTP) from a resource naming
``service.name`` and ``process.pid``. It stops after ``--seconds`` or ``--max-requests``.

``python bench/contention_workers.py burn --seconds 60`` spins one core in pure Python for
``--seconds``, and emits nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core per request, as a CPU-bound model server

import numpy as np  # noqa: E402


def burn(seconds: float) -> int:
    end = time.monotonic() + seconds
    x = 0
    while time.monotonic() < end:
        for _ in range(10_000):
            x += 1
    return 0


def calibrate(work_ms: float, a: np.ndarray) -> int:
    """Matrix products that take ``work_ms`` on this core now (fastest of 5 tries)."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20):
            a @ a
        best = min(best, (time.perf_counter() - t0) / 20)
    return max(1, round(work_ms / 1000 / best))


def serve_model(args: argparse.Namespace) -> int:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": args.name, "process.pid": os.getpid()})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=args.otlp, timeout=5), schedule_delay_millis=500
        )
    )
    tracer = provider.get_tracer("real-contention")
    rng = np.random.default_rng(args.seed)
    a = rng.random((args.matrix, args.matrix))
    iters = calibrate(args.work_ms, a)
    attrs = {
        "cotenant.model": args.name,
        "cotenant.gpu": "gpu0",
        "cotenant.tenant": "bench",
        "cotenant.batch_size": 1,
    }
    end = time.time_ns() + int(args.seconds * 1e9)
    arrival = time.time_ns()
    served = 0
    while served < args.max_requests:
        if args.rate > 0:
            arrival += int(rng.exponential(1e9 / args.rate))
        else:
            arrival = time.time_ns()
        if arrival >= end:
            break
        wait = (arrival - time.time_ns()) / 1e9
        if wait > 0:
            time.sleep(wait)
        start = time.time_ns()
        for _ in range(iters):
            a @ a
        done = time.time_ns()
        root = tracer.start_span("request", start_time=arrival, attributes=attrs)
        ctx = trace.set_span_in_context(root)
        tracer.start_span("queue", context=ctx, start_time=arrival).end(end_time=start)
        tracer.start_span("compute", context=ctx, start_time=start).end(end_time=done)
        root.end(end_time=done)
        served += 1
    provider.shutdown()  # flushes what is queued
    print(
        f"{args.name} pid {os.getpid()}: {served} requests, {iters} products each", file=sys.stderr
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model", help="serve a model's requests and emit their spans")
    m.add_argument("--name", required=True)
    m.add_argument("--rate", type=float, required=True, help="arrivals per second; 0: back to back")
    m.add_argument("--work-ms", type=float, required=True)
    m.add_argument("--seconds", type=float, required=True)
    m.add_argument("--otlp", required=True, help="OTLP/HTTP traces endpoint (loopback)")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--matrix", type=int, default=48, help="side of the matrices multiplied")
    m.add_argument("--max-requests", type=int, default=1_000_000)
    b = sub.add_parser("burn", help="spin one core, emit nothing")
    b.add_argument("--seconds", type=float, required=True)
    args = ap.parse_args(argv)
    if args.cmd == "burn":
        return burn(args.seconds)
    if not args.otlp.startswith("http://127.0.0.1:"):
        ap.error("--otlp must be a loopback http://127.0.0.1:PORT/... endpoint")
    return serve_model(args)


if __name__ == "__main__":
    sys.exit(main())
