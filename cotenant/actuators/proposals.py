"""From an incident's diagnosis to one proposed action, sized by the policy.

The cause acted on is the incident's top named cause (``Incident.top``: the first cause that is
not ``unknown``, the one the dashboard and alerts show). A ``rate_limit`` reads the target's arrival
rate before the incident (or during it, ``basis: during``) through the injected
:class:`store.source.MetricSource`; a target that served no requests at all (a process without
spans, say) cannot be rate-limited, so the proposal falls back to ``notify`` and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from cotenant.actuators.policy import Policy
from cotenant.analysis.incident_record import Incident
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.readers import MetricSource
from cotenant.core.timerange import TimeRange


class IncidentSource(Protocol):
    """Where the control loop reads incidents (:class:`analysis.incidents.IncidentBook`)."""

    def find(
        self,
        *,
        since_ns: int | None = None,
        model: str | None = None,
        state: str | None = None,
        limit: int = 500,
    ) -> list[Incident]: ...

    def get(self, incident_id: str) -> Incident | None: ...


@dataclass(frozen=True)
class Proposal:
    kind: str  # rate_limit | priority | notify
    target: str
    params: dict[str, Any] = field(default_factory=dict)
    reason: str = ""


def arrival_rates(
    source: MetricSource, model: str, lo_ns: int, mid_ns: int, hi_ns: int, step_s: float
) -> tuple[float | None, float | None]:
    """Mean arrival rates (requests/s) of ``model`` on every GPU over ``[lo, mid)`` and
    ``[mid, hi)``, read in one query; None for a span without any request window."""
    hi_ns = max(hi_ns, mid_ns)
    t = source.request_windows(TimeRange(lo_ns, hi_ns), step_s, model=model)
    ts = t.column("ts_ns").to_numpy(zero_copy_only=False)
    arrivals = np.nan_to_num(t.column("arrival_rps").to_numpy(zero_copy_only=False))
    out: list[float | None] = []
    for a, b, sel in ((lo_ns, mid_ns, ts < mid_ns), (mid_ns, hi_ns, ts >= mid_ns)):
        out.append(
            None
            if b <= a or not sel.any()
            else float(arrivals[sel].sum() * step_s / ((b - a) / 1e9))
        )
    return out[0], out[1]


def propose(
    incident: Incident,
    policy: Policy,
    source: MetricSource,
    *,
    floor_rps: float,
    step_s: float,
    now_ns: int,
) -> Proposal:
    """The action the policy proposes for ``incident`` (always one; ``notify`` at least)."""
    # the cause the incident names (its top named cause, as the dashboard and alerts show it)
    cause = incident.top
    kind = str(cause.kind) if cause is not None else CauseKind.UNKNOWN.value
    culprit = cause.culprit if cause is not None else ""
    share = cause.share if cause is not None else 0.0
    confidence = cause.confidence if cause is not None else 0.0
    rule = policy.rule(kind)
    target = incident.model if rule.target == "victim" else culprit
    context: dict[str, Any] = {
        "victim": incident.model,
        "gpu": incident.gpu,
        "cause": kind,
        "culprit": culprit,
        "resource": cause.resource if cause is not None else None,
        "share": share,
        "confidence": confidence,
        "slo_ms": incident.slo_ms,
        "baseline_p99_ms": incident.baseline_p99_ms,
        "peak_p99_ms": incident.peak_p99_ms,
        "incident_start_ns": incident.start_ns,
        "policy": policy.path,
    }
    what = f"{kind} {culprit or '(none)'} explains {share:.0%} of {incident.model}'s excess"

    def notify(why: str) -> Proposal:
        return Proposal("notify", target or incident.model, {"context": context}, f"{what}: {why}")

    if rule.action == "notify":
        return notify(f"policy for {kind} is notify only")
    if share < rule.min_share or confidence < rule.min_confidence:
        return notify(
            f"share {share:.2f} / confidence {confidence:.2f} below the policy's "
            f"{rule.min_share:.2f} / {rule.min_confidence:.2f}"
        )
    if not target:
        return notify("the cause names no target")
    if rule.action == "priority":
        assert rule.priority is not None  # the policy loader requires it
        return Proposal(
            "priority",
            target,
            {"priority": rule.priority, "context": context},
            f"{what}: set {target}'s priority to {rule.priority}",
        )
    lookback = int(rule.lookback_s * 1e9)
    start = incident.start_ns
    end = max(min(incident.end_ns, now_ns), start + int(step_s * 1e9))
    pre, during = arrival_rates(source, target, start - lookback, start, end, step_s)
    if pre is None and during is None:
        return notify(f"{target} served no requests, so it cannot be rate-limited")
    basis = (pre if rule.basis == "pre" else during) or 0.0
    rate, burst = Policy.size_rate(rule, basis, share, floor_rps)
    context.update(pre_rate_rps=pre, during_rate_rps=during, basis=rule.basis)
    ref = max(during or 0.0, pre or 0.0)
    fraction = 1.0 if ref <= 0 else min(1.0, rate / ref)
    params: dict[str, Any] = {"rate_rps": rate, "burst": burst, "fraction": round(fraction, 4)}
    if rule.max_wait_s is not None:
        params["max_wait_s"] = rule.max_wait_s
    return Proposal(
        "rate_limit",
        target,
        {**params, "context": context},
        f"{what}: limit {target} to {rate:g} rps (burst {burst}); it sent "
        f"{(pre or 0.0):.3g} rps before the incident and {(during or 0.0):.3g} rps during it",
    )
