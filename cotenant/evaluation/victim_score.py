"""Strict scoring of one scenario's incidents against its faults' truth, per victim.

Both paths users consume are scored the same way: the batch path
(:func:`evaluation.accuracy.diagnose_models`, what on-demand diagnosis does) and the live loop
(:func:`evaluation.live.replay`); each turns its incidents into :class:`Found` records
(``found_from_diagnoses`` / ``found_from_events`` beside them), and :func:`score_scenario`
scores those. The rules:

* a fault's **victims** are the models the counterfactual truth names
  (:func:`simulator.output.truth`: p99 >= 1.2x the same run without the fault), each with its
  slowdown (the largest ratio among the indicators that made it a victim);
* a victim is **found** when an incident *on that model* overlaps the fault plus the settle
  time (``output.SETTLE_S``); the first such incident (by detection time) is *its* incident;
  its **delay** is from the fault's start to that incident's detection (0 if it was open
  already); the others are **duplicates** (at most one incident per (fault, victim) is right);
* its cause is **right first** / **right final** when its incident's first / final top cause
  (kind and culprit; ``unknown`` never counts) is the fault's (:func:`expected_cause`: a
  neighbour slowed by another model's surge, longer requests or loads is slowed by a
  co-tenant); **AC@k** (final causes) is over victims: a fault with two victims counts
  twice, and a victim not found counts as a miss;
* **false incidents** overlap no fault (plus settle time) at all: every incident of a
  fault-free control, and those of a faulted scenario outside its faults, per model-hour of
  time outside faults; incidents of models that are no victim during a fault are counted
  apart (``bystander_incidents``: a slight slowdown under the truth's bar, or a wrong model);
* a victim is **at the goal's bar** (:mod:`evaluation.goal`) when slowed >= 1.2x (and 1 ms,
  on e2e) for >= 60 s at >= 0.5 req/s over the fault; an **SLO victim** when its 1-s p99
  (3 requests or more) crossed its SLO during the fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cotenant.core.slos import breach
from cotenant.evaluation.goal import GOAL_MARGIN_MS, at_goal
from cotenant.simulator import output
from cotenant.simulator.ground_truth import truth_cause
from cotenant.simulator.scenario import Fault, Scenario
from cotenant.store.db import Store
from cotenant.store.queries import request_latencies

SETTLE_NS = int(output.SETTLE_S * 1e9)
SLO_WINDOW_NS = 1_000_000_000
SLO_WINDOW_MIN_REQUESTS = 3
OWN_KINDS = ("load_surge", "length_shift", "model_load")
"""Faults whose cause names the victim itself (``load``, ``mix``, ``model_load``)."""


@dataclass(frozen=True)
class Found:
    """One incident as the scorer sees it, whichever path raised it. Causes are
    ``kind:culprit`` strings, ranked, ``unknown`` left out: the live path's first published and
    last, the batch path's on the windows until it was found and on the whole
    (``Diagnosis.first_causes``; the same list where their top cause is the same)."""

    model: str
    start_ns: int
    end_ns: int
    detected_ns: int
    first: tuple[str, ...]
    final: tuple[str, ...]
    severity: str = ""

    def overlaps(self, lo: int, hi: int) -> bool:
        return self.start_ns < hi and self.end_ns > lo


@dataclass(frozen=True)
class Requests:
    """The completed requests of a run: ``model`` (object array), ``end_ns`` (int64),
    ``latency_ms`` (float64), one row each."""

    model: np.ndarray
    end_ns: np.ndarray
    latency_ms: np.ndarray

    @classmethod
    def of_store(cls, store: Store) -> Requests:
        got = request_latencies(store)
        return cls(
            np.asarray(got.column("model").to_pylist(), dtype=object),
            got.column("ts_end_ns").to_numpy().astype(np.int64),
            got.column("latency_ms").to_numpy().astype(np.float64),
        )

    def of(self, model: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """(end_ns, latency_ms) of ``model``'s requests ending in ``[lo, hi)``."""
        sel = (self.model == model) & (self.end_ns >= lo) & (self.end_ns < hi)
        return self.end_ns[sel], self.latency_ms[sel]


