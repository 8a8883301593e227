"""Cause enrichment on the GenTD26 trace: is a named cause's evidence more common where it is
named than in ordinary windows of the same containers?

**Evidence**, per container and 57 s step, each judged against the container's own trailing
median (the 30 steps before, the step excluded) or a level fitted on the first half:

======================  ===================================================================
``slow_load:<kind>``    a load of that kind (base model, LoRA, ControlNet) >= 2x the
                        trailing median of that kind (at least 3 earlier loads)
``queue``               gateway queue time or QPS >= 1.5x its trailing median
``heavier_inference``   pure inference time (``model_predict``) >= 2x its trailing median:
                        the requests themselves got heavier
``duty_saturated``      GPU duty cycle >= the 90th percentile of the pool's duty cycle over
                        the first half's serving steps
``gpu_memory_up``       GPU memory used >= 1.2x its trailing median
======================  ===================================================================

**Causes** map to evidence (:data:`CAUSE_EVIDENCE`): ``model_load`` to the slow load of its
culprit's kind (any kind when the culprit names none), ``load`` to ``queue``, ``mix`` to
``heavier_inference``, ``cotenant`` / ``bandwidth`` / ``throttle`` (the GPU busier) to
``duty_saturated``, ``memory`` to ``gpu_memory_up``. ``cpu`` and ``lock`` have no evidence in
the trace: such a cause is counted as untestable, never as enriched.

**Enrichment.** An incident's window is its steps and the step before (loads lead the e2e
rows they delay by 0-1 step). For each incident of the second half naming a cause, the
*base rate* is the share of the windows of the same length on the same container, over the
first half and holding at least one e2e value, that hold the evidence. Enrichment = the
number of named windows holding it over the sum of their base rates (observed / expected),
with a 90 % exact Poisson interval on the observed count. 1 means the evidence is as common
where the cause is named as anywhere; a detector that names a cause on evidence that is
everywhere scores about 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cotenant.evaluation.gentd26 import LOAD_KINDS, Trace
from cotenant.evaluation.gentd26_steps import (
    UNKNOWN,
    MeasureParams,
    Panels,
    Scored,
    load_kind,
    ratio_at_least,
    runs,
    trailing_median,
)
from cotenant.evaluation.intervals import poisson_rate

SLOW_LOAD = 2.0
QUEUE = 1.5
HEAVIER = 2.0
MEMORY_UP = 1.2
SATURATION_QUANTILE = 0.9
LOAD_MIN_COUNT = 3

SATURATING = ("cotenant", "bandwidth", "throttle")
CAUSE_EVIDENCE: dict[str, tuple[str, ...]] = {
    "model_load": tuple(f"slow_load:{k}" for k in LOAD_KINDS),
    "load": ("queue",),
    "mix": ("heavier_inference",),
    "memory": ("gpu_memory_up",),
    **{k: ("duty_saturated",) for k in SATURATING},
}
"""Cause kind -> the evidence any of which supports it (``model_load`` narrowed to the kind
its culprit names, see :func:`evidence_for`)."""


def evidence_for(kind: str, culprit: str) -> tuple[str, ...]:
    """The evidence names of a cause; () when the trace holds none for it."""
    load = load_kind(culprit) if kind == "model_load" else None
    return (f"slow_load:{load}",) if load else CAUSE_EVIDENCE.get(kind, ())


class Evidence:
    """Per evidence name a ``(steps, containers)`` bool mask, and the levels fitted on the
    first half."""

    def __init__(
        self,
        masks: dict[str, np.ndarray],
        serving: np.ndarray,
        levels: dict[str, float],
        split: int,
    ) -> None:
        self.masks, self.serving, self.levels, self.split = masks, serving, levels, split
        self._base: dict[tuple[str, int, int, bool], float | None] = {}

    @classmethod
    def of(cls, trace: Trace, p: MeasureParams, split: int) -> Evidence:
        def up(name: str, ratio: float, min_count: int = p.min_count) -> np.ndarray:
            x = trace.panels[name]
            return ratio_at_least(x, trailing_median(x, p.window, min_count), ratio)

        masks = {f"slow_load:{k}": up(f"load_{k}", SLOW_LOAD, LOAD_MIN_COUNT) for k in LOAD_KINDS}
        masks["queue"] = up("queue_rt", QUEUE) | up("qps", QUEUE)
        masks["heavier_inference"] = up("model_predict", HEAVIER)
        masks["gpu_memory_up"] = up("gpu_memory", MEMORY_UP)
        duty = trace.panels["duty_cycle"]
        serving = np.isfinite(trace.panels["e2e"])
        pools = np.asarray(trace.models())
        sat = np.zeros_like(serving)
        levels: dict[str, float] = {}
        for pool in sorted(set(pools.tolist()) - {"sd-idle"}):
            cols = pools == pool
            first = duty[:split][:, cols][serving[:split][:, cols]]
            first = first[np.isfinite(first)]
            if not len(first):
                continue
            level = float(np.quantile(first, SATURATION_QUANTILE))
            levels[f"duty_saturated:{pool}"] = level
            with np.errstate(invalid="ignore"):
                sat[:, cols] = np.isfinite(duty[:, cols]) & (duty[:, cols] >= level)
        masks["duty_saturated"] = sat
        return cls(masks, serving, levels, split)

    def fitted(self) -> dict[str, float]:
        return dict(self.levels)

    def present(self, names: Sequence[str], col: int, a: int, b: int) -> bool:
        return any(bool(self.masks[n][a : b + 1, col].any()) for n in names)

    def base(
        self, names: tuple[str, ...], col: int, length: int, second: bool = False
    ) -> float | None:
        """Share of the windows of ``length`` steps on ``col`` within the first half (the
        second with ``second``) and holding an e2e value that hold any of ``names``; None
        when there is no such window."""
        key = ("|".join(names), col, length, second)
        if key not in self._base:
            lo, hi = (self.split, len(self.serving)) if second else (0, self.split)
            ev = np.zeros(hi - lo, dtype=bool)
            for n in names:
                ev |= self.masks[n][lo:hi, col]
            srv = self.serving[lo:hi, col]
            if len(ev) < length:
                self._base[key] = None
            else:
                ce = np.concatenate([[0], np.cumsum(ev)])
                cs = np.concatenate([[0], np.cumsum(srv)])
                has_ev = (ce[length:] - ce[:-length]) > 0
                served = (cs[length:] - cs[:-length]) > 0
                self._base[key] = float(has_ev[served].mean()) if served.any() else None
        return self._base[key]

    def spike_reference(self, panels: Panels, split: int, columns: Sequence[int]) -> dict[str, Any]:
        """Each evidence's enrichment in the windows of the second half's unambiguous spike
        events (whatever a detector did): how far the evidence goes with spikes at all."""
        windows = [
            (c, max(0, a - 1), b)
            for c in columns
            for a, b in runs(panels.spike[:, c])
            if a >= split
        ]
        return {name: _ratio(self, (name,), windows) for name in self.masks}


def _ratio(
    ev: Evidence, names: tuple[str, ...], windows: list[tuple[int, int, int]]
) -> dict[str, Any]:
    observed, expected, held, second = 0, 0.0, 0, 0.0
    for col, a, b in windows:
        base = ev.base(names, col, b - a + 1)
        if base is None:
            continue
        held += 1
        expected += base
        second += ev.base(names, col, b - a + 1, second=True) or 0.0
        observed += ev.present(names, col, a, b)
    out: dict[str, Any] = {
        "windows": held,
        "with_evidence": observed,
        "expected": expected,
        "enrichment": observed / expected if expected > 0 else None,
        "ci90": None,
        "base_rate_first_half": expected / held if held else None,
        "base_rate_second_half": second / held if held else None,
    }
    if expected > 0:
        ci = poisson_rate(observed, expected)
        out["ci90"] = [ci.low, ci.high]
    return out


def enrichment(ev: Evidence, scored: Sequence[Scored], split: int) -> dict[str, dict[str, Any]]:
    """Per cause key named by an incident of the second half: its enrichment (see the
    module), or ``untestable`` when the trace has no evidence for it."""
    by_cause: dict[str, list[tuple[int, int, int]]] = {}
    names: dict[str, tuple[str, ...]] = {}
    for s in scored:
        if s.s0 < split:
            continue
        for c in s.incident.causes:
            if c.kind == UNKNOWN:
                continue
            names[c.key] = evidence_for(c.kind, c.culprit)
            by_cause.setdefault(c.key, []).append((s.column, max(0, s.s0 - 1), s.s1))
    out: dict[str, dict[str, Any]] = {}
    for key, windows in sorted(by_cause.items()):
        if not names[key]:
            out[key] = {"windows": len(windows), "untestable": True, "enrichment": None}
            continue
        out[key] = {"evidence": list(names[key]), "untestable": False} | _ratio(
            ev, names[key], windows
        )
    return out
