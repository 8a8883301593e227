"""The physical explanations of a victim's compute excess (and who drove its PCIe traffic).

:func:`compute_causes` shares the compute excess (ms per request) among what the physics we
know predicts — a lower clock, co-tenants and processes whose demand rose (their SM or DRAM
activity), memory that grew into a full GPU, the victim's own bigger batches — trusting the
predictions within a factor of :data:`TRUST`; what they leave unexplained goes to the host
process whose CPU use rose most. :func:`pcie_culprit` names the process most active while PCIe
traffic rose. Both skip co-tenants whose demand did not rise (:mod:`analysis.demand`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cotenant.analysis.candidates import Candidate, activity
from cotenant.analysis.change import confidence, mean_over, rise, wmean_over
from cotenant.analysis.change import evidence as change_evidence
from cotenant.analysis.cpu_causes import CpuRiser
from cotenant.analysis.demand import Demand, arrival_surge
from cotenant.analysis.windows import GpuWindows

TRUST = 2.0
"""Predictions are trusted within this factor: at most TRUST x their sum is allocated."""

SAMPLE_LAG_WINDOWS = 3
"""Windows after an incident that still count as 'during' for per-process samples."""


def widen(mask: np.ndarray, after: int) -> np.ndarray:
    """``mask`` extended by ``after`` windows past each run's end."""
    out = mask.copy()
    for k in range(1, after + 1):
        out[k:] |= mask[:-k]
    return out


@dataclass
class Context:
    """One attribution's inputs and the confidence / evidence / notes it fills in."""

    w: GpuWindows
    victim: str
    before: np.ndarray
    during: np.ndarray
    near: np.ndarray  # during, widened for per-process samples stamped after the work
    flat: set[str]  # co-tenant models whose own demand did not rise
    demands: dict[str, Demand]
    conf: dict[Candidate, float]
    evidence: dict[Candidate, dict[str, Any]]
    notes: list[str]


def cpu_candidate(name: str, victim: str) -> Candidate:
    """The cause a rise in ``name``'s host CPU use points at: the victim's own ``load`` when it
    is the victim (its arrivals surged), else ``cpu``."""
    return Candidate("load", victim) if name == victim else Candidate("cpu", name)


def cpu_evidence(
    ctx: Context, cand: Candidate, top: CpuRiser, series: np.ndarray, risers: list[CpuRiser]
) -> None:
    """Confidence and evidence of the host CPU cause ``cand``: ``top``'s series (cores), and
    the next processes whose CPU use rose too."""
    ctx.conf[cand] = confidence(series, ctx.before, ctx.during)
    ev = change_evidence(series, ctx.before, ctx.during, f"{top.name} host CPU", "cores")
    if len(risers) > 1:
        ev["also_rose"] = [
            {"process": r.name, "before": round(r.before, 3), "during": round(r.during, 3)}
            for r in risers[1:6]
        ]
    ctx.evidence[cand] = ev


