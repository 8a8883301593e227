"""Latency indicators of a model: end-to-end, and for generative models TTFT and TPOT.

Every model has ``e2e`` (the request's latency). A model whose requests carry token counts
(:attr:`analysis.windows.GpuWindows.tokens`) also has ``ttft`` (time to first token) and
``tpot`` (time per output token) where its windows hold them. Each indicator is its own p99
series with its own baseline, detector state and optional SLO; an incident names the one that
breached.

For attribution, :func:`indicator_view` presents a token indicator as if it were the model's
latency: windows whose ``p99_ms`` / ``mean_ms`` are that indicator's and whose phases are the
parts of it (TTFT: queue, lock wait, preprocess, transfers and prefill as ``compute``; TPOT:
all ``compute``, per token), so the same counterfactual attributes a per-token slowdown.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cotenant.analysis.windows import GpuWindows
from cotenant.core.phases import PHASE_COLUMNS
from cotenant.core.slos import E2E, TPOT, TTFT

UNITS = {E2E: "ms", TTFT: "ms", TPOT: "ms/token"}
"""The unit of each indicator's values (p99, baseline, SLO)."""


@dataclass(frozen=True)
class Series:
    """One indicator's windows: its p99 (ms), the request count behind each window, and its
    typical request (the mean: every source has it, a histogram's sum over its count and a
    rollup's minute alike) for :mod:`analysis.detector`. Arrays of shape ``(n_windows,)``."""

    p99_ms: np.ndarray
    count: np.ndarray
    center: np.ndarray


def indicator_series(w: GpuWindows, model: str) -> dict[str, Series]:
    """``model``'s indicators on ``w`` that have data: e2e always, TTFT and TPOT where its
    requests carry token counts and some window holds the value."""
    v = w.models[model]
    out = {E2E: Series(v["p99_ms"], v["count"], v["mean_ms"])}
    tok = w.tokens.get(model)
    if tok is None:
        return out
    for name in (TTFT, TPOT):
        p99 = tok[f"{name}_p99_ms"]
        if np.isfinite(p99).any():
            # windows without the value count no requests, so the detector skips them
            count = np.where(np.isfinite(p99), tok["count"], 0.0)
            out[name] = Series(p99, count, tok[f"{name}_mean_ms"])
    return out


def indicator_view(w: GpuWindows, model: str, indicator: str) -> GpuWindows:
    """``w`` with ``model``'s request series replaced by ``indicator``'s (see the module
    docstring); ``w`` itself for ``e2e``. The other models and the counters are shared, not
    copied. Raises KeyError when ``model`` has no token windows."""
    if indicator == E2E:
        return w
    v = w.models[model]
    tok = w.tokens[model]
    n = w.n
    zero = np.zeros(n)
    mine = dict(v)
    mine["count"] = tok["count"]
    if indicator == TPOT:
        for c in PHASE_COLUMNS:
            mine[c] = zero
        mine["compute_ms"] = tok["tpot_mean_ms"]
        mine["mean_ms"] = tok["tpot_mean_ms"]
        mine["p99_ms"] = tok["tpot_p99_ms"]
    else:
        ahead = ("queue_ms", "lock_wait_ms", "preprocess_ms", "h2d_ms")
        before_prefill = sum((np.nan_to_num(v[c]) for c in ahead), zero)
        for c in PHASE_COLUMNS:
            if c not in ahead:
                mine[c] = zero
        mine["compute_ms"] = np.fmax(tok["ttft_mean_ms"] - before_prefill, 0.0)
        mine["mean_ms"] = tok["ttft_mean_ms"]
        mine["p99_ms"] = tok["ttft_p99_ms"]
    return replace(w, models={**w.models, model: mine})
