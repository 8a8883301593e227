"""Central diagnosis at fleet scale: one hour of a fleet's agent series, backfilled with
promtool into a real Prometheus, read by central serve's analysis through PrometheusSource.

Run ``.venv/bin/python bench/fleet_scale.py --nodes 16`` (``--help``; the issue's size is
``--nodes 64``). The history is synthetic but has the agent's exact series: per (node, GPU,
model; each GPU's models are its own) the latency histogram (49 buckets + ``+Inf``,
``_count``, ``_sum``) and two phases (``compute``, ``queue``); per GPU the DCGM-named
counters; per model process its SM share and memory; a scrape every ``--scrape`` s. Latency
is log-normal (median 20 ms) at 20 requests/s per model. On node 0, GPU 0
``model-1-n0-g0``'s traffic rises eightfold from minute 40 to 46 and ``model-0-n0-g0``'s
compute time doubles while the GPU's SM use and model-1's SM share climb.

Measured (each the median of ``--repeats``):

* **one 1-hour diagnosis** — ``Analyzer.diagnose(model-0-n0-g0, last hour)`` at 15 s and 5 s
  windows: wall time (the goal: <= 2 s at 64 nodes), and that it names ``model-1-n0-g0``;
* **the continuous loop** — ``AnalysisLoop.run_once`` over the whole fleet (every GPU of every
  node, horizon ``--horizon`` s, 5 s windows): the first pass (reads the whole horizon) and a
  following pass 15 s later (re-reads only the overlap), as wall time and CPU seconds of this
  process and of Prometheus (``/proc/<pid>/stat``); loop cost in cores = CPU per pass /
  ``analysis.interval_s`` (15 s here). The goal: <= 1 core at 64 nodes. Five passes, 15 s
  apart: the first, three that re-read the last minute, and one that re-reads the whole range
  (every ``[analysis] full_read_s``, 60 s by default); cores over that minute, and with
  ``full_read_s = 600`` (computed from the same passes);
* with ``--rules``: the loop's window rules (``cotenant-fleet-windows``) backfilled with
  ``promtool tsdb create-blocks-from rules``, so PrometheusSource reads recorded series, and
  Prometheus' CPU for one evaluation of the group (its rules as instant queries), as cores at
  an evaluation every scrape interval.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
from promserver import PROMETHEUS, start_prometheus  # noqa: E402
from scipy.stats import norm  # noqa: E402
from window_rules import backfill_window_rules, proc_cpu, window_rules  # noqa: E402

from cotenant.analysis.analyzer import Analyzer  # noqa: E402
from cotenant.analysis.incidents import IncidentBook  # noqa: E402
from cotenant.analysis.loop import AnalysisLoop  # noqa: E402
from cotenant.collectors.fleet_histogram import NAME, TOTAL_BUCKETS_S  # noqa: E402
from cotenant.collectors.prometheus.source import PrometheusSource  # noqa: E402
from cotenant.store.db import Store  # noqa: E402

S = 1_000_000_000
PROMTOOL = str(Path(PROMETHEUS).with_name("promtool"))
FAULT_MIN = (40, 46)


def _model(node: int, gpu: int, m: int) -> str:
    """Each GPU serves its own models (replicas of one model would be diagnosed on every GPU
    they run on: the cost of one diagnosis is per GPU)."""
    return f"model-{m}-n{node}-g{gpu}"


def _lb(**kv: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in kv.items()) + "}"


def history(path: Path, nodes: int, gpus: int, models: int, minutes: int, scrape: float,
            t0_s: int) -> int:  # fmt: skip
    """Write the fleet's OpenMetrics; returns the samples written."""
    rng = np.random.default_rng(7)
    n = int(minutes * 60 / scrape) + 1
    ts = t0_s + scrape * np.arange(n)
    stamps = [f" {t:.3f}" for t in ts.tolist()]
    minute = (ts - t0_s) / 60.0
    fault = (minute >= FAULT_MIN[0]) & (minute < FAULT_MIN[1])
    les = [*(repr(float(b)) for b in TOTAL_BUCKETS_S), "+Inf"]
    edges = np.log(np.asarray(TOTAL_BUCKETS_S))
    written = 0
    with path.open("w") as f:
        f.write(f"# TYPE {NAME} histogram\n")
        for node in range(nodes):
            for g in range(gpus):
                uuid = f"GPU-{node:03d}-{g}"
                for m in range(models):
                    hot = node == 0 and g == 0
                    rate = np.full(n, 20.0)
                    median = np.full(n, 0.020)
                    if hot and m == 1:
                        rate = np.where(fault, 160.0, rate)
                    if hot and m == 0:
                        median = np.where(fault, 0.040, median)
                    per = rng.poisson(rate * scrape)
                    per[0] = 0
                    # bucket shares of a log-normal (sigma 0.3) per scrape interval
                    cdf = norm.cdf((edges[None, :] - np.log(median)[:, None]) / 0.3)
                    p = np.diff(np.concatenate([np.zeros((n, 1)), cdf, np.ones((n, 1))], 1), axis=1)
                    counts = rng.multinomial(per, p)
                    cum = counts.cumsum(axis=0).cumsum(axis=1).tolist()
                    total = [r[-1] for r in cum]
                    lat_sum = np.cumsum(per * median * np.exp(0.045)).tolist()
                    base = {"node": f"node-{node}", "model": _model(node, g, m), "gpu": uuid}
                    pre = [f"{NAME}_bucket{_lb(**base, phase='total', le=le)} " for le in les]
                    cnt = f"{NAME}_count{_lb(**base, phase='total')} "
                    sm = f"{NAME}_sum{_lb(**base, phase='total')} "
                    out = []
                    for i in range(n):
                        st = stamps[i]
                        out += [f"{a}{c}{st}" for a, c in zip(pre, cum[i], strict=True)]
                        out.append(f"{cnt}{total[i]}{st}")
                        out.append(f"{sm}{lat_sum[i]!r}{st}")
                    for phase, share in (("compute", 0.8), ("queue", 0.2)):
                        inf = f"{NAME}_bucket{_lb(**base, phase=phase, le='+Inf')} "
                        pc_ = f"{NAME}_count{_lb(**base, phase=phase)} "
                        ps = f"{NAME}_sum{_lb(**base, phase=phase)} "
                        for i in range(n):
                            st = stamps[i]
                            v = lat_sum[i] * share
                            out += [
                                f"{inf}{total[i]}{st}",
                                f"{pc_}{total[i]}{st}",
                                f"{ps}{v!r}{st}",
                            ]
                    f.write("\n".join(out) + "\n")
                    written += len(out)
        gauges: dict[str, list[str]] = {}
        for node in range(nodes):
            for g in range(gpus):
                uuid = f"GPU-{node:03d}-{g}"
                hot = node == 0 and g == 0
                lb = _lb(gpu=str(g), UUID=uuid, device=f"nvidia{g}", Hostname=f"node-{node}")
                sm = np.where(fault & hot, 97.0, 45.0) + rng.normal(0, 1, n)
                for name, v in (
                    ("DCGM_FI_DEV_GPU_UTIL", sm),
                    ("DCGM_FI_DEV_MEM_COPY_UTIL", sm / 2),
                    ("DCGM_FI_DEV_FB_USED", np.full(n, 40000.0)),
                    ("DCGM_FI_DEV_FB_FREE", np.full(n, 40000.0)),
                    ("DCGM_FI_DEV_POWER_USAGE", sm * 6),
                    ("DCGM_FI_DEV_SM_CLOCK", np.full(n, 1980.0)),
                    ("DCGM_FI_DEV_MAX_SM_CLOCK", np.full(n, 1980.0)),
                    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", np.zeros(n)),
                ):
                    gauges.setdefault(name, []).extend(
                        f"{name}{lb} {x!r}{st}" for x, st in zip(v.tolist(), stamps, strict=True)
                    )
                for m in range(models):
                    share = np.where(fault & hot & (m == 1), 60.0, 10.0) + rng.normal(0, 0.5, n)
                    name_m = _model(node, g, m)
                    plb = _lb(host=f"node-{node}", gpu=uuid, pid=str(1000 + m),
                              process=name_m, model=name_m)  # fmt: skip
                    for name, v in (
                        ("cotenant_gpu_process_sm_utilization_ratio", share / 100),
                        ("cotenant_gpu_process_memory_used_bytes", np.full(n, 8e9)),
                    ):
                        gauges.setdefault(name, []).extend(
                            f"{name}{plb} {x!r}{st}"
                            for x, st in zip(v.tolist(), stamps, strict=True)
                        )
        for name, lines in gauges.items():
            f.write(f"# TYPE {name} gauge\n" + "\n".join(lines) + "\n")
            written += len(lines)
        f.write("# EOF\n")
    return written


