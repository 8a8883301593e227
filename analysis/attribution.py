"""Attribution: which phases carry a victim's excess latency, and why.

Given the victim's windows *during* an incident and a *before* baseline on the same GPU:

1. **Decomposition** — the excess of each phase's mean (ms per request), clipped at 0.
2. **Compute excess** is explained by a counterfactual on the physics we know, each candidate
   contributing what it predicts: throttling ``compute_before x (clock_before / clock_during -
   1)``; a co-tenant (or process) ``compute_before x its rise in SM activity`` — classed as
   DRAM ``bandwidth`` when its rise is mostly memory traffic; memory pressure (GPU nearly full)
   the whole excess, to the process whose memory grew; the victim's own bigger batches
   ``compute_before x (batch ratio - 1) / 2`` as ``load``. Predictions are trusted within a
   factor of two: the excess is shared in proportion to them, up to twice their sum.
3. **Queue excess** is split between own load (arrival-rate ratio - 1) and lost capacity
   (per-item service-time ratio - 1); lost capacity goes to the compute causes.
4. **Lock wait** goes to the lock most waited on (its holder in the evidence); **preprocess**
   and **postprocess** to host CPU (the process whose CPU use rose most); **transfers** to
   PCIe bandwidth (the process most active while PCIe traffic rose); **other** is unknown.

Shares are fractions of the summed phase excess and add up to at most 1; ``unknown`` holds the
rest. Confidence is the strength of the supporting signal's change (:func:`change.strength`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.candidates import Candidate, activity
from analysis.change import absent_as_zero, mean_over, robust_change, strength, wmean_over
from analysis.cpu_causes import CpuRiser, cpu_risers
from analysis.demand import (
    Demand,
    arrival_surge,
    cotenant_demands,
    cpu_work_rose,
    fellow_victims,
    slowdown,
)
from analysis.windows import GpuWindows
from store.schema import PHASE_COLUMNS

TRUST = 2.0
MIN_SHARE = 0.01
"""Causes explaining less than this fraction of the excess are folded into ``unknown``."""


@dataclass
class Cause:
    kind: str
    culprit: str
    share: float
    confidence: float
    evidence: dict[str, Any] = field(default_factory=dict)
    resource: str | None = None
    excess_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": self.kind,
            "culprit": self.culprit,
            "share": round(self.share, 4),
            "confidence": round(self.confidence, 3),
            "excess_ms": round(self.excess_ms, 3),
            "evidence": self.evidence,
        }
        if self.resource:
            d["resource"] = self.resource
        return d


@dataclass
class Attribution:
    phases_ms: dict[str, float]  # excess per phase column, ms per request
    causes: list[Cause]  # ranked, ``unknown`` last
    notes: list[str] = field(default_factory=list)


def _rise(x: np.ndarray, before: np.ndarray, during: np.ndarray) -> float:
    x = absent_as_zero(x, before)
    b, d = mean_over(x, before), mean_over(x, during)
    return 0.0 if not (np.isfinite(b) and np.isfinite(d)) else max(0.0, d - b)


def _conf(x: np.ndarray | None, before: np.ndarray, during: np.ndarray) -> float:
    if x is None:
        return 0.3
    x = absent_as_zero(np.asarray(x, dtype=np.float64), before)
    c = robust_change(x, before, during, during_stat="mean")
    return 0.0 if c is None else strength(c.score)


def _ev(
    x: np.ndarray | None, before: np.ndarray, during: np.ndarray, series: str, unit: str
) -> dict[str, Any]:
    if x is None:
        return {"series": series}
    x = absent_as_zero(x, before)
    return {
        "series": series,
        "unit": unit,
        "before": round(mean_over(x, before), 4),
        "during": round(mean_over(x, during), 4),
    }


def attribute(
    w: GpuWindows,
    victim: str,
    before: np.ndarray,
    during: np.ndarray,
    *,
    host_cpu: dict[str, np.ndarray] | None = None,
    locks: list[tuple[str, str, float]] | None = None,
) -> Attribution:
    """Attribute ``victim``'s excess latency during ``during`` relative to ``before``.

    ``before``/``during`` are boolean masks over ``w``'s windows. ``host_cpu`` maps host
    processes (and models) to their CPU use; ``locks`` lists ``(lock, holder, wait_ms)`` of the
    victim's requests during the incident, most waited first."""
    v = w.models[victim]
    cnt = v["count"]
    notes: list[str] = []
    has_phases = bool(np.isfinite(v["compute_ms"]).any())
    phases: dict[str, float] = {}
    if has_phases:
        for c in PHASE_COLUMNS:
            b, d = wmean_over(v[c], cnt, before), wmean_over(v[c], cnt, during)
            phases[c] = max(0.0, d - b) if np.isfinite(b) and np.isfinite(d) else 0.0
    else:
        notes.append(
            "no per-request phases (spans absent): the latency excess is explained "
            "from GPU and co-tenant series only"
        )
        b, d = wmean_over(v["mean_ms"], cnt, before), wmean_over(v["mean_ms"], cnt, during)
        phases["compute_ms"] = max(0.0, d - b) if np.isfinite(b) and np.isfinite(d) else 0.0
    total = sum(phases.values())
    excess: dict[Candidate, float] = defaultdict(float)
    conf: dict[Candidate, float] = {}
    evidence: dict[Candidate, dict[str, Any]] = {}
    near = _widen(during, SAMPLE_LAG_WINDOWS) & ~before
    demands = cotenant_demands(w, victim, before, during, near)
    # co-tenants whose own demand did not rise: their busier time is a symptom
    flat = {m for m, d in demands.items() if not d.rose}
    # a model's CPU counts only where it rose beyond its slowdown (spin-waits are symptoms)
    cpu_flat = {
        m
        for m, x in (host_cpu or {}).items()
        if m in w.models and not cpu_work_rose(w.models[m], x, before, during, w.step_ns)
    }
    risers = cpu_risers(host_cpu, before, during, exclude=cpu_flat)
    ctx = _Context(w, victim, before, during, near, flat, demands, conf, evidence, notes)

    compute = _compute_causes(ctx, phases.get("compute_ms", 0.0), risers, host_cpu or {})
    for cand, ms in compute.items():
        excess[cand] += ms
    # queue: own load vs lost capacity
    q = phases.get("queue_ms", 0.0)
    if q > 0:
        rate_b, rate_d = mean_over(v["arrival_rps"], before), mean_over(v["arrival_rps"], during)
        item = (
            np.nan_to_num(v["compute_ms"]) + np.nan_to_num(v["h2d_ms"]) + np.nan_to_num(v["d2h_ms"])
        ) / np.fmax(np.nan_to_num(v["batch_size_mean"], nan=1.0), 1.0)
        svc_b, svc_d = wmean_over(item, cnt, before), wmean_over(item, cnt, during)
        lw = max(0.0, rate_d / rate_b - 1) if arrival_surge(v, before, during, w.step_ns) else 0.0
        cw = max(0.0, svc_d / svc_b - 1) if svc_b > 0 else 0.0
        load = Candidate("load", victim)
        if lw + cw > 0:
            excess[load] += q * lw / (lw + cw)
            conf.setdefault(load, _conf(v["arrival_rps"], before, during))
            evidence.setdefault(
                load, _ev(v["arrival_rps"], before, during, f"{victim} arrival rate", "req/s")
            )
            lost = q * cw / (lw + cw)
            ctotal = sum(compute.values())
            if ctotal > 0:
                for cand, ms in compute.items():
                    excess[cand] += lost * ms / ctotal
            else:
                excess[Candidate("unknown", "—")] += lost
        else:
            excess[Candidate("unknown", "—")] += q
    # lock wait
    lw_ms = phases.get("lock_wait_ms", 0.0)
    if lw_ms > 0:
        name, holder = (locks[0][0], locks[0][1]) if locks else ("unknown lock", "")
        cand = Candidate("lock", name)
        excess[cand] += lw_ms
        conf[cand] = _conf(v["lock_wait_ms"], before, during)
        ev = _ev(v["lock_wait_ms"], before, during, f"{victim} lock wait", "ms")
        ev["holder"] = holder
        if locks:
            ev["holders"] = [
                {"lock": n, "holder": h, "wait_ms": round(ms, 1)} for n, h, ms in locks[:5]
            ]
        evidence[cand] = ev
    # host CPU
    cpu_ms = phases.get("preprocess_ms", 0.0) + phases.get("postprocess_ms", 0.0)
    if cpu_ms > 0:
        top_cpu = risers[0] if risers else None
        cand = Candidate("cpu", top_cpu.name if top_cpu else "host")
        excess[cand] += cpu_ms
        if top_cpu is not None:
            _cpu_evidence(ctx, cand, top_cpu, (host_cpu or {})[top_cpu.name], risers)
        else:
            conf[cand] = 0.2
            evidence[cand] = _ev(None, before, during, f"{victim} preprocess", "cores")
            if cpu_ms >= MIN_SHARE * total:
                notes.append("preprocess grew but no host CPU series names a culprit")
    # transfers
    xfer = phases.get("h2d_ms", 0.0) + phases.get("d2h_ms", 0.0)
    if xfer > 0:
        pcand, pconf, pev = _pcie_culprit(w, victim, before, during, flat)
        excess[pcand] += xfer
        conf[pcand] = pconf
        evidence[pcand] = pev
    other = phases.get("other_ms", 0.0)
    if other > 0:
        excess[Candidate("unknown", "—")] += other

    causes = []
    explained = 0.0
    for cand, ms in sorted(excess.items(), key=lambda kv: -kv[1]):
        if cand.kind == "unknown" or total <= 0 or ms < MIN_SHARE * total:
            continue
        share = ms / total
        explained += share
        causes.append(
            Cause(
                cand.kind,
                cand.culprit,
                share,
                conf.get(cand, 0.3),
                evidence.get(cand, {}),
                cand.resource,
                ms,
            )
        )
    rest = max(0.0, 1.0 - explained) if total > 0 else 1.0
    if rest > 1e-9:
        ev = _contention(demands, slowdown(v, before, during), explained, notes)
        causes.append(Cause("unknown", "—", rest, 0.0, ev, None, rest * total))
    return Attribution(phases, causes, notes)