@dataclass
class VictimOutcome:
    """One (fault, victim) pair and what the incidents made of it."""

    fault_index: int
    fault_kind: str  # the simulator's fault kind
    truth: str  # kind:culprit a diagnosis should name
    victim: str
    slowdown: float
    excess_ms: float
    rate_rps: float
    fault_s: float
    slo_victim: bool
    at_goal: bool
    incidents: int  # of this model overlapping the fault
    delay_s: float | None
    first_rank: int | None  # rank of the truth among its incident's first causes
    final_rank: int | None
    first_cause: str | None
    final_cause: str | None

    @property
    def found(self) -> bool:
        return self.incidents > 0

    @property
    def duplicates(self) -> int:
        return max(0, self.incidents - 1)

    @property
    def right_first(self) -> bool:
        return self.first_rank == 1

    @property
    def right_final(self) -> bool:
        return self.final_rank == 1


@dataclass
class ScenarioScore:
    """What one scenario scored. ``hours`` is its simulated time; ``model_hours_outside``
    the model-hours outside every fault (plus settle time), where an incident is false."""

    name: str
    seed: int
    kind: str  # faulted | control
    path: str  # batch | live
    hours: float
    models: int
    model_hours_outside: float
    incidents: int
    false_incidents: int
    false_by_severity: dict[str, int]
    bystander_incidents: int
    faults: int
    faults_with_victims: int
    victims: list[VictimOutcome] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    error: str | None = None
    drawn: dict[str, Any] = field(default_factory=dict)


def expected_cause(f: dict[str, Any], victim: str, s: Scenario) -> str:
    """The ``kind:culprit`` a diagnosis of ``victim`` should name for fault ``f`` (a truth
    entry): the truth's cause, except that a *neighbour* slowed by another model's own-kind
    fault (its surge, longer requests or loads) is slowed by a co-tenant, so its cause is what
    a burst of that model would be (``cotenant``, or ``bandwidth`` for a DRAM-bound one under
    MPS: :func:`simulator.ground_truth.truth_cause`); ``load``, ``mix`` and ``model_load``
    name the victim itself."""
    if f["fault"] in OWN_KINDS and victim != f["culprit"]:
        burst = Fault("cotenant_burst", f["start_s"], f["end_s"] - f["start_s"], f["culprit"])
        c = truth_cause(burst, s)
        return f"{c.kind}:{c.culprit}"
    return f"{f['kind']}:{f['culprit']}"


def _rank(causes: tuple[str, ...], truth: str) -> int | None:
    return causes.index(truth) + 1 if truth in causes else None


def _slowdown(f: dict[str, Any], model: str) -> tuple[float, float]:
    """(slowdown, excess ms) of ``model`` over fault ``f`` from the truth's counterfactual:
    the largest ratio among the indicators that made it a victim; the excess is e2e's (the
    goal's 1-ms margin is not applied to a slowdown seen on TPOT only)."""
    p = f.get("p99", {}).get(model, {})
    why = f.get("victim_indicators", {}).get(model, ["e2e"])
    ratios = []
    if "e2e" in why and p.get("p99_without_ms"):
        ratios.append(p["p99_ms"] / p["p99_without_ms"])
    if "tpot" in why and p.get("tpot_p99_without_ms"):
        ratios.append(p["tpot_p99_ms"] / p["tpot_p99_without_ms"])
    excess = (
        float(p["p99_ms"] - p["p99_without_ms"])
        if "e2e" in why and "p99_ms" in p
        else GOAL_MARGIN_MS
    )
    return (max(ratios) if ratios else float("inf")), excess