def rule_cost(prom: Any, scrape: float, end_ns: int, evaluations: int = 4) -> dict[str, float]:
    """Prometheus' CPU for one evaluation of the window group: each rule as an instant query
    at the times a rule manager would evaluate it (the work of an evaluation, without the
    writing of its output); cores = that / the scrape interval (the group's interval)."""
    group = window_rules(scrape)
    p0 = proc_cpu(prom.proc.pid)
    for i in range(evaluations):
        at = (end_ns - (200 - i * scrape) * S) / S
        for rule in group["rules"]:
            r = httpx.get(f"{prom.url}/api/v1/query", params={"query": rule["expr"], "time": at},
                          timeout=120)  # fmt: skip
            r.raise_for_status()
    per = (proc_cpu(prom.proc.pid) - p0) / evaluations
    return {"prometheus_cpu_s_per_evaluation": round(per, 3), "cores": round(per / scrape, 3)}


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--models", type=int, default=4)
    p.add_argument("--minutes", type=int, default=60)
    p.add_argument("--scrape", type=float, default=15.0)
    p.add_argument("--horizon", type=float, default=600.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--rules",
        action="store_true",
        help="backfill the loop's window rules (fleet.rules.yml, cotenant-fleet-windows) too, "
        "so PrometheusSource reads recorded series",
    )
    args = p.parse_args()
    now_s = int(time.time())
    t0_s = (now_s // 3600 - 3) * 3600
    end_ns = (t0_s + args.minutes * 60) * S
    out: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "models_per_gpu": args.models,
        "minutes": args.minutes,
        "scrape_s": args.scrape,
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t = time.perf_counter()
        samples = history(tmp / "h.om", args.nodes, args.gpus, args.models, args.minutes,
                          args.scrape, t0_s)  # fmt: skip
        out["samples"] = samples
        out["generate_s"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        r = subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "h.om"),
             str(tmp / "blocks")], capture_output=True, text=True, check=False,
        )  # fmt: skip
        if r.returncode:
            raise SystemExit(r.stderr[-2000:])
        (tmp / "h.om").unlink()
        out["promtool_s"] = round(time.perf_counter() - t, 1)
        if args.rules:
            out["window_rules"] = backfill_window_rules(
                tmp, tmp / "blocks", args.scrape, t0_s, t0_s + args.minutes * 60
            )
        with start_prometheus(tmp / "prom", [], blocks=tmp / "blocks", ready_timeout_s=300) as prom:
            store = Store(":memory:")
            src = PrometheusSource(prom.url, timeout_s=120, scrape_interval_s=args.scrape)
            if os.environ.get("FLEET_SCALE_PROFILE") == "diagnose":
                import cProfile

                an = Analyzer(src, IncidentBook(store), step_s=15.0)
                cProfile.runctx(
                    'an.diagnose(_model(0, 0, 0), end_ns - 3600 * S, end_ns)',
                    globals(), locals(), sort="cumulative",
                )  # fmt: skip
                return
            for step in () if os.environ.get("FLEET_SCALE_PROFILE") else (15.0, 5.0):
                an = Analyzer(src, IncidentBook(store), step_s=step)
                walls, named = [], None
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    got = an.diagnose(_model(0, 0, 0), end_ns - 3600 * S, end_ns)
                    walls.append(time.perf_counter() - t)
                    hot = [x for x in got["diagnoses"] if x["gpu"] == "GPU-000-0"]
                    named = hot[0]["causes"][0] if hot and hot[0]["causes"] else None
                out[f"diagnose_1h_step_{step:g}s"] = {
                    "wall_s_median": round(statistics.median(walls), 3),
                    "top_cause": None if named is None else f"{named['kind']} {named['culprit']}",
                }
            clock = [end_ns - 120 * S]
            loop = AnalysisLoop(src, IncidentBook(store), interval_s=15.0, horizon_s=args.horizon,
                                step_s=5.0, clock_ns=lambda: clock[0], reread_s=60.0,
                                batch_reads=not os.environ.get("FLEET_SCALE_PER_GPU"))  # fmt: skip
            if os.environ.get("FLEET_SCALE_PROFILE") == "loop":
                import cProfile

                loop.run_once()
                clock[0] += 15 * S
                cProfile.runctx("loop.run_once()", globals(), locals(), sort="tottime")
                return
            passes = []
            for _ in range(5):  # the first; three that re-read the overlap; a refresh (60 s)
                c0, p0, w0 = _self_cpu(), proc_cpu(prom.proc.pid), time.perf_counter()
                events = loop.run_once()
                passes.append(
                    {
                        "wall_s": round(time.perf_counter() - w0, 2),
                        "serve_cpu_s": round(_self_cpu() - c0, 2),
                        "prometheus_cpu_s": round(proc_cpu(prom.proc.pid) - p0, 2),
                        "events": len(events),
                    }
                )
                clock[0] += 15 * S
            nxt = {k: statistics.median(p[k] for p in passes[1:4]) for k in passes[1]}
            out["loop_pass_first"] = passes[0]
            out["loop_pass_next"] = nxt
            out["loop_pass_refresh"] = passes[4]
            out["loop_cores_at_15s_interval"] = {
                "serve": round(nxt["serve_cpu_s"] / 15.0, 3),
                "prometheus": round(nxt["prometheus_cpu_s"] / 15.0, 3),
            }
            # steady state: every 4th pass (60 s) re-reads the whole range (WindowCache)
            cyc = passes[1:5]
            out["loop_cores_over_60s"] = {
                "serve": round(sum(p["serve_cpu_s"] for p in cyc) / 60.0, 3),
                "prometheus": round(sum(p["prometheus_cpu_s"] for p in cyc) / 60.0, 3),
            }
            # with [analysis] full_read_s = 600: one full read per 40 passes (from the same
            # measured passes)
            out["loop_cores_full_read_600s"] = {
                k: round((39 * nxt[f"{k}_cpu_s"] + passes[4][f"{k}_cpu_s"]) / 600.0, 3)
                for k in ("serve", "prometheus")
            }
            if args.rules:
                out["window_rules"]["evaluation"] = rule_cost(prom, args.scrape, end_ns)
            src.close()
            store.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
