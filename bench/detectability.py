"""Minimum detectable slowdown of the live detector: P(detect) and delay.

    nice -n 10 .venv/bin/python bench/detectability.py [--seeds 5] [--seeds-200 3]
        [--jobs 2] [--json OUT]

What the live incident stream (``cotenant serve``'s analysis loop, replayed on a virtual clock
by :func:`cotenant.evaluation.live.replay`) finds of a known slowdown, by request rate and
size, beside how often it raises an incident when nothing happens.

**Slowdown cases.** One scenario per (rate, slowdown, seed), built from the Scenario
dataclasses: two H100s shared by time slicing, each serving a *victim* at ``rate`` requests/s
(Poisson) beside a steady *neighbour* (Poisson 10 req/s, 5 ms kernels: ordinary contention, so
the victim's latency has a spread). The victim on ``gpu0`` has an SLO ten times its kernel time
(well above anything the slowdown reaches: a within-SLO victim, a ``degradation`` when found);
the one on ``gpu1`` has no SLO. From 300 s (a full baseline of history) for 120 s both GPUs
are throttled to ``1 / slowdown`` of their clock (a ``throttle`` fault: a compute slowdown that
stretches every kernel by ``slowdown``), then 60 s more. The victims' kernels are sized to the
rate so that queueing stays modest (20 ms up to 2 req/s, 10 ms at 20, 3 ms with batches of up
to 32 at 200); the slowdown of their p99 actually measured (during the fault over the 120 s
before it, pooled over seeds) is printed beside the nominal one, as queueing adds to it.

A victim is **detected** when an incident of that model, as last published (withdrawn
transients are not incidents), overlaps the fault (plus the 10 s settle time); its **delay** is
from the fault's start to the first ``opened`` event of such an incident (0 if one was open
already). P(detect) is over seeds; the delay is the median over detected runs.

**False incidents** per simulated hour, on fault-free controls (every model counted):

* ``poisson-<rate>``: the slowdown scenarios without their fault (seeds as above);
* ``azure-two-llms-mps``: two LLMs (``llm`` physics) replaying the bundled Azure conversation
  and code traces (about 5.6 and 2.6 req/s, with the code trace's bursts) on one H100 under MPS;
* ``image-voice-low-rate``: an image generator at 0.2 req/s, a speech recogniser at 0.5, a
  text-to-speech model at 2 and an embedding model with ordinary bursts (Poisson 20, bursts of
  100 req/s) time-slicing one L4.

Runs go through a process pool of ``--jobs`` workers; the table is printed at the end and
``--json`` writes every run and the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import detectability_oracle as oracle

from cotenant.evaluation.live import SETTLE_S, START_NS, Seen, replay
from cotenant.simulator.scenario import (
    GPU_TYPES,
    Arrival,
    Batching,
    Fault,
    Gpu,
    Kernel,
    Llm,
    Model,
    Scenario,
)
from cotenant.simulator.scenario_load import TRACES_DIR

RATES = (0.1, 0.5, 1.0, 2.0, 20.0, 200.0)
SLOWDOWNS = (1.1, 1.2, 1.5, 2.0)
FAULT_START_S = 300.0
FAULT_S = 120.0
AFTER_S = 60.0
VICTIMS = ("victim-slo", "victim-noslo")
TRACE_DIR = TRACES_DIR / "azure-llm-inference-2023"
TRACE_CONTROL_S = 1800.0
LOW_RATE_CONTROL_S = 1800.0


# --- scenarios --------------------------------------------------------------------------------


def _victim_kernel(rate: float) -> tuple[Kernel, Batching]:
    base = 20.0 if rate <= 2 else 10.0 if rate <= 20 else 3.0
    kernel = Kernel(base_ms=base, per_item_ms=base / 10, sm_demand=0.6, dram_demand=0.1)
    return kernel, Batching(max_batch=8 if rate <= 20 else 32, max_wait_ms=2.0)


def slowdown_scenario(rate: float, slowdown: float | None, seed: int) -> Scenario:
    """The victims at ``rate`` req/s, both GPUs throttled by ``slowdown`` over the fault (no
    fault when None: the control)."""
    kernel, batching = _victim_kernel(rate)
    slo = 10 * (kernel.base_ms + kernel.per_item_ms)
    models = []
    for gpu, victim, victim_slo in (("gpu0", VICTIMS[0], slo), ("gpu1", VICTIMS[1], None)):
        models.append(
            Model(
                victim,
                gpu,
                Arrival("poisson", rate_rps=rate),
                kernel,
                batching,
                slo_p99_ms=victim_slo,
                memory_gib=4,
            )
        )
        models.append(
            Model(
                f"neighbour-{gpu}",
                gpu,
                Arrival("poisson", rate_rps=10.0),
                Kernel(base_ms=5.0, per_item_ms=0.5, sm_demand=0.5, dram_demand=0.1),
                Batching(max_batch=8, max_wait_ms=2.0),
                memory_gib=4,
            )
        )
    faults = (
        ()
        if slowdown is None
        else tuple(
            Fault(
                "throttle",
                start_s=FAULT_START_S,
                duration_s=FAULT_S,
                gpu=gpu,
                clock_factor=1.0 / slowdown,
                reason="hw_thermal",
            )
            for gpu in ("gpu0", "gpu1")
        )
    )
    name = f"rate{rate:g}-x{slowdown:g}" if slowdown else f"poisson-{rate:g}"
    return Scenario(
        name=name,
        seed=seed,
        duration_s=FAULT_START_S + FAULT_S + AFTER_S,
        gpus=(Gpu("gpu0", GPU_TYPES["h100-sxm"]), Gpu("gpu1", GPU_TYPES["h100-sxm"])),
        models=tuple(models),
        faults=faults,
    )


def azure_two_llms(seed: int) -> Scenario:
    """Two LLMs replaying the Azure conversation and code traces on one H100 under MPS; each
    seed starts both traces at another half hour of their hour (seed 2000: the first)."""
    llm = Llm(prefill_ms_per_1k=15, decode_step_ms=9, decode_per_seq_ms=0.02, max_seqs=256)
    kernel = Kernel(base_ms=4, per_item_ms=0.5, sm_demand=0.5, dram_demand=0.5, memory_bound=0.7)
    models = tuple(
        Model(
            name,
            "gpu0",
            Arrival(
                "trace",
                file=str(TRACE_DIR / f"AzureLLMInferenceTrace_{trace}.csv"),
                start_s=((seed - 2000) % 2) * TRACE_CONTROL_S,
            ),
            kernel,
            Batching(max_batch=8, max_wait_ms=2),
            memory_gib=20,
            kv_cache_gib=40,
            llm=llm,
        )
        for name, trace in (("chat", "conv"), ("code", "code"))
    )
    return Scenario(
        name="azure-two-llms-mps",
        seed=seed,
        duration_s=TRACE_CONTROL_S,
        gpus=(Gpu("gpu0", GPU_TYPES["h100-sxm"], "mps"),),
        models=models,
    )


def image_voice_low_rate(seed: int) -> Scenario:
    """Image and voice models at low rates beside a bursty embedding model on one L4."""

    def model(name: str, arrival: Arrival, base_ms: float, sm: float, gib: float) -> Model:
        return Model(
            name,
            "gpu0",
            arrival,
            Kernel(base_ms=base_ms, per_item_ms=base_ms / 10, sm_demand=sm, dram_demand=0.3),
            Batching(max_batch=4, max_wait_ms=3),
            memory_gib=gib,
        )

    models = (
        model("imagegen", Arrival("poisson", rate_rps=0.2), 600.0, 0.9, 8),
        model("asr", Arrival("poisson", rate_rps=0.5), 60.0, 0.5, 3),
        model("tts", Arrival("poisson", rate_rps=2.0), 20.0, 0.5, 3),
        model(
            "embed",
            Arrival("bursty", rate_rps=20, burst_rps=100, mean_burst_s=8, mean_gap_s=60),
            3.0,
            0.3,
            2,
        ),
    )
    return Scenario(
        name="image-voice-low-rate",
        seed=seed,
        duration_s=LOW_RATE_CONTROL_S,
        gpus=(Gpu("gpu0", GPU_TYPES["l4"]),),
        models=models,
        host_cpus=8,
    )


# --- one run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    kind: str  # "slowdown" or "control"
    name: str
    rate: float
    slowdown: float | None
    seed: int


def _scenario(c: Case) -> Scenario:
    if c.name == "azure-two-llms-mps":
        return azure_two_llms(c.seed)
    if c.name == "image-voice-low-rate":
        return image_voice_low_rate(c.seed)
    return slowdown_scenario(c.rate, c.slowdown, c.seed)


def _final(events: list[Seen]) -> dict[str, Seen]:
    by_inc: dict[str, Seen] = {}
    for e in events:
        by_inc[e.incident_id] = e
    return {k: e for k, e in by_inc.items() if e.kind != "dismissed"}


def _episodes(incidents: Iterable[Seen]) -> int:
    """Incidents of one model that overlap in time counted once: what is left when the same
    event's e2e, TTFT and TPOT incidents are joined."""
    n = 0
    by_model: dict[str, list[Seen]] = {}
    for i in incidents:
        by_model.setdefault(i.model, []).append(i)
    for mine in by_model.values():
        end = -1
        for i in sorted(mine, key=lambda i: i.start_ns):
            if i.start_ns > end:
                n += 1
            end = max(end, i.end_ns)
    return n


