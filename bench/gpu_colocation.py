"""Two processes on one GPU: a latency-sensitive victim and a bandwidth-heavy co-tenant.

Starts ``cotenant serve`` (NVML polled every ``--nvml-interval`` s, store in ``--out``), a
victim process running a small model loop instrumented with :mod:`collectors.instrument` and
exporting over OTLP/HTTP to the serve, and a co-tenant process that runs bandwidth-heavy
bursts at known times. Afterwards it stops the serve, reads the store and writes to ``--out``:

* ``victim_latency.csv``: every victim request (client-measured wall clock), in/out of burst;
* ``bursts.csv``: the co-tenant's logged burst start/end times;
* ``gpu_util.csv``: NVML device and per-process SM/memory utilisation samples;
* ``summary.json``: victim p50/p99 inside vs outside bursts, mean SM/memory util of the
  device and of each process inside vs outside bursts, and whether GPU counters existed.

Uses torch when importable (``--device cuda`` needs it), else numpy: only meaningful with
``--device cpu``, a check of this script's logic, not of GPU behaviour. See
docs/gpu-validation.md for how to run it.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VICTIM_MODEL = "coloc-victim"


def parse_bursts(text: str) -> list[tuple[float, float]]:
    """``"20:5,40:5"`` -> ``[(20.0, 5.0), (40.0, 5.0)]`` (start, length in seconds)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        start, _, length = part.partition(":")
        try:
            s, n = float(start), float(length)
        except ValueError:
            raise SystemExit(f"--bursts: {part!r} is not START:LENGTH in seconds") from None
        if s < 0 or n <= 0:
            raise SystemExit(f"--bursts: {part!r} needs START >= 0 and LENGTH > 0")
        out.append((s, n))
    return sorted(out)


def _torch() -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _wait_start() -> float:
    """Tell the parent we are ready, then wait for (and until) the shared start time."""
    print("ready", flush=True)
    t0 = float(sys.stdin.readline())
    time.sleep(max(0.0, t0 - time.time()))
    return t0


def run_victim(a: argparse.Namespace) -> int:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from cotenant.collectors.instrument import request

    resource = Resource.create(
        {
            "service.name": "gpu-colocation-victim",
            "process.pid": os.getpid(),
            "host.name": socket.gethostname(),
        }
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=a.otlp)))
    tracer = provider.get_tracer("gpu-colocation")

    torch, gpu = _torch(), None
    if torch is not None:
        dev = torch.device(a.device)
        x = torch.randn(8, 3, 64, 64, device=dev)
        conv = torch.nn.Conv2d(3, 32, 3, padding=1).to(dev)
        w = torch.randn(1024, 1024, device=dev)
        if a.device == "cuda":
            idx = torch.cuda.current_device()
            uuid = getattr(torch.cuda.get_device_properties(idx), "uuid", None)
            gpu = f"GPU-{uuid}" if uuid is not None else None

        def step() -> None:
            with torch.no_grad():
                y = conv(x).flatten(1)[:, :1024] @ w
                (y @ w).relu_()
            if a.device == "cuda":
                torch.cuda.synchronize()

    else:
        import numpy as np

        m = np.random.default_rng(0).standard_normal((256, 256))

        def step() -> None:
            y = m @ m
            _ = np.maximum(y @ m, 0.0)

    step()  # warm up before the clock starts
    t0 = _wait_start()
    with open(a.csv, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["ts_start_ns", "ts_end_ns", "latency_ms"])
        while time.time() < t0 + a.duration:
            start = time.time_ns()
            with (
                request(model=VICTIM_MODEL, gpu=gpu, tracer=tracer) as req,
                req.phase("compute"),
            ):
                step()
            end = time.time_ns()
            wr.writerow([start, end, round((end - start) / 1e6, 4)])
            time.sleep(a.interval)
    provider.shutdown()
    return 0


