"""Figures of a population run (:mod:`evaluation.victim_score` per scenario), with 90 %
intervals: proportions by Clopper-Pearson, false-incident rates by Garwood
(:mod:`evaluation.intervals`). :func:`summarize` gives a JSON-ready dict, :func:`render` the
tables ``cotenant bench --population`` prints (Markdown, as docs/accuracy.md shows them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from cotenant.evaluation.intervals import Interval, poisson_rate, proportion
from cotenant.evaluation.victim_score import ScenarioScore, VictimOutcome

RATE_BANDS: tuple[tuple[str, float, float], ...] = (
    ("< 0.5", 0.0, 0.5),
    ("0.5-2", 0.5, 2.0),
    ("2-20", 2.0, 20.0),
    (">= 20", 20.0, float("inf")),
)
"""Request-rate bands (req/s, the victim's rate over the fault): [low, high)."""
SLOWDOWN_BANDS: tuple[tuple[str, float, float], ...] = (
    ("1.2-1.5x", 0.0, 1.5),
    ("1.5-2x", 1.5, 2.0),
    ("2-3x", 2.0, 3.0),
    (">= 3x", 3.0, float("inf")),
)
"""Slowdown bands (the victim's p99 with / without the fault): [low, high); the truth's
victims are all 1.2x or more on some indicator."""


def _band(bands: tuple[tuple[str, float, float], ...], x: float) -> str:
    return next(name for name, lo, hi in bands if lo <= x < hi)


def _iv(i: Interval) -> dict[str, float]:
    return {"estimate": i.estimate, "low": i.low, "high": i.high}


def _prop(vs: Sequence[VictimOutcome], hit: Callable[[VictimOutcome], bool]) -> dict[str, Any]:
    k = sum(1 for v in vs if hit(v))
    return {"k": k, "n": len(vs), **_iv(proportion(k, len(vs)))}


def victim_figures(vs: Sequence[VictimOutcome]) -> dict[str, Any]:
    """Found, right first / final, AC@1 / AC@3, duplicates and delays over ``vs``."""
    found = [v for v in vs if v.found]
    delays = [v.delay_s for v in found if v.delay_s is not None]
    return {
        "victims": len(vs),
        "found": _prop(vs, lambda v: v.found),
        "right_first": _prop(vs, lambda v: v.right_first),
        "right_final": _prop(vs, lambda v: v.right_final),
        "right_first_or_final": _prop(vs, lambda v: v.right_first or v.right_final),
        "ac1": _prop(vs, lambda v: v.final_rank is not None and v.final_rank <= 1),
        "ac3": _prop(vs, lambda v: v.final_rank is not None and v.final_rank <= 3),
        "found_wrong_cause": sum(1 for v in found if not v.right_final),
        "one_incident": _prop(found, lambda v: v.incidents == 1),
        "duplicates": sum(v.duplicates for v in vs),
        "median_delay_s": float(np.median(delays)) if delays else None,
        "p90_delay_s": float(np.percentile(delays, 90)) if delays else None,
    }


def _false(scores: Sequence[ScenarioScore]) -> dict[str, Any]:
    k = sum(s.false_incidents for s in scores)
    mh = sum(s.model_hours_outside for s in scores)
    sev: dict[str, int] = {}
    for s in scores:
        for key, n in s.false_by_severity.items():
            sev[key] = sev.get(key, 0) + n
    hit = sum(1 for s in scores if s.false_incidents)
    out: dict[str, Any] = {
        "incidents": k,
        "model_hours": mh,
        "by_severity": sev,
        # false incidents cluster in a few scenarios: the Poisson interval assumes they do not
        "scenarios_with_false": {"k": hit, "n": len(scores), **_iv(proportion(hit, len(scores)))},
        "most_in_one_scenario": max((s.false_incidents for s in scores), default=0),
    }
    if mh > 0:
        out["per_model_hour"] = _iv(poisson_rate(k, mh))
    return out


def summarize(scores: Sequence[ScenarioScore]) -> dict[str, Any]:
    """Every figure of a run (module doc); errors are counted, their scenarios left out."""
    ok = [s for s in scores if s.error is None]
    faulted = [s for s in ok if s.kind == "faulted"]
    controls = [s for s in ok if s.kind == "control"]
    vs = [v for s in faulted for v in s.victims]
    goal = [v for v in vs if v.at_goal]
    cells: dict[str, Any] = {}
    for rname, _, _ in RATE_BANDS:
        for sname, _, _ in SLOWDOWN_BANDS:
            mine = [
                v
                for v in vs
                if _band(RATE_BANDS, v.rate_rps) == rname
                and _band(SLOWDOWN_BANDS, v.slowdown) == sname
            ]
            found = [v.delay_s for v in mine if v.delay_s is not None]
            cells[f"{rname}|{sname}"] = {
                "rate": rname,
                "slowdown": sname,
                "found": _prop(mine, lambda v: v.found),
                "median_delay_s": float(np.median(found)) if found else None,
            }
    kinds = sorted({v.fault_kind for v in vs})
    return {
        "scenarios": {
            "faulted": len(faulted),
            "controls": len(controls),
            "errors": [{"name": s.name, "error": s.error} for s in scores if s.error],
            "hours_faulted": sum(s.hours for s in faulted),
            "hours_controls": sum(s.hours for s in controls),
            "faults": sum(s.faults for s in faulted),
            "faults_with_victims": sum(s.faults_with_victims for s in faulted),
        },
        "all_victims": victim_figures(vs),
        "goal_victims": victim_figures(goal),
        "slo_victims": victim_figures([v for v in vs if v.slo_victim]),
        "within_slo_goal_victims": victim_figures([v for v in goal if not v.slo_victim]),
        "false_controls": _false(controls),
        "false_faulted_outside": _false(faulted),
        "bystander_incidents": sum(s.bystander_incidents for s in faulted),
        "cells": cells,
        "by_kind": {k: victim_figures([v for v in vs if v.fault_kind == k]) for k in kinds},
        "wall_s_sum": sum(s.wall_s for s in scores),
        "cpu_s_sum": sum(s.cpu_s for s in scores),
    }


def score_json(s: ScenarioScore) -> dict[str, Any]:
    """One scenario's score as JSON (victims with their derived flags)."""
    d = asdict(s)
    d["victims"] = [
        {**asdict(v), "found": v.found, "right_first": v.right_first, "right_final": v.right_final}
        for v in s.victims
    ]
    return d


# -- rendering ----------------------------------------------------------------------------------


def _pct(p: dict[str, Any]) -> str:
    if not p["n"]:
        return "—"
    return f"{p['k']}/{p['n']} = {p['estimate']:.2f} [{p['low']:.2f}, {p['high']:.2f}]"


def _rate(f: dict[str, Any]) -> str:
    if "per_model_hour" not in f:
        return "— (no model-hours)"
    r = f["per_model_hour"]
    return (
        f"{f['incidents']} in {f['model_hours']:.1f} model-h = {r['estimate']:.3f} "
        f"[{r['low']:.3f}, {r['high']:.3f}] per model-hour"
    )


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}"


