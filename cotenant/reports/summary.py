"""The weekly report's numbers: one typed object the renderers and ``summary.json`` share.

Durations are minutes or hours as named; latencies milliseconds; timestamps integer
nanoseconds UTC. "Impacted minutes" of an incident are its minutes inside the week; a cause's
"victim-minutes" are those minutes times the cause's share of the victim's excess latency.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelWeek:
    model: str
    requests: int
    errors: int
    minutes: int  # minutes with at least one request
    slo_ms: float | None
    slo_minutes_met: int  # minutes whose p99 (worst GPU) was within the SLO
    slo_attainment: float | None  # slo_minutes_met / minutes; None without an SLO
    incidents: int
    impacted_minutes: float
    peak_to_median_rate: float | None  # busiest minute / median minute, by request count
    # generative models with a TTFT / TPOT SLO ([analysis] slo_ttft_ms, slo_tpot_ms): the
    # share of minutes whose p99 (worst GPU) was within it; None without that SLO or data
    ttft_slo_ms: float | None = None
    ttft_attainment: float | None = None
    tpot_slo_ms: float | None = None
    tpot_attainment: float | None = None


@dataclass(frozen=True)
class Totals:
    requests: int
    incidents: int
    impacted_minutes: float
    slo_attainment: float | None  # over every model with an SLO


@dataclass(frozen=True)
class WeekOverWeek:
    """Week-over-week: ``scope`` is a model or ``all``."""

    scope: str
    metric: str  # requests | slo_attainment | incidents | impacted_minutes
    this_week: float | None
    last_week: float | None

    @property
    def delta(self) -> float | None:
        if self.this_week is None or self.last_week is None:
            return None
        return self.this_week - self.last_week


@dataclass(frozen=True)
class MatrixCell:
    victim: str
    culprit: str
    minutes: float


@dataclass(frozen=True)
class OrdinaryCell:
    """Ordinary contention of ``victim`` by ``culprit``: minutes within the SLO that opened no
    incident (the culprit's recurring bursts, or, where culprit = victim, its own traffic)."""

    victim: str
    culprit: str
    minutes: float
    slowdowns: int
    reasons: list[str]  # own_load | recurring | seen


@dataclass(frozen=True)
class CulpritImpact:
    culprit: str
    culprit_type: str  # model | process | gpu | lock | host
    kinds: list[str]
    victim_minutes: float
    victims: list[str]
    gpus: list[str]
    incidents: int
    main_kind: str  # the kind under which it caused the most victim-minutes
    resource: str | None  # bandwidth: dram | pcie | nvlink


@dataclass(frozen=True)
class CauseMinutes:
    model: str
    kind: str
    minutes: float


@dataclass(frozen=True)
class IncidentRow:
    id: str
    model: str
    gpu: str
    start_ns: int
    end_ns: int
    minutes: float
    peak_p99_ms: float | None
    baseline_p99_ms: float | None
    slo_ms: float | None
    top_kind: str | None
    top_culprit: str | None
    top_share: float | None
    url: str
    replica: str | None = None  # the slow replica, when the model runs as named replicas


@dataclass(frozen=True)
class GpuWeek:
    gpu: str
    host: str
    hours_sampled: float
    sm_saturated_h: float
    dram_saturated_h: float
    pcie_saturated_h: float
    throttled_h: float
    memory_full_h: float
    models: list[str]
    processes: list[str]  # GPU processes that serve no model
    cotenancy_h: float  # hours with two or more tenants active at once


@dataclass(frozen=True)
class LoadWait:
    """A model's requests' time waiting for model loads (their ``other`` phase: the
    ``model.load`` spans), in hours, and as a share of their summed latency."""

    model: str
    requests: int
    wait_h: float
    latency_share: float | None  # wait / summed latency; None without latency
    mean_wait_ms: float  # per request


@dataclass(frozen=True)
class LoadKindWeek:
    """Loads of one kind (``base``, ``lora``, ``controlnet``, ...) on one model's replicas."""

    model: str
    kind: str
    loads: int
    load_h: float
    mean_ms: float
    max_ms: float
    replicas: int  # replicas (containers) that loaded this kind
    top_replica: str  # the one that spent the most time loading it


@dataclass(frozen=True)
class LoadReplicaWeek:
    """A replica (container) among those that spent the most time loading, by kind (ms)."""

    model: str
    replica: str
    loads: int
    load_h: float
    by_kind_ms: dict[str, float]


@dataclass(frozen=True)
class ActionRow:
    id: str
    incident_id: str | None
    kind: str
    target: str
    state: str
    created_ns: int
    victim: str | None
    p99_before_ms: float | None
    p99_after_ms: float | None
    held_back: bool  # guardrails held it back at least once (audit event ``held``)


@dataclass(frozen=True)
class ActionCounts:
    """``held``: applied and kept (verified, or expired at its TTL without a rollback);
    ``held_back``: stopped by a guardrail at least once (the control loop's ``held`` event)."""

    proposed: int
    applied: int
    held: int
    rolled_back: int
    failed: int
    held_back: int


@dataclass(frozen=True)
class Recommendation:
    title: str  # what to do, e.g. "Move embed off gpu-0"
    kind: str  # move | mps | mig | rate_limit | fix_lock | cooling | memory | cpu | prewarm
    target: str
    because: str  # the evidence in a sentence
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Thresholds:
    sm_saturated: float = 90.0  # percent, per-minute mean
    dram_saturated: float = 0.9  # fraction (DCGM dram_active, else NVML memory util / 100)
    pcie_saturated_bps: float = 20e9  # TX + RX
    memory_full: float = 0.95  # used / total
    min_victim_minutes: float = 10.0  # a culprit earns a recommendation from this ...
    min_incidents: int = 2  # ... or from this many incidents (a repeat offender)


@dataclass(frozen=True)
class WeekSummary:
    week: str
    start_ns: int
    end_ns: int
    generated_ns: int
    dashboard_url: str
    thresholds: Thresholds
    models: list[ModelWeek]
    totals: Totals
    last_week: Totals
    changes: list[WeekOverWeek]
    matrix: list[MatrixCell]
    culprits: list[CulpritImpact]
    causes: list[CauseMinutes]
    worst: list[IncidentRow]
    gpus: list[GpuWeek]
    actions: list[ActionRow]
    action_counts: ActionCounts
    recommendations: list[Recommendation]
    # where model-load latency went (empty without loads; fleet mode: load_waits only)
    load_waits: list[LoadWait] = field(default_factory=list)
    load_kinds: list[LoadKindWeek] = field(default_factory=list)
    load_replicas: list[LoadReplicaWeek] = field(default_factory=list)
    # who slowed whom within the SLO without an incident (ordinary contention)
    ordinary: list[OrdinaryCell] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """No request and no incident in the week."""
        return self.totals.requests == 0 and self.totals.incidents == 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["empty"] = self.empty
        d["changes"] = [{**dataclasses.asdict(c), "delta": c.delta} for c in self.changes]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WeekSummary:
        """The inverse of :meth:`to_dict` (for summaries fetched from a server)."""

        def many(t: type[Any], key: str) -> list[Any]:
            names = {f.name for f in dataclasses.fields(t)}
            return [t(**{k: v for k, v in x.items() if k in names}) for x in d.get(key, [])]

        return cls(
            week=d["week"],
            start_ns=d["start_ns"],
            end_ns=d["end_ns"],
            generated_ns=d["generated_ns"],
            dashboard_url=d["dashboard_url"],
            thresholds=Thresholds(**d["thresholds"]),
            models=many(ModelWeek, "models"),
            totals=Totals(**d["totals"]),
            last_week=Totals(**d["last_week"]),
            changes=many(WeekOverWeek, "changes"),
            matrix=many(MatrixCell, "matrix"),
            culprits=many(CulpritImpact, "culprits"),
            causes=many(CauseMinutes, "causes"),
            worst=many(IncidentRow, "worst"),
            gpus=many(GpuWeek, "gpus"),
            actions=many(ActionRow, "actions"),
            action_counts=ActionCounts(**d["action_counts"]),
            recommendations=many(Recommendation, "recommendations"),
            load_waits=many(LoadWait, "load_waits"),
            load_kinds=many(LoadKindWeek, "load_kinds"),
            load_replicas=many(LoadReplicaWeek, "load_replicas"),
            ordinary=many(OrdinaryCell, "ordinary"),
        )
