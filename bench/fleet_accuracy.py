"""Fleet mode's accuracy: the scenario library diagnosed through agents' series in Prometheus,
side by side with embedded mode on the same simulations.

Run ``.venv/bin/python bench/fleet_accuracy.py`` (``--help``). For every scenario file:

1. simulate it and decide each fault's victims (:func:`simulator.output.truth`), in its own
   two-hour slot of the last days;
2. **embedded**: load the tables into a store and diagnose every model from ``StoreSource``
   with 1 s windows (what ``cotenant bench --suite`` scores);
3. write what the scenario's ``cotenant agent`` would have exposed, scraped every
   ``--scrape`` seconds (:mod:`evaluation.agent_series`).

Then all slots become TSDB blocks (``promtool tsdb create-blocks-from openmetrics``), a real
Prometheus serves them, and every model of every scenario is diagnosed again from
``PrometheusSource`` at each ``--steps`` window width: **fleet**. Scored like
``evaluation.accuracy``: AC@1 / AC@3 per fault with victims (a cause of the fault's kind and
culprit among the top k of an incident of a victim overlapping the fault), detection delay, and
the time of one diagnosis call. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
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

from promserver import PROMETHEUS, start_prometheus  # noqa: E402
from window_rules import backfill_window_rules  # noqa: E402

from cotenant.analysis.detector.detect import DetectorParams  # noqa: E402
from cotenant.analysis.diagnose import Diagnosis, diagnose  # noqa: E402
from cotenant.app.config import load_config  # noqa: E402
from cotenant.collectors.prometheus.source import PrometheusSource  # noqa: E402
from cotenant.core.readers import MetricSource  # noqa: E402
from cotenant.core.timerange import TimeRange  # noqa: E402
from cotenant.evaluation.accuracy import SETTLE_NS, load_outputs  # noqa: E402
from cotenant.evaluation.agent_series import agent_openmetrics, write_openmetrics  # noqa: E402
from cotenant.simulator import output  # noqa: E402
from cotenant.simulator.scenario import Scenario  # noqa: E402
from cotenant.simulator.scenario_load import load_scenario  # noqa: E402
from cotenant.store.source import StoreSource  # noqa: E402

SLOT_NS = 2 * 3600 * 10**9
PROMTOOL = str(Path(PROMETHEUS).with_name("promtool"))


def _rank(d: Diagnosis, f: dict[str, Any]) -> int | None:
    named = [c for c in d.causes if c.kind != "unknown"]
    for i, c in enumerate(named):
        if c.kind == f["kind"] and c.culprit == f["culprit"]:
            return i + 1
    return None


@functools.cache
def params_at(step_s: float) -> DetectorParams:
    """The detector's parameters central serve runs with at ``[analysis] step_s``."""
    return load_config(env={"COTENANT_ANALYSIS_STEP_S": f"{step_s:g}"}).analysis.detector_params()


def with_lead(s: Scenario, lead_s: float) -> Scenario:
    """``s`` with ``lead_s`` more seconds of its normal traffic before its faults (a running
    fleet has history: with 5 s windows the detector's baseline needs minutes of it)."""
    if lead_s <= 0:
        return s
    faults = tuple(dataclasses.replace(f, start_s=f.start_s + lead_s) for f in s.faults)
    return dataclasses.replace(s, duration_s=s.duration_s + lead_s, faults=faults)


def score(
    source: MetricSource, s: Any, start: int, truth: list[dict[str, Any]], step_s: float
) -> tuple[list[dict[str, Any]], float]:
    """Per fault with victims: best rank and detection delay; and seconds per diagnose call."""
    rng = TimeRange(start, start + int(s.duration_s * 1e9))
    diags: list[Diagnosis] = []
    t0 = time.perf_counter()
    calls = 0
    for m in s.models:
        try:
            diags += diagnose(
                source, m.name, rng, slo_ms=m.slo_p99_ms, step_s=step_s, params=params_at(step_s)
            )
        except Exception as exc:  # a model with no windows at this step: no incident
            if "served no requests" not in str(exc):
                raise
        calls += 1
    per_call = (time.perf_counter() - t0) / max(1, calls)
    out = []
    for f in truth:
        if not f["victims"]:
            continue
        lo = start + int(f["start_s"] * 1e9)
        hi = start + int(f["end_s"] * 1e9) + SETTLE_NS
        mine = [d for d in diags if d.model in f["victims"] and d.start_ns < hi and d.end_ns > lo]
        ranks = [r for r in (_rank(d, f) for d in mine) if r is not None]
        delays = [max(0.0, (d.detected_ns - lo) / 1e9) for d in mine]
        out.append(
            {
                "scenario": s.name,
                "kind": f["kind"],
                "culprit": f["culprit"],
                "rank": min(ranks) if ranks else None,
                "delay_s": min(delays) if delays else None,
            }
        )
    return out, per_call


