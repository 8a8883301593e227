"""Fellow victim or culprit: did a co-tenant's own demand rise during a victim's incident?

A co-tenant that was slowed by the same contention as the victim looks busier: its requests
take longer, so its compute seconds in flight per second (and, where the GPU or a spin-waiting
runtime counts wall time, its SM or CPU use) go up. That is a symptom. Only an actor whose
*demand* rose can take a share of the victim's excess. A co-tenant model's demand rose when any
of these holds between the before and the during windows:

* **arrivals** — more requests arrived than Poisson noise allows (:func:`arrival_surge`:
  ``z`` standard errors of the difference of the two rates and 10 % over the before rate;
  after no arrival at all, over the highest rate the before windows could hide);
* **work per request** — its mean batch size grew by more than 10 % while neither its queue
  nor its compute per item did (a slowed server batches more of the requests that wait for
  it: a symptom, not more work);
* **work per item at its baseline speed** — its compute per item grew more than
  ``3 x`` the victim's (the slowdown both saw), over at least 10 requests before and during,
  so it is not only slowed;
* **GPU work** — where NVML measures its process, its SM or DRAM activity grew by more than
  its own slowdown explains (``x 1.25`` and 2 points over ``before x`` its compute-per-item
  ratio). Per-process GPU activity counts the work a process runs, which a slower GPU stretches
  only as much as it stretches that process's kernels; more than that is more work: more
  requests completed, or work of its own that its requests do not show (a fine-tune in the
  serving process, a warm-up).

Tokens per request are not in the request windows yet, so they are not a signal here.
Processes that emit no spans have no request signal: their measured GPU or CPU use is their
demand, and they stay candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cotenant.analysis.change import absent_as_zero, mean_over, wmean_over
from cotenant.analysis.windows import GpuWindows

BATCH_RISE = 1.1
"""Mean batch size over the before level by this factor is more work per request."""
WORK_RISE = 3.0
"""Compute per item over the victim's own slowdown by this factor is more work per item. Not
less: on a contended host a long job is slowed more than a short one (a scheduler favours
tasks that sleep), by 1.6x in the real-contention bench."""
MIN_ITEMS = 10
"""...judged only with at least this many requests completed before and during (a few slow
requests of a sparse model say little)."""
OWN_USE_RISE = 1.25
"""Measured GPU activity over ``before x`` its own slowdown by this factor is more work."""
OWN_USE_MIN = 0.02
"""...and by at least this much activity (0-1)."""
MIN_CPU_RISE = 0.05
"""Host CPU use rising by less than this many cores is no change."""
SLOWED = 1.2
"""A co-tenant whose compute per item (or mean latency) grew by this factor was slowed."""


IDLE_LEAD = 180
"""Windows of idleness before a model's "before" windows that count as its time."""


def arrival_span(v: dict[str, np.ndarray], before: np.ndarray, during: np.ndarray) -> np.ndarray:
    """The stretch of time ``before`` covers: its windows and the windows without requests
    between its first and its last (not those of other slowdowns), less ``during``. An
    arrival rate is requests over *time*: ``before`` itself holds only windows with enough
    requests for a latency (or, for a sparse model, any request), so a bursty model's rate
    over it was that of its busy windows alone — the tail of its last burst read as 12
    requests/s before a burst of 8, and its own burst was never a surge."""
    idx = np.flatnonzero(before)
    if not len(idx):
        return before
    idle = ~(np.nan_to_num(v["arrival_rps"]) > 0)
    if "count" in v:  # (requests that arrived earlier and completed in the window)
        idle &= ~(np.nan_to_num(v["count"]) > 0)
    # ... from the idle stretch that led up to its first window (a bursty model idle for
    # minutes between bursts, whose "before" is a window or two), at most IDLE_LEAD back
    # (not before its first request in the windows: before that it is unknown, not idle)
    seen = np.flatnonzero(~idle)
    lo = max(0, int(idx[0]) - IDLE_LEAD, int(seen[0]) if len(seen) else 0)
    busy = np.flatnonzero(~idle[lo : idx[0]])
    lo += int(busy[-1]) + 1 if len(busy) else 0
    span = np.zeros_like(before)
    span[lo : idx[-1] + 1] = True
    out: np.ndarray = span & (before | idle) & ~during
    return out


