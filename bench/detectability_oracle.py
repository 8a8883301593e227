"""The oracle limit beside ``bench/detectability.py``'s cells (imported by it, not run alone).

For each request rate and slowdown of the detection table, and each victim, the CUSUM of
:mod:`cotenant.evaluation.oracle` that *knows* the victim's latency distribution without and
with the fault, on seeds the scored runs do not use:

* **fit** (16 seeds from 7000, 4 at 200 req/s): ``before`` = the victim's request latencies
  over the whole fault-free run (the simulator's counterfactual: the same seed without the
  fault), ``after`` = its latencies over the fault in the faulted run; a per-request
  log-likelihood ratio on histograms of log latency;
* **calibrate** (32 seeds from 8000, 8 at 200 req/s: fault-free runs of the same scenario,
  both victims, 8.5 model-hours per rate; the two victims are the same model on twin GPUs):
  the ratio summed over 1-s windows, a circular block bootstrap (60-s blocks) to 1,000 hours,
  the threshold at which the CUSUM raises **0.05 false alarms per model-hour** (the
  product's target), and another at the rate our detector shows on the fault-free Poisson
  controls of the same table (its 90 % upper bound when it shows none). Where no threshold
  of the grid (0.25 nats and up) alarms at all in the bootstrapped hours, the smallest is
  used: the oracle then raises fewer false alarms than asked;
* **score** (the table's own seeds, 1000-...): the CUSUM runs from the start of each faulted
  run over 1-s windows (restarting after any alarm, those before the fault included); it
  detects when it alarms in a window from the fault's start to its end plus the settle time,
  its delay being that window's end minus the fault's start (so at least 1 s). Our delay
  over the oracle's, per seed where both detect (ours counted as 1 s when an incident was
  open already), median over those seeds with their number n.

**Calibration check** (32 more fault-free seeds from 9000, 8 at 200 req/s, neither fitted
nor calibrated on): each oracle at a threshold for 10 false alarms per model-hour (a rate an
hour or two of fresh data can show; fewer where the grid's smallest threshold already alarms
less often) and at its 0.05 threshold counts its false alarms there; they should match what
the bootstrap predicts. The interval is a bootstrap over runs (alarms cluster within a run).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.evaluation.intervals import poisson_rate
from cotenant.evaluation.live import START_NS
from cotenant.evaluation.oracle import (
    FalseAlarmCurve,
    LatencyRatio,
    calibrate,
    cusum_alarms,
    first_alarm,
    window_increments,
)
from cotenant.simulator import output
from cotenant.simulator.scenario import Scenario

WIDTH_S = 1.0
FIT_SEEDS = 16  # seeds 7000-..., 4 at 200 req/s (simulating is dearer; plenty of requests)
NULL_SEEDS = 32  # seeds 8000-..., 8 at 200 req/s


def _seeds(first: int, n: int, rate: float) -> range:
    return range(first, first + (n // 4 if rate >= 200 else n))


BOOT_HOURS = 1000.0
TARGET_PER_HOUR = 0.05
LOOP_PASS_S = 5.0  # the live loop's pass interval in the replay (live.replay's interval_s)
CHECK_PER_HOUR = 10.0

Factory = Callable[[float, float | None, int], Scenario]
Series = dict[str, tuple[np.ndarray, np.ndarray]]  # victim -> (end s, latency ms)


@dataclass
class VictimOracle:
    ratio: LatencyRatio
    curve: FalseAlarmCurve
    threshold: float  # at TARGET_PER_HOUR
    check_threshold: float  # at CHECK_PER_HOUR


def series(requests: Any, victims: tuple[str, ...]) -> Series:
    """Per victim, its requests' end (s from the run's start) and latency (ms), from a
    simulated ``requests`` Arrow table."""
    model = np.asarray(requests.column("model").to_pylist(), dtype=object)
    end = (requests.column("ts_end_ns").to_numpy() - START_NS) / 1e9
    lat = requests.column("latency_ms").to_numpy()
    return {v: (end[model == v], lat[model == v]) for v in victims}


def _run(s: Scenario, victims: tuple[str, ...]) -> Series:
    return series(output.run(s, start_ns=START_NS).requests, victims)


def simulated(
    s: Scenario, victims: tuple[str, ...], fault: tuple[float, float] | None
) -> dict[str, Any]:
    """A case simulated without replaying the live loop (``--oracle-only``): the victims'
    ``series`` and, for a faulted case (``fault``: start and end, s), empty findings with
    the latencies of the fault and of as long before it."""
    out: dict[str, Any] = {"series": _run(s, victims), "incidents": 0, "episodes": 0}
    if fault is not None:
        lo, hi = fault
        for v in victims:
            end, lat = out["series"][v]
            out[v] = {
                "detected": False,
                "delay_s": None,
                "severities": [],
                "before_ms": lat[(end >= 2 * lo - hi) & (end < lo)],
                "during_ms": lat[(end >= lo) & (end < hi)],
            }
    return out


def take_ours(
    results: list[dict[str, Any]], saved: list[dict[str, Any]], victims: tuple[str, ...]
) -> None:
    """Our detector's findings from a saved full run (``--ours``) into simulated-only
    ``results``, matched by scenario name and seed; a case the saved run lacks is an error."""
    by_key = {(r["name"], r["seed"]): r for r in saved}
    for r in results:
        got = by_key.get((r["name"], r["seed"]))
        if got is None:
            raise SystemExit(f"--ours: the saved run has no {r['name']} seed {r['seed']}")
        r["incidents"], r["episodes"] = got["incidents"], got["episodes"]
        for v in victims:
            if v in r:
                r[v].update({k: got[v][k] for k in ("detected", "delay_s", "severities")})


def fit_rate(
    rate: float,
    slowdowns: tuple[float, ...],
    victims: tuple[str, ...],
    factory: Factory,
    fault: tuple[float, float],
) -> dict[str, Any]:
    """The oracles of every (slowdown, victim) at ``rate``: ``{"rate", "oracles": {(x,
    victim): VictimOracle}, "wall_s"}``. ``fault``: its start and end, s."""
    t0 = time.perf_counter()
    lo, hi = fault
    duration_s = factory(rate, None, 0).duration_s
    fit_seeds = _seeds(7000, FIT_SEEDS, rate)
    calm = [_run(factory(rate, None, seed), victims) for seed in fit_seeds]
    null = [_run(factory(rate, None, seed), victims) for seed in _seeds(8000, NULL_SEEDS, rate)]
    fresh = [_run(factory(rate, None, seed), victims) for seed in _seeds(9000, NULL_SEEDS, rate)]
    # per fresh (run, victim): alarms at the check and target thresholds, summed over oracles
    at_check = np.zeros(len(fresh) * len(victims))
    at_target = np.zeros_like(at_check)
    predicted = 0.0
    out: dict[tuple[float, str], VictimOracle] = {}
    for x in slowdowns:
        faulted = [_run(factory(rate, x, seed), victims) for seed in fit_seeds]
        for v in victims:
            before = np.concatenate([c[v][1] for c in calm])
            after = np.concatenate([f[v][1][(f[v][0] >= lo) & (f[v][0] < hi)] for f in faulted])
            ratio = LatencyRatio.fit(before, after)
            runs = [
                window_increments(n[w][0], ratio(n[w][1]), duration_s, WIDTH_S)
                for n in null
                for w in victims
            ]
            curve = calibrate(runs, WIDTH_S, hours=BOOT_HOURS, seed=int(rate * 1000 + x * 10))
            o = VictimOracle(
                ratio, curve, curve.threshold(TARGET_PER_HOUR), curve.threshold(CHECK_PER_HOUR)
            )
            out[(x, v)] = o
            k = 0
            for n in fresh:
                for w in victims:
                    inc = increments(o, n[w], duration_s)
                    at_check[k] += len(cusum_alarms(inc, o.check_threshold))
                    at_target[k] += len(cusum_alarms(inc, o.threshold))
                    k += 1
            predicted += curve.rate_at(o.check_threshold)
    model_hours = len(at_check) * duration_s / 3600 * len(out)  # oracle-hours of fresh data
    check = {
        "runs": len(at_check),
        "oracle_hours": model_hours,
        "alarms": int(at_check.sum()),
        "per_hour": float(at_check.sum() / model_hours),
        "ci90": _run_bootstrap(at_check, model_hours),
        "predicted_per_hour": predicted / len(out),
        "alarms_at_target": int(at_target.sum()),
    }
    return {"rate": rate, "oracles": out, "check": check, "wall_s": time.perf_counter() - t0}


def _run_bootstrap(counts: np.ndarray, hours: float, n: int = 2000) -> list[float]:
    """90 % interval of ``sum(counts) / hours``, the runs resampled with replacement."""
    rng = np.random.default_rng(0)
    sums = counts[rng.integers(0, len(counts), size=(n, len(counts)))].sum(axis=1)
    return [float(np.quantile(sums, 0.05) / hours), float(np.quantile(sums, 0.95) / hours)]


def increments(o: VictimOracle, s: tuple[np.ndarray, np.ndarray], duration_s: float) -> np.ndarray:
    return window_increments(s[0], o.ratio(s[1]), duration_s, WIDTH_S)


def delay(inc: np.ndarray, threshold: float, lo_s: float, hi_s: float) -> float | None:
    """Seconds from ``lo_s`` to the end of the window at which the CUSUM alarms in
    ``[lo_s, hi_s)``; None if it does not."""
    k = first_alarm(inc, threshold, int(lo_s / WIDTH_S), int(np.ceil(hi_s / WIDTH_S)))
    return None if k is None else (k + 1) * WIDTH_S - lo_s


def ours_per_model_hour(results: list[dict[str, Any]], models: int) -> dict[str, Any]:
    """Our detector's false incidents per model-hour on the fault-free Poisson controls
    (every model of the scenario counted), with a 90 % interval."""
    runs = [r for r in results if r["kind"] == "control" and r["name"].startswith("poisson-")]
    hours = sum(r["hours"] for r in runs) * models
    n = sum(r["incidents"] for r in runs)
    if not hours:
        return {"incidents": 0, "model_hours": 0.0, "per_hour": None, "ci90": None}
    ci = poisson_rate(n, hours)
    return {"incidents": n, "model_hours": hours, "per_hour": n / hours, "ci90": [ci.low, ci.high]}


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def score(
    results: list[dict[str, Any]],
    fitted: list[dict[str, Any]],
    victims: tuple[str, ...],
    fault: tuple[float, float],
    settle_s: float,
    models: int,
) -> dict[str, Any]:
    """The oracle's detection and delay per cell and victim beside ours, and the calibration
    check, from the detection runs (``results``, each with ``series``) and ``fitted``
    (:func:`fit_rate` per rate)."""
    lo, hi = fault
    ours = ours_per_model_hour(results, models)
    at_ours = ours["per_hour"] or (ours["ci90"][1] if ours["ci90"] else None)
    oracles = {(f["rate"], x, v): o for f in fitted for (x, v), o in f["oracles"].items()}
    cells: dict[str, Any] = {}
    for (rate, x, v), o in sorted(oracles.items()):
        t_ours = o.curve.threshold(at_ours) if at_ours else None
        runs = [r for r in results if r["kind"] == "slowdown" and r["rate"] == rate]
        runs = [r for r in runs if r["slowdown"] == x]
        delays, delays_ours, ratios, paced = [], [], [], []
        per_run: list[dict[str, Any]] = []
        for r in runs:
            inc = increments(o, r["series"][v], r["duration_s"])
            d = delay(inc, o.threshold, lo, hi + settle_s)
            if d is not None:
                delays.append(d)
            if t_ours is not None:
                d2 = delay(inc, t_ours, lo, hi + settle_s)
                if d2 is not None:
                    delays_ours.append(d2)
            mine = r[v]["delay_s"]
            per_run.append({"seed": r["seed"], "ours_s": mine, "oracle_s": d})
            if d is not None and mine is not None:
                ratios.append(max(mine, WIDTH_S) / d)
                # the oracle deciding only at the loop's passes: its first pass at or after
                paced.append(max(mine, LOOP_PASS_S) / (LOOP_PASS_S * np.ceil(d / LOOP_PASS_S)))
        cells[f"{v}|{rate:g}|{x:g}"] = {
            "victim": v,
            "rate_rps": rate,
            "slowdown": x,
            "runs": len(runs),
            "threshold": o.threshold,
            "divergence_per_request": o.ratio.divergence(),
            "p_detect": len(delays) / len(runs) if runs else None,
            "median_delay_s": _median(delays),
            "threshold_at_ours": t_ours,
            "median_delay_at_ours_s": _median(delays_ours),
            "ratio_median": _median(ratios),
            "ratio_n": len(ratios),
            "ratio_range": [min(ratios), max(ratios)] if ratios else None,
            "ratio_at_passes_median": _median(paced),
            "runs_detail": per_run,
        }
    checks = {f"{f['rate']:g}": f["check"] for f in sorted(fitted, key=lambda f: f["rate"])}
    return {
        "target_per_model_hour": TARGET_PER_HOUR,
        "ours_controls": ours,
        "at_ours_per_model_hour": at_ours,
        "cells": cells,
        "calibration_check": checks,
    }


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def render(
    summary: dict[str, Any],
    rates: tuple[float, ...],
    slowdowns: tuple[float, ...],
    victims: tuple[str, ...],
) -> str:
    o = summary
    ours = o["ours_controls"]
    lines = [
        "\noracle limit: a CUSUM that knows each victim's latency with and without the fault "
        f"(fit on {FIT_SEEDS} seeds from 7000, calibrated on {NULL_SEEDS} fault-free runs from "
        f"8000, a quarter of each at 200 req/s; {WIDTH_S:g}-s windows)",
        f"our false incidents on the Poisson controls: {ours['incidents']} in "
        f"{_f(ours['model_hours'], '.1f')} model-hours = {_f(ours['per_hour'], '.3f')}/h "
        f"(90 % {_f(ours['ci90'][0] if ours['ci90'] else None, '.3f')}-"
        f"{_f(ours['ci90'][1] if ours['ci90'] else None, '.3f')}); oracle also run at "
        f"{_f(o['at_ours_per_model_hour'], '.3f')}/h",
    ]
    for v in victims:
        lines.append(
            f"\n{v}: oracle P(detect) / median delay s at {TARGET_PER_HOUR:g}/model-hour "
            "[at ours' rate]; our delay / oracle's, median over seeds (n), and / the oracle's "
            f"at the loop's {LOOP_PASS_S:g}-s passes"
        )
        lines.append("| rate req/s | " + " | ".join(f"{x:g}x" for x in slowdowns) + " |")
        lines.append("|---:|" + "---|" * len(slowdowns))
        for rate in rates:
            cells = []
            for x in slowdowns:
                c = o["cells"].get(f"{v}|{rate:g}|{x:g}")
                if c is None:
                    cells.append("-")
                    continue
                cells.append(
                    f"{_f(c['p_detect'], '.2f')} / {_f(c['median_delay_s'], '.0f')} "
                    f"[{_f(c['median_delay_at_ours_s'], '.0f')}]; "
                    f"{_f(c['ratio_median'], '.1f')}x ({c['ratio_n']}), "
                    f"{_f(c['ratio_at_passes_median'], '.1f')}x"
                )
            lines.append(f"| {rate:g} | " + " | ".join(cells) + " |")
    lines.append(
        f"\ncalibration check on {NULL_SEEDS} fresh fault-free runs per rate (8 at 200 req/s): "
        f"the oracles at the threshold for {CHECK_PER_HOUR:g} false alarms per model-hour "
        f"(or the grid's smallest) and at the {TARGET_PER_HOUR:g} one"
    )
    for rate, c in o["calibration_check"].items():
        lines.append(
            f"  {rate} req/s: {c['alarms']} alarms in {c['oracle_hours']:.1f} oracle-hours = "
            f"{c['per_hour']:.1f}/h (90 % {c['ci90'][0]:.1f}-{c['ci90'][1]:.1f}), bootstrap "
            f"predicts {c['predicted_per_hour']:.1f}/h; at the {TARGET_PER_HOUR:g} threshold "
            f"{c['alarms_at_target']} alarms"
        )
    return "\n".join(lines)
