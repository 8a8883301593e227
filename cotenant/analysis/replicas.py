"""Which replica is slow, and whether its siblings say the model itself is fine.

A replica is a model on one GPU (requests name it in their ``replica`` column, spans in
``cotenant.replica``), so its series are the (model, GPU) series analysis already has. When an
incident of model M on GPU G is diagnosed, :func:`annotate_replicas` names G's replica of M
(``Diagnosis.replica``) and, for every other GPU serving M in the same windows, compares that
sibling's p99 during the incident with its own p99 before it (``Diagnosis.siblings``). A
sibling within ``FINE_RATIO`` of its baseline and within the SLO is evidence that the model
and its traffic are fine and G is the problem — what makes moving traffic to that sibling
(a ``reroute``) worth proposing.

A pool of a hundred replicas must not turn one diagnosis into a hundred lines:
``Diagnosis.siblings`` is a summary (:func:`summarise`): how many siblings served during the
incident and how many were fine, the median and spread of their p99, and the siblings listed
in full only up to ``LIST_ALL`` of them; beyond that, the ``WORST`` slowest and the ``FINE``
fastest fine ones (the candidates a reroute moves traffic to).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from cotenant.analysis.windows import GpuWindows
from cotenant.core.slos import breach


class Diagnosed(Protocol):
    """What this module reads and sets on a diagnosis (:class:`analysis.diagnose.Diagnosis`,
    which calls it)."""

    model: str
    gpu: str
    start_ns: int
    end_ns: int
    slo_ms: float | None
    notes: list[str]
    replica: str | None
    siblings: dict[str, Any]


BEFORE_WINDOWS = 60
"""Windows with requests before the incident that make a sibling's baseline."""
FINE_RATIO = 1.5
"""A sibling whose p99 during the incident is at most this times its baseline is "fine"."""
LIST_ALL = 8
"""Up to this many siblings are listed in full; beyond, WORST + FINE of them."""
WORST = 3
"""Siblings listed beyond LIST_ALL: the slowest (highest p99 over its baseline) ..."""
FINE = 5
"""... and the fastest fine ones."""


def sibling_evidence(
    w: GpuWindows,
    model: str,
    start_ns: int,
    end_ns: int,
    *,
    replica: str | None,
    slo_ms: float | None,
) -> dict[str, Any] | None:
    """``model``'s p99 on ``w``'s GPU over ``[start_ns, end_ns)`` (median of the windows'
    p99, ms) against its baseline (median p99 of up to BEFORE_WINDOWS windows with requests
    just before ``start_ns``); None when it served nothing during that span."""
    v = w.models.get(model)
    if v is None:
        return None
    ts = w.ts_ns
    p99, count = v["p99_ms"], v["count"]
    has = np.isfinite(p99) & (count > 0)
    during = has & (ts >= start_ns) & (ts < end_ns)
    if not during.any():
        return None
    before = np.flatnonzero(has & (ts < start_ns))[-BEFORE_WINDOWS:]
    now = float(np.median(p99[during]))
    base = float(np.median(p99[before])) if len(before) else None
    within = not breach(now, slo_ms)
    fine = within and (base is None or now <= FINE_RATIO * base)
    return {
        "replica": replica,
        "gpu": w.gpu,
        "p99_ms": round(now, 3),
        "baseline_p99_ms": None if base is None else round(base, 3),
        "slo_ms": slo_ms,
        "rate_rps": round(float(np.mean(v["rate_rps"][during])), 3),
        "fine": bool(fine),
    }


def annotate_replicas(
    diags: Sequence[Diagnosed],
    windows: Mapping[str, GpuWindows],
    names: Mapping[tuple[str, str], str],
) -> None:
    """Set ``replica`` and ``siblings`` (:func:`summarise`) on each incident diagnosis in
    ``diags`` (in place), and add a note saying what the siblings show. ``windows``: GPU ->
    the windows read this pass; ``names``: (model, GPU) -> replica name
    (:meth:`MetricSource.replicas`)."""
    for d in diags:
        d.replica = names.get((d.model, d.gpu))
        sibs = []
        for gpu, w in windows.items():
            if gpu == d.gpu:
                continue
            ev = sibling_evidence(
                w,
                d.model,
                d.start_ns,
                d.end_ns,
                replica=names.get((d.model, gpu)),
                slo_ms=d.slo_ms,
            )
            if ev is not None:
                sibs.append(ev)
        d.siblings = summarise(sibs)
        if sibs:
            d.notes.append(_note(d, d.siblings))


