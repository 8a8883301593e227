"""Arrival processes, generated up front with NumPy (vectorised, seeded per model).

Each generator returns ``(times_s, work_scale, prompt_tokens, output_tokens)`` arrays sorted by
time; ``work_scale`` multiplies the kernel's per-item time (1 except for trace replay, where it
follows the request's token count). ``closed`` arrivals are driven by the engine instead.
"""

from __future__ import annotations

import csv
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from cotenant.simulator.scenario import Arrival, Fault, Llm, Model, Scenario

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _poisson(rng: np.random.Generator, rate: float, start: float, end: float) -> np.ndarray:
    if rate <= 0 or end <= start:
        return np.empty(0)
    n = rng.poisson(rate * (end - start))
    return np.sort(rng.uniform(start, end, n))


def _bursty(rng: np.random.Generator, a: Arrival, duration: float) -> np.ndarray:
    parts = []
    t = 0.0
    on = False
    while t < duration:
        length = rng.exponential(a.mean_burst_s if on else a.mean_gap_s)
        end = min(duration, t + length)
        parts.append(_poisson(rng, a.burst_rps if on else a.rate_rps, t, end))
        t = end
        on = not on
    return np.concatenate(parts) if parts else np.empty(0)


@lru_cache(maxsize=8)
def load_trace(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets_s from the first arrival, context tokens, generated tokens) of an Azure-style
    CSV with columns TIMESTAMP, ContextTokens, GeneratedTokens."""
    ts: list[float] = []
    ctx: list[int] = []
    gen: list[int] = []
    with Path(path).open(newline="") as fh:
        for row in csv.DictReader(fh):
            stamp = row["TIMESTAMP"].strip()
            # Python parses at most 6 fractional digits; the trace has 7
            head, _, frac = stamp.partition(".")
            dt = datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}" if frac else head)
            ts.append(dt.timestamp())
            ctx.append(int(row["ContextTokens"]))
            gen.append(int(row["GeneratedTokens"]))
    t = np.asarray(ts)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order][0]
    return t, np.asarray(ctx)[order], np.asarray(gen)[order]


def _trace(a: Arrival, duration: float) -> Arrays:
    offs, ctx, gen = load_trace(a.file)
    if a.start_s > 0 and len(offs) > 1:  # begin start_s in, wrapping round to the beginning
        cycle = float(offs[-1]) + float(np.diff(offs).mean())
        rolled = (offs - a.start_s) % cycle
        order = np.argsort(rolled, kind="stable")
        offs, ctx, gen = rolled[order] - rolled[order][0], ctx[order], gen[order]
    span = float(offs[-1]) if len(offs) > 1 else 1.0
    period = span / a.scale + (float(np.diff(offs).mean()) / a.scale if len(offs) > 1 else 1.0)
    reps = int(np.ceil(duration / period)) if period > 0 else 1
    times = np.concatenate([offs / a.scale + k * period for k in range(reps)])
    keep = times < duration
    c = np.tile(ctx, reps)[keep]
    g = np.tile(gen, reps)[keep]
    tokens = (c + g).astype(np.float64)
    scale = tokens / max(1.0, float((ctx + gen).mean()))
    return times[keep], scale, c, g


def mean_rate(m: Model, duration: float) -> float:
    a = m.arrival
    if a.kind == "poisson":
        return a.rate_rps
    if a.kind == "bursty":
        on = a.mean_burst_s / (a.mean_burst_s + a.mean_gap_s)
        return on * a.burst_rps + (1 - on) * a.rate_rps
    if a.kind == "trace":
        offs, _, _ = load_trace(a.file)
        return len(offs) / max(1e-9, float(offs[-1])) * a.scale
    return 0.0


def model_arrivals(s: Scenario, index: int) -> Arrays:
    """Open-loop arrivals of model ``index`` including its rate-multiplying faults."""
    m = s.models[index]
    rng = np.random.default_rng([s.seed, index])
    a = m.arrival
    if a.kind == "poisson":
        t = _poisson(rng, a.rate_rps, 0.0, s.duration_s)
        parts: list[Arrays] = [(t, np.ones(len(t)), _none(len(t)), _none(len(t)))]
    elif a.kind == "bursty":
        t = _bursty(rng, a, s.duration_s)
        parts = [(t, np.ones(len(t)), _none(len(t)), _none(len(t)))]
    elif a.kind == "trace":
        tt, sc, c, g = _trace(a, s.duration_s)
        parts = [(tt, sc, c, g)]
    else:
        return (np.empty(0), np.empty(0), _none(0), _none(0))
    if m.llm is not None and a.kind != "trace":
        parts = [_with_tokens(s, index, m.llm, parts[0])]
    base_rate = mean_rate(m, s.duration_s)
    for fi, f in enumerate(s.faults):
        if f.kind in ("cotenant_burst", "load_surge") and f.target == m.name and f.factor > 1:
            parts.append(_extra(s, fi, f, base_rate, parts[0]))
    t = np.concatenate([p[0] for p in parts])
    order = np.argsort(t, kind="stable")
    t = t[order]
    ctx = np.concatenate([p[2] for p in parts])[order]
    gen = np.concatenate([p[3] for p in parts])[order]
    for f in s.faults:
        if f.kind == "length_shift" and f.target == m.name:
            ctx, gen = _shift_lengths(t, ctx, gen, f)
    return t, np.concatenate([p[1] for p in parts])[order], ctx, gen


TOKEN_SIGMA = 0.6
"""Log-space spread of the token counts drawn for an LLM model without a trace."""


def _with_tokens(s: Scenario, index: int, llm: Llm, base: Arrays) -> Arrays:
    """``base`` with prompt and output token counts drawn from lognormals whose means are the
    model's ``llm`` ones; an RNG stream of its own, so arrival times are those of the run
    without tokens."""
    rng = np.random.default_rng([s.seed, index, 20_000])
    n = len(base[0])
    mu = -(TOKEN_SIGMA**2) / 2

    def draw(mean: float) -> np.ndarray:
        x = rng.lognormal(np.log(mean) + mu, TOKEN_SIGMA, n)
        return np.maximum(1, np.rint(x)).astype(np.int64)

    return base[0], base[1], draw(llm.prompt_tokens), draw(llm.output_tokens)


def _shift_lengths(
    t: np.ndarray, ctx: np.ndarray, gen: np.ndarray, f: Fault
) -> tuple[np.ndarray, np.ndarray]:
    """A ``length_shift``: the token counts of requests arriving during the fault, x factor
    (at least 1 token)."""
    during = (t >= f.start_s) & (t < f.end_s)
    ctx, gen = ctx.copy(), gen.copy()
    if f.lengths in ("prompt", "both"):
        sel = during & (ctx >= 0)
        ctx[sel] = np.maximum(1, np.rint(ctx[sel] * f.factor)).astype(ctx.dtype)
    if f.lengths in ("output", "both"):
        sel = during & (gen >= 0)
        gen[sel] = np.maximum(1, np.rint(gen[sel] * f.factor)).astype(gen.dtype)
    return ctx, gen


class MergedArrivals(NamedTuple):
    """Every model's open-loop arrivals in one time order (ties keep the lower model index
    first), as lists for the engine's loop: virtual time (s), model index, kernel work scale,
    prompt and output tokens (-1 when unknown)."""

    t: list[float]
    model: list[int]
    scale: list[float]
    ctx: list[int]
    gen: list[int]


def merged_arrivals(s: Scenario) -> MergedArrivals:
    """The open-loop arrivals of all of ``s``'s models (:func:`model_arrivals`), merged."""
    parts = [model_arrivals(s, i) for i in range(len(s.models))]
    times = np.concatenate([p[0] for p in parts]) if parts else np.empty(0)
    which = (
        np.concatenate([np.full(len(p[0]), i) for i, p in enumerate(parts)])
        if parts
        else np.empty(0, dtype=np.int64)
    )
    order = np.argsort(times, kind="stable")
    return MergedArrivals(
        times[order].tolist(),
        which[order].astype(np.int64).tolist(),
        np.concatenate([p[1] for p in parts])[order].tolist() if parts else [],
        np.concatenate([p[2] for p in parts])[order].tolist() if parts else [],
        np.concatenate([p[3] for p in parts])[order].tolist() if parts else [],
    )


def _extra(s: Scenario, fi: int, f: Fault, rate: float, base: Arrays) -> Arrays:
    """Extra arrivals of a burst fault: Poisson at (factor - 1) x the model's mean rate;
    token counts resampled from the model's own arrivals. Own RNG stream per fault, so the
    counterfactual without this fault keeps every other arrival identical."""
    rng = np.random.default_rng([s.seed, 10_000 + fi])
    t = _poisson(rng, (f.factor - 1) * rate, f.start_s, min(f.end_s, s.duration_s))
    if len(base[0]):
        pick = rng.integers(0, len(base[0]), len(t))
        return t, base[1][pick], base[2][pick], base[3][pick]
    return t, np.ones(len(t)), _none(len(t)), _none(len(t))


def _none(n: int) -> np.ndarray:
    return np.full(n, -1, dtype=np.int64)
