"""A screen for a detector channel the product does not have: per window, how many requests
are over the model's request-level p99 before, judged by a Poisson CUSUM (docs/accuracy.md,
"A lead: requests over the p99").

The product judges a window by its mean and its p99. Under a hundred requests a window's p99
is its slowest one or two, so a fast model whose slowest 2 % got slower is seen in half its
windows at best (dev's largest group of misses). The count over a fixed p99 adds up over
windows instead: under normal it is about 1 % of the requests, and a slower tail raises it.

This is the raw statistic alone: no verdicts (ordinary contention, own load), no warm-up
beyond ``MIN_REQUESTS`` over ``MIN_HISTORY_S`` of history, no transient floor. What it shows
is what the channel can see and what its false alarms look like before any of that; it is not
the product.

    # the development population, cached by bench/detector_sweep.py (or .pkl.gz files)
    nice .venv/bin/python bench/exceedance_screen.py --cache DIR [--jobs 2]
    # a real engine's recorded requests, slowdowns injected as bench/real_noise.py does
    .venv/bin/python bench/exceedance_screen.py \\
        --recording tests/fixtures/engines/triton-2.51.0/quiet-then-burst/run1.csv --until 895

Only the development population belongs here (this is how a channel would be tuned).
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from cotenant.core.timerange import TimeRange
from cotenant.evaluation.accuracy import diagnose_models, found_from_diagnoses, load_outputs
from cotenant.evaluation.population_bench import START_NS
from cotenant.evaluation.victim_score import Found, Requests, score_scenario
from cotenant.store.source import StoreSource

THRESHOLDS = (9.0, 16.0, 25.0)
"""CUSUM thresholds (nats) screened."""
RATIO = 3.0
"""The exceedance rate, as a multiple of the normal's, the CUSUM is tuned to."""
SHARE = 0.01
"""The share of requests over the normal's p99."""
BASELINE_S, GUARD_S, REFIT_S = 1800.0, 120.0, 60.0
"""As the product's normal: 30 minutes, less the newest two, refitted every minute."""
MIN_REQUESTS = 1000
"""Requests of history before anything is judged (ten over the p99) ..."""
MIN_HISTORY_S = 120.0
"""... over at least this long (so nothing is judged before 240 s: the product's warm-up is
180 s)."""
BLOCK = 16
"""Windows per block over which the baseline's overdispersion is taken."""
DEAD_S = 120
"""After an alarm the CUSUM restarts this many seconds later (one alarm per episode)."""
EARLY_S = 600
"""Alarms before this second of a run are counted apart (a cold start's)."""


def alarms(t: np.ndarray, lat: np.ndarray, duration_s: float) -> dict[float, list[int]]:
    """Per threshold, the seconds at which the channel alarms on requests starting at ``t``
    (s) with latencies ``lat`` (ms), in 1-s windows."""
    n_win = int(duration_s) + 1
    order = np.argsort(t)
    t, lat = t[order], lat[order]
    w = np.minimum(t.astype(int), n_win - 1)
    n = np.bincount(w, minlength=n_win).astype(float)
    over_at = np.full(n_win, np.nan)
    phi = np.ones(n_win)
    for t0 in np.arange(0.0, n_win, REFIT_S):
        hi = t0 - GUARD_S
        lo = max(0.0, hi - BASELINE_S)
        sel = (t >= lo) & (t < hi)
        if sel.sum() < MIN_REQUESTS or hi - lo < MIN_HISTORY_S:
            continue
        q = float(np.quantile(lat[sel], 1.0 - SHARE))
        k_b = np.bincount(w[sel] - int(lo), weights=(lat[sel] > q).astype(float))
        n_b = np.bincount(w[sel] - int(lo)).astype(float)
        m = len(k_b) // BLOCK * BLOCK
        disp = 1.0
        if m >= 4 * BLOCK:
            ks = k_b[:m].reshape(-1, BLOCK).sum(axis=1)
            expect = n_b[:m].reshape(-1, BLOCK).sum(axis=1) * float(np.mean(lat[sel] > q))
            disp = float(np.sum((ks - expect) ** 2) / max(float(np.sum(expect)), 1e-9))
        span = slice(int(t0), int(min(n_win, t0 + REFIT_S)))
        over_at[span], phi[span] = q, max(1.0, disp)
    judged = np.isfinite(over_at)
    k = np.bincount(w, weights=(lat > over_at[w]).astype(float), minlength=n_win)
    incr = np.where(judged, (k * np.log(RATIO) - n * SHARE * (RATIO - 1.0)) / phi, 0.0)
    out: dict[float, list[int]] = {}
    for h in THRESHOLDS:
        hits: list[int] = []
        s, resume = 0.0, 0
        for i in range(n_win):
            if i < resume:
                continue
            s = max(0.0, s + float(incr[i]))
            if s > h:
                hits.append(i)
                s, resume = 0.0, i + DEAD_S
        out[h] = hits
    return out