def arrival_rates(
    v: dict[str, np.ndarray], before: np.ndarray, during: np.ndarray
) -> tuple[float, float]:
    """A model's mean arrival rate (requests/s) over :func:`arrival_span` and over
    ``during``."""
    arr = v["arrival_rps"]
    return mean_over(arr, arrival_span(v, before, during)), mean_over(arr, during)


def arrival_z(
    v: dict[str, np.ndarray], before: np.ndarray, during: np.ndarray, step_ns: int
) -> tuple[float, float, float]:
    """How far arrivals rose beyond Poisson noise: ``(z, rate_before, rate_during)``, ``z``
    the difference of the two rates in standard errors (``nan`` with no before rate or no
    time to count over). ``v`` is one model's request windows.

    Both rates are counts over a time, so both are uncertain: the standard error is that of
    the difference of two Poisson rates, ``sqrt(n_b / t_b^2 + n_d / t_d^2)``. Taking the
    before rate as exact made a sparse model (0.2 requests/s, 5 arrivals in a minute that
    happened to be quiet) "surge" on the 17 of an ordinary minute after it."""
    rate_b, _ = arrival_rates(v, before, during)
    step_s = step_ns / 1e9
    secs_b = float(arrival_span(v, before, during).sum()) * step_s
    secs_d = float(during.sum()) * step_s
    if not np.isfinite(rate_b) or rate_b <= 0 or secs_b <= 0 or secs_d <= 0:
        return float("nan"), rate_b, float("nan")
    n_b = rate_b * secs_b
    n_d = float(np.nansum(v["arrival_rps"][during])) * step_s
    rate_d = n_d / secs_d
    se = np.sqrt(max(n_b, 1.0) / secs_b**2 + max(n_d, 1.0) / secs_d**2)
    return float((rate_d - rate_b) / se), rate_b, rate_d


def arrival_surge(
    v: dict[str, np.ndarray], before: np.ndarray, during: np.ndarray, step_ns: int, z: float = 3.0
) -> bool:
    """Did arrivals rise beyond Poisson noise? (more than ``z`` standard errors of
    :func:`arrival_z` and 10 % over the before rate)."""
    got, rate_b, rate_d = arrival_z(v, before, during, step_ns)
    return bool(got > z and rate_d > 1.1 * rate_b)


SURGE_SMOOTH_S = 30.0
"""Arrivals are judged over this long (a centred rolling mean) when a surge's length is taken."""


