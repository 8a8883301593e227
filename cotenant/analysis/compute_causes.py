"""The GPU-side explainers of a victim's compute excess, and who drove its PCIe traffic.

Each predicts what its cause would add to the victim's compute time per request, from the
physics we know, relative to ``compute_before`` (the victim's compute per request in its
normal windows); :mod:`analysis.apportion` shares the excess in proportion to the predictions:

* :class:`ThrottleExplainer` — the SM clock while the GPU is busy fell: ``compute_before x
  (clock_before / clock_during - 1)``. Whatever the clock-event reasons say: a clock held under
  its maximum by an operator or a driver policy (locked clocks) slows kernels like a thermal
  slowdown, and is said so in the evidence;
* :class:`CotenantExplainer` — a co-tenant (model or process) whose own demand rose
  (:mod:`analysis.demand`) and whose SM activity rose: ``compute_before x`` its rise;
* :class:`BandwidthExplainer` — the same when the rise is mostly memory traffic (DRAM
  ``bandwidth``), and the transfers' growth to the process most active while PCIe traffic rose;
* :class:`MemoryExplainer` — a nearly full GPU into which some process's memory *grew*: the
  whole excess, to that process.

Every rise is a one-sided test on enrichment (:mod:`analysis.enrichment`): a co-tenant as busy
in the victim's normal windows as in its slow ones, or a clock as low, names nothing. A
co-tenant idle in every normal window (a base rate of zero) is enriched by any activity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.analysis.candidates import Candidate, activity
from cotenant.analysis.change import absent_as_zero, confidence, mean_over, median_over, rise
from cotenant.analysis.change import evidence as change_evidence
from cotenant.analysis.claims import Claim, Context, Phase, Stage
from cotenant.analysis.enrichment import rate_enrichment, shift_enrichment
from cotenant.analysis.metric_direction import Direction
from cotenant.analysis.windows import GpuWindows
from cotenant.core.cause_kinds import CauseKind

SAMPLE_LAG_WINDOWS = 3
"""Windows after an incident that still count as 'during' for per-process samples."""

CLOCK_DROP = 1.03
"""Busy clock before over busy clock during above this: the clock fell."""
UNDER_MAX = 0.9
"""A busy window whose SM clock is under this fraction of its maximum is a throttled one."""
BUSY_PCT = 10.0
"""GPU SM utilisation (%) from which a window counts as busy (idle GPUs lower their clocks)."""
MIN_RISE = 0.02
"""Activity (0-1) a co-tenant's SM or DRAM use must rise by to be weighed at all."""
DRAM_OVER_SM = 1.5
"""A co-tenant whose DRAM activity rose this many times its SM activity is DRAM bandwidth."""
ACTIVITY_SE = 0.01
"""Activity (0-1): the least standard error of a rise (a flat series is not a certain one)."""
IDLE = 0.005
"""Activity (0-1) under which a co-tenant is idle."""
MIN_IDLE_WINDOWS = 20
"""Normal windows a co-tenant must have been idle in for any rise to count as enriched."""
NEARLY_FULL = 0.95
"""Share of GPU memory in use (over a slowdown's median window) from which memory that grew
into it is a cause."""
MEM_GROWTH = 0.02
"""...grown by at least this share of the GPU's memory."""


def widen(mask: np.ndarray, after: int) -> np.ndarray:
    """``mask`` extended by ``after`` windows past each run's end."""
    out = mask.copy()
    for k in range(1, after + 1):
        out[k:] |= mask[:-k]
    return out


def capacity_lost(w: GpuWindows, lo: int, hi: int) -> bool:
    """Whether windows ``[lo, hi]`` show a capacity the GPU lost, which ordinary traffic does
    not cause: a busy window whose SM clock sat under :data:`UNDER_MAX` of its maximum, or
    memory :data:`NEARLY_FULL` over the windows' median (a cheap look at the counters: the
    explainers decide what caused what)."""
    sl = slice(lo, hi + 1)
    clock, top = w.counters.get("sm_clock_mhz"), w.counters.get("max_sm_clock_mhz")
    if clock is not None and top is not None:
        with np.errstate(invalid="ignore"):
            under = clock[sl] < UNDER_MAX * top[sl]
        if bool((under & busy_windows(w)[sl]).any()):
            return True
    used, total = w.counters.get("mem_used_bytes"), w.counters.get("mem_total_bytes")
    if used is None or total is None:
        return False
    with np.errstate(invalid="ignore", divide="ignore"):
        full = used[sl] / total[sl]
    return bool(np.isfinite(full).any() and np.nanmedian(full) >= NEARLY_FULL)


def busy_windows(w: GpuWindows) -> np.ndarray:
    """Windows where the GPU was busy (SM utilisation at least :data:`BUSY_PCT`); every
    window where its utilisation is not known."""
    sm = w.counters.get("sm_util")
    if sm is None:
        return np.ones(w.n, dtype=bool)
    out: np.ndarray = ~(np.isfinite(sm) & (sm < BUSY_PCT))
    return out


