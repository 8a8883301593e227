"""The ``mix`` cause: latency that the victim's own heavier requests explain, not contention.

**Token counts (LLMs).** A generative model's end-to-end latency is ``TTFT + TPOT x (output
tokens - 1)`` and its TTFT grows with the prompt (prefill). When a tenant starts sending longer
prompts or asking for longer completions, e2e rises with no co-tenant involved.
:func:`mix_excess` predicts what the windows *during* an incident would have cost at the
*before* windows' per-token rates with the token counts seen during it:

* decode: ``TPOT_before x (output_during - output_before)`` (mean output tokens per request);
* prefill: ``slope x (prompt_during - prompt_before)``, ``slope`` the least-squares slope of
  the before windows' mean TTFT on their mean prompt length (a regression of latency on tokens
  over the baseline; clipped at 0, and 0 when the baseline's prompts hardly vary).

Means are exact here (a mean of sums is the sum of means), so the prediction is in ms per
request, the unit of the attribution's phase excess. The caller gives the predicted excess to
``mix`` (culprit: the model whose requests changed) before the co-tenant counterfactual sees
the rest, so a co-tenant is only blamed for what the token counts do not explain.

**Token counts without a TTFT.** A model whose requests carry token counts but no first-token
time (an embedding replaying a trace, or spans that do not say) has no decode time to multiply
by its output tokens; its per-token costs are the slopes of its normal windows' compute time
per request on their mean prompt and output lengths (weighted least squares, a negative slope
dropped), so a length that never cost it anything explains nothing.

**Work per request (any model).** Where the requests say how much work each was (a
:class:`WorkSeries`: work units per request, e.g. images or diffusion steps from the spans'
``cotenant.work_units``) the cost per unit is held at its normal level: the heavier requests
predict ``compute_before x (units_during / units_before - 1)``, taken first like the tokens'. Where
only the time of the work itself is known (the victim's pure inference time per request, or its
compute time per request, which stands in where the given work series has no value before or
during the slowdown), the same ratio is the victim's own heavier work only when nothing else
claims the compute excess and no other actor is in sight: no co-tenant whose demand rose or that
slowed alongside it (that is contention), no host process whose CPU use rose, no clock or memory
evidence, and per-process GPU series that would have shown a co-tenant; and never where the
requests carry token counts that did not grow (the same prompts and answers taking longer is a
slower model, not a busier one: seen on a real vLLM on a shared host). In both cases the work per
request must have risen beyond its normal spread (a one-sided test, :mod:`analysis.enrichment`) by
at least :data:`MIN_WORK_RISE`.
:class:`MixExplainer` makes these claims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.analysis.candidates import Candidate
from cotenant.analysis.change import strength, wmean_over
from cotenant.analysis.claims import Claim, Context, Phase, Stage
from cotenant.analysis.demand import fellow_victims
from cotenant.analysis.enrichment import shift_enrichment
from cotenant.analysis.metric_direction import Direction
from cotenant.analysis.work import MixExcess as MixExcess  # re-exported
from cotenant.analysis.work import WorkSeries as WorkSeries  # re-exported
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.slos import E2E, TPOT

MIN_BEFORE_WINDOWS = 5
"""Fewer baseline windows with token counts than this: no prediction."""

MIN_SHIFT_Z = 3.0
"""A token count changed when its per-window means during and before differ by this many
standard errors (Welch); a change within the windows' ordinary spread explains nothing (a
contention incident on a model whose lengths merely wander is not a mix change)."""


MIN_WORK_RISE = 0.1
"""Work per request must rise by at least this fraction of its normal level to be heavier."""
WORK_SE = 0.01
"""Fraction of the normal work per request: the least standard error of its rise."""


def mix_excess(
    tok: dict[str, np.ndarray] | None,
    indicator: str,
    before: np.ndarray,
    during: np.ndarray,
    compute_ms: np.ndarray | None = None,
) -> MixExcess | None:
    """The mean excess of ``indicator`` (``e2e`` or ``ttft``; never ``tpot``, a per-token
    time) that the token counts of ``during`` explain at ``before``'s per-token rates, or
    None when ``tok`` (a model's token windows) is missing or too thin, or the token counts
    explain nothing. ``before`` / ``during``: boolean masks over the windows. Requests
    without a TTFT (no first token: an embedding, or spans that do not say) take their
    per-token costs from ``compute_ms`` (the model's compute time per request, per window)
    instead (:func:`_regressed`)."""
    if tok is None or indicator == TPOT:
        return None
    cnt = tok["count"]
    if np.count_nonzero(before & (cnt > 0)) < MIN_BEFORE_WINDOWS:
        return None
    if not np.isfinite(tok["ttft_mean_ms"][before & (cnt > 0)]).any():
        return None if compute_ms is None else _regressed(tok, compute_ms, before, during)
    out_b, out_d = (
        wmean_over(tok["output_tokens_mean"], cnt, before),
        wmean_over(tok["output_tokens_mean"], cnt, during),
    )
    pr_b, pr_d = (
        wmean_over(tok["prompt_tokens_mean"], cnt, before),
        wmean_over(tok["prompt_tokens_mean"], cnt, during),
    )
    tpot_b = wmean_over(tok["tpot_mean_ms"], cnt, before)
    out_moved = _shifted(tok["output_tokens_mean"], cnt, before, during)
    decode = tpot_b * (out_d - out_b) if indicator == E2E and out_moved else 0.0
    slope = _prefill_slope(tok, cnt, before)
    pr_moved = _shifted(tok["prompt_tokens_mean"], cnt, before, during)
    prefill = slope * (pr_d - pr_b) if pr_moved else 0.0
    ms = float(np.nan_to_num(decode) + np.nan_to_num(prefill))
    if ms <= 0:
        return None
    ev: dict[str, Any] = {
        "explained_ms": round(ms, 3),
        "decode_ms": round(float(np.nan_to_num(decode)), 3),
        "prefill_ms": round(float(np.nan_to_num(prefill)), 3),
        "prefill_ms_per_token": round(slope, 5),
        "output_tokens": _dist(tok, "output_tokens", cnt, before, during),
        "prompt_tokens": _dist(tok, "prompt_tokens", cnt, before, during),
        "tpot_ms": _pair(tok["tpot_mean_ms"], cnt, before, during),
        "ttft_ms": _pair(tok["ttft_mean_ms"], cnt, before, during),
    }
    return MixExcess(ms, ev)


def _regressed(
    tok: dict[str, np.ndarray], compute_ms: np.ndarray, before: np.ndarray, during: np.ndarray
) -> MixExcess | None:
    """What the token counts explain of the compute time per request of a model whose
    requests carry no TTFT: its normal windows' compute time regressed on their mean prompt
    and output lengths (weighted least squares, slopes held at 0 or above), times how far
    each length moved (:func:`_shifted`). Without a first token there is no decode time to
    multiply by the output tokens: an embedding's cost follows its input, and a trace's
    lengths may drive a model's work through both, or neither."""
    cnt = tok["count"]
    names = ("prompt_tokens_mean", "output_tokens_mean")
    ok = before & (cnt > 0) & np.isfinite(compute_ms)
    for n in names:
        ok &= np.isfinite(tok[n])
    if np.count_nonzero(ok) < MIN_BEFORE_WINDOWS:
        return None
    slopes = _nonnegative_slopes(
        np.column_stack([tok[n][ok] for n in names]), compute_ms[ok], cnt[ok]
    )
    moved = {
        n: wmean_over(tok[n], cnt, during) - wmean_over(tok[n], cnt, before)
        if _shifted(tok[n], cnt, before, during)
        else 0.0
        for n in names
    }
    parts = [float(np.nan_to_num(b * moved[n])) for b, n in zip(slopes, names, strict=True)]
    ms = sum(parts)
    if ms <= 0:
        return None
    ev: dict[str, Any] = {
        "explained_ms": round(ms, 3),
        "prompt_ms": round(parts[0], 3),
        "output_ms": round(parts[1], 3),
        "compute_ms_per_prompt_token": round(float(slopes[0]), 5),
        "compute_ms_per_output_token": round(float(slopes[1]), 5),
        "output_tokens": _dist(tok, "output_tokens", cnt, before, during),
        "prompt_tokens": _dist(tok, "prompt_tokens", cnt, before, during),
        "compute_ms": _pair(compute_ms, cnt, before, during),
    }
    return MixExcess(ms, ev)


def _nonnegative_slopes(x: np.ndarray, y: np.ndarray, wts: np.ndarray) -> np.ndarray:
    """Weighted least-squares slopes of ``y`` on the columns of ``x`` (with an intercept),
    a column whose slope comes out negative dropped and the rest refitted (a longer request
    never costs less); a column that hardly varies (under 5 % of its mean) says nothing."""
    k = x.shape[1]
    keep = [
        j
        for j in range(k)
        if np.sqrt(np.cov(x[:, j], aweights=wts)) > 0.05 * abs(np.average(x[:, j], weights=wts))
    ]
    out = np.zeros(k)
    while keep:
        a = np.column_stack([np.ones(len(y)), x[:, keep]])
        sw = np.sqrt(wts)
        coef = np.linalg.lstsq(a * sw[:, None], y * sw, rcond=None)[0][1:]
        if (coef >= 0).all():
            out[keep] = coef
            break
        keep = [j for j, c in zip(keep, coef, strict=True) if c >= 0]
    return out


def _shifted(x: np.ndarray, cnt: np.ndarray, before: np.ndarray, during: np.ndarray) -> bool:
    """Whether the per-window means ``x`` moved between ``before`` and ``during`` by
    :data:`MIN_SHIFT_Z` standard errors or more."""
    b = x[before & (cnt > 0) & np.isfinite(x)]
    d = x[during & (cnt > 0) & np.isfinite(x)]
    if len(b) < 2 or len(d) < 2:
        return False
    se = np.sqrt(b.var(ddof=1) / len(b) + d.var(ddof=1) / len(d))
    diff = abs(float(d.mean() - b.mean()))
    return bool(diff > 0 and (se == 0 or diff / se >= MIN_SHIFT_Z))


def _prefill_slope(tok: dict[str, np.ndarray], cnt: np.ndarray, before: np.ndarray) -> float:
    """ms of TTFT per prompt token over the before windows (weighted least squares), >= 0."""
    x, y = tok["prompt_tokens_mean"], tok["ttft_mean_ms"]
    ok = before & (cnt > 0) & np.isfinite(x) & np.isfinite(y)
    if np.count_nonzero(ok) < MIN_BEFORE_WINDOWS:
        return 0.0
    wts, xs, ys = cnt[ok], x[ok], y[ok]
    xm = np.average(xs, weights=wts)
    var = np.average((xs - xm) ** 2, weights=wts)
    # prompts that hardly vary say nothing about prefill cost
    if not var > (0.05 * xm) ** 2:
        return 0.0
    cov = np.average((xs - xm) * (ys - np.average(ys, weights=wts)), weights=wts)
    return max(0.0, float(cov / var))


def _pair(x: np.ndarray, cnt: np.ndarray, before: np.ndarray, during: np.ndarray) -> dict[str, Any]:
    b, d = wmean_over(x, cnt, before), wmean_over(x, cnt, during)
    return {"before": _r(b), "during": _r(d)}


def _dist(
    tok: dict[str, np.ndarray], name: str, cnt: np.ndarray, before: np.ndarray, during: np.ndarray
) -> dict[str, Any]:
    """A token count before and during: its mean per request, the 10th and 90th percentiles
    of its per-window means (how the mix wandered), and the median window's p99 where the
    windows carry one (``lengths=True``)."""
    out = {}
    for label, mask in (("before", before), ("during", during)):
        sel = mask & (cnt > 0)
        means = tok[f"{name}_mean"][sel]
        means = means[np.isfinite(means)]
        p99 = tok[f"{name}_p99"][sel]
        p99 = p99[np.isfinite(p99)]
        out[label] = {
            "mean": _r(wmean_over(tok[f"{name}_mean"], cnt, mask)),
            "window_mean_p10": _r(float(np.percentile(means, 10))) if len(means) else None,
            "window_mean_p90": _r(float(np.percentile(means, 90))) if len(means) else None,
            "p99": _r(float(np.median(p99))) if len(p99) else None,
        }
    return out


def _r(x: float) -> float | None:
    return round(float(x), 3) if np.isfinite(x) else None


@dataclass(frozen=True)
class MixExplainer:
    kind: CauseKind = CauseKind.MIX

    def claims(self, ctx: Context) -> list[Claim]:
        comp = ctx.excess.get(Phase.COMPUTE, 0.0)
        if comp <= 0:
            return []
        cand = Candidate(CauseKind.MIX, ctx.victim)
        out = []
        if ctx.mix is not None and ctx.mix_ms > 0:
            conf = min(1.0, ctx.mix_ms / comp)
            out.append(Claim(cand, Phase.COMPUTE, Stage.FIRST, ctx.mix.ms, conf, ctx.mix.evidence))
        if ctx.work is not None and _known(ctx, ctx.work):
            work = ctx.work
        elif _same_tokens(ctx):
            return out  # compute time rose, its requests did not get longer: no heavier work
        else:
            work = _compute_time(ctx)
        heavier = _heavier(ctx, work)
        if heavier is not None:
            ms, conf, ev = heavier
            if work.kind == "units":
                out.append(Claim(cand, Phase.COMPUTE, Stage.FIRST, ms, conf, ev))
            elif _alone_on_gpu(ctx):
                out.append(Claim(cand, Phase.COMPUTE, Stage.LEFTOVER, ms, conf, ev, alone=True))
        return out


def _known(ctx: Context, work: WorkSeries) -> bool:
    """Whether ``work`` has a value in both the normal and the slow windows with requests."""
    ok = np.isfinite(work.per_request) & (ctx.v["count"] > 0)
    return bool((ok & ctx.before).any() and (ok & ctx.during).any())


def _same_tokens(ctx: Context) -> bool:
    """Whether the victim's requests say how long they were (token counts, before and during)
    and neither the prompts nor the answers got longer (:func:`_shifted`): then what its
    compute time per request did is no measure of heavier work."""
    tok = ctx.w.tokens.get(ctx.victim)
    if tok is None:
        return False
    cnt = np.nan_to_num(tok["count"])
    seen = False
    for name in ("prompt_tokens_mean", "output_tokens_mean"):
        x = tok.get(name)
        if x is None:
            continue
        has = np.isfinite(x) & (cnt > 0)
        if np.count_nonzero(has & ctx.before) < 2 or np.count_nonzero(has & ctx.during) < 2:
            continue
        longer = wmean_over(x, cnt, ctx.during) > wmean_over(x, cnt, ctx.before)
        if longer and _shifted(x, cnt, ctx.before, ctx.during):
            return False
        seen = True
    return seen


def _compute_time(ctx: Context) -> WorkSeries:
    return WorkSeries(ctx.v["compute_ms"], "time", f"{ctx.victim} compute time per request", "ms")


def _heavier(ctx: Context, work: WorkSeries) -> tuple[float, float, dict[str, Any]] | None:
    """What heavier requests predict of the compute excess (ms per request), a confidence and
    the evidence, or None when the work per request did not rise beyond its spread."""
    x, cnt = work.per_request, ctx.v["count"]
    wb, wd = wmean_over(x, cnt, ctx.before), wmean_over(x, cnt, ctx.during)
    if not (np.isfinite(wb) and np.isfinite(wd) and wb > 0 and wd > (1 + MIN_WORK_RISE) * wb):
        return None
    ok = cnt > 0
    test = shift_enrichment(x, ctx.before & ok, ctx.during & ok, Direction.RISE, WORK_SE * wb)
    if not test.named:
        return None
    ms = ctx.compute_before * (wd / wb - 1)
    ev: dict[str, Any] = {
        "series": work.label,
        "unit": work.unit,
        "work": work.kind,
        "before": _r(wb),
        "during": _r(wd),
        "ratio": _r(wd / wb),
        "explained_ms": _r(ms),
        "enrichment": test.to_evidence(),
    }
    return ms, strength(test.z), ev


def _alone_on_gpu(ctx: Context) -> bool:
    """Whether nothing but the victim's own work is in sight: no co-tenant model whose demand
    rose or that slowed alongside it with flat demand (contention), no other host process whose
    CPU use rose, and per-process GPU series that would have shown a co-tenant process (or no
    other model on the GPU)."""
    if any(d.rose for d in ctx.demands.values()) or fellow_victims(ctx.demands):
        return False
    if any(r.name != ctx.victim for r in ctx.risers):
        return False
    others = [m for m in ctx.w.models if m != ctx.victim]
    seen = any(np.isfinite(s["sm_util"]).any() for s in ctx.w.processes.values())
    return seen or not others
