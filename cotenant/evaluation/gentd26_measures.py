"""Measures of any detector's incidents on the GenTD26 trace that can fail.

The trace has no fault labels, so what can be checked is whether a detector's incidents agree
with what the trace itself shows, by definitions that do not depend on the detector:

* **recall of unambiguous spikes**: a step whose e2e latency is at least ``spike_ratio`` (3)
  times its container's trailing median and ``spike_margin_ms`` (5 s) above it is a spike
  step; a run of consecutive spike steps of one container is one spike event. An event is
  found when an incident on that container covers one of its steps.
* **precision**: an incident is true when one of the steps it covers is at least
  ``elevated_ratio`` (1.5) times its container's trailing median. Beside it, the share of
  the covered steps that are (an incident held open over flat steps lowers it).
* **cause enrichment** (:mod:`cotenant.evaluation.gentd26_enrichment`): for each cause named,
  how much more often its evidence is in the windows where it is named than in ordinary
  windows of the same containers.
* **share of excess explained**: the excess latency of an incident is the sum over its steps
  of e2e above the trailing median; the share explained is the part its named causes (not
  ``unknown``) take, weighted by excess.

**Trailing medians only.** A step's reference is the median of its container's values over
the ``window`` (30) steps before it, the step itself excluded, and a step is judged only when
at least ``min_count`` (5) of them have a value: nothing uses data after the step judged.

**Halves.** The trace is cut where half of its e2e rows lie behind (:func:`split_step`; its
traffic is not even over time: the middle *step* would leave a seventh of the rows to the
second half). Every rate or threshold the measures fit (the enrichment's base rates, the
duty-cycle saturation level) comes from the first half; the figures are reported on the second
(events and incidents belong to the half they start in).

An incident is a :class:`TraceIncident` (container hash or ``None`` for one covering every
container of its model, start and end in trace seconds, causes with shares), so incidents of
any detector can be scored: the product's through an import (``gentd26_product``) or any
other. Raises :class:`~cotenant.core.errors.UsageError` for an incident on a container or
model the trace does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cotenant.core.errors import UsageError
from cotenant.evaluation.gentd26 import Trace
from cotenant.evaluation.gentd26_enrichment import Evidence, enrichment
from cotenant.evaluation.gentd26_steps import (
    UNKNOWN,
    MeasureParams,
    NamedCause,
    Panels,
    Scored,
    TraceIncident,
    place,
    runs,
)
from cotenant.evaluation.intervals import proportion

__all__ = ["MeasureParams", "NamedCause", "TraceIncident", "measure"]


def _rate(k: int, n: int) -> dict[str, Any]:
    if not n:
        return {"k": 0, "n": 0, "rate": None, "ci90": None}
    ci = proportion(k, n)
    return {"k": k, "n": n, "rate": k / n, "ci90": [ci.low, ci.high]}


def detection(
    panels: Panels, scored: Sequence[Scored], split: int, columns: Sequence[int]
) -> dict[str, Any]:
    """Recall of the spike events that start at or after ``split`` on ``columns``, and the
    precision of the incidents that start there (a model-wide incident is true when any of
    its containers holds an elevated step)."""
    covered = np.zeros_like(panels.spike)
    for s in scored:
        covered[s.s0 : s.s1 + 1, s.column] = True
    events = found = 0
    event_excess = found_excess = 0.0
    for c in columns:
        for a, b in runs(panels.spike[:, c]):
            if a < split:
                continue
            events += 1
            x = panels.excess(c, a, b)
            event_excess += x
            if covered[a : b + 1, c].any():
                found += 1
                found_excess += x
    late = [s for s in scored if s.s0 >= split]
    true: dict[int, bool] = {}
    steps = up = 0
    for s in late:
        hit = panels.elevated[s.s0 : s.s1 + 1, s.column]
        true[id(s.incident)] = true.get(id(s.incident), False) or bool(hit.any())
        steps += int(np.isfinite(panels.e2e[s.s0 : s.s1 + 1, s.column]).sum())
        up += int(hit.sum())
    return {
        "spike_events": events,
        "recall": _rate(found, events),
        "spike_excess_covered": found_excess / event_excess if event_excess else None,
        "incidents": len(true),
        "model_wide_incidents": len({id(s.incident) for s in late if s.incident.container is None}),
        "precision": _rate(sum(true.values()), len(true)),
        "step_precision": _rate(up, steps),
    }


def explained(scored: Sequence[Scored], split: int, enriched: set[str]) -> dict[str, Any]:
    """Excess-weighted share of the incidents starting at or after ``split`` that their
    named causes take (``share`` summed over causes that are not unknown, at most 1), and
    the part of it taken by causes in ``enriched`` (cause keys)."""
    late = [s for s in scored if s.s0 >= split]
    total = sum(s.excess_ms for s in late)  # a model-wide incident: summed over containers
    named = sum(s.excess_ms * s.named_share for s in late)
    good = 0.0
    for s in late:
        share = sum(c.share for c in s.incident.causes if c.kind != UNKNOWN and c.key in enriched)
        good += s.excess_ms * min(1.0, share)
    return {
        "incidents": len({id(s.incident) for s in late}),
        "excess_h": total / 3.6e6,
        "explained_share": named / total if total else None,
        "explained_by_enriched_share": good / total if total else None,
        "naming_nothing": len({id(s.incident) for s in late if s.named_share == 0}),
    }


def spike_steps(
    panels: Panels, evidence: Evidence, split: int, columns: Sequence[int]
) -> dict[str, Any]:
    """How common unambiguous spike steps are among the judged steps (a trailing median and
    an e2e value) of ``columns`` from ``split`` on: over all of them, over those whose window
    (the step and the one before) holds no evidence of any kind, and over those holding none
    but heavier inference (the requests' own work) — how often a step triples its median when
    nothing in the trace points at a fault."""
    e2e, med, spike = (x[split:, columns] for x in (panels.e2e, panels.median, panels.spike))
    judged = np.isfinite(e2e) & np.isfinite(med)
    any_ev = np.zeros_like(judged)
    no_work = np.zeros_like(judged)
    for name, mask in evidence.masks.items():
        m = mask[:, columns]
        m = (m | np.vstack([np.zeros((1, m.shape[1]), dtype=bool), m[:-1]]))[split:]
        any_ev |= m
        if name != "heavier_inference":
            no_work |= m
    quiet, own_work = judged & ~any_ev, judged & ~no_work
    return {
        "judged": _rate(int((spike & judged).sum()), int(judged.sum())),
        "no_evidence": _rate(int((spike & quiet).sum()), int(quiet.sum())),
        "only_heavier_inference_or_none": _rate(int((spike & own_work).sum()), int(own_work.sum())),
    }


def score(trace: Trace, panels: Panels, incidents: Sequence[TraceIncident]) -> list[Scored]:
    """``incidents`` on the grid (:func:`~cotenant.evaluation.gentd26_steps.place`) with their
    excess over the trailing median and the share their named causes take."""
    scored = place(trace, incidents)
    for s in scored:
        s.excess_ms = panels.excess(s.column, s.s0, s.s1)
        named = [c for c in s.incident.causes if c.kind != UNKNOWN]
        s.named_share = min(1.0, sum(max(0.0, c.share) for c in named))
        s.names = tuple(sorted({c.key for c in named}))
    return scored


def split_step(trace: Trace, how: str = "rows") -> int:
    """The first step of the second half: where half of the e2e rows lie behind
    (``"rows"``), or the middle step (``"time"``)."""
    if how == "time":
        return len(trace.ts) // 2
    if how != "rows":
        raise UsageError(f"split {how!r}: choose 'rows' or 'time'")
    rows = np.cumsum(np.isfinite(trace.panels["e2e"]).sum(axis=1))
    return int(np.searchsorted(rows, rows[-1] / 2, side="left")) + 1


def measure(
    trace: Trace,
    incidents: Sequence[TraceIncident],
    params: MeasureParams | None = None,
    *,
    split: str = "rows",
) -> dict[str, Any]:
    """Every measure above for ``incidents`` on ``trace``, on the second half (JSON-ready;
    ``split``: see :func:`split_step`)."""
    p = params or MeasureParams()
    cut = split_step(trace, split)
    panels = Panels.of(trace, p)
    scored = score(trace, panels, incidents)
    models = np.asarray(trace.models())
    serving = np.flatnonzero(models != "sd-idle").tolist()
    evidence = Evidence.of(trace, p, cut)
    causes = enrichment(evidence, scored, cut)
    enriched = {k for k, e in causes.items() if (e.get("enrichment") or 0.0) >= p.enriched}
    pools: dict[str, Any] = {}
    for pool in sorted(set(models.tolist()) - {"sd-idle"}):
        cols = np.flatnonzero(models == pool).tolist()
        mine = [s for s in scored if s.column in set(cols)]
        pc = enrichment(evidence, mine, cut)
        pe = {k for k, e in pc.items() if (e.get("enrichment") or 0.0) >= p.enriched}
        pools[pool] = {
            "containers": len(cols),
            "detection": detection(panels, mine, cut, cols),
            "causes": pc,
            "explained": explained(mine, cut, pe),
            "spike_steps": spike_steps(panels, evidence, cut, cols),
        }
    return {
        "halves": {
            "how": split,
            "split_step": cut,
            "steps": [cut, len(trace.ts) - cut],
            "split_ts": int(trace.ts[cut]),
            "e2e_rows": [
                int(np.isfinite(trace.panels["e2e"][:cut]).sum()),
                int(np.isfinite(trace.panels["e2e"][cut:]).sum()),
            ],
        },
        "detection": detection(panels, scored, cut, serving),
        "causes": causes,
        "spike_reference": evidence.spike_reference(panels, cut, serving),
        "explained": explained(scored, cut, enriched),
        "pools": pools,
        "params": p.__dict__,
        "evidence_thresholds": evidence.fitted(),
    }
