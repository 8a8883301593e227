"""LLM goals over many seeds of the LLM scenarios of the library.

Goals:

* length shifts with no contention (``length-shift-*``): no co-tenant blamed — the top cause
  of every incident of the shifted model during the fault is ``mix`` — in >= 0.95 of cases;
* decode contention that leaves e2e p99 within its usual range (``decode-contention-*``):
  found on TPOT (an incident of indicator ``tpot`` during the fault) and its top cause the
  culprit, AC@1 >= 0.9.

    .venv/bin/python bench/llm_goals.py [--seeds 10] [--json out.json]

Each scenario is run with seeds ``seed, seed + 1, ...`` through the same harness as
``cotenant bench --suite`` (simulate, counterfactual truth, diagnose every model over the run).
A case is one (scenario, seed); a mix case counts as a hit when the shifted model has at
least one incident overlapping the fault and every such incident's top cause is ``mix`` (a
miss when none is found, or one names anything else); a decode case is a hit when the victim
has a ``tpot`` incident overlapping the fault whose top cause is the fault's culprit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotenant.evaluation.accuracy import SETTLE_NS, run_scenario
from cotenant.simulator.scenario_load import library, load_scenario

START = 1_767_225_600_000_000_000


def _fault_range(f: Any) -> tuple[int, int]:
    return START + int(f.start_s * 1e9), START + int(f.end_s * 1e9) + SETTLE_NS


def mix_case(path: Path, seed: int) -> dict[str, Any]:
    s = replace(load_scenario(path), seed=seed)
    r = run_scenario(s)
    [f] = [f for f in s.faults if f.kind == "length_shift"]
    lo, hi = _fault_range(f)
    mine = [d for d in r.diagnoses if d.model == f.target and d.start_ns < hi and d.end_ns > lo]
    tops = [(d.indicator, d.top.kind if d.top else "unknown") for d in mine]
    others = {c.culprit for d in mine for c in d.causes if c.kind not in ("mix", "unknown")}
    hit = bool(mine) and all(k == "mix" for _, k in tops)
    return {"scenario": s.name, "seed": seed, "hit": hit, "tops": tops, "also": sorted(others)}


def decode_case(path: Path, seed: int) -> dict[str, Any]:
    s = replace(load_scenario(path), seed=seed)
    r = run_scenario(s)
    [f] = [f for f in s.faults if f.kind != "length_shift"]
    culprit = f.target
    victim = next(m.name for m in s.models if m.llm is not None)
    lo, hi = _fault_range(f)
    mine = [d for d in r.diagnoses if d.model == victim and d.start_ns < hi and d.end_ns > lo]
    tpot = [d for d in mine if d.indicator == "tpot"]
    hit = any(d.top is not None and d.top.culprit == culprit for d in tpot)
    e2e = [d.severity for d in mine if d.indicator == "e2e"]
    return {
        "scenario": s.name,
        "seed": seed,
        "hit": hit,
        "found_on_tpot": bool(tpot),
        "e2e_incidents": e2e,
        "tops": [(d.indicator, d.top.kind if d.top else "unknown") for d in mine],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds per scenario")
    ap.add_argument("--json", type=Path, help="write the cases and figures here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    lib = library()
    mix = [p for p in lib if p.stem.startswith("length-shift-")]
    dec = [p for p in lib if p.stem.startswith("decode-contention-")]
    cases: dict[str, list[dict[str, Any]]] = {"mix": [], "decode": []}
    for kind, paths, fn in (("mix", mix, mix_case), ("decode", dec, decode_case)):
        for p in paths:
            base = load_scenario(p).seed
            for k in range(args.seeds):
                c = fn(p, base + k)
                cases[kind].append(c)
                print(
                    f"{kind:6s} {c['scenario'][:60]:60s} seed {c['seed']:4d} "
                    f"{'hit ' if c['hit'] else 'MISS'} {c['tops']}",
                    flush=True,
                )
    out: dict[str, Any] = {"seeds": args.seeds, "wall_s": round(time.perf_counter() - t0, 1)}
    for kind in cases:
        n = len(cases[kind])
        out[kind] = {"cases": n, "hits": sum(c["hit"] for c in cases[kind])}
        out[kind]["rate"] = out[kind]["hits"] / n if n else None
    out["decode"]["found_on_tpot"] = sum(c["found_on_tpot"] for c in cases["decode"])
    out["decode"]["with_e2e_incident"] = sum(bool(c["e2e_incidents"]) for c in cases["decode"])
    print(
        f"mix (length shifts, no contention): top cause mix in {out['mix']['hits']}/"
        f"{out['mix']['cases']} = {out['mix']['rate']:.3f} (goal >= 0.95)\n"
        f"decode contention, e2e flat: culprit first on TPOT in {out['decode']['hits']}/"
        f"{out['decode']['cases']} = {out['decode']['rate']:.3f} (goal >= 0.9); found on TPOT "
        f"{out['decode']['found_on_tpot']}, an e2e incident as well in "
        f"{out['decode']['with_e2e_incident']}; {out['wall_s']} s"
    )
    if args.json:
        args.json.write_text(json.dumps({"figures": out, "cases": cases}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