def compute_causes(
    ctx: Context, comp_excess: float, risers: list[CpuRiser], host_cpu: dict[str, np.ndarray]
) -> dict[Candidate, float]:
    """Compute excess (ms per request) shared among physical explanations.

    GPU-side explanations first (clock, co-tenants and processes whose demand rose, memory, own
    bigger batches); what they leave unexplained goes to the host process whose CPU use rose
    most, up to ``TRUST x`` its prediction ``compute_before x cores it took`` (compute spans
    hold host work too: kernel launches, CPU-side inference) — to the victim's own ``load``
    when that process is the victim itself, whose arrivals surged."""
    if comp_excess <= 0:
        return {}
    w, victim, before, during = ctx.w, ctx.victim, ctx.before, ctx.during
    conf, evidence = ctx.conf, ctx.evidence
    v = w.models[victim]
    cnt = v["count"]
    comp_b = wmean_over(v["compute_ms"], cnt, before)
    if not np.isfinite(comp_b) or comp_b <= 0:
        comp_b = comp_excess
    pred: dict[Candidate, float] = {}
    clock = w.counters.get("sm_clock_mhz")
    if clock is not None:
        cb, cd = mean_over(clock, before), mean_over(clock, during)
        if np.isfinite(cb) and np.isfinite(cd) and cd > 0 and cb / cd > 1.03:
            cand = Candidate("throttle", w.gpu)
            pred[cand] = comp_b * (cb / cd - 1)
            conf[cand] = confidence(-clock, before, during)
            ev = change_evidence(clock, before, during, f"{w.gpu} SM clock", "MHz")
            reasons = w.counters.get("clock_event_reasons")
            if reasons is not None:
                r = np.nan_to_num(reasons[during]).astype(np.int64)
                ev["clock_event_reasons"] = int(np.bitwise_or.reduce(r)) if len(r) else 0
            evidence[cand] = ev
    near = ctx.near
    for name, (sm, dram) in activity(w, victim).items():
        if name in ctx.flat:
            continue
        d_sm, d_dram = rise(sm, before, near), rise(dram, before, near)
        if d_sm <= 0.02 and d_dram <= 0.02:
            continue
        if d_dram > 1.5 * d_sm:
            cand = Candidate("bandwidth", name, "dram")
            pred[cand] = comp_b * d_dram
            conf[cand] = confidence(dram, before, near)
            evidence[cand] = change_evidence(
                dram * 100, before, near, f"{name} DRAM utilisation", "%"
            )
        else:
            cand = Candidate("cotenant", name)
            pred[cand] = comp_b * d_sm
            conf[cand] = confidence(sm, before, near)
            evidence[cand] = change_evidence(sm * 100, before, near, f"{name} SM utilisation", "%")
        if name in ctx.demands:  # why this co-tenant is a culprit, not a fellow victim
            evidence[cand]["demand_rose"] = ctx.demands[name].reasons
    used, total = w.counters.get("mem_used_bytes"), w.counters.get("mem_total_bytes")
    if used is not None and total is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            full = used / total
        cap = float(np.nanmax(total)) if np.isfinite(total).any() else 0.0
        if mean_over(full, during) >= 0.95 and cap > 0:
            # a nearly full GPU alone is normal for KV-cache servers; the cause is memory that
            # *grew* into it (at least 2 % of the GPU)
            best, best_rise = None, 0.02 * cap
            for name, ps in w.processes.items():
                r = rise(ps["mem_used_bytes"], before, during)
                if r > best_rise:
                    best, best_rise = w.process_model.get(name) or name, r
            if best is not None:
                cand = Candidate("memory", best)
                pred[cand] = comp_excess
                conf[cand] = confidence(full, before, during)
                evidence[cand] = change_evidence(
                    full * 100, before, during, f"{w.gpu} memory used", "%"
                )
                evidence[cand]["grew_gib"] = round(best_rise / 1024**3, 2)
    bb = wmean_over(v["batch_size_mean"], cnt, before)
    bd = wmean_over(v["batch_size_mean"], cnt, during)
    # bigger batches from a queue alone are a symptom, not a cause
    if (
        arrival_surge(v, before, during, w.step_ns)
        and np.isfinite(bb)
        and np.isfinite(bd)
        and bb > 0
        and bd > 1.1 * bb
    ):
        cand = Candidate("load", victim)
        pred[cand] = comp_b * (bd / bb - 1) / 2
        conf[cand] = confidence(v["batch_size_mean"], before, during)
        evidence[cand] = change_evidence(
            v["batch_size_mean"], before, during, f"{victim} batch size", "requests"
        )
    s = sum(pred.values())
    out = {c: min(comp_excess, TRUST * s) * p / s for c, p in pred.items()} if s > 0 else {}
    rest = comp_excess - sum(out.values())
    if risers and rest > 1e-9:
        top = risers[0]
        cand = cpu_candidate(top.name, victim)
        out[cand] = min(rest, TRUST * comp_b * top.rise)
        cpu_evidence(ctx, cand, top, host_cpu[top.name], risers)
    if not out:
        ctx.notes.append(
            "compute time grew with no co-tenant, clock, memory or host CPU change to explain it"
        )
    return out


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
    cand = Candidate("bandwidth", best or "unknown", "pcie")
    ev = change_evidence(
        None if pcie is None else pcie / 1e9, before, during, f"{w.gpu} PCIe throughput", "GB/s"
    )
    return cand, confidence(pcie, before, during) if pcie is not None else 0.2, ev