@dataclass(frozen=True)
class ThrottleExplainer:
    kind: CauseKind = CauseKind.THROTTLE

    def claims(self, ctx: Context) -> list[Claim]:
        w = ctx.w
        clock = w.counters.get("sm_clock_mhz")
        comp = ctx.excess.get(Phase.COMPUTE, 0.0)
        if clock is None or comp <= 0:
            return []
        busy = busy_windows(w)
        before, during = ctx.before & busy, ctx.during & busy
        if not (np.isfinite(clock[before]).any() and np.isfinite(clock[during]).any()):
            before, during = ctx.before, ctx.during
        cb, cd = mean_over(clock, before), mean_over(clock, during)
        if not (np.isfinite(cb) and np.isfinite(cd) and cd > 0 and cb / cd > CLOCK_DROP):
            return []
        drop = shift_enrichment(clock, before, during, Direction.FALL, se_floor=0.01 * cb)
        if not drop.named:
            return []
        ev = change_evidence(clock, ctx.before, ctx.during, f"{w.gpu} SM clock", "MHz")
        ev["busy_clock_mhz"] = {"before": round(cb, 1), "during": round(cd, 1)}
        ev["clock_drop"] = drop.to_evidence()
        ev.update(_clock_level(w, clock, before, during))
        return [
            Claim(
                Candidate(CauseKind.THROTTLE, w.gpu),
                Phase.COMPUTE,
                Stage.SHARED,
                ctx.compute_before * (cb / cd - 1),
                confidence(-clock, ctx.before, ctx.during),
                ev,
            )
        ]


def _clock_level(
    w: GpuWindows, clock: np.ndarray, before: np.ndarray, during: np.ndarray
) -> dict[str, Any]:
    """Evidence on the clock against its maximum: the share of busy windows under
    :data:`UNDER_MAX` of it before and during, the clock-event reasons, and whether the clock
    sat under its maximum with no reason given (clocks locked)."""
    out: dict[str, Any] = {}
    top = w.counters.get("max_sm_clock_mhz")
    reasons = w.counters.get("clock_event_reasons")
    bits = 0
    if reasons is not None:
        r = np.nan_to_num(reasons[during]).astype(np.int64)
        bits = int(np.bitwise_or.reduce(r)) if len(r) else 0
        out["clock_event_reasons"] = bits
    if top is not None and np.isfinite(top[during]).any():
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = clock / top
        under = np.where(np.isfinite(ratio), (ratio < UNDER_MAX).astype(float), np.nan)
        level = rate_enrichment(under, before, during)
        out["under_max"] = level.to_evidence()
        out["clock_of_max"] = {
            "before": _r(mean_over(ratio, before)),
            "during": _r(mean_over(ratio, during)),
        }
        # idle (0x1) and the application-clocks setting (0x2) are no throttle reason
        if level.during > 0 and not bits & ~0x3:
            out["locked"] = (
                "the SM clock sat under its maximum while busy with no throttle reason: "
                "clocks locked by an operator or a driver policy"
            )
    return out


def _rises(ctx: Context) -> list[tuple[str, np.ndarray, np.ndarray, float, float]]:
    """Co-tenants whose own demand rose, with their SM and DRAM activity and its rises over
    the windows ``near`` the incident (largest activity first, as :func:`activity` lists)."""
    out = []
    for name, (sm, dram) in activity(ctx.w, ctx.victim).items():
        if name in ctx.flat:
            continue
        d_sm, d_dram = rise(sm, ctx.before, ctx.near), rise(dram, ctx.before, ctx.near)
        if d_sm <= MIN_RISE and d_dram <= MIN_RISE:
            continue
        out.append((name, sm, dram, d_sm, d_dram))
    return out


def _activity_claim(
    ctx: Context, name: str, x: np.ndarray, d: float, cand: Candidate, what: str
) -> Claim | None:
    x = absent_as_zero(x, ctx.before)  # a process that appeared was idle before (as rise says)
    enr = shift_enrichment(x, ctx.before, ctx.near, Direction.RISE, se_floor=ACTIVITY_SE)
    if not (enr.named or _appeared(x, ctx.before)):
        return None
    ev = change_evidence(x * 100, ctx.before, ctx.near, f"{name} {what}", "%")
    ev["enrichment"] = enr.to_evidence()
    if name in ctx.demands:  # why this co-tenant is a culprit, not a fellow victim
        ev["demand_rose"] = ctx.demands[name].reasons
    return Claim(
        cand,
        Phase.COMPUTE,
        Stage.SHARED,
        ctx.compute_before * d,
        confidence(x, ctx.before, ctx.near),
        ev,
    )


