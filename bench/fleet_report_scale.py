"""The fleet weekly report at scale: a week of the recording rules' minute series for N nodes,
backfilled with promtool into a real Prometheus, and central serve's report built on them.

Run ``nice -n 19 .venv/bin/python bench/fleet_report_scale.py --nodes 1 2 4`` (``--help``).

The history is what ``rules/fleet.rules.yml``'s group ``cotenant-fleet-rollups`` would have
recorded over the last complete ISO week — not raw agent series with the rules evaluated over
them: one sample per minute per series, minute ``M`` recorded at ``M + 60 s + --offset`` s,
with the labels the rules keep (:mod:`alerts.rules.fleet`). Per node, 8 GPUs x 4 models (each
GPU's models are its own, as in ``bench/fleet_scale.py``: 32 distinct models a node, the worst
case for per-model queries; one model of four is generative):

* per (model, GPU): requests, errors, latency sum ``{node,model,gpu}``; p50/p90/p95/p99
  ``{model,gpu}``; TTFT and TPOT p99 (generative models); four phases' sums ``{...,phase}``;
* per model: requests, p99 (max over GPUs), TTFT / TPOT p99 (generative), errors only in
  minutes with errors ``{model}``;
* per GPU: the eight ``cotenant:gpu_*`` series ``{host,gpu}`` and its tenants ``{gpu}``;
* per process (``--procs`` per GPU: one per model, the rest co-tenants without a model): SM
  share and memory ``{host,gpu,pid,process,model}``, host CPU ``{host,pid,process,model}``.

The week before is empty unless ``--weeks 2`` (it doubles the history); the report reads
both weeks (``ReportBuilder.build`` reads the week before's totals).

Measured per N, in a fresh child process that is central serve's report path (as in
``tests/e2e/test_fleet_report.py``): ``report_builder(cfg, store, fleet.week_rollups)
.build(week)`` — its wall time, its CPU, its peak RSS (``VmHWM``), Prometheus' CPU
(``/proc/<pid>/stat``), the bytes Prometheus sent and the queries it answered, and each
PromQL query's wall time (the slowest listed). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # after ROOT: tests/alerts is not alerts

import httpx  # noqa: E402
import numpy as np  # noqa: E402

S = 1_000_000_000
MIN_NS = 60 * S
GPUS, MODELS = 8, 4
PHASES = ("queue", "preprocess", "compute", "postprocess")


def _lb(**kv: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in kv.items() if v) + "}"


def _families(nodes: int, procs: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """(series name, [(label set, value kind)]) in the order written."""
    req = ["count", "errors", "sum"]
    fam: dict[str, list[tuple[str, str]]] = {}

    def add(name: str, labels: str, kind: str) -> None:
        fam.setdefault(name, []).append((labels, kind))

    for n in range(nodes):
        host = f"node-{n}"
        for g in range(GPUS):
            uuid = f"GPU-{n:03d}-{g}"
            for m in range(MODELS):
                model = f"model-{m}-n{n}-g{g}"
                full = _lb(node=host, model=model, gpu=uuid)
                for k, name in zip(
                    req,
                    (
                        "cotenant:requests:increase_minute",
                        "cotenant:request_errors:increase_minute",
                        "cotenant:request_latency_seconds:sum_minute",
                    ),
                    strict=True,
                ):
                    add(name, full, k)
                for q in ("p50", "p90", "p95", "p99"):
                    add(
                        f"cotenant:request_latency_seconds:{q}_minute",
                        _lb(model=model, gpu=uuid),
                        q,
                    )
                if m == 0:
                    for t in ("time_to_first_token_seconds", "time_per_output_token_seconds"):
                        add(f"cotenant:{t}:p99_minute", _lb(model=model, gpu=uuid), "p99")
                for p in PHASES:
                    add(
                        "cotenant:request_phase_seconds:sum_minute",
                        _lb(node=host, model=model, gpu=uuid, phase=p),
                        "phase",
                    )
                ml = _lb(model=model)
                add("cotenant:model_requests:increase_minute", ml, "count")
                add("cotenant:model_request_errors:increase_minute", ml, "errors")
                add("cotenant:model_request_latency_seconds:p99_max_minute", ml, "p99")
                if m == 0:
                    for t in ("time_to_first_token_seconds", "time_per_output_token_seconds"):
                        add(f"cotenant:model_{t}:p99_max_minute", ml, "p99")
            gl = _lb(host=host, gpu=uuid)
            for name, kind in (
                ("cotenant:gpu_sm_utilization:avg_minute", "ratio"),
                ("cotenant:gpu_memory_bandwidth_utilization:avg_minute", "ratio"),
                ("cotenant:gpu_pcie_bytes_per_second:avg_minute", "pcie"),
                ("cotenant:gpu_memory_used_bytes:max_minute", "mem"),
                ("cotenant:gpu_memory_total_bytes:max_minute", "const"),
                ("cotenant:gpu_power_watts:avg_minute", "power"),
                ("cotenant:gpu_sm_clock_ratio:min_minute", "clock"),
                ("cotenant:gpu_throttled:max_minute", "flag"),
            ):
                add(name, gl, kind)
            add("cotenant:gpu_tenants:count_minute", _lb(gpu=uuid), f"tenants{procs}")
            for k in range(procs):
                pid = str(10_000 + 100 * g + k)
                model = f"model-{k}-n{n}-g{g}" if k < MODELS else ""
                proc = f"python-{model}" if model else f"worker-{k}"
                pl = _lb(host=host, gpu=uuid, pid=pid, process=proc, model=model)
                add("cotenant:process_sm_utilization:avg_minute", pl, "share")
                add("cotenant:process_memory_used_bytes:max_minute", pl, "pmem")
                add(
                    "cotenant:process_cpu_cores:avg_minute",
                    _lb(host=host, pid=pid, process=proc, model=model),
                    "cpu",
                )
    return list(fam.items())


def _values(kind: str, rng: np.random.Generator, n: int) -> list[str]:
    """One series' per-minute values, as OpenMetrics text (rounded as a real series' would
    not be: only the size of the text depends on it)."""
    if kind == "count":
        v = rng.poisson(1200, n).astype(float)
    elif kind == "errors":
        v = rng.poisson(0.2, n).astype(float)
    elif kind in ("sum", "phase"):
        v = np.round(rng.normal(25.0 if kind == "sum" else 6.0, 1.0, n), 4)
    elif kind in ("p50", "p90", "p95", "p99"):
        base = {"p50": 0.02, "p90": 0.03, "p95": 0.035, "p99": 0.045}[kind]
        v = np.round(base * rng.lognormal(0, 0.1, n), 5)
    elif kind in ("ratio", "share"):
        v = np.round(rng.uniform(0.05, 0.9 if kind == "ratio" else 0.3, n), 4)
    elif kind == "pcie":
        v = np.round(rng.uniform(1e8, 5e9, n), -3)
    elif kind in ("mem", "pmem"):
        v = np.round(rng.uniform(1e9, 6e10 if kind == "mem" else 8e9, n), -6)
    elif kind == "const":
        v = np.full(n, 85899345920.0)
    elif kind == "power":
        v = np.round(rng.uniform(100, 600, n), 1)
    elif kind == "clock":
        v = np.round(rng.uniform(0.8, 1.0, n), 3)
    elif kind.startswith("tenants"):  # models and co-tenant processes (all over 1 % SM)
        v = np.full(n, float(kind[len("tenants") :]))
    elif kind == "flag":
        v = (rng.uniform(size=n) < 0.01).astype(float)
    else:  # cpu
        v = np.round(rng.uniform(0.0, 2.0, n), 3)
    return [repr(x) for x in v.tolist()]


def history(path: Path, nodes: int, procs: int, lo_ns: int, minutes: int, offset_s: float) -> int:
    """Write the week's recorded series as OpenMetrics; returns the samples written."""
    rng = np.random.default_rng(16)
    stamps = [f" {(lo_ns // S) + 60 * (i + 1) + offset_s:.3f}\n" for i in range(minutes)]
    written = 0
    with path.open("w") as f:
        for name, series in _families(nodes, procs):
            f.write(f"# TYPE {name} gauge\n")
            for labels, kind in series:
                pre = f"{name}{labels} "
                vals = _values(kind, rng, minutes)
                # the per-model errors are recorded only in minutes with errors
                sparse = name == "cotenant:model_request_errors:increase_minute"
                lines = [
                    pre + v + st
                    for v, st in zip(vals, stamps, strict=True)
                    if not (sparse and v == "0.0")
                ]
                f.write("".join(lines))
                written += len(lines)
        f.write("# EOF\n")
    return written


