"""Slowdowns injected into a real engine's noise: what the detector finds, how fast, and how
fast the oracle CUSUM would, when the latencies are a real vLLM's.

    .venv/bin/python bench/real_noise.py [--duration 60] [--every 20] [--json out.json]

The runs are ``tests/fixtures/engines/vllm-0.32.0/quiet-then-burner`` (``make engines``'
``test_vllm_contention``: a real vLLM at 1 request/s on this machine's two CPU cores, a quiet
stretch, then CPU burners; ``runs.json`` says where each run's burners began). Only the quiet
stretch of each is used: real latencies no fault touched, whose medians wander by a third from
one half-minute to the next.

* **Injected slowdowns**: every request from ``onset`` for ``--duration`` s multiplied by the
  factor (1.3, 1.5, 2x), onsets every ``--every`` s from :data:`FIRST_ONSET_S` (the warm-up
  and a minute after it) to the stretch's end. The **product**'s detector (``detect`` with
  the default settings on the e2e and TTFT windows of 1 s, the three indicators of an LLM
  sharing the false-alarm budget) finds it when an incident-strength episode begins in
  ``[onset - 5 s, onset + duration]``; its delay is to the end of the window it crossed in,
  and the delay a user sees adds the wait a slowdown within its SLO must last
  (``degradation_s``, :func:`episode.needs_s`).
* **The oracle** (:mod:`cotenant.evaluation.oracle`): a CUSUM of the per-request likelihood
  ratio of the latency slowed by the factor against the latency as it was, both fitted on the
  scored run's own quiet requests from its second minute (the engine's first requests are its
  start-up), its threshold set for 0.05 false alarms per hour by a block bootstrap (60-s
  blocks) of the same stretch: it knows the run's distribution and its drift, which no
  detector does (the runs' levels differ by a third, so a threshold set on another run
  alarms at every step of this one).
* **False incidents**: incident-strength episodes in the untouched quiet stretches, and those
  an injected slowdown adds after its end (plus 30 s) that the untouched run does not show.

Delays are per onset where both detect; the ratio of medians is the figure the detection goal
of issue 41 (within 2x of the oracle at 1.5x and 2x) reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from detector_series import windows

from cotenant.analysis.detector.detect import DetectorParams, detect
from cotenant.analysis.detector.episode import needs_s
from cotenant.evaluation import oracle

RUNS = (
    Path(__file__).resolve().parent.parent
    / "tests"
    / "fixtures"
    / "engines"
    / "vllm-0.32.0"
    / "quiet-then-burner"
)
FACTORS = (1.3, 1.5, 2.0)
FIRST_ONSET_S = 240.0  # the 3-minute warm-up (baseline_s x WARMUP_SHARE) and a minute more
SLACK_S = 5.0
FALSE_PER_HOUR = 0.05
WARM_S = 60.0  # the engine's own start (its first requests, 1.5-2x the rest) is no null
GRID = np.arange(0.25, 400.0 + 1e-9, 0.25)


def load(folder: Path = RUNS) -> dict[str, dict[str, np.ndarray]]:
    """Each run's quiet stretch: request start (s), e2e latency and, where recorded, TTFT
    (ms); ``end`` (s) and ``indicators`` (how many the product judges: 3 for an LLM)."""
    meta = json.loads((folder / "runs.json").read_text())
    out = {}
    for name, m in sorted(meta.items()):
        d = np.genfromtxt(folder / f"{name}.csv", delimiter=",", names=True)
        quiet = d["t_s"] < float(m["burner_s"]) - SLACK_S
        run = {
            "t": d["t_s"][quiet],
            "e2e": d["latency_ms"][quiet],
            "end": np.array(float(m["burner_s"]) - SLACK_S),
            "indicators": np.array(int(m.get("indicators", 1))),
        }
        if "ttft_ms" in (d.dtype.names or ()):
            run["ttft"] = d["ttft_ms"][quiet]
        out[name] = run
    return out


def product(run: dict[str, np.ndarray], factor: np.ndarray) -> list[tuple[int, int, float, int]]:
    """The strong episodes (start, opened, ratio, requests) over the run's e2e and TTFT,
    every request multiplied by ``factor``."""
    end = float(run["end"])
    p = DetectorParams()
    found = []
    for key in ("e2e", "ttft"):
        if key not in run:
            continue
        s = windows(run["t"], run[key] * factor, end)
        k = int(run["indicators"])
        for e in detect(s, None, p, step_s=1.0, indicators=k).episodes:
            if e.strong:
                n = int(np.nansum(s.count[e.start : e.end + 1]))
                found.append((e.start, e.opened, e.ratio, n))
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0, help="s each slowdown lasts")
    ap.add_argument("--every", type=float, default=20.0, help="s between onsets")
    ap.add_argument("--first", type=float, default=FIRST_ONSET_S, help="s of the first onset")
    ap.add_argument(
        "--factors",
        default=",".join(f"{f:g}" for f in FACTORS),
        help="comma-separated slowdowns (default %(default)s)",
    )
    ap.add_argument("--runs", type=Path, default=RUNS, help="a folder of recorded runs")
    ap.add_argument(
        "--tail",
        type=float,
        help="slow only this share of the requests (drawn at random): a slower tail, the "
        "median flat",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        factors = [float(x) for x in args.factors.split(",")]
    except ValueError:
        raise SystemExit(f"--factors {args.factors!r}: numbers and commas, e.g. 1.5,2") from None
    if not factors or min(factors) <= 1.0:
        raise SystemExit(f"--factors {args.factors!r}: every slowdown must be over 1")
    runs = load(args.runs)
    rng = np.random.default_rng(0)
    p = DetectorParams()
    quiet_h = sum(float(r["end"]) for r in runs.values()) / 3600
    # each run's own episodes with nothing injected (an injected run that shows one of these
    # again has not made it)
    untouched = {k: [e[0] for e in product(r, np.ones_like(r["t"]))] for k, r in runs.items()}
    false_quiet = sum(len(v) for v in untouched.values())
    print(
        f"{len(runs)} runs, {quiet_h * 60:.1f} min of real quiet: "
        f"{false_quiet} incident-strength episodes untouched",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for f in factors:
        ours, users, orc, both, false = [], [], [], [], 0
        n = 0
        for name, run in runs.items():
            end = float(run["end"])
            warm = run["t"] >= WARM_S
            before = run["e2e"][warm]
            share = 1.0 if args.tail is None else args.tail
            after = np.where(rng.uniform(size=len(before)) < share, before * f, before)
            ratio = oracle.LatencyRatio.fit(before, after)
            null = oracle.window_increments(
                run["t"][warm] - WARM_S, ratio(before), end - WARM_S, 1.0
            )
            h = oracle.calibrate([null], 1.0, thresholds=GRID, hours=200.0, chains=200).threshold(
                FALSE_PER_HOUR
            )
            for onset in np.arange(args.first, end - args.duration + 1e-9, args.every):
                n += 1
                hit = (run["t"] >= onset) & (run["t"] < onset + args.duration)
                if args.tail is not None:
                    hit &= rng.uniform(size=len(hit)) < args.tail
                g = np.where(hit, f, 1.0)
                eps = product(run, g)
                mine = [e for e in eps if onset - SLACK_S <= e[0] <= onset + args.duration]
                false += sum(
                    1
                    for e in eps
                    if e[0] > onset + args.duration + 30
                    and not any(abs(e[0] - u) <= SLACK_S for u in untouched[name])
                )
                d_ours = None
                if mine:
                    st, op, r_, cnt = min(mine, key=lambda e: e[1])
                    d_ours = op + 1 - onset
                    wait = needs_s(r_, cnt, p.degradation_s)
                    users.append(max(d_ours, st + wait - onset))
                    ours.append(d_ours)
                lat = run["e2e"] * g
                inc = oracle.window_increments(run["t"] + lat / 1000, ratio(lat), end, 1.0)
                a = oracle.first_alarm(inc, h, int(onset), int(onset + args.duration + 30))
                d_orc = None if a is None else a + 1 - onset
                if d_orc is not None:
                    orc.append(d_orc)
                if d_ours is not None and d_orc is not None:
                    both.append(d_ours / d_orc)
        row = {
            "factor": f,
            "slowdowns": n,
            "found": len(ours),
            "oracle_found": len(orc),
            "delay_s_median": float(np.median(ours)) if ours else None,
            "published_s_median": float(np.median(users)) if users else None,
            "oracle_delay_s_median": float(np.median(orc)) if orc else None,
            "ratio_median": float(np.median(both)) if both else None,
            "ratio_n": len(both),
            "false_outside": false,
        }
        rows.append(row)
        print(
            f"{f:.1f}x for {args.duration:.0f} s: found {row['found']}/{n} (oracle "
            f"{row['oracle_found']}/{n}); delay median {row['delay_s_median']} s, published "
            f"{row['published_s_median']} s, oracle {row['oracle_delay_s_median']} s; ours / "
            f"oracle median {row['ratio_median']} (n {row['ratio_n']}); "
            f"{false} more after the slowdowns",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps({"quiet_false": false_quiet, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
