"""Attribution: which phases carry a victim's excess latency, and why.

Given the victim's windows *during* an incident and a *before* baseline on the same GPU:

1. **Decomposition** — the excess of each phase's mean (ms per request), clipped at 0.
2. **Compute excess** is explained by a counterfactual on the physics we know, each candidate
   contributing what it predicts: throttling ``compute_before x (clock_before / clock_during -
   1)``; a co-tenant (or process) ``compute_before x its rise in SM activity`` — classed as
   DRAM ``bandwidth`` when its rise is mostly memory traffic; memory pressure (GPU nearly full)
   the whole excess, to the process whose memory grew; the victim's own bigger batches
   ``compute_before x (batch ratio - 1) / 2`` as ``load``. Predictions are trusted within a
   factor of two: the excess is shared in proportion to them, up to twice their sum; what they
   leave goes to the host process whose CPU use rose most (:mod:`analysis.compute_causes`).
   Only actors whose own demand rose take a share: a co-tenant slowed like the victim, with
   flat demand, is a *fellow victim* (:mod:`analysis.demand`).
3. **Queue excess** is split between own load (arrival-rate ratio - 1) and lost capacity
   (per-item service-time ratio - 1); lost capacity goes to the compute causes.
4. **Lock wait** goes to the lock most waited on (its holder in the evidence); **preprocess**
   and **postprocess** to host CPU (the process whose CPU use rose most); **transfers** to
   PCIe bandwidth (the process most active while PCIe traffic rose); **other** is unknown,
   unless the victim's other time (its ``model.load`` waits) rose well beyond its history:
   then it and the queue excess nothing else explains are ``model_load``
   (:mod:`analysis.load_causes`).

Shares are fractions of the summed phase excess and add up to at most 1; ``unknown`` holds the
rest, with the fellow victims in its evidence (``fellow_victims``) and, when every co-tenant
slowed that way and the named causes explain under half, ``contention``: something unseen is
contending. Confidence is the strength of the supporting signal's change
(:func:`change.strength`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cotenant.analysis.candidates import Candidate
from cotenant.analysis.change import confidence, wmean_over
from cotenant.analysis.change import evidence as change_evidence
from cotenant.analysis.compute_causes import (
    SAMPLE_LAG_WINDOWS,
    Context,
    compute_causes,
    cpu_candidate,
    cpu_evidence,
    pcie_culprit,
    widen,
)
from cotenant.analysis.cpu_causes import cpu_risers
from cotenant.analysis.demand import (
    Demand,
    arrival_rates,
    arrival_span,
    arrival_surge,
    cotenant_demands,
    cpu_work_rose,
    fellow_victims,
    slowdown,
)
from cotenant.analysis.load_causes import load_finding
from cotenant.analysis.missing_series import missing_notes
from cotenant.analysis.mix import MixExcess
from cotenant.analysis.windows import GpuWindows
from cotenant.core.phases import PHASE_COLUMNS

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


def attribute(
    w: GpuWindows,
    victim: str,
    before: np.ndarray,
    during: np.ndarray,
    *,
    host_cpu: dict[str, np.ndarray] | None = None,
    locks: list[tuple[str, str, float]] | None = None,
    mix: MixExcess | None = None,
) -> Attribution:
    """Attribute ``victim``'s excess latency during ``during`` relative to ``before``.

    ``before``/``during`` are boolean masks over ``w``'s windows. ``host_cpu`` maps host
    processes (and models) to their CPU use; ``locks`` lists ``(lock, holder, wait_ms)`` of the
    victim's requests during the incident, most waited first; ``mix``: what the victim's token
    counts explain (:mod:`analysis.mix`), taken out of the compute excess (prefill and decode)
    as the ``mix`` cause before any co-runner is weighed."""
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
    near = widen(during, SAMPLE_LAG_WINDOWS) & ~before
    demands = cotenant_demands(w, victim, before, during, near)
    # co-tenants whose own demand did not rise: their busier time is a symptom
    flat = {m for m, d in demands.items() if not d.rose}
    # a model's CPU counts only where it rose beyond its slowdown (spin-waits are symptoms)
    cpu_flat = {
        m
        for m, x in (host_cpu or {}).items()
        if m in w.models and not cpu_work_rose(w.models[m], x, before, during, w.step_ns)
    }
    # the victim's own CPU counts when its own arrivals surged: its load, not a culprit's
    own_surge = arrival_surge(v, before, during, w.step_ns)
    mine = {victim} if own_surge else set()
    risers = cpu_risers(host_cpu, before, during, exclude=cpu_flat - mine)
    ctx = Context(w, victim, before, during, near, flat, demands, conf, evidence, notes)

    comp = phases.get("compute_ms", 0.0)
    mix_ms = min(mix.ms, comp) if mix is not None else 0.0
    compute = compute_causes(ctx, comp - mix_ms, risers, host_cpu or {})
    if mix is not None and mix_ms > 0:
        cand = Candidate("mix", victim)
        compute[cand] = mix_ms
        conf[cand] = min(1.0, mix_ms / comp) if comp > 0 else 0.0
        evidence[cand] = mix.evidence
    for cand, ms in compute.items():
        excess[cand] += ms
    # model loads on the victim's own replica: its other time (model.load spans) rose
    loads = load_finding(v, before, during, total) if has_phases else None
    unexplained = Candidate("unknown", "—")
    if loads is not None:
        unexplained = Candidate("model_load", victim)
        conf[unexplained] = loads.confidence
        evidence[unexplained] = loads.evidence(victim)
    # queue: own load vs lost capacity
    q = phases.get("queue_ms", 0.0)
    if q > 0:
        rate_b, rate_d = arrival_rates(v, before, during)
        item = (
            np.nan_to_num(v["compute_ms"]) + np.nan_to_num(v["h2d_ms"]) + np.nan_to_num(v["d2h_ms"])
        ) / np.fmax(np.nan_to_num(v["batch_size_mean"], nan=1.0), 1.0)
        svc_b, svc_d = wmean_over(item, cnt, before), wmean_over(item, cnt, during)
        lw = max(0.0, rate_d / rate_b - 1) if arrival_surge(v, before, during, w.step_ns) else 0.0
        cw = max(0.0, svc_d / svc_b - 1) if svc_b > 0 else 0.0
        load = Candidate("load", victim)
        if lw + cw > 0:
            excess[load] += q * lw / (lw + cw)
            span = arrival_span(v, before, during)
            conf.setdefault(load, confidence(v["arrival_rps"], span, during))
            evidence.setdefault(
                load,
                change_evidence(v["arrival_rps"], span, during, f"{victim} arrival rate", "req/s"),
            )
            lost = q * cw / (lw + cw)
            ctotal = sum(compute.values())
            if ctotal > 0:
                for cand, ms in compute.items():
                    excess[cand] += lost * ms / ctotal
            else:  # the backlog behind the loads, when there were unusual ones
                excess[unexplained] += lost
        else:
            excess[unexplained] += q
    # lock wait
    lw_ms = phases.get("lock_wait_ms", 0.0)
    if lw_ms > 0:
        name, holder = (locks[0][0], locks[0][1]) if locks else ("unknown lock", "")
        cand = Candidate("lock", name)
        excess[cand] += lw_ms
        conf[cand] = confidence(v["lock_wait_ms"], before, during)
        ev = change_evidence(v["lock_wait_ms"], before, during, f"{victim} lock wait", "ms")
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
        cand = cpu_candidate(top_cpu.name, victim) if top_cpu else Candidate("cpu", "host")
        excess[cand] += cpu_ms
        if top_cpu is not None:
            cpu_evidence(ctx, cand, top_cpu, (host_cpu or {})[top_cpu.name], risers)
        else:
            conf[cand] = 0.2
            evidence[cand] = change_evidence(None, before, during, f"{victim} preprocess", "cores")
            if cpu_ms >= MIN_SHARE * total:
                notes.append("preprocess grew but no host CPU series names a culprit")
    # transfers
    xfer = phases.get("h2d_ms", 0.0) + phases.get("d2h_ms", 0.0)
    if xfer > 0:
        pcand, pconf, pev = pcie_culprit(w, victim, before, during, flat)
        excess[pcand] += xfer
        conf[pcand] = pconf
        evidence[pcand] = pev
    other = phases.get("other_ms", 0.0)
    if other > 0:
        excess[unexplained] += other

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
        own = explained if not own_surge else 1.0  # its own load rose: not unseen contention
        ev = _contention(demands, slowdown(v, before, during), own, notes)
        causes.append(Cause("unknown", "—", rest, 0.0, ev, None, rest * total))
    notes += missing_notes(w, phases, before | during, (c.kind for c in causes))
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
