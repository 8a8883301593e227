"""The ground truth a scenario's faults carry: which root cause a diagnosis of each should name.

Every fault kind maps to one cause of the vocabulary in DESIGN.md ("Root-cause vocabulary"):
``(kind, culprit, resource)``. The simulator writes it beside its output
(:func:`simulator.output.truth`), and the benchmarks score diagnoses against it.
"""

from __future__ import annotations

from typing import NamedTuple

from cotenant.core.errors import UsageError
from cotenant.simulator.scenario import Fault, Scenario


class TruthCause(NamedTuple):
    """The root cause a fault injects, in the vocabulary of DESIGN.md."""

    kind: str
    culprit: str
    resource: str | None = None


DRAM_BOUND = 1.5
"""A kernel whose ``dram_demand`` exceeds this many times its ``sm_demand`` is DRAM-bound."""


def truth_cause(fault: Fault, scenario: Scenario | None = None) -> TruthCause:
    """The ground-truth ``(kind, culprit, resource)`` a diagnosis of ``fault`` should name.

    With ``scenario``: a ``cotenant_burst`` of a model whose kernel is DRAM-bound
    (``dram_demand > DRAM_BOUND x sm_demand``) on an MPS GPU slows its co-runners through
    DRAM bandwidth, not SM time, so its cause is ``bandwidth`` (dram)."""
    if fault.kind == "cotenant_burst" and scenario is not None and _dram_bound(scenario, fault):
        return TruthCause("bandwidth", fault.target, "dram")
    if fault.kind in ("cotenant_burst", "process_active"):
        return TruthCause("cotenant", fault.target)
    if fault.kind == "bandwidth_hog":
        return TruthCause("bandwidth", fault.target, fault.resource)
    if fault.kind == "lock_hog":
        return TruthCause("lock", fault.lock)
    if fault.kind == "throttle":
        return TruthCause("throttle", fault.gpu)
    kind = {
        "memory_pressure": "memory",
        "cpu_hog": "cpu",
        "load_surge": "load",
        "length_shift": "mix",
        "model_load": "model_load",
    }.get(fault.kind)
    if kind is None:
        raise UsageError(f"unknown fault kind {fault.kind!r}")
    return TruthCause(kind, fault.target)


def _dram_bound(s: Scenario, fault: Fault) -> bool:
    m = next((m for m in s.models if m.name == fault.target), None)
    if m is None or s.gpu(m.gpu).sharing != "mps":
        return False
    return m.kernel.dram_demand > DRAM_BOUND * m.kernel.sm_demand