def run_cotenant(a: argparse.Namespace) -> int:
    torch = _torch()
    n = a.burst_mb * 2**20 // 4  # float32 elements
    if torch is not None:
        src = torch.ones(n, device=a.device)
        dst = torch.empty_like(src)

        def work() -> None:
            dst.copy_(src)
            src.add_(dst, alpha=1e-6)
            if a.device == "cuda":
                torch.cuda.synchronize()

    else:
        import numpy as np

        src = np.ones(n, dtype=np.float32)
        dst = np.empty_like(src)

        def work() -> None:
            np.copyto(dst, src)
            np.add(src, dst, out=src)

    t0 = _wait_start()
    with open(a.csv, "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["start_ns", "end_ns", "iterations"])
        for start, length in parse_bursts(a.bursts):
            time.sleep(max(0.0, t0 + start - time.time()))
            b0, iters = time.time_ns(), 0
            while time.time() < t0 + start + length:
                work()
                iters += 1
            wr.writerow([b0, time.time_ns(), iters])
            f.flush()
            print(f"burst {b0} .. {time.time_ns()} ({iters} iterations)", file=sys.stderr)
    return 0


def _start_serve(out: Path, interval: float) -> tuple[subprocess.Popen[str], dict[str, str]]:
    store = out / "store.duckdb"
    for p in (store, out / "store.duckdb.wal"):
        p.unlink(missing_ok=True)
    env = {
        **os.environ,
        "COTENANT_SERVER_PORT": "0",
        "COTENANT_OTLP_HTTP_PORT": "0",
        "COTENANT_OTLP_GRPC_PORT": "0",
        "COTENANT_NVML_POLL_INTERVAL_S": str(interval),
        "COTENANT_NVML_PROCESS_INTERVAL_S": str(interval),  # both processes at every poll
    }
    with (out / "serve.log").open("w") as log:
        cmd = [sys.executable, "-m", "cotenant", "serve", "--store", str(store)]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT
        )
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.match(r"listening api=(\S+) otlp_http=(\S+) otlp_grpc=(\S+)", line)
        if m:
            break
    else:
        proc.wait(30)
        raise SystemExit(f"cotenant serve did not start:\n{(out / 'serve.log').read_text()}")
    ep = {"api": m.group(1), "otlp_http": m.group(2), "otlp_grpc": m.group(3)}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{ep['api']}/readyz", timeout=2) as r:
                if r.status == 200:
                    return proc, ep
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("cotenant serve never became ready (see serve.log)")