CONTENTION_NOTE = (
    "every co-tenant slowed at once with no rise in anyone's demand: something these series "
    "do not show is contending (a process outside NVML's and procfs's view, or one already "
    "running in the baseline windows)"
)


def _contention(
    demands: dict[str, Demand], victim_slowdown: float, explained: float, notes: list[str]
) -> dict[str, Any]:
    """Evidence for ``unknown``: the co-tenants slowed alongside the victim whose demand did
    not rise (fellow victims), and whether that is every co-tenant (contention exists, but
    nothing visible explains it)."""
    fellows = fellow_victims(demands)
    if not fellows:
        return {}
    for d in fellows:
        notes.append(
            f"{d.model} slowed too (compute per item x{d.slowed:.2f}) with no rise in its own "
            "demand: a fellow victim, given no share"
        )
    ev: dict[str, Any] = {"fellow_victims": [d.to_evidence() for d in fellows]}
    if np.isfinite(victim_slowdown):
        ev["victim_compute_per_item_ratio"] = round(victim_slowdown, 2)
    if len(fellows) == len(demands) and explained < 0.5:
        ev["contention"] = "every co-tenant slowed at once, no demand change"
        notes.append(CONTENTION_NOTE)
    return ev


SAMPLE_LAG_WINDOWS = 3
"""Windows after an incident that still count as 'during' for per-process samples."""


