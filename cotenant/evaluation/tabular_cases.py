"""``cotenant bench --tabular DIR``: accuracy of tabular mode on labelled cases, side by side
with the baselines.

Every sub-folder of ``DIR`` holding a ``label.json`` (``{"root_cause": "<entity>", ...}``) is a
case (see :mod:`analysis.tabular`). For each, the anomaly start is the case's inject time (or,
with ``detect_start``, the start :func:`analysis.tabular.find_start` finds without one: a
change point, else the largest rise; a case where none can be found counts as a miss for every
method), and then:

* cotenant ranks the entities with :func:`analysis.tabular.rank_entities`;
* each baseline ranks every column of the candidate entities
  (:func:`analysis.tabular.candidate_series`) from the same start; an entity's rank is that of
  its best column.

AC@k is the share of cases whose root cause is among the top k; Avg@5 the mean of AC@1..AC@5;
AC@1 and AC@3 come with a 95 % Wilson interval. A case whose table cannot be read, or whose
anomaly start cannot be placed, counts as a miss for every method (its reason in ``start_from``).

**Halves.** The cases, in name order, are split into a *development* half (the 1st, 3rd, 5th,
... case) and a *test* half (the 2nd, 4th, ...): rules are tuned looking at the development half
only, and the test half is reported, not looked at. Interleaving keeps both halves alike when
cases are numbered in injection order (fault types and services come in runs). The summary is
given for all cases and for each half.

The results are a JSON-ready dict; :func:`render_tabular` prints them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cotenant.analysis.baselines import Baro, NSigma, Ranker
from cotenant.analysis.tabular import (
    Rules,
    candidate_series,
    entity_of,
    find_start,
    load_case,
    rank_entities,
)
from cotenant.core.errors import TabularError

OURS = "cotenant"
KS = (1, 2, 3, 4, 5)
HALVES = ("dev", "test")


def entity_order(ranked: Sequence[tuple[str, float]]) -> list[str]:
    """Entities in the order their best column appears in a column ranking."""
    return list(dict.fromkeys(entity_of(col) for col, _ in ranked))


def _rank(order: Sequence[str], truth: str) -> int | None:
    return order.index(truth) + 1 if truth in order else None


def _label(folder: Path) -> dict[str, Any]:
    path = folder / "label.json"
    try:
        label = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TabularError(f"{path}: cannot be read as JSON ({exc})") from exc
    if not isinstance(label, dict) or not isinstance(label.get("root_cause"), str):
        raise TabularError(f'{path}: needs {{"root_cause": "<entity>"}}')
    return label


def half_of(index: int) -> str:
    """The half of the case at ``index`` (0-based, name order): ``dev`` for even indices (the
    1st, 3rd, ... case), ``test`` for odd ones."""
    return HALVES[index % 2]


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of ``hits`` out of ``n`` (``(0, 1)`` when ``n`` is 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(ranks: Sequence[int | None]) -> dict[str, Any]:
    """AC@1, AC@3, AC@5 and Avg@5 of the root cause's ranks (None: not ranked), the number of
    cases ``n``, and 95 % Wilson intervals of AC@1 and AC@3."""
    n = len(ranks)
    hits = {k: sum(r is not None and r <= k for r in ranks) for k in KS}
    ac = {k: hits[k] / max(n, 1) for k in KS}
    return {
        "n": n,
        "AC@1": ac[1],
        "AC@3": ac[3],
        "AC@5": ac[5],
        "Avg@5": sum(ac.values()) / len(KS),
        "AC@1_ci": [round(x, 3) for x in wilson(hits[1], n)],
        "AC@3_ci": [round(x, 3) for x in wilson(hits[3], n)],
    }


def bench_tabular(
    root: Path | str,
    *,
    baselines: Sequence[Ranker] | None = None,
    detect_start: bool = False,
    rules: Rules | None = None,
) -> dict[str, Any]:
    """Score cotenant (with ``rules``, default all on) and ``baselines`` (default: BARO and
    NSigma) on every case folder under ``root``. Returns ``{"dir", "start", "methods",
    "summary": {method: {"AC@1", "AC@3", "AC@5", "Avg@5"}}, "cases": [{"case", "root_cause",
    "fault", "anomaly_start", "start_from", "ranks": {method: rank or None}}]}``.
    Each case also has ``"half"`` (``dev`` | ``test``, :func:`half_of`) and ``"notes"`` (what its
    table's loading read leniently); ``"halves"`` holds the summary of each half. Raises
    :class:`TabularError` when ``root`` holds no case or a ``label.json`` cannot be read."""
    folder = Path(root)
    rankers: list[Ranker] = list(baselines) if baselines is not None else [Baro(), NSigma()]
    methods = [OURS, *(r.name for r in rankers)]
    dirs = (
        sorted(p for p in folder.iterdir() if (p / "label.json").is_file())
        if folder.is_dir()
        else []
    )
    if not dirs:
        raise TabularError(f"{folder}: no case folders (with label.json) in it")
    cases: list[dict[str, Any]] = []
    for i, d in enumerate(dirs):
        label = _label(d)
        truth = label["root_cause"]
        row: dict[str, Any] = {
            "case": d.name,
            "half": half_of(i),
            "root_cause": truth,
            "fault": label.get("fault"),
            "anomaly_start": None,
            "start_from": None,
            "notes": [],
            "ranks": dict.fromkeys(methods),
        }
        cases.append(row)
        try:
            case = load_case(d)
            row["notes"] = list(case.notes)
            if detect_start:
                case = dataclasses.replace(case, inject_time=None)
            found = find_start(case)
        except TabularError as exc:
            row["start_from"] = f"none ({exc})"
            continue
        start = found.row
        row["anomaly_start"] = float(case.time[start])
        row["start_from"] = found.how
        if found.note:
            row["notes"].append(found.note)
        ours, _, _ = rank_entities(case, start, rules)
        row["ranks"][OURS] = _rank(ours, truth)
        series = candidate_series(case)
        for r in rankers:
            row["ranks"][r.name] = _rank(entity_order(r.rank(series, start)), truth)
    summary = {m: summarize([c["ranks"][m] for c in cases]) for m in methods}
    halves = {
        h: {m: summarize([c["ranks"][m] for c in cases if c["half"] == h]) for m in methods}
        for h in HALVES
    }
    return {
        "dir": str(folder),
        "start": "change-point" if detect_start else "inject-time",
        "methods": methods,
        "summary": summary,
        "halves": halves,
        "cases": cases,
    }


def render_tabular(results: dict[str, Any]) -> str:
    """The per-case ranks and the summary of :func:`bench_tabular` as a text table."""
    methods: list[str] = results["methods"]
    lines = [
        f"{'case':30s} {'half':4s} {'fault':16s} {'root cause':24s} "
        + " ".join(f"{m:>9s}" for m in methods)
    ]
    for c in results["cases"]:
        ranks = " ".join(f"{c['ranks'][m] or 'miss'!s:>9s}" for m in methods)
        fault = str(c.get("fault") or "")
        lines.append(
            f"{c['case'][:30]:30s} {c['half']:4s} {fault[:16]:16s} {c['root_cause'][:24]:24s} "
            f"{ranks}"
        )
    refused = [c for c in results["cases"] if str(c["start_from"]).startswith("none")]
    lines.append("")
    lines.append(
        f"{len(results['cases'])} cases, anomaly start from {results['start']}"
        + (f"; {len(refused)} without a start (a miss for every method)" if refused else "")
    )
    for title, summary in (("all", results["summary"]), *results["halves"].items()):
        lines.append(f"{title} (n = {next(iter(summary.values()))['n']}):")
        for m in methods:
            s = summary[m]
            lines.append(
                f"{m:>10s}: AC@1 {s['AC@1']:.3f} {_ci(s['AC@1_ci'])}  AC@3 {s['AC@3']:.3f} "
                f"{_ci(s['AC@3_ci'])}  Avg@5 {s['Avg@5']:.3f}"
            )
    return "\n".join(lines)


def _ci(ci: list[float]) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]"