def surge_s(
    v: dict[str, np.ndarray], before: np.ndarray, during: np.ndarray, step_ns: int
) -> float:
    """How long (s) arrivals stayed up in ``during``: the longest run of its windows whose
    arrival rate, averaged over :data:`SURGE_SMOOTH_S` around each, is at least 10 % over the
    before rate. A burst is short; a surge that lasts is not."""
    rate_b, _ = arrival_rates(v, before, during)
    idx = np.flatnonzero(during)
    if not np.isfinite(rate_b) or rate_b <= 0 or len(idx) == 0:
        return 0.0
    step_s = step_ns / 1e9
    arr = np.nan_to_num(v["arrival_rps"][idx[0] : idx[-1] + 1])
    k = max(1, min(len(arr), round(SURGE_SMOOTH_S / step_s)))
    c = np.concatenate([[0.0], np.cumsum(arr)])
    lo = np.clip(np.arange(len(arr)) - k // 2, 0, len(arr) - k)
    up = (c[lo + k] - c[lo]) / k > 1.1 * rate_b
    edges = np.flatnonzero(np.diff(np.concatenate([[0], up.astype(np.int8), [0]])))
    return float((edges[1::2] - edges[::2]).max()) * step_s if len(edges) else 0.0


SWING_S = 10.0
"""Arrivals are counted per this long when how much their rate swung is taken ..."""
SWING_LOOKBACK_S = 600.0
"""... over at most this long before a slowdown (from the model's first request)."""


def arrival_swing(v: dict[str, np.ndarray], during: np.ndarray, step_ns: int) -> float:
    """How much the model's arrival rate swung over the :data:`SWING_LOOKBACK_S` before
    ``during``, beyond Poisson noise: the squared coefficient of variation of its arrivals per
    :data:`SWING_S` less the Poisson part, ``(var - mean) / mean**2`` of the counts (at
    least 0). About 0 for steady traffic at any rate; 1 and more for bursts or a trace's
    swings. NaN with fewer than six such spans."""
    first = np.flatnonzero(during)
    arr = np.nan_to_num(v["arrival_rps"])
    seen = np.flatnonzero(arr > 0)
    if not len(first) or not len(seen):
        return float("nan")
    step_s = step_ns / 1e9
    lo = max(int(seen[0]), int(first[0]) - round(SWING_LOOKBACK_S / step_s))
    x = arr[lo : int(first[0])]
    k = max(1, round(SWING_S / step_s))
    n = len(x) // k
    if n < 6:
        return float("nan")
    counts = x[len(x) - n * k :].reshape(n, k).sum(axis=1) * step_s
    mean = float(counts.mean())
    if mean <= 0:
        return float("nan")
    return max(0.0, float(counts.var(ddof=1)) - mean) / mean**2


def _woke_up(
    v: dict[str, np.ndarray], before: np.ndarray, during: np.ndarray, step_ns: int, z: float = 3.0
) -> bool:
    """No arrival before, and more during than a rate that could have hidden in the before
    windows allows (its 95 % upper bound, 3 / their length: the rule of three). A sparse model
    with a short history (a warm-up) has not woken up by sending one request."""
    span = arrival_span(v, before, during)
    if mean_over(v["arrival_rps"], span) > 0:
        return False
    secs_b = float(span.sum()) * step_ns / 1e9
    if secs_b <= 0:
        return False
    expected = 3.0 / secs_b * float(during.sum()) * step_ns / 1e9
    got = float(np.nansum(v["arrival_rps"][during])) * step_ns / 1e9
    return bool(got - expected > z * np.sqrt(max(expected, 1.0)))


def per_item_ms(v: dict[str, np.ndarray]) -> np.ndarray:
    """Compute time per batch item (ms): the request's compute over its mean batch size, or
    its mean latency when no phases are known."""
    comp = v["compute_ms"]
    if not np.isfinite(comp).any():
        comp = v["mean_ms"]
    out: np.ndarray = comp / np.fmax(np.nan_to_num(v["batch_size_mean"], nan=1.0), 1.0)
    return out


def slowdown(v: dict[str, np.ndarray], before: np.ndarray, during: np.ndarray) -> float:
    """During / before compute per item, request-weighted; NaN when either is unknown."""
    item, cnt = per_item_ms(v), v["count"]
    b, d = wmean_over(item, cnt, before), wmean_over(item, cnt, during)
    return d / b if np.isfinite(b) and np.isfinite(d) and b > 0 else float("nan")


@dataclass
class Demand:
    """What a co-tenant model did during the victim's incident."""

    model: str
    rose: bool  # its own demand rose: it may take a share
    reasons: list[str] = field(default_factory=list)  # which signals rose, in words
    slowed: float = float("nan")  # its compute per item, during / before
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, **self.evidence}
        if np.isfinite(self.slowed):
            out["compute_per_item_ratio"] = round(self.slowed, 2)
        return out


def _nvml_activity(w: GpuWindows, model: str) -> tuple[np.ndarray, np.ndarray] | None:
    """The model's process SM and DRAM activity (0-1) as NVML measured it, if it did."""
    for pname, owner in w.process_model.items():
        if owner == model:
            ps = w.processes[pname]
            return ps["sm_util"] / 100.0, ps["mem_util"] / 100.0
    return None