def _appeared(x: np.ndarray, before: np.ndarray) -> bool:
    """Idle (under :data:`IDLE` activity) in every one of at least :data:`MIN_IDLE_WINDOWS`
    normal windows: a base rate of zero, which any activity during the slowdown exceeds however
    few windows it shows in (a short burst of a co-tenant idle until then)."""
    b = x[before]
    b = b[np.isfinite(b)]
    return bool(len(b) >= MIN_IDLE_WINDOWS and b.max() < IDLE)


@dataclass(frozen=True)
class CotenantExplainer:
    kind: CauseKind = CauseKind.COTENANT

    def claims(self, ctx: Context) -> list[Claim]:
        if ctx.excess.get(Phase.COMPUTE, 0.0) <= 0:
            return []
        out = []
        for name, sm, _, d_sm, d_dram in _rises(ctx):
            if d_dram > DRAM_OVER_SM * d_sm:
                continue
            c = _activity_claim(
                ctx, name, sm, d_sm, Candidate(CauseKind.COTENANT, name), "SM utilisation"
            )
            if c is not None:
                out.append(c)
        return out


@dataclass(frozen=True)
class BandwidthExplainer:
    kind: CauseKind = CauseKind.BANDWIDTH

    def claims(self, ctx: Context) -> list[Claim]:
        out = []
        if ctx.excess.get(Phase.COMPUTE, 0.0) > 0:
            for name, _, dram, d_sm, d_dram in _rises(ctx):
                if not d_dram > DRAM_OVER_SM * d_sm:
                    continue
                cand = Candidate(CauseKind.BANDWIDTH, name, "dram")
                c = _activity_claim(ctx, name, dram, d_dram, cand, "DRAM utilisation")
                if c is not None:
                    out.append(c)
        if ctx.excess.get(Phase.TRANSFER, 0.0) > 0:
            cand, conf, ev = pcie_culprit(ctx.w, ctx.victim, ctx.before, ctx.during, ctx.flat)
            out.append(Claim(cand, Phase.TRANSFER, Stage.FIRST, np.inf, conf, ev))
        return out


@dataclass(frozen=True)
class MemoryExplainer:
    kind: CauseKind = CauseKind.MEMORY

    def claims(self, ctx: Context) -> list[Claim]:
        w = ctx.w
        comp = ctx.excess.get(Phase.COMPUTE, 0.0)
        used, total = w.counters.get("mem_used_bytes"), w.counters.get("mem_total_bytes")
        if comp <= 0 or used is None or total is None:
            return []
        with np.errstate(invalid="ignore", divide="ignore"):
            full = used / total
        cap = float(np.nanmax(total)) if np.isfinite(total).any() else 0.0
        # its typical window, not its mean: a slowdown found a few seconds before the memory
        # filled (or that outlasts it) is no less a full GPU's
        if not (median_over(full, ctx.during) >= NEARLY_FULL and cap > 0):
            return []
        # a nearly full GPU alone is normal for KV-cache servers; the cause is memory that
        # *grew* into it
        best, best_rise = None, MEM_GROWTH * cap
        for name, ps in w.processes.items():
            r = rise(ps["mem_used_bytes"], ctx.before, ctx.during)
            if r > best_rise:
                best, best_rise = w.process_model.get(name) or name, r
        if best is None:
            return []
        ev = change_evidence(full * 100, ctx.before, ctx.during, f"{w.gpu} memory used", "%")
        ev["grew_gib"] = round(best_rise / 1024**3, 2)
        return [
            Claim(
                Candidate(CauseKind.MEMORY, best),
                Phase.COMPUTE,
                Stage.SHARED,
                comp - ctx.mix_ms,
                confidence(full, ctx.before, ctx.during),
                ev,
            )
        ]


def pcie_culprit(
    w: GpuWindows, victim: str, before: np.ndarray, during: np.ndarray, flat: set[str]
) -> tuple[Candidate, float, dict[str, Any]]:
    """The process most active while PCIe traffic rose; co-tenants in ``flat`` (no rise in
    their own demand) are skipped."""
    tx = w.counters.get("pcie_tx_bps")
    rx = w.counters.get("pcie_rx_bps")
    pcie = (
        None
        if tx is None
        else np.nan_to_num(tx) + np.nan_to_num(rx if rx is not None else np.zeros(w.n))
    )
    best, best_rise = None, 0.0
    for name, (sm, dram) in activity(w, victim).items():
        if name in flat:
            continue
        r = rise(sm + dram, before, during) + (
            0.05
            if mean_over(sm + dram, before) < 0.005 and mean_over(sm + dram, during) > 0.005
            else 0.0
        )
        if r > best_rise:
            best, best_rise = name, r
    cand = Candidate(CauseKind.BANDWIDTH, best or CauseKind.UNKNOWN, "pcie")
    ev = change_evidence(
        None if pcie is None else pcie / 1e9, before, during, f"{w.gpu} PCIe throughput", "GB/s"
    )
    return cand, confidence(pcie, before, during) if pcie is not None else 0.2, ev


def _r(x: float) -> float | None:
    return round(float(x), 3) if np.isfinite(x) else None
