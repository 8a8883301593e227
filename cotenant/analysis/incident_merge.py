"""How the diagnoses of one event become one incident's story (:mod:`analysis.incidents`):
which indicator leads, what each indicator shows, the merged diagnosis of the episodes that
continue an incident."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cotenant.analysis.diagnosis import Diagnosis
from cotenant.core.slos import BREACH


def lead(ds: list[Diagnosis], current: str | None) -> str:
    """The indicator an incident is told by: the first to breach its SLO, else the one it
    already had, else the first found."""
    breached = sorted((d for d in ds if d.severity == BREACH), key=lambda d: d.start_ns)
    if current is not None and any(d.indicator == current for d in breached):
        return current
    if breached:
        return breached[0].indicator
    if current is not None and any(d.indicator == current for d in ds):
        return current
    return min(ds, key=lambda d: d.start_ns).indicator


def indicator_entry(d: Diagnosis, frozen: dict[str, Any] | None) -> dict[str, Any]:
    """What an incident shows of one indicator: extent, severity, before / during, SLO; the
    baseline and threshold stay as frozen when the indicator joined."""
    out: dict[str, Any] = {
        "start_ns": d.start_ns,
        "end_ns": d.end_ns,
        "open": d.open,
        "severity": d.severity,
        "baseline_p99_ms": num(d.baseline_p99_ms),
        "peak_p99_ms": num(d.peak_p99_ms),
        "slo_ms": d.slo_ms,
        "judged_on": None if d.judged is None else d.judged.to_dict(),
        "carried": d.carried,
    }
    if frozen:
        for k in ("baseline_p99_ms", "judged_on"):
            if k in frozen:
                out[k] = frozen[k]
        out["start_ns"] = min(d.start_ns, int(frozen.get("start_ns", d.start_ns)))
        if frozen.get("severity") == BREACH:
            out["severity"] = BREACH
        peaks = [float(x) for x in (frozen.get("peak_p99_ms"), out["peak_p99_ms"]) if x is not None]
        out["peak_p99_ms"] = max(peaks) if peaks else None
    return out


def num(x: float) -> float | None:
    return None if x != x else round(float(x), 3)


def merged(ds: list[Diagnosis]) -> Diagnosis:
    """One diagnosis for the episodes (in start order) that continue one incident: its
    extent, open when the newest is, a breach when any was; causes from the newest episode
    unless it is too short to say, then from the longest."""
    newest = ds[-1]
    src = newest
    if len(ds) > 1 and newest.open and newest.during_windows < 5:
        src = max(ds, key=lambda d: d.during_windows)
    peaks = [d.peak_p99_ms for d in ds if d.peak_p99_ms == d.peak_p99_ms]
    return replace(
        src,
        start_ns=min(d.start_ns for d in ds),
        end_ns=max(d.end_ns for d in ds),
        open=newest.open,
        severity=BREACH if any(d.severity == BREACH for d in ds) else newest.severity,
        peak_p99_ms=max(peaks) if peaks else src.peak_p99_ms,
        after_p99_ms=newest.after_p99_ms,
        during_windows=max(d.during_windows for d in ds),
    )