def _latencies(store: Any, model: str, lo_s: float, hi_s: float) -> list[float]:
    lo, hi = START_NS + int(lo_s * 1e9), START_NS + int(hi_s * 1e9)
    rows = store.cursor().execute(
        "SELECT latency_ms FROM requests WHERE model = ? AND ts_end_ns >= ? AND ts_end_ns < ?",
        [model, lo, hi],
    )
    return [float(r[0]) for r in rows.fetchall()]


def run_case(c: Case, oracle_only: bool = False) -> dict[str, Any]:
    """Replay one case through the live loop; what it found, per victim (slowdown cases) or
    in all (controls), and the victims' request latencies (``series``: the oracle's input).
    ``oracle_only``: simulate only (no replay, nothing found)."""
    s = _scenario(c)
    t0 = time.process_time()
    if oracle_only:
        return _simulated(c, s, t0)
    events, _, store, _, passes = replay(s, with_truth=False)
    final = _final(events)
    out: dict[str, Any] = {
        "kind": c.kind,
        "name": c.name,
        "rate": c.rate,
        "slowdown": c.slowdown,
        "seed": c.seed,
        "hours": s.duration_s / 3600,
        "duration_s": s.duration_s,
        "incidents": len(final),
        "incident_list": [
            {
                "model": i.model,
                "severity": i.severity,
                "indicator": i.indicator,
                "start_s": (i.start_ns - START_NS) / 1e9,
                "end_s": (i.end_ns - START_NS) / 1e9,
                "cause": i.cause,
            }
            for i in final.values()
        ],
    }
    out["episodes"] = _episodes(final.values())
    if c.kind == "slowdown":
        lo = START_NS + int(FAULT_START_S * 1e9)
        hi = START_NS + int((FAULT_START_S + FAULT_S + SETTLE_S) * 1e9)
        for v in VICTIMS:
            mine = [i for i in final.values() if i.model == v and i.start_ns < hi and i.end_ns > lo]
            ids = {i.incident_id for i in mine}
            opened = [e.at_ns for e in events if e.kind == "opened" and e.incident_id in ids]
            out[v] = {
                "detected": bool(mine),
                "delay_s": max(0.0, (min(opened) - lo) / 1e9) if opened else None,
                "severities": sorted({i.severity for i in mine}),
                "before_ms": _latencies(store, v, FAULT_START_S - FAULT_S, FAULT_START_S),
                "during_ms": _latencies(store, v, FAULT_START_S, FAULT_START_S + FAULT_S),
            }
    if c.name.startswith(("rate", "poisson-")):
        out["series"] = oracle.series(
            store.cursor()
            .sql("SELECT model, ts_end_ns, latency_ms FROM requests")
            .to_arrow_table(),
            VICTIMS,
        )
    store.close()
    out["cpu_s"] = time.process_time() - t0
    out["passes"] = passes
    return out


