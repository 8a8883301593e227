"""Attribution: which phases carry a victim's excess latency, and why.

Given the victim's windows *during* an incident and a *before* baseline on the same GPU (its
normal windows):

1. **Decomposition** — the excess of each phase's mean (ms per request), clipped at 0.
2. **Explanation** — one explainer per cause kind (:mod:`analysis.explainers`) claims what its
   cause explains of each phase, from the physics we know and only where its evidence is
   enriched in the slow windows over the normal ones (:mod:`analysis.enrichment`; evidence is
   direction-aware, :mod:`analysis.metric_direction`): the victim's heavier requests (``mix``:
   token counts, work units, its own inference time), a lower SM clock (``throttle``),
   co-tenants whose own demand rose (``cotenant``, DRAM / PCIe ``bandwidth``), memory grown into
   a full GPU (``memory``), its own surging arrivals and batches (``load``), the lock most waited
   on (``lock``), host processes whose CPU use rose or a CPU frequency that fell (``cpu``),
   unusual model loads (``model_load``). Only actors whose own demand rose take a share: a
   co-tenant slowed like the victim, with flat demand, is a *fellow victim*
   (:mod:`analysis.demand`).
3. **Apportioning** — :mod:`analysis.apportion` shares each phase's excess among the claims:
   the queue growth not due to the victim's own arrivals is lost capacity and follows the
   compute causes; physical predictions are trusted within a factor of two.

Shares are fractions of the summed phase excess and add up to at most 1; ``unknown`` holds the
rest, with the fellow victims in its evidence (``fellow_victims``) and, when every co-tenant
slowed that way and the named causes explain under half, ``contention``: something unseen is
contending. Confidence is the strength of the supporting signal's change
(:func:`change.strength`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cotenant.analysis.apportion import apportion
from cotenant.analysis.change import wmean_over
from cotenant.analysis.claims import PHASE_OF_COLUMN, Claim, Context, Explainer, Phase
from cotenant.analysis.compute_causes import SAMPLE_LAG_WINDOWS, widen
from cotenant.analysis.cpu_causes import cpu_risers
from cotenant.analysis.demand import (
    Demand,
    arrival_surge,
    arrival_swing,
    cotenant_demands,
    cpu_work_rose,
    fellow_victims,
    slowdown,
    surge_s,
)
from cotenant.analysis.explainers import EXPLAINERS
from cotenant.analysis.host_cpu import HostCpu
from cotenant.analysis.missing_series import missing_notes
from cotenant.analysis.windows import GpuWindows
from cotenant.analysis.work import MixExcess, WorkSeries
from cotenant.core.cause_kinds import CAUSE_KINDS, CauseKind
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
            "kind": str(self.kind),
            "culprit": self.culprit,
            "share": round(self.share, 4),
            "confidence": round(self.confidence, 3),
            "excess_ms": round(self.excess_ms, 3),
            "evidence": self.evidence,
        }
        if self.resource:
            d["resource"] = self.resource
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cause:
        """The inverse of :meth:`to_dict`, tolerant of what earlier versions stored: a missing
        confidence, excess or evidence takes 0 or nothing; a kind this version does not know
        is kept as its name. Raises KeyError without ``kind``, ``culprit`` or ``share``."""
        name = str(d["kind"])
        return cls(
            CauseKind(name) if name in CAUSE_KINDS else name,
            str(d["culprit"]),
            float(d["share"]),
            float(d.get("confidence") or 0.0),
            dict(d.get("evidence") or {}),
            d.get("resource") or None,
            float(d.get("excess_ms") or 0.0),
        )


@dataclass
class Attribution:
    phases_ms: dict[str, float]  # excess per phase column, ms per request
    causes: list[Cause]  # ranked, ``unknown`` last
    notes: list[str] = field(default_factory=list)


def phase_excess(
    v: Mapping[str, np.ndarray], before: np.ndarray, during: np.ndarray, notes: list[str]
) -> tuple[dict[str, float], bool]:
    """The excess of each phase column's mean (ms per request, clipped at 0), and whether the
    windows hold phases at all (without spans, the mean latency's excess is ``compute_ms``)."""
    cnt = v["count"]
    phases: dict[str, float] = {}
    has_phases = bool(np.isfinite(v["compute_ms"]).any())
    cols = PHASE_COLUMNS if has_phases else ("mean_ms",)
    if not has_phases:
        notes.append(
            "no per-request phases (spans absent): the latency excess is explained "
            "from GPU and co-tenant series only"
        )
    for c in cols:
        b, d = wmean_over(v[c], cnt, before), wmean_over(v[c], cnt, during)
        ms = max(0.0, d - b) if np.isfinite(b) and np.isfinite(d) else 0.0
        phases[c if has_phases else "compute_ms"] = ms
    return phases, has_phases


def attribute(
    w: GpuWindows,
    victim: str,
    before: np.ndarray,
    during: np.ndarray,
    *,
    host_cpu: Mapping[str, np.ndarray] | None = None,
    locks: list[tuple[str, str, float]] | None = None,
    mix: MixExcess | None = None,
    work: WorkSeries | None = None,
    explainers: Mapping[CauseKind, Explainer] = EXPLAINERS,
) -> Attribution:
    """Attribute ``victim``'s excess latency during ``during`` relative to ``before``.

    ``before``/``during`` are boolean masks over ``w``'s windows. ``host_cpu`` maps host
    processes (and models) to their CPU use (cores); a :class:`analysis.cpu_causes.HostCpu`
    also carries the host's CPU frequency. ``locks`` lists ``(lock, holder, wait_ms)`` of the
    victim's requests during the incident, most waited first; ``mix``: what the victim's token
    counts explain (:mod:`analysis.mix`), taken out of the compute excess before any co-runner
    is weighed; ``work``: the victim's work per request where known (:class:`analysis.mix.
    WorkSeries`; default: its compute time per request). ``explainers``: one per cause kind
    (:data:`analysis.explainers.EXPLAINERS`)."""
    v = w.models[victim]
    notes: list[str] = []
    phases, has_phases = phase_excess(v, before, during, notes)
    excess: dict[Phase, float] = {}
    for col, ms in phases.items():
        excess[PHASE_OF_COLUMN[col]] = excess.get(PHASE_OF_COLUMN[col], 0.0) + ms
    total = sum(phases.values())
    near = widen(during, SAMPLE_LAG_WINDOWS) & ~before
    demands = cotenant_demands(w, victim, before, during, near)
    cpu = host_cpu or {}
    # a model's CPU counts only where it rose beyond its slowdown (spin-waits are symptoms)
    cpu_flat = {
        m
        for m, x in cpu.items()
        if m in w.models and not cpu_work_rose(w.models[m], x, before, during, w.step_ns)
    }
    # the victim's own CPU counts when its own arrivals surged: its load, not a culprit's
    own_surge = arrival_surge(v, before, during, w.step_ns)
    mine = {victim} if own_surge else set()
    ctx = Context(
        w=w,
        victim=victim,
        before=before,
        during=during,
        near=near,
        excess=excess,
        has_phases=has_phases,
        flat={m for m, d in demands.items() if not d.rose},
        demands=demands,
        host_cpu=cpu,
        risers=cpu_risers(cpu, before, during, exclude=cpu_flat - mine),
        frequency=host_cpu.frequency if isinstance(host_cpu, HostCpu) else None,
        own_surge=own_surge,
        locks=locks or [],
        mix=mix,
        work=work,
        notes=notes,
    )
    claims: list[Claim] = []
    for explainer in explainers.values():
        claims += explainer.claims(ctx)
    got = apportion(excess, claims, victim)
    comp_left = excess.get(Phase.COMPUTE, 0.0) - ctx.mix_ms
    took = got.by_phase.get(Phase.COMPUTE, {})
    if comp_left > 0 and not any(c.kind != CauseKind.MIX for c in took):
        notes.append(
            "compute time grew with no co-tenant, clock, memory or host CPU change to explain it"
        )
    causes = []
    explained = 0.0
    for cand, ms in sorted(got.ms.items(), key=lambda kv: -kv[1]):
        if total <= 0 or ms < MIN_SHARE * total:
            continue
        share = ms / total
        explained += share
        claim = got.named_by[cand]
        causes.append(
            Cause(
                cand.kind, cand.culprit, share, claim.confidence, claim.evidence, cand.resource, ms
            )
        )
    if own_surge:  # how long its surge held, how steady its traffic was (verdicts)
        surge = {"surge_s": surge_s(v, before, during, w.step_ns)}
        swing = arrival_swing(v, during, w.step_ns)
        if math.isfinite(swing):
            surge["swing"] = round(swing, 3)
        for c in causes:
            if c.kind == CauseKind.LOAD and c.culprit == victim:
                c.evidence = {**c.evidence, **surge}
    rest = max(0.0, 1.0 - explained) if total > 0 else 1.0
    if rest > 1e-9:
        own = explained if not own_surge else 1.0  # its own load rose: not unseen contention
        ev = _contention(demands, slowdown(v, before, during), own, notes)
        causes.append(Cause(CauseKind.UNKNOWN, "—", rest, 0.0, ev, None, rest * total))
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