def _prom_metric(url: str, name: str, match: str) -> float:
    """The sum of Prometheus' own ``name`` samples whose line contains ``match``."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name) and match in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def report_child(url: str, week: str, db: str) -> None:
    """Central serve's report path, alone in this process: prints wall, CPU and peak RSS."""
    import threading

    from prometheus_client import CollectorRegistry

    from cotenant.app.config import load_config
    from cotenant.app.fleet import Fleet
    from cotenant.app.report_builder import report_builder
    from cotenant.collectors.prometheus.source import PrometheusSource
    from cotenant.reports.isoweek import parse_week
    from cotenant.store.db import Store

    cfg = load_config(
        env={"COTENANT_PROMETHEUS_URL": url, "COTENANT_PROMETHEUS_SCRAPE_INTERVAL_S": "15",
             "COTENANT_RULES_SLO_DEFAULT_MS": "50"}
    )  # fmt: skip
    # each query's wall time: wrapped, not replaced (the product path runs as it is)
    spent: list[tuple[float, str]] = []
    lock = threading.Lock()
    instant = PrometheusSource.instant

    def timed(self: PrometheusSource, query: str, at_ns: int | None = None) -> Any:
        t = time.perf_counter()
        try:
            return instant(self, query, at_ns)
        finally:
            with lock:
                spent.append((time.perf_counter() - t, query))

    PrometheusSource.instant = timed  # type: ignore[method-assign]
    store = Store(Path(db))
    fleet = Fleet(cfg, CollectorRegistry())
    rss0 = _vm("VmRSS")
    c0, w0 = time.process_time(), time.perf_counter()
    summary = report_builder(cfg, store, fleet.week_rollups).build(parse_week(week))
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    fleet.close()
    store.close()
    spent.sort(reverse=True)
    print(
        json.dumps(
            {
                "wall_s": round(wall, 2),
                "serve_cpu_s": round(cpu, 2),
                "rss_before_mib": rss0,
                "peak_rss_mib": _vm("VmHWM"),
                "queries": len(spent),
                "query_wall_s_sum": round(sum(t for t, _ in spent), 2),
                "slowest_queries": [[round(t, 2), q[:160]] for t, q in spent[:8]],
                "models_in_report": len(summary.models),
                "models_with_slo_minutes": sum(m.minutes > 0 for m in summary.models),
                "gpus_in_report": len(summary.gpus),
                "gpus_with_cotenancy": sum(g.cotenancy_h > 0 for g in summary.gpus),
            }
        )
    )


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    return -1