def summary(faults: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(faults)
    by_kind: dict[str, list[int]] = {}
    for f in faults:
        by_kind.setdefault(f["kind"], [0, 0])
        by_kind[f["kind"]][1] += 1
        by_kind[f["kind"]][0] += f["rank"] == 1
    delays = [f["delay_s"] for f in faults if f["delay_s"] is not None]
    return {
        "faults": n,
        "ac1": round(sum(f["rank"] == 1 for f in faults) / n, 3) if n else None,
        "ac3": round(sum(f["rank"] is not None and f["rank"] <= 3 for f in faults) / n, 3)
        if n
        else None,
        "detected": sum(f["delay_s"] is not None for f in faults),
        "delay_s_median": round(statistics.median(delays), 1) if delays else None,
        "ac1_by_kind": {k: f"{h}/{t}" for k, (h, t) in sorted(by_kind.items())},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", type=Path, default=ROOT / "cotenant" / "simulator" / "scenarios")
    p.add_argument("--only", default="", help="only files whose name contains this")
    p.add_argument("--scrape", type=float, default=15.0, help="scrape interval (s)")
    p.add_argument("--steps", default="15,5", help="fleet window widths to score (s)")
    p.add_argument(
        "--lead",
        type=float,
        default=600.0,
        help="seconds of normal traffic added before every scenario's faults, for both modes "
        "(a running fleet has history; 0: from a cold start)",
    )
    p.add_argument(
        "--rules",
        action="store_true",
        help="backfill the loop's window rules (fleet.rules.yml, cotenant-fleet-windows) too, "
        "so PrometheusSource reads recorded series",
    )
    args = p.parse_args()
    files = sorted(
        f
        for f in args.suite.glob("*.yaml")
        if args.only in f.name and not f.name.startswith(("demo", "actuate"))
    )
    now = time.time_ns()
    base = (now // SLOT_NS) * SLOT_NS - (len(files) + 2) * SLOT_NS
    runs = []
    parts = []
    embedded: list[dict[str, Any]] = []
    emb_call: list[float] = []
    t_sim = time.perf_counter()
    for i, f in enumerate(files):
        s = with_lead(load_scenario(f), args.lead)
        start = base + i * SLOT_NS
        sim = output.run(s, start_ns=start)
        truth = output.truth(s, sim, start_ns=start)
        store = load_outputs(sim)
        got, per_call = score(StoreSource(store), s, start, truth, 1.0)
        store.close()
        embedded += got
        emb_call.append(per_call)
        parts.append(
            agent_openmetrics(
                sim.requests,
                sim.gpu_samples,
                sim.process_samples,
                node=s.host,
                t0_ns=start,
                t1_ns=start + int(s.duration_s * 1e9) + 60 * 10**9,
                scrape_s=args.scrape,
            )
        )
        runs.append((s, start, truth))
        print(f"{s.name}: simulated, {len(truth)} faults", file=sys.stderr)
    sim_s = time.perf_counter() - t_sim
    out: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
        "scenarios": len(files),
        "scrape_s": args.scrape,
        "embedded": {**summary(embedded), "diagnose_s_median": statistics.median(emb_call)},
        "simulate_s": round(sim_s, 1),
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        om = tmp / "history.om"
        lines = write_openmetrics(str(om), parts)
        t0 = time.perf_counter()
        done = subprocess.run(
            [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(om), str(tmp / "blocks")],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise SystemExit(done.stderr[-2000:])
        out["backfill"] = {"samples": lines, "promtool_s": round(time.perf_counter() - t0, 1)}
        if args.rules:
            out["window_rules"] = backfill_window_rules(
                tmp, tmp / "blocks", args.scrape, base // 10**9,
                (base + len(files) * SLOT_NS) // 10**9,
            )  # fmt: skip
        with start_prometheus(tmp / "prom", [], blocks=tmp / "blocks") as prom:
            for step in (float(x) for x in args.steps.split(",")):
                fleet: list[dict[str, Any]] = []
                calls: list[float] = []
                with PrometheusSource(prom.url, scrape_interval_s=args.scrape) as src:
                    for s, start, truth in runs:
                        got, per_call = score(src, s, start, truth, step)
                        fleet += got
                        calls.append(per_call)
                out[f"fleet_step_{step:g}s"] = {
                    **summary(fleet),
                    "diagnose_s_median": round(statistics.median(calls), 3),
                    "misses_vs_embedded": [
                        f"{e['scenario']}: {e['kind']} {e['culprit']} (embedded rank "
                        f"{e['rank']}, fleet {g['rank']})"
                        for e, g in zip(embedded, fleet, strict=True)
                        if e["rank"] == 1 and g["rank"] != 1
                    ],
                }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
