"""Which replica is slow, and whether its siblings say the model itself is fine.

A replica is a model on one GPU (requests name it in their ``replica`` column, spans in
``cotenant.replica``), so its series are the (model, GPU) series analysis already has. When an
incident of model M on GPU G is diagnosed, :func:`annotate_replicas` names G's replica of M
(``Diagnosis.replica``) and, for every other GPU serving M in the same windows, compares that
sibling's p99 during the incident with its own p99 before it (``Diagnosis.siblings``). A
sibling within ``FINE_RATIO`` of its baseline and within the SLO is evidence that the model
and its traffic are fine and G is the problem — what makes moving traffic to that sibling
(a ``reroute``) worth proposing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from cotenant.analysis.windows import GpuWindows


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
    siblings: list[dict[str, Any]]


BEFORE_WINDOWS = 60
"""Windows with requests before the incident that make a sibling's baseline."""
FINE_RATIO = 1.5
"""A sibling whose p99 during the incident is at most this times its baseline is "fine"."""


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
    within = slo_ms is None or now <= slo_ms
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
    """Set ``replica`` and ``siblings`` on each incident diagnosis in ``diags`` (in place),
    and add a note saying what the siblings show. ``windows``: GPU -> the windows read this
    pass; ``names``: (model, GPU) -> replica name (:meth:`MetricSource.replicas`)."""
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
        d.siblings = sibs
        if sibs:
            d.notes.append(_note(d, sibs))


def _note(d: Diagnosed, sibs: list[dict[str, Any]]) -> str:
    me = f"replica {d.replica} on {d.gpu}" if d.replica else f"{d.model} on {d.gpu}"

    def one(s: dict[str, Any]) -> str:
        name = f"{s['replica']} on {s['gpu']}" if s["replica"] else s["gpu"]
        base = s["baseline_p99_ms"]
        vs = f" (baseline {base:g} ms)" if base is not None else ""
        return f"{name} p99 {s['p99_ms']:g} ms{vs}"

    fine = [s for s in sibs if s["fine"]]
    if fine:
        return (
            f"{me} is slow while {', '.join(one(s) for s in fine)} "
            "is not: the model itself is fine, this GPU is not"
        )
    return f"{me} is slow and so is {', '.join(one(s) for s in sibs)}: not this GPU alone"