def _simulated(c: Case, s: Scenario, t0: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": c.kind,
        "name": c.name,
        "rate": c.rate,
        "slowdown": c.slowdown,
        "seed": c.seed,
        "hours": s.duration_s / 3600,
        "duration_s": s.duration_s,
        "passes": 0,
    }
    fault = (FAULT_START_S, FAULT_START_S + FAULT_S)
    out |= oracle.simulated(s, VICTIMS, fault if c.kind == "slowdown" else None)
    out["cpu_s"] = time.process_time() - t0
    return out


# --- the table --------------------------------------------------------------------------------


def cases(seeds: int, seeds_200: int, controls_seeds: int) -> list[Case]:
    out: list[Case] = []
    for rate in RATES:
        n = seeds_200 if rate >= 200 else seeds
        for x in SLOWDOWNS:
            out += [Case("slowdown", f"rate{rate:g}-x{x:g}", rate, x, 1000 + k) for k in range(n)]
        nc = min(n, 3)
        out += [Case("control", f"poisson-{rate:g}", rate, None, 1000 + k) for k in range(nc)]
    for name in ("azure-two-llms-mps", "image-voice-low-rate"):
        out += [Case("control", name, 0.0, None, 2000 + k) for k in range(controls_seeds)]
    # the costliest first, so the pool's tail is short
    return sorted(out, key=lambda c: (-(c.rate or 50.0), c.name, c.seed))


