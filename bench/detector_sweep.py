"""Tune the detector on the **development** population: each scenario simulated once (its
store and its truth cached), then diagnosed through the batch path under every setting asked,
scored strictly per victim as ``cotenant bench --population`` scores it.

    nice -n 10 .venv/bin/python bench/detector_sweep.py --count 60 --controls-hours 4 \\
        --cache /tmp/sweep --set false_per_hour=0.05 --set false_per_hour=0.01,min_slowdown=1.2

Never point it at the test population: what is tuned here is reported there
(docs/accuracy.md). One line per setting: found / right cause for the victims at the goal's
bar, SLO and within-SLO victims, and false incidents per model-hour on the controls and
outside the faults.
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotenant.analysis.detector.detect import DetectorParams
from cotenant.core.timerange import TimeRange
from cotenant.evaluation.accuracy import diagnose_models, found_from_diagnoses, load_outputs
from cotenant.evaluation.population import draw_scenario
from cotenant.evaluation.population_bench import START_NS, plan
from cotenant.evaluation.population_summary import summarize
from cotenant.evaluation.victim_score import Requests, score_scenario
from cotenant.simulator import output
from cotenant.store.source import StoreSource


def _cache(args: tuple[str, str, int, Path]) -> str:
    population, kind, index, folder = args
    name = f"{kind}-{index:04d}"
    out = folder / f"{name}.pkl"
    if not out.exists():
        s = draw_scenario(population, index, kind)  # type: ignore[arg-type]
        sim = output.run(s, start_ns=START_NS)
        truth = output.truth(s, sim, start_ns=START_NS) if s.faults else []
        out.write_bytes(pickle.dumps((s, sim, truth)))
    return name


def _score(args: tuple[Path, DetectorParams]) -> Any:
    path, params = args
    s, sim, truth = pickle.loads(path.read_bytes())
    store = load_outputs(sim)
    try:
        rng = TimeRange(START_NS, START_NS + int(s.duration_s * 1e9))
        found = found_from_diagnoses(diagnose_models(StoreSource(store), s, rng, params))
        kind = "faulted" if s.faults else "control"
        return score_scenario(
            s, truth, found, Requests.of_store(store), START_NS, path="batch", kind=kind
        )
    finally:
        store.close()


def _setting(text: str) -> DetectorParams:
    kinds = {f.name: f.type for f in fields(DetectorParams)}
    p = DetectorParams()
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in kinds:
            raise SystemExit(f"--set {part}: no DetectorParams field {key!r} ({', '.join(kinds)})")
        p = replace(p, **{key: int(value) if kinds[key] == "int" else float(value)})
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--controls-hours", type=float, default=4.0)
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--set", action="append", default=[], help="field=value,... per setting")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--misses",
        action="store_true",
        help="list the victims at the goal's bar not found or misnamed, and the scenarios with "
        "false incidents",
    )
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    jobs = plan("dev", count=args.count, controls_hours=args.controls_hours, start=0, live=False)
    todo = [("dev", j.kind, j.index, args.cache) for j in jobs]
    settings = [(t, _setting(t)) for t in (args.set or [""])]
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        names = list(pool.map(_cache, todo))
        print(f"{len(names)} scenarios cached in {args.cache}", file=sys.stderr)
        for text, p in settings:
            paths = [args.cache / f"{n}.pkl" for n in names]
            scores = list(pool.map(_score, [(path, p) for path in paths]))
            sm = summarize(scores)
            row = {"set": text or "defaults", "summary": sm}
            rows.append(row)
            print(_line(row), flush=True)
            if args.misses:
                for sc in scores:
                    if sc.false_incidents:
                        print(f"    {sc.name} false incidents: {sc.false_incidents}", flush=True)
                    for v in sc.victims:
                        if v.at_goal and not (v.found and v.right_final):
                            print(
                                f"    {sc.name} {v.victim} {v.fault_kind} {v.truth} "
                                f"{v.slowdown:.2f}x {v.rate_rps:.2f} req/s {v.fault_s:.0f} s "
                                f"found={v.found} first={v.first_cause} final={v.final_cause}",
                                flush=True,
                            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


def _line(row: dict[str, Any]) -> str:
    sm = row["summary"]

    def p(key: str, what: str) -> str:
        f = sm[key][what]
        return f"{f['k']}/{f['n']}"

    fc, fo = sm["false_controls"], sm["false_faulted_outside"]

    def rate(f: dict[str, Any]) -> str:
        if "per_model_hour" not in f:  # no hours of that kind (--count 0: controls only)
            return f"{f['incidents']}/{f['model_hours']:.1f} h"
        return f"{f['incidents']}/{f['model_hours']:.1f} h = {f['per_model_hour']['estimate']:.3f}"

    return (
        f"{row['set']:40s} goal found {p('goal_victims', 'found')} right "
        f"{p('goal_victims', 'right_final')} first or final "
        f"{p('goal_victims', 'right_first_or_final')} | SLO {p('slo_victims', 'found')} | within "
        f"{p('within_slo_goal_victims', 'found')} | false ctl {rate(fc)}, outside {rate(fo)}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