def _slowness(s: Mapping[str, Any]) -> float:
    base = s["baseline_p99_ms"]
    return float(s["p99_ms"]) / base if base else float(s["p99_ms"])


def summarise(sibs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The siblings of one diagnosis (each a :func:`sibling_evidence`) as ``{count, fine,
    p99_ms: {median, p10, p90, max}, listed, omitted}``: ``listed`` holds every sibling when
    there are at most LIST_ALL, else the WORST slowest (p99 over baseline) then the FINE fine
    ones of lowest p99; ``omitted`` is how many are not listed. ``{}`` for no sibling."""
    if not sibs:
        return {}
    p99 = np.array([s["p99_ms"] for s in sibs], dtype=float)
    if len(sibs) <= LIST_ALL:
        listed = list(sibs)
    else:
        worst = sorted(sibs, key=_slowness, reverse=True)[:WORST]
        fine = sorted((s for s in sibs if s["fine"]), key=lambda s: s["p99_ms"])
        listed = worst + [s for s in fine if s not in worst][:FINE]
    return {
        "count": len(sibs),
        "fine": sum(bool(s["fine"]) for s in sibs),
        "p99_ms": {
            "median": round(float(np.median(p99)), 3),
            "p10": round(float(np.percentile(p99, 10)), 3),
            "p90": round(float(np.percentile(p99, 90)), 3),
            "max": round(float(p99.max()), 3),
        },
        "listed": listed,
        "omitted": len(sibs) - len(listed),
    }


def listed_siblings(siblings: Any) -> list[dict[str, Any]]:
    """The siblings a diagnosis or a stored incident lists in full: ``listed`` of a
    :func:`summarise` summary, or the whole list of incidents stored before summaries."""
    if isinstance(siblings, Mapping):
        return list(siblings.get("listed") or [])
    return list(siblings or [])


def _one(s: Mapping[str, Any]) -> str:
    name = f"{s['replica']} on {s['gpu']}" if s["replica"] else str(s["gpu"])
    base = s["baseline_p99_ms"]
    vs = f" (baseline {base:g} ms)" if base is not None else ""
    return f"{name} p99 {s['p99_ms']:g} ms{vs}"


def _note(d: Diagnosed, summary: Mapping[str, Any]) -> str:
    """One sentence: whether the siblings say the model is fine (most of them are) or not;
    every sibling named when all are listed, else their count, spread and the slowest."""
    me = f"replica {d.replica} on {d.gpu}" if d.replica else f"{d.model} on {d.gpu}"
    n, fine, listed = summary["count"], summary["fine"], summary["listed"]
    model_fine = fine > 0 and 2 * fine >= n
    if not summary["omitted"]:
        if model_fine:
            shown = ", ".join(_one(s) for s in listed if s["fine"])
            return f"{me} is slow while {shown} is not: the model itself is fine, this GPU is not"
        return f"{me} is slow and so is {', '.join(_one(s) for s in listed)}: not this GPU alone"
    q = summary["p99_ms"]
    spread = f"p99 median {q['median']:g} ms, p10-p90 {q['p10']:g}-{q['p90']:g} ms"
    slowest = "; slowest " + ", ".join(_one(s) for s in listed[:WORST])
    if model_fine:
        return (
            f"{me} is slow while {fine} of its {n} sibling replicas are fine ({spread}"
            f"{slowest}): the model itself is fine, this GPU is not"
        )
    return (
        f"{me} is slow and so are {n - fine} of its {n} sibling replicas ({spread}{slowest}):"
        " not this GPU alone"
    )