def render(summary: dict[str, Any], *, live: bool) -> str:
    """The run's tables, Markdown (``live``: the path scored, said by the caller's title; both
    paths have a first and a final cause).
    """
    sc = summary["scenarios"]
    lines = [
        f"{sc['faulted']} faulted scenarios ({sc['hours_faulted']:.1f} h, {sc['faults']} faults, "
        f"{sc['faults_with_victims']} with victims), {sc['controls']} fault-free controls "
        f"({sc['hours_controls']:.1f} h); errors: {len(sc['errors'])}",
        "",
        "| victims | n | found | right cause first | right cause final | first or final | AC@1 "
        "| AC@3 | one incident (of found) | duplicates | delay median / p90 s |",
        "|---|---:|---|---|---|---|---|---|---|---:|---|",
    ]
    groups = (
        ("all", "all_victims"),
        ("at the goal's bar", "goal_victims"),
        ("SLO victims", "slo_victims"),
        ("within-SLO at the bar", "within_slo_goal_victims"),
    )
    for label, key in groups:
        v = summary[key]
        lines.append(
            f"| {label} | {v['victims']} | {_pct(v['found'])} | {_pct(v['right_first'])} | "
            f"{_pct(v['right_final'])} | {_pct(v['right_first_or_final'])} | "
            f"{_pct(v['ac1'])} | {_pct(v['ac3'])} | "
            f"{_pct(v['one_incident'])} | {v['duplicates']} | "
            f"{_s(v['median_delay_s'])} / {_s(v['p90_delay_s'])} |"
        )
    lines += [
        "",
        f"false incidents, controls: {_rate(summary['false_controls'])}",
        f"false incidents, faulted scenarios outside faults: "
        f"{_rate(summary['false_faulted_outside'])}",
        f"incidents of non-victims during faults: {summary['bystander_incidents']}",
        "",
        "found / n [90 % interval], median delay s — by victim rate (rows) and slowdown:",
        "",
        "| rate req/s | " + " | ".join(name for name, _, _ in SLOWDOWN_BANDS) + " |",
        "|---|" + "---|" * len(SLOWDOWN_BANDS),
    ]
    for rname, _, _ in RATE_BANDS:
        cells = []
        for sname, _, _ in SLOWDOWN_BANDS:
            c = summary["cells"][f"{rname}|{sname}"]
            cells.append(f"{_pct(c['found'])}, {_s(c['median_delay_s'])} s")
        lines.append(f"| {rname} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| fault kind | victims | found | right cause final | AC@3 |",
        "|---|---:|---|---|---|",
    ]
    for kind, v in summary["by_kind"].items():
        lines.append(
            f"| {kind} | {v['victims']} | {_pct(v['found'])} | {_pct(v['right_final'])} | "
            f"{_pct(v['ac3'])} |"
        )
    return "\n".join(lines)