def demand_of(
    w: GpuWindows,
    model: str,
    before: np.ndarray,
    during: np.ndarray,
    victim_slowdown: float,
    samples_during: np.ndarray | None = None,
) -> Demand:
    """Did co-tenant ``model``'s demand rise from ``before`` to ``during`` (masks over
    ``w``'s windows)? ``victim_slowdown`` is the victim's own compute per item during / before
    (NaN or below 1 counts as 1). ``samples_during`` (default ``during``) is the mask for its
    NVML series, which are stamped when polled, a little after the work they measure."""
    v = w.models[model]
    cnt = v["count"]
    d = Demand(model, False, slowed=slowdown(v, before, during))
    rate_b, rate_d = arrival_rates(v, before, during)
    d.evidence["arrival_rps"] = [_r(rate_b), _r(rate_d)]
    if arrival_surge(v, before, during, w.step_ns) or _woke_up(v, before, during, w.step_ns):
        d.reasons.append(f"arrivals {_r(rate_b)} -> {_r(rate_d)} req/s")
    bb = wmean_over(v["batch_size_mean"], cnt, before)
    bd = wmean_over(v["batch_size_mean"], cnt, during)
    d.evidence["batch_size"] = [_r(bb), _r(bd)]
    qb, qd = wmean_over(v["queue_ms"], cnt, before), wmean_over(v["queue_ms"], cnt, during)
    queue_grew = not (np.isfinite(qb) and np.isfinite(qd)) or qd > 1.25 * qb + 0.5
    # a slowed server batches more of the requests that wait for it: a symptom
    not_slowed = not (np.isfinite(d.slowed) and d.slowed >= SLOWED)
    bigger = np.isfinite(bb) and np.isfinite(bd) and bb > 0 and bd > BATCH_RISE * bb
    if bigger and not queue_grew and not_slowed:
        d.reasons.append(f"batch size {_r(bb)} -> {_r(bd)} with no queue growth or slowdown")
    s = victim_slowdown if np.isfinite(victim_slowdown) and victim_slowdown > 1 else 1.0
    enough = min(np.nansum(cnt[before]), np.nansum(cnt[during])) >= MIN_ITEMS
    if enough and np.isfinite(d.slowed) and d.slowed > WORK_RISE * s:
        d.reasons.append(
            f"compute per item x{d.slowed:.2f} while the victim's grew x{s:.2f}: more work per item"
        )
    nvml = _nvml_activity(w, model)
    near = during if samples_during is None else samples_during
    own = d.slowed if np.isfinite(d.slowed) and d.slowed > 1 else 1.0
    for what, x in zip(("SM", "DRAM"), nvml or (), strict=False):
        x = absent_as_zero(x, before)
        ub, ud = mean_over(x, before), mean_over(x, near)
        if np.isfinite(ub) and np.isfinite(ud) and ud > ub * own * OWN_USE_RISE + OWN_USE_MIN:
            d.reasons.append(
                f"{what} activity {ub:.2f} -> {ud:.2f}, more than its own slowdown x{own:.2f} "
                "explains"
            )
            break
    d.rose = bool(d.reasons)
    if d.reasons:
        d.evidence["demand_rose"] = d.reasons
    return d


def cotenant_demands(
    w: GpuWindows,
    victim: str,
    before: np.ndarray,
    during: np.ndarray,
    samples_during: np.ndarray | None = None,
) -> dict[str, Demand]:
    """:func:`demand_of` for every other model on the victim's GPU that served requests
    during the incident or before it."""
    s = slowdown(w.models[victim], before, during)
    out = {}
    for m, v in w.models.items():
        if m == victim or not (np.nansum(v["count"][before | during]) > 0):
            continue
        out[m] = demand_of(w, m, before, during, s, samples_during)
    return out


def cpu_work_rose(
    v: dict[str, np.ndarray],
    cpu: np.ndarray,
    before: np.ndarray,
    during: np.ndarray,
    step_ns: int,
) -> bool:
    """Did a model's host CPU use (``cpu``, cores per window) rise by more than its own
    slowdown and its arrivals explain? It must exceed ``OWN_USE_RISE x`` its before level x
    its compute-per-item ratio x its arrival ratio (1 unless :func:`arrival_surge`), and rise
    by at least :data:`MIN_CPU_RISE` cores: a runtime that spin-waits on a slow device burns
    CPU in proportion to the wait, which is a symptom."""
    y = absent_as_zero(np.asarray(cpu, dtype=np.float64), before)
    cb, cd = mean_over(y, before), mean_over(y, during)
    if not (np.isfinite(cb) and np.isfinite(cd)) or cd - cb < MIN_CPU_RISE:
        return False
    own = slowdown(v, before, during)
    own = own if np.isfinite(own) and own > 1 else 1.0
    # more requests bring more CPU work; a rate within Poisson noise of before counts as flat
    rb, rd = arrival_rates(v, before, during)
    more = rd / rb if rb > 0 and arrival_surge(v, before, during, step_ns) else 1.0
    return bool(cd > cb * more * own * OWN_USE_RISE)


def fellow_victims(demands: dict[str, Demand]) -> list[Demand]:
    """Co-tenants slowed (compute per item up by :data:`SLOWED`) with no demand rise."""
    return [d for d in demands.values() if not d.rose and d.slowed >= SLOWED]


def _r(x: float) -> float | None:
    return round(float(x), 3) if np.isfinite(x) else None
