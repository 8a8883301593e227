"""Tables for docs/accuracy.md from ``cotenant bench --population ... --json`` outputs.

    .venv/bin/python bench/population_report.py --batch TEST DEV LIB --live TEST DEV LIB

Each argument is one run's JSON (test population, dev population, bundled library; ``-`` for
a run not made; ``--columns`` renames the three, e.g. ``test before dev`` to set a run of the
previous detector beside the current one). Prints Markdown: per-victim figures side by side
(test | dev | library) for each path, false incidents per model-hour with their 90 %
intervals, detection and delay by (rate band, slowdown band) for each population, by fault
kind, and what each run took.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cotenant.evaluation.population_summary import RATE_BANDS, SLOWDOWN_BANDS

COLUMNS = ("test", "dev", "library")


def _load(path: str) -> dict[str, Any] | None:
    return None if path == "-" else json.loads(Path(path).read_text())


def _p(p: dict[str, Any] | None, short: bool = False) -> str:
    if p is None or not p["n"]:
        return "—"
    if short:
        return f"{p['k']}/{p['n']}"
    return f"{p['k']}/{p['n']} = **{p['estimate']:.2f}** [{p['low']:.2f}, {p['high']:.2f}]"


def _d(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}"


def victim_table(
    runs: list[dict[str, Any] | None], group: str, live: bool, columns: tuple[str, ...] = COLUMNS
) -> list[str]:
    rows = [
        ("victims", lambda v: str(v["victims"])),
        ("found", lambda v: _p(v["found"])),
    ]
    if live:
        rows.append(("right cause first", lambda v: _p(v["right_first"])))
    rows += [
        ("right cause final" if live else "right cause (AC@1)", lambda v: _p(v["right_final"])),
        ("right first or final", lambda v: _p(v["right_first_or_final"])),
        ("AC@3", lambda v: _p(v["ac3"])),
        ("found, wrong final cause", lambda v: str(v["found_wrong_cause"])),
        ("one incident (of found)", lambda v: _p(v["one_incident"])),
        ("duplicate incidents", lambda v: str(v["duplicates"])),
        ("delay median / p90 (s)", lambda v: f"{_d(v['median_delay_s'])} / {_d(v['p90_delay_s'])}"),
    ]
    if not live:
        rows = [r for r in rows if r[0] != "right first or final"]
    out = ["| | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label, fn in rows:
        cells = ["—" if r is None else fn(r["summary"][group]) for r in runs]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return out


def _rate(f: dict[str, Any]) -> str:
    if "per_model_hour" not in f:
        return "—"
    r = f["per_model_hour"]
    out = (
        f"{f['incidents']} in {f['model_hours']:.0f} model-h = **{r['estimate']:.3f}** "
        f"[{r['low']:.3f}, {r['high']:.3f}]"
    )
    if "scenarios_with_false" in f:
        w = f["scenarios_with_false"]
        out += f"; in {w['k']} of {w['n']} scenarios, at most {f['most_in_one_scenario']} in one"
    return out


def _with_clusters(run: dict[str, Any]) -> None:
    """Add how false incidents cluster by scenario to a run summarised before that was."""
    for key, kind in (("false_controls", "control"), ("false_faulted_outside", "faulted")):
        f = run["summary"][key]
        if "scenarios_with_false" not in f:
            got = [s["false_incidents"] for s in run["scenarios"] if s["kind"] == kind]
            f["scenarios_with_false"] = {"k": sum(1 for x in got if x), "n": len(got)}
            f["most_in_one_scenario"] = max(got, default=0)


def false_table(
    batch: list[dict[str, Any] | None],
    live: list[dict[str, Any] | None],
    columns: tuple[str, ...] = COLUMNS,
) -> list[str]:
    out = ["| false incidents per model-hour | " + " | ".join(columns) + " |"]
    out.append("|---|" + "---|" * len(columns))
    for path, runs in (("batch", batch), ("live", live)):
        for key, label in (
            ("false_controls", "fault-free controls"),
            ("false_faulted_outside", "faulted scenarios, outside faults"),
        ):
            cells = ["—" if r is None else _rate(r["summary"][key]) for r in runs]
            out.append(f"| {path}: {label} | " + " | ".join(cells) + " |")
        cells = ["—" if r is None else str(r["summary"]["bystander_incidents"]) for r in runs]
        out.append(
            f"| {path}: incidents of non-victims during faults | " + " | ".join(cells) + " |"
        )
    return out


def _cell(c: dict[str, Any], short: bool = False) -> str:
    f = c["found"]
    if not f["n"]:
        return "—"
    delay = _d(c["median_delay_s"])
    if short:
        return f"{f['k']}/{f['n']}, {delay} s"
    return f"{f['k']}/{f['n']} [{f['low']:.2f}, {f['high']:.2f}], {delay} s"


def cells_table(
    run: dict[str, Any], beside: dict[str, Any] | None, label: str = "dev"
) -> list[str]:
    """Found [90 %] and median delay per (rate band, slowdown band); ``beside``'s (``label``)
    after each cell in brackets."""
    out = ["| victim rate req/s | " + " | ".join(n for n, _, _ in SLOWDOWN_BANDS) + " |"]
    out.append("|---|" + "---|" * len(SLOWDOWN_BANDS))
    for rname, _, _ in RATE_BANDS:
        cells = []
        for sname, _, _ in SLOWDOWN_BANDS:
            key = f"{rname}|{sname}"
            cell = _cell(run["summary"]["cells"][key])
            if beside is not None:
                cell += f" ({label} {_cell(beside['summary']['cells'][key], True)})"
            cells.append(cell)
        out.append(f"| {rname} | " + " | ".join(cells) + " |")
    return out


def kinds_table(runs: list[tuple[str, dict[str, Any] | None]]) -> list[str]:
    runs = [(label, r) for label, r in runs if r is not None]
    kinds = sorted({k for _, r in runs for k in r["summary"]["by_kind"]})
    out = ["| fault kind: found / right final | " + " | ".join(label for label, _ in runs) + " |"]
    out.append("|---|" + "---|" * len(runs))
    for k in kinds:
        cells = []
        for _, r in runs:
            v = r["summary"]["by_kind"].get(k)
            cells.append(
                "—" if v is None else f"{_p(v['found'], True)} / {_p(v['right_final'], True)}"
            )
        out.append(f"| {k} | " + " | ".join(cells) + " |")
    return out


def runs_table(runs: list[tuple[str, dict[str, Any] | None]]) -> list[str]:
    out = [
        "| run | command | faulted / controls | hours | wall | CPU | load avg at end |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for name, r in runs:
        if r is None:
            continue
        sc = r["summary"]["scenarios"]
        hours = sc["hours_faulted"] + sc["hours_controls"]
        load = ", ".join(f"{x:.1f}" for x in r["machine"]["load_avg"])
        out.append(
            f"| {name} | `{r['command']}` | {sc['faulted']} / {sc['controls']} | {hours:.1f} | "
            f"{r['wall_s'] / 60:.0f} min | {r['summary']['cpu_s_sum'] / 60:.0f} min | {load} |"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", nargs=3, default=["-", "-", "-"], metavar=("TEST", "DEV", "LIB"))
    ap.add_argument("--live", nargs=3, default=["-", "-", "-"], metavar=("TEST", "DEV", "LIB"))
    ap.add_argument("--columns", nargs=3, default=list(COLUMNS), metavar=("A", "B", "C"))
    args = ap.parse_args()
    columns = tuple(args.columns)
    batch = [_load(p) for p in args.batch]
    live = [_load(p) for p in args.live]
    for run in batch + live:
        if run is not None:
            _with_clusters(run)
    out: list[str] = []
    for title, runs, is_live in (("batch", batch, False), ("live", live, True)):
        if not any(runs):
            continue
        for group, label in (
            ("all_victims", "every victim"),
            ("goal_victims", "at the goal's bar"),
        ):
            out += ["", f"#### {title}: {label}", "", *victim_table(runs, group, is_live, columns)]
    out += ["", "#### false incidents", "", *false_table(batch, live, columns)]
    for title, runs in (("batch", batch), ("live", live)):
        if runs[0] is not None:
            out += [
                "",
                f"#### {title}, {columns[0]} ({columns[1]}): found [90 %] and median delay",
                "",
            ]
            out += cells_table(runs[0], runs[1], columns[1])
    out += ["", "#### by fault kind", ""]
    out += kinds_table(
        [
            (f"{p} {c}", r)
            for p, rs in (("batch", batch), ("live", live))
            for c, r in zip(columns, rs, strict=True)
        ]
    )
    named = [(f"batch {c}", r) for c, r in zip(columns, batch, strict=True)]
    named += [(f"live {c}", r) for c, r in zip(columns, live, strict=True)]
    out += ["", "#### runs", "", *runs_table(named)]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