def _load(path: Path) -> Any:
    raw = path.read_bytes()
    return pickle.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def screen_scenario(path: Path, min_rate: float) -> dict[str, Any]:
    """One cached scenario: control model-hours and alarms, and its goal victims on busy
    models, found by the product and by the channel at each threshold."""
    s, sim, truth = _load(path)
    store = load_outputs(sim)
    try:
        rng = TimeRange(START_NS, START_NS + int(s.duration_s * 1e9))
        requests = Requests.of_store(store)
        busy: dict[str, dict[float, list[int]]] = {}
        cur = store.cursor()
        for m in s.models:
            got = cur.execute(
                "SELECT ts_start_ns, latency_ms FROM requests WHERE model = ?", [m.name]
            ).fetchnumpy()
            t = (np.asarray(got["ts_start_ns"], dtype=np.int64) - START_NS) / 1e9
            if len(t) / s.duration_s >= min_rate:
                lat = np.asarray(got["latency_ms"], dtype=np.float64)
                busy[m.name] = alarms(t, lat, s.duration_s)
        row: dict[str, Any] = {"name": path.name.split(".")[0], "control": not s.faults}
        row["model_h"] = len(busy) * s.duration_s / 3600.0
        row["alarms"] = {h: sum(len(a[h]) for a in busy.values()) for h in THRESHOLDS}
        row["early"] = {
            h: sum(1 for a in busy.values() for x in a[h] if x < EARLY_S) for h in THRESHOLDS
        }
        if not s.faults:
            return row
        kind = "faulted"
        product = found_from_diagnoses(diagnose_models(StoreSource(store), s, rng))
        mine = score_scenario(s, truth, product, requests, START_NS, path="batch", kind=kind)
        victims = [(v.fault_index, v.victim) for v in mine.victims if v.at_goal]
        row["victims"] = {
            f"{fi}:{m}": {"product": False, **{str(h): False for h in THRESHOLDS}}
            for fi, m in victims
            if m in busy
        }
        for v in mine.victims:
            key = f"{v.fault_index}:{v.victim}"
            if key in row["victims"]:
                row["victims"][key]["product"] = v.found
        for h in THRESHOLDS:
            found = [
                Found(
                    m,
                    START_NS + int(a * 1e9),
                    START_NS + int((a + 1) * 1e9),
                    START_NS + int(a * 1e9),
                    (),
                    (),
                )
                for m, hits in busy.items()
                for a in hits[h]
            ]
            sc = score_scenario(s, truth, found, requests, START_NS, path="batch", kind=kind)
            for v in sc.victims:
                key = f"{v.fault_index}:{v.victim}"
                if key in row["victims"]:
                    row["victims"][key][str(h)] = v.found
        return row
    finally:
        store.close()


def run_cache(folder: Path, jobs: int, min_rate: float) -> int:
    paths = sorted(p for p in folder.iterdir() if p.name.endswith((".pkl", ".pkl.gz")))
    if not paths:
        raise SystemExit(
            f"--cache {folder}: no cached scenarios (bench/detector_sweep.py makes them)"
        )
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(jobs) as ex:
        futures = [ex.submit(screen_scenario, p, min_rate) for p in paths]
        for i, f in enumerate(futures, 1):
            rows.append(f.result())
            if i % 50 == 0 or i == len(futures):
                print(f"  {i}/{len(futures)} scenarios", file=sys.stderr, flush=True)
    ctl = [r for r in rows if r["control"]]
    hours = sum(r["model_h"] for r in ctl)
    victims = [(r["name"], k, v) for r in rows for k, v in r.get("victims", {}).items()]
    product = sum(v["product"] for _, _, v in victims)
    print(
        f"busy models (>= {min_rate:g} req/s): {hours:.1f} model-h of controls, "
        f"{len(victims)} goal victims, the product finds {product}"
    )
    for h in THRESHOLDS:
        alarms_ctl = sum(r["alarms"][h] for r in ctl)
        early = sum(r["early"][h] for r in ctl)
        got = [(n, k) for n, k, v in victims if v[str(h)]]
        alone = [f"{n}/{k}" for n, k, v in victims if v[str(h)] and not v["product"]]
        print(
            f"h={h:g}: {alarms_ctl} alarms on controls ({alarms_ctl / max(hours, 1e-9):.3f} per "
            f"model-h; {early} in the first {EARLY_S // 60} minutes); finds {len(got)} victims, "
            f"{len(alone)} the product misses: {alone}"
        )
    return 0


def run_recording(csv: Path, until: float, every: float) -> int:
    d = np.genfromtxt(csv, delimiter=",", names=True)
    t, lat = np.asarray(d["t_s"]), np.asarray(d["latency_ms"])
    keep = t < until
    t, lat = t[keep], lat[keep]
    print(f"{csv}: nothing injected, alarms at {alarms(t, lat, until)}")
    rng = np.random.default_rng(0)
    for factor, share in ((1.5, 1.0), (2.0, 1.0), (5.0, 0.05)):
        hits = dict.fromkeys(THRESHOLDS, 0)
        n = 0
        for onset in np.arange(240.0, until - 60.0 + 1e-9, every):
            n += 1
            slow = (t >= onset) & (t < onset + 60.0) & (rng.uniform(size=len(t)) < share)
            got = alarms(t, np.where(slow, lat * factor, lat), until)
            for h in THRESHOLDS:
                hits[h] += any(onset - 5.0 <= a <= onset + 60.0 for a in got[h])
        what = f"{factor:g}x" if share == 1.0 else f"{share:.0%} of requests {factor:g}x"
        found = ", ".join(f"h={h:g}: {k}/{n}" for h, k in hits.items())
        print(f"{what} for 60 s: found {found}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--cache", type=Path, help="a bench/detector_sweep.py cache (dev only)")
    src.add_argument("--recording", type=Path, help="a recorded run: t_s, latency_ms")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--min-rate", type=float, default=5.0, help="req/s a model needs to be judged")
    ap.add_argument("--until", type=float, default=895.0, help="s of the recording that are quiet")
    ap.add_argument("--every", type=float, default=20.0, help="s between injected onsets")
    args = ap.parse_args()
    if args.cache is not None:
        if not args.cache.is_dir():
            raise SystemExit(f"--cache {args.cache}: not a folder")
        return run_cache(args.cache, max(1, args.jobs), args.min_rate)
    if not args.recording.is_file():
        raise SystemExit(f"--recording {args.recording}: no such file")
    return run_recording(args.recording, args.until, args.every)


if __name__ == "__main__":
    raise SystemExit(main())