def run(
    nodes: int,
    procs: int,
    offset_s: float,
    tmp: Path,
    max_samples: int | None = None,
    weeks: int = 1,
) -> dict[str, Any]:
    from promserver import PROMETHEUS, start_prometheus
    from window_rules import proc_cpu

    from cotenant.reports.isoweek import last_complete_week

    promtool = str(Path(PROMETHEUS).with_name("promtool"))
    week = last_complete_week(time.time_ns())
    minutes = int((week.end_ns - week.start_ns) // MIN_NS)
    first = week.start_ns - (weeks - 1) * (week.end_ns - week.start_ns)
    om = tmp / "week.om"
    t0 = time.perf_counter()
    samples = history(om, nodes, procs, first, minutes * weeks, offset_s)
    written_s, om_mib = time.perf_counter() - t0, om.stat().st_size / 2**20
    t0 = time.perf_counter()
    blocks = tmp / "blocks"
    r = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=24h",
         str(om), str(blocks)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
    promtool_s = time.perf_counter() - t0
    om.unlink()
    out: dict[str, Any] = {
        "nodes": nodes,
        "weeks_of_history": weeks,
        "series": samples // (minutes * weeks),
        "samples": samples,
        "openmetrics_mib": round(om_mib),
        "written_s": round(written_s, 1),
        "promtool_s": round(promtool_s, 1),
        "week": str(week),
    }
    with start_prometheus(
        tmp / "prom",
        [],
        blocks=blocks,
        extra_args=(
            "--storage.tsdb.retention.time=60d",
            *([f"--query.max-samples={max_samples}"] if max_samples else []),
        ),
    ) as prom:
        pid = prom.proc.pid
        time.sleep(5)  # let the head settle after loading the blocks
        handler = 'handler="/api/v1/query"'
        b0 = _prom_metric(prom.url, "prometheus_http_response_size_bytes_sum", handler)
        q0 = _prom_metric(prom.url, "prometheus_http_requests_total", handler)
        p0 = proc_cpu(pid)
        child = subprocess.run(
            [sys.executable, __file__, "--_report", prom.url, str(week), str(tmp / "c.duckdb")],
            capture_output=True, text=True, check=False, env={**os.environ},
        )  # fmt: skip
        out["prometheus_cpu_s"] = round(proc_cpu(pid) - p0, 2)
        if child.returncode != 0:
            out["report_error"] = child.stderr[-3000:]
        else:
            out.update(json.loads(child.stdout.strip().splitlines()[-1]))
        out["prometheus_sent_mib"] = round(
            (_prom_metric(prom.url, "prometheus_http_response_size_bytes_sum", handler) - b0)
            / 2**20,
            1,
        )
        out["instant_queries"] = int(
            _prom_metric(prom.url, "prometheus_http_requests_total", handler) - q0
        )
    return out


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--_report":
        report_child(*sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--procs", type=int, default=20, help="processes per GPU")
    ap.add_argument(
        "--weeks",
        type=int,
        choices=(1, 2),
        default=1,
        help="weeks of history: 2 fills the week before too (the report reads its totals)",
    )
    ap.add_argument("--offset", type=float, default=17.25, help="the group's offset, s")
    ap.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help="Prometheus' --query.max-samples (default: its own, 50 M): a lower one shows, at a "
        "small N, the refusal a larger fleet meets",
    )
    a = ap.parse_args()
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    runs = []
    for n in a.nodes:
        with tempfile.TemporaryDirectory(prefix="fleet-report-") as d:
            runs.append(run(n, a.procs, a.offset, Path(d), a.max_samples, a.weeks))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "revision": rev,
                "nproc": os.cpu_count(),
                "date": time.strftime("%Y-%m-%d"),
                "procs_per_gpu": a.procs,
                "self_maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                "runs": runs,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
