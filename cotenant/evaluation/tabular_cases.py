"""``cotenant bench --tabular DIR``: accuracy of tabular mode on labelled cases, side by side
with the baselines.

Every sub-folder of ``DIR`` holding a ``label.json`` (``{"root_cause": "<entity>", ...}``) is a
case (see :mod:`analysis.tabular`). For each, the anomaly start is the case's inject time (or,
with ``detect_start``, the BOCPD change point of :func:`analysis.tabular.find_start`; a case
where none is found counts as a miss for every method), and then:

* cotenant ranks the entities with :func:`analysis.tabular.rank_entities`;
* each baseline ranks every column of the candidate entities
  (:func:`analysis.tabular.candidate_series`) from the same start; an entity's rank is that of
  its best column.

AC@k is the share of cases whose root cause is among the top k; Avg@5 the mean of AC@1..AC@5.
The results are a JSON-ready dict; :func:`render_tabular` prints them.
"""

from __future__ import annotations

import dataclasses
import json
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


def summarize(ranks: Sequence[int | None]) -> dict[str, float]:
    """AC@1, AC@3, AC@5 and Avg@5 of the root cause's ranks (None: not ranked)."""
    n = max(len(ranks), 1)
    ac = {k: sum(r is not None and r <= k for r in ranks) / n for k in KS}
    return {"AC@1": ac[1], "AC@3": ac[3], "AC@5": ac[5], "Avg@5": sum(ac.values()) / len(KS)}


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
    Raises :class:`TabularError` when ``root`` holds no case or a case cannot be read."""
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
    for d in dirs:
        label = _label(d)
        case = load_case(d)
        truth = label["root_cause"]
        row: dict[str, Any] = {
            "case": d.name,
            "root_cause": truth,
            "fault": label.get("fault"),
            "anomaly_start": None,
            "start_from": None,
            "ranks": dict.fromkeys(methods),
        }
        cases.append(row)
        try:
            if detect_start:
                case = dataclasses.replace(case, inject_time=None)
            start, how, _ = find_start(case)
        except TabularError as exc:
            if not detect_start:
                raise
            row["start_from"] = f"none ({exc})"
            continue
        row["anomaly_start"] = float(case.time[start])
        row["start_from"] = how
        ours, _, _ = rank_entities(case, start, rules)
        row["ranks"][OURS] = _rank(ours, truth)
        series = candidate_series(case)
        for r in rankers:
            row["ranks"][r.name] = _rank(entity_order(r.rank(series, start)), truth)
    summary = {m: summarize([c["ranks"][m] for c in cases]) for m in methods}
    return {
        "dir": str(folder),
        "start": "change-point" if detect_start else "inject-time",
        "methods": methods,
        "summary": summary,
        "cases": cases,
    }


def render_tabular(results: dict[str, Any]) -> str:
    """The per-case ranks and the summary of :func:`bench_tabular` as a text table."""
    methods: list[str] = results["methods"]
    lines = [
        f"{'case':30s} {'fault':16s} {'root cause':24s} " + " ".join(f"{m:>9s}" for m in methods)
    ]
    for c in results["cases"]:
        ranks = " ".join(f"{c['ranks'][m] or 'miss'!s:>9s}" for m in methods)
        fault = str(c.get("fault") or "")
        lines.append(f"{c['case'][:30]:30s} {fault[:16]:16s} {c['root_cause'][:24]:24s} {ranks}")
    lines.append("")
    lines.append(f"{len(results['cases'])} cases, anomaly start from {results['start']}")
    for m in methods:
        s = results["summary"][m]
        lines.append(
            f"{m:>10s}: AC@1 {s['AC@1']:.3f}  AC@3 {s['AC@3']:.3f}  Avg@5 {s['Avg@5']:.3f}"
        )
    return "\n".join(lines)