def _widen(mask: np.ndarray, after: int) -> np.ndarray:
    """``mask`` extended by ``after`` windows past each run's end."""
    out = mask.copy()
    for k in range(1, after + 1):
        out[k:] |= mask[:-k]
    return out


@dataclass
class _Context:
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


def _cpu_evidence(
    ctx: _Context, cand: Candidate, top: CpuRiser, series: np.ndarray, risers: list[CpuRiser]
) -> None:
    ctx.conf[cand] = _conf(series, ctx.before, ctx.during)
    ev = _ev(series, ctx.before, ctx.during, f"{top.name} host CPU", "cores")
    if len(risers) > 1:
        ev["also_rose"] = [
            {"process": r.name, "before": round(r.before, 3), "during": round(r.during, 3)}
            for r in risers[1:6]
        ]
    ctx.evidence[cand] = ev


def _compute_causes(
    ctx: _Context, comp_excess: float, risers: list[CpuRiser], host_cpu: dict[str, np.ndarray]
) -> dict[Candidate, float]:
    """Compute excess (ms per request) shared among physical explanations.

    GPU-side explanations first (clock, co-tenants and processes whose demand rose, memory, own
    bigger batches); what they leave unexplained goes to the host process whose CPU use rose
    most, up to ``TRUST x`` its prediction ``compute_before x cores it took`` (compute spans
    hold host work too: kernel launches, CPU-side inference)."""
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
            conf[cand] = _conf(-clock, before, during)
            ev = _ev(clock, before, during, f"{w.gpu} SM clock", "MHz")
            reasons = w.counters.get("clock_event_reasons")
            if reasons is not None:
                r = np.nan_to_num(reasons[during]).astype(np.int64)
                ev["clock_event_reasons"] = int(np.bitwise_or.reduce(r)) if len(r) else 0
            evidence[cand] = ev
    near = ctx.near
    for name, (sm, dram) in activity(w, victim).items():
        if name in ctx.flat:
            continue
        d_sm, d_dram = _rise(sm, before, near), _rise(dram, before, near)
        if d_sm <= 0.02 and d_dram <= 0.02:
            continue
        if d_dram > 1.5 * d_sm:
            cand = Candidate("bandwidth", name, "dram")
            pred[cand] = comp_b * d_dram
            conf[cand] = _conf(dram, before, near)
            evidence[cand] = _ev(dram * 100, before, near, f"{name} DRAM utilisation", "%")
        else:
            cand = Candidate("cotenant", name)
            pred[cand] = comp_b * d_sm
            conf[cand] = _conf(sm, before, near)
            evidence[cand] = _ev(sm * 100, before, near, f"{name} SM utilisation", "%")
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
                r = _rise(ps["mem_used_bytes"], before, during)
                if r > best_rise:
                    best, best_rise = w.process_model.get(name) or name, r
            if best is not None:
                cand = Candidate("memory", best)
                pred[cand] = comp_excess
                conf[cand] = _conf(full, before, during)
                evidence[cand] = _ev(full * 100, before, during, f"{w.gpu} memory used", "%")
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
        conf[cand] = _conf(v["batch_size_mean"], before, during)
        evidence[cand] = _ev(
            v["batch_size_mean"], before, during, f"{victim} batch size", "requests"
        )
    s = sum(pred.values())
    out = {c: min(comp_excess, TRUST * s) * p / s for c, p in pred.items()} if s > 0 else {}
    rest = comp_excess - sum(out.values())
    if risers and rest > 1e-9:
        top = risers[0]
        cand = Candidate("cpu", top.name)
        out[cand] = min(rest, TRUST * comp_b * top.rise)
        _cpu_evidence(ctx, cand, top, host_cpu[top.name], risers)
    if not out:
        ctx.notes.append(
            "compute time grew with no co-tenant, clock, memory or host CPU change to explain it"
        )
    return out


def _pcie_culprit(
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
        r = _rise(sm + dram, before, during) + (
            0.05
            if mean_over(sm + dram, before) < 0.005 and mean_over(sm + dram, during) > 0.005
            else 0.0
        )
        if r > best_rise:
            best, best_rise = name, r
    cand = Candidate("bandwidth", best or "unknown", "pcie")
    ev = _ev(
        None if pcie is None else pcie / 1e9, before, during, f"{w.gpu} PCIe throughput", "GB/s"
    )
    return cand, _conf(pcie, before, during) if pcie is not None else 0.2, ev
