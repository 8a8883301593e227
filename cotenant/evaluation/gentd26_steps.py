"""The GenTD26 trace on its grid for the measures of ``gentd26_measures``: incidents to score,
trailing medians, the spike and elevated steps.

Shapes: panels are ``(steps, containers)`` float64 (NaN = no value) on the trace's 57 s grid;
masks the same shape, bool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from cotenant.core.errors import UsageError
from cotenant.evaluation.gentd26 import Trace

UNKNOWN = "unknown"


def load_kind(culprit: str) -> str | None:
    """The GenTD26 load kind (``basemodel``, ``lora``, ``controlnet``) a ``model_load``
    culprit names (``basemodel``, ``lora``, ``controlnet``, or the import's ``base``), else None."""
    c = culprit.lower()
    for part, kind in (("controlnet", "controlnet"), ("lora", "lora"), ("base", "basemodel")):
        if part in c:
            return kind
    return None


@dataclass(frozen=True)
class NamedCause:
    kind: str
    culprit: str
    share: float  # of the incident's excess, 0..1

    @property
    def key(self) -> str:
        """What enrichment is reported by: the kind (``model_load`` with the load kind its
        culprit names); a culprit container or model does not split a cause."""
        kind = load_kind(self.culprit) if self.kind == "model_load" else None
        return f"{self.kind}:{kind}" if kind else self.kind


@dataclass(frozen=True)
class TraceIncident:
    """One incident to score: ``start_s`` / ``end_s`` are trace seconds (``timestamp_anon``,
    both inclusive); ``container`` None covers every container of ``model``."""

    model: str
    container: str | None
    start_s: float
    end_s: float
    causes: tuple[NamedCause, ...] = ()


@dataclass(frozen=True)
class MeasureParams:
    window: int = 30  # steps of the trailing median
    min_count: int = 5  # values it needs before a step is judged
    spike_ratio: float = 3.0
    spike_margin_ms: float = 5_000.0
    elevated_ratio: float = 1.5
    enriched: float = 2.0  # a cause counts as explained excess from this enrichment up


@dataclass
class Scored:
    """An incident on the trace's grid: container column, first and last step covered."""

    incident: TraceIncident
    column: int
    s0: int
    s1: int
    excess_ms: float = 0.0
    named_share: float = 0.0
    names: tuple[str, ...] = field(default_factory=tuple)


def trailing_median(x: np.ndarray, window: int, min_count: int) -> np.ndarray:
    """Median of each column of ``x`` (``(steps, series)``, NaN = no value) over the
    ``window`` steps before each step, the step excluded; NaN where fewer than ``min_count``
    values are there. Same shape as ``x``."""
    steps, cols = x.shape
    padded = np.vstack([np.full((window, cols), np.nan), x])
    win = np.lib.stride_tricks.sliding_window_view(padded, window, axis=0)[:steps]
    n = np.isfinite(win).sum(axis=-1)
    s = np.sort(win, axis=-1)  # NaN last: the median of each window's first n values
    lo = np.take_along_axis(s, np.clip((n - 1) // 2, 0, None)[..., None], axis=-1)[..., 0]
    hi = np.take_along_axis(s, np.clip(n // 2, 0, window - 1)[..., None], axis=-1)[..., 0]
    med: np.ndarray = (lo + hi) / 2
    med[n < max(min_count, 1)] = np.nan
    return med


def ratio_at_least(x: np.ndarray, ref: np.ndarray, ratio: float) -> np.ndarray:
    """``x >= ratio * ref`` where both have a value and ``ref`` > 0 (False elsewhere)."""
    with np.errstate(invalid="ignore"):
        out: np.ndarray = np.isfinite(x) & np.isfinite(ref) & (ref > 0) & (x >= ratio * ref)
    return out


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``(first, last)`` step of each run of consecutive True values of a 1-D mask."""
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1) - 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def place(trace: Trace, incidents: Sequence[TraceIncident]) -> list[Scored]:
    """Each incident on the grid, once per container it covers (a model-wide one on every
    container of its model). The steps covered are those whose time lies in
    ``[start_s, end_s]``; an incident between two steps covers the next one."""
    models = np.asarray(trace.models())
    column = {c: i for i, c in enumerate(trace.containers)}
    out = []
    for inc in incidents:
        if inc.container is None:
            cols = np.flatnonzero(models == inc.model).tolist()
            if not cols:
                raise UsageError(f"incident on model {inc.model!r}: the trace has no such model")
        elif inc.container in column:
            cols = [column[inc.container]]
        else:
            raise UsageError(f"incident on container {inc.container!r}: not in the trace")
        s0 = int(np.searchsorted(trace.ts, inc.start_s, side="left"))
        s1 = max(s0, int(np.searchsorted(trace.ts, inc.end_s, side="right")) - 1)
        if s0 >= len(trace.ts):
            continue  # after the trace's last step
        out += [Scored(inc, c, s0, s1) for c in cols]
    return out


@dataclass
class Panels:
    """The e2e panel with its trailing median and the spike / elevated masks."""

    e2e: np.ndarray
    median: np.ndarray
    spike: np.ndarray
    elevated: np.ndarray

    @classmethod
    def of(cls, trace: Trace, p: MeasureParams) -> Panels:
        e2e = trace.panels["e2e"]
        med = trailing_median(e2e, p.window, p.min_count)
        with np.errstate(invalid="ignore"):
            margin = np.isfinite(med) & (e2e - med >= p.spike_margin_ms)
        spike = ratio_at_least(e2e, med, p.spike_ratio) & margin
        return cls(e2e, med, spike, ratio_at_least(e2e, med, p.elevated_ratio))

    def excess(self, col: int, s0: int, s1: int) -> float:
        d = self.e2e[s0 : s1 + 1, col] - self.median[s0 : s1 + 1, col]
        return float(np.sum(np.clip(d[np.isfinite(d)], 0.0, None)))