def _spawn(role: str, a: argparse.Namespace, extra: list[str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", role, "--device", a.device]
    cmd += ["--duration", str(a.duration), "--bursts", a.bursts, "--interval", str(a.interval)]
    cmd += extra
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    p = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        p.kill()
        raise SystemExit(f"{role} process failed to start (exit {p.wait(30)})")
    return p


def _inside(ts: int, windows: list[tuple[int, int]]) -> bool:
    return any(s <= ts <= e for s, e in windows)


def _pcts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    import numpy as np

    vals = np.asarray([float(r["latency_ms"]) for r in rows])
    pct = {q: round(float(np.percentile(vals, q)), 4) if len(vals) else None for q in (50, 99)}
    return {"n": len(vals), "p50_ms": pct[50], "p99_ms": pct[99]}


def _means(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if r[key] is not None]
        return round(sum(vals) / len(vals), 3) if vals else None

    return {"n": len(rows), "sm_util_mean": mean("sm_util"), "mem_util_mean": mean("mem_util")}


def _split(rows: list[dict[str, Any]], stat: Any) -> dict[str, Any]:
    inside = [r for r in rows if r["in_burst"]]
    return {
        "inside_bursts": stat(inside),
        "outside_bursts": stat([r for r in rows if not r["in_burst"]]),
    }


def _read_store(store: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], int]:
    import duckdb

    with duckdb.connect(str(store), read_only=True) as con:
        q = "SELECT ts_ns, gpu, {} sm_util, mem_util FROM {} WHERE gpu IS NOT NULL ORDER BY ts_ns"
        gpu = con.execute(q.format("NULL AS pid,", "gpu_samples")).fetchall()
        proc = con.execute(q.format("pid,", "process_samples")).fetchall()
        n = con.execute("SELECT count(*) FROM requests WHERE model = ?", [VICTIM_MODEL])
        return gpu, proc, int((n.fetchone() or (0,))[0])


def run_driver(a: argparse.Namespace) -> int:
    torch = _torch()
    if a.device != "cpu" and (torch is None or not torch.cuda.is_available()):
        why = "torch is not installed" if torch is None else "torch sees no CUDA device"
        raise SystemExit(
            f"no GPU to run on ({why}). Run on a GPU host, or pass --device cpu "
            "for a logic check of this script (no GPU counters, not a GPU measurement)."
        )
    a.device = a.device or "cuda"
    bursts = parse_bursts(a.bursts)
    (out := Path(a.out)).mkdir(parents=True, exist_ok=True)
    burst_mb = a.burst_mb or (1024 if a.device == "cuda" else 64)

    serve, ep = _start_serve(out, a.nvml_interval)
    kids: list[subprocess.Popen[str]] = []
    try:
        vcsv, bcsv = out / "victim_latency.csv", out / "bursts.csv"
        kids.append(_spawn("victim", a, ["--otlp", ep["otlp_http"], "--csv", str(vcsv)]))
        kids.append(_spawn("cotenant", a, ["--csv", str(bcsv), "--burst-mb", str(burst_mb)]))
        t0 = time.time() + 0.2
        for k in kids:
            assert k.stdin is not None
            k.stdin.write(f"{t0}\n")
            k.stdin.close()
        for k in kids:
            if k.wait(a.duration + 120) != 0:
                raise SystemExit(f"a worker process failed (exit {k.returncode})")
    finally:
        for k in kids:
            if k.poll() is None:
                k.kill()
                k.wait(30)
            if k.stdout is not None:
                k.stdout.close()
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait(30)
        if serve.stdout is not None:
            serve.stdout.close()
    victim_pid, cot_pid = kids[0].pid, kids[1].pid

    with bcsv.open() as f:
        windows = [(int(r["start_ns"]), int(r["end_ns"])) for r in csv.DictReader(f)]
    with vcsv.open() as f:
        reqs = list(csv.DictReader(f))
    with vcsv.open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["ts_start_ns", "ts_end_ns", "latency_ms", "in_burst"])
        for r in reqs:
            r["in_burst"] = _inside(int(r["ts_start_ns"]), windows)
            wr.writerow([r["ts_start_ns"], r["ts_end_ns"], r["latency_ms"], int(r["in_burst"])])

    gpu_rows, proc_rows, stored = _read_store(out / "store.duckdb")
    roles = {victim_pid: "victim", cot_pid: "cotenant"}
    cols = ("ts_ns", "gpu", "pid", "sm_util", "mem_util")
    util = [{**dict(zip(cols, r, strict=True)), "role": "device"} for r in gpu_rows]
    util += [
        {**dict(zip(cols, r, strict=True)), "role": roles.get(r[2], "other")} for r in proc_rows
    ]
    with (out / "gpu_util.csv").open("w", newline="") as f:
        wr = csv.DictWriter(f, ["ts_ns", "role", "gpu", "pid", "in_burst", "sm_util", "mem_util"])
        wr.writeheader()
        for u in util:
            u["in_burst"] = _inside(u["ts_ns"], windows)
            wr.writerow({**u, "in_burst": int(u["in_burst"])})

    available = bool(gpu_rows)
    summary: dict[str, Any] = {
        "device": a.device,
        "backend": "torch" if _torch() is not None else "numpy",
        "duration_s": a.duration,
        "nvml_interval_s": a.nvml_interval,
        "bursts_planned": [list(b) for b in bursts],
        "bursts_observed_ns": [list(w) for w in windows],
        "gpu_counters_available": available,
        "gpu_counters_note": (
            f"{len(gpu_rows)} device and {len(proc_rows)} process samples from NVML"
            if available
            else "GPU counters unavailable: cotenant serve ran without NVML (see serve.log)"
        ),
        "victim": {
            "pid": victim_pid,
            "requests": len(reqs),
            "requests_in_store": stored,
            **_split(reqs, _pcts),
        },
        "cotenant": {"pid": cot_pid, "burst_mb": burst_mb},
        "util": {
            role: _split([u for u in util if u["role"] == role], _means)
            for role in ("device", "victim", "cotenant")
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    v = summary["victim"]
    print(
        f"victim p99 inside bursts {v['inside_bursts']['p99_ms']} ms, outside "
        f"{v['outside_bursts']['p99_ms']} ms; GPU counters "
        f"{'available' if available else 'unavailable'}; wrote {out}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds the victim runs")
    ap.add_argument("--bursts", default="20:5,40:5", help="START:LENGTH[,...] in seconds")
    ap.add_argument("--out", default="bench/out/gpu_colocation")
    ap.add_argument("--nvml-interval", type=float, default=0.1, help="NVML poll period (s)")
    ap.add_argument("--burst-mb", type=int, default=0, help="co-tenant buffer size (MiB)")
    ap.add_argument("--interval", type=float, default=0.01, help="victim pause between requests")
    ap.add_argument(
        "--role", choices=["driver", "victim", "cotenant"], default="driver", help=argparse.SUPPRESS
    )
    ap.add_argument("--otlp", help=argparse.SUPPRESS)
    ap.add_argument("--csv", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    return {"victim": run_victim, "cotenant": run_cotenant}.get(a.role, run_driver)(a)


if __name__ == "__main__":
    sys.exit(main())