def _p99_ratio(runs: Iterable[dict[str, Any]]) -> float | None:
    runs = list(runs)
    before = [x for r in runs for x in r["before_ms"]]
    during = [x for r in runs for x in r["during_ms"]]
    if len(before) < 2 or len(during) < 2:
        return None
    return float(np.percentile(during, 99) / np.percentile(before, 99))


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for rate in RATES:
        for x in SLOWDOWNS:
            runs = [r for r in results if r["kind"] == "slowdown" and r["rate"] == rate]
            runs = [r for r in runs if r["slowdown"] == x]
            for v in VICTIMS:
                vs = [r[v] for r in runs]
                delays = [d["delay_s"] for d in vs if d["delay_s"] is not None]
                table[f"{v}|{rate:g}|{x:g}"] = {
                    "victim": v,
                    "rate_rps": rate,
                    "slowdown": x,
                    "runs": len(vs),
                    "p_detect": sum(d["detected"] for d in vs) / len(vs) if vs else None,
                    "median_delay_s": float(np.median(delays)) if delays else None,
                    "measured_p99_ratio": _p99_ratio(vs),
                    "severities": sorted({s for d in vs for s in d["severities"]}),
                }
    controls: dict[str, Any] = {}
    for name in sorted({r["name"] for r in results if r["kind"] == "control"}):
        runs = [r for r in results if r["kind"] == "control" and r["name"] == name]
        hours = sum(r["hours"] for r in runs)
        n = sum(r["incidents"] for r in runs)
        ep = sum(r["episodes"] for r in runs)
        controls[name] = {
            "runs": len(runs),
            "hours": hours,
            "incidents": n,
            "per_hour": n / hours if hours else None,
            "episodes": ep,
            "episodes_per_hour": ep / hours if hours else None,
        }
    hours = sum(c["hours"] for c in controls.values())
    n = sum(c["incidents"] for c in controls.values())
    trace = [c for k, c in controls.items() if not k.startswith("poisson-")]
    th = sum(c["hours"] for c in trace)
    return {
        "table": table,
        "controls": controls,
        "false_per_hour_all": n / hours if hours else None,
        "false_per_hour_trace_controls": sum(c["incidents"] for c in trace) / th if th else None,
    }


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def render(summary: dict[str, Any]) -> str:
    lines = []
    for v in VICTIMS if any(t["runs"] for t in summary["table"].values()) else ():
        title = "within-SLO victim (SLO 10x its kernel time)" if v == VICTIMS[0] else "no SLO"
        lines.append(f"\n{v}: {title} — P(detect) / median delay s [measured p99 ratio]")
        lines.append("| rate req/s | " + " | ".join(f"{x:g}x" for x in SLOWDOWNS) + " |")
        lines.append("|---:|" + "---|" * len(SLOWDOWNS))
        for rate in RATES:
            cells = []
            for x in SLOWDOWNS:
                t = summary["table"][f"{v}|{rate:g}|{x:g}"]
                cells.append(
                    f"{_f(t['p_detect'], '.2f')} / {_f(t['median_delay_s'], '.0f')} "
                    f"[{_f(t['measured_p99_ratio'], '.2f')}]"
                )
            n = summary["table"][f"{v}|{rate:g}|{SLOWDOWNS[0]:g}"]["runs"]
            lines.append(f"| {rate:g} ({n} seeds) | " + " | ".join(cells) + " |")
    lines.append("\nfalse incidents on fault-free controls")
    lines.append("| control | runs | hours | incidents | per hour | episodes | per hour |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for name, c in summary["controls"].items():
        lines.append(
            f"| {name} | {c['runs']} | {c['hours']:.2f} | {c['incidents']} | "
            f"{_f(c['per_hour'], '.1f')} | {c['episodes']} | "
            f"{_f(c['episodes_per_hour'], '.1f')} |"
        )
    lines.append(
        f"all controls: {_f(summary['false_per_hour_all'], '.1f')}/h; trace-driven and "
        f"low-rate controls: {_f(summary['false_per_hour_trace_controls'], '.1f')}/h"
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds per cell (rates up to 20/s)")
    ap.add_argument("--seeds-200", type=int, default=3, help="seeds per cell at 200 req/s")
    ap.add_argument("--control-seeds", type=int, default=2, help="seeds per trace control")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--json", type=Path, help="write every run and the figures here")
    ap.add_argument(
        "--controls-only",
        action="store_true",
        help="only the fault-free controls (false incidents; the cells' table stays empty)",
    )
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle limit")
    ap.add_argument(
        "--oracle-only",
        action="store_true",
        help="only the oracle: simulate the cells without replaying the live loop (our "
        "detector's columns stay empty, or come from --ours)",
    )
    ap.add_argument(
        "--ours",
        type=Path,
        metavar="FILE",
        help="with --oracle-only: our detector's findings from a full run's --json (same "
        "seeds), to score the oracle against them without replaying again",
    )
    args = ap.parse_args()
    if args.ours and not args.oracle_only:
        ap.error("--ours applies only to --oracle-only")
    todo = cases(args.seeds, args.seeds_200, args.control_seeds)
    if args.controls_only:
        todo = [c for c in todo if c.kind == "control"]
    if args.oracle_only:
        todo = [c for c in todo if c.name.startswith(("rate", "poisson-"))]
    with_oracle = not (args.no_oracle or args.controls_only)
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        fault = (FAULT_START_S, FAULT_START_S + FAULT_S)
        fits = [
            pool.submit(oracle.fit_rate, rate, SLOWDOWNS, VICTIMS, slowdown_scenario, fault)
            for rate in (sorted(RATES, reverse=True) if with_oracle else ())
        ]
        for r in pool.map(partial(run_case, oracle_only=args.oracle_only), todo):
            results.append(r)
            print(
                f"[{time.perf_counter() - t0:6.0f} s] {r['name']} seed {r['seed']}: "
                f"{r['incidents']} incidents, {r['cpu_s']:.1f} CPU s",
                file=sys.stderr,
                flush=True,
            )
        fitted = [f.result() for f in fits]
    if args.ours:
        oracle.take_ours(results, json.loads(args.ours.read_text())["runs"], VICTIMS)
    summary = summarize(results)
    if with_oracle:
        summary["oracle"] = oracle.score(results, fitted, VICTIMS, fault, SETTLE_S, models=4)
        summary["oracle"]["fit_wall_s"] = {f"{f['rate']:g}": f["wall_s"] for f in fitted}
    wall = time.perf_counter() - t0
    print(render(summary))
    if with_oracle:
        print(oracle.render(summary["oracle"], RATES, SLOWDOWNS, VICTIMS))
    print(f"\n{len(results)} runs in {wall:.0f} s wall on {os.cpu_count()} CPUs, {args.jobs} jobs")
    if args.json:
        slim = [
            {k: v for k, v in r.items() if k not in VICTIMS and k != "series"}
            | {
                v: {k: x for k, x in r[v].items() if not k.endswith("_ms")}
                for v in VICTIMS
                if v in r
            }
            for r in results
        ]
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json)},
                    "wall_s": wall,
                    "summary": summary,
                    "runs": slim,
                },
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