def _breached(end_ns: np.ndarray, lat: np.ndarray, lo: int, slo_ms: float | None) -> bool:
    """Whether any 1-s window (from ``lo``) with 3 requests or more has a p99 over ``slo_ms``."""
    if slo_ms is None or len(lat) < SLO_WINDOW_MIN_REQUESTS:
        return False
    bins = (end_ns - lo) // SLO_WINDOW_NS
    order = np.argsort(bins, kind="stable")
    bins, lat = bins[order], lat[order]
    edges = np.flatnonzero(np.diff(bins)) + 1
    for chunk in np.split(lat, edges):
        if len(chunk) >= SLO_WINDOW_MIN_REQUESTS and breach(np.percentile(chunk, 99), slo_ms):
            return True
    return False


def _union_s(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, -np.inf
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return float(total)


def score_scenario(
    s: Scenario,
    truth: list[dict[str, Any]],
    found: list[Found],
    requests: Requests,
    start_ns: int,
    *,
    path: str,
    kind: str,
) -> ScenarioScore:
    """Score ``found`` (one path's incidents over the whole run of ``s``, whose virtual time
    0 is ``start_ns``) against ``truth`` (module doc)."""
    slo = {m.name: m.slo_p99_ms for m in s.models}
    windows = []
    victims: list[VictimOutcome] = []
    for fi, f in enumerate(truth):
        lo = start_ns + int(f["start_s"] * 1e9)
        hi = start_ns + int(f["end_s"] * 1e9) + SETTLE_NS
        windows.append((lo, hi))
        for m in f["victims"]:
            cause = expected_cause(f, m, s)
            mine = sorted(
                (x for x in found if x.model == m and x.overlaps(lo, hi)),
                key=lambda x: (x.detected_ns, x.start_ns),
            )
            slowdown, excess = _slowdown(f, m)
            end, lat = requests.of(m, lo, hi)
            rate = len(lat) / ((hi - lo) / 1e9)
            fault_s = float(f["end_s"] - f["start_s"])
            first = mine[0] if mine else None
            victims.append(
                VictimOutcome(
                    fi,
                    str(f["fault"]),
                    cause,
                    m,
                    slowdown,
                    excess,
                    rate,
                    fault_s,
                    _breached(end, lat, lo, slo.get(m)),
                    at_goal(slowdown, excess, rate, fault_s),
                    len(mine),
                    None if first is None else max(0.0, (first.detected_ns - lo) / 1e9),
                    None if first is None else _rank(first.first, cause),
                    None if first is None else _rank(first.final, cause),
                    None if first is None or not first.first else first.first[0],
                    None if first is None or not first.final else first.final[0],
                )
            )
    false = [x for x in found if not any(x.overlaps(lo, hi) for lo, hi in windows)]
    victims_of = [set(f["victims"]) for f in truth]
    bystanders = [
        x
        for x in found
        if any(
            x.overlaps(lo, hi) and x.model not in victims_of[i]
            for i, (lo, hi) in enumerate(windows)
        )
        and not any(
            x.overlaps(lo, hi) and x.model in victims_of[i] for i, (lo, hi) in enumerate(windows)
        )
    ]
    span_s = [
        (max(0.0, (lo - start_ns) / 1e9), min(s.duration_s, (hi - start_ns) / 1e9))
        for lo, hi in windows
    ]
    outside_h = len(s.models) * (s.duration_s - _union_s(span_s)) / 3600
    severities: dict[str, int] = {}
    for x in false:
        severities[x.severity or "?"] = severities.get(x.severity or "?", 0) + 1
    return ScenarioScore(
        name=s.name,
        seed=s.seed,
        kind=kind,
        path=path,
        hours=s.duration_s / 3600,
        models=len(s.models),
        model_hours_outside=outside_h,
        incidents=len(found),
        false_incidents=len(false),
        false_by_severity=severities,
        bystander_incidents=len(bystanders),
        faults=len(truth),
        faults_with_victims=sum(1 for f in truth if f["victims"]),
        victims=victims,
    )
