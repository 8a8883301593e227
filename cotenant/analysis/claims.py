"""The contract between the attribution and its explainers: one explainer per cause kind.

An :class:`Explainer` looks at one incident (:class:`Context`) and makes :class:`Claim` s: "of
the excess of this phase, my cause explains this many ms per request, for these reasons".
:mod:`analysis.explainers` lists every explainer in one table; :mod:`analysis.apportion` turns
the claims into shares that add up to at most the excess. An explainer only claims what its
evidence supports (its evidence enriched in the slow windows over the normal ones,
:mod:`analysis.enrichment`); it never sees the other explainers' claims, so the order in which
the excess is handed out lives in one place, the :class:`Stage` of each claim:

* ``FIRST`` — taken before anything else, in table order, up to the claim (the victim's heavier
  requests, whose cost is known from their token counts or work units; a lock waited on);
* ``SHARED`` — the physical predictions, shared in proportion to them and trusted within a factor
  (a lower clock, co-tenants whose demand rose, memory, bigger batches);
* ``RESIDUAL`` — what the shared ones leave, in table order, up to the claim (host CPU, which a
  compute span holds part of);
* ``LEFTOVER`` — after the queue time lost to slower service has followed the compute causes:
  what nothing else took (the backlog behind unusual model loads; heavier requests judged from
  their own inference time, claimed only when no other actor explains any of the excess).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from cotenant.analysis.candidates import Candidate
from cotenant.analysis.change import wmean_over
from cotenant.analysis.demand import Demand
from cotenant.analysis.host_cpu import CpuRiser, HostFrequency
from cotenant.analysis.windows import GpuWindows
from cotenant.analysis.work import MixExcess, WorkSeries
from cotenant.core.cause_kinds import CauseKind


class Phase(StrEnum):
    """The parts of a request's latency the excess is split into (their phase columns)."""

    COMPUTE = "compute"  # compute_ms
    QUEUE = "queue"  # queue_ms
    LOCK = "lock"  # lock_wait_ms
    CPU = "cpu"  # preprocess_ms + postprocess_ms
    TRANSFER = "transfer"  # h2d_ms + d2h_ms
    OTHER = "other"  # other_ms (model loads)


PHASE_OF_COLUMN: dict[str, Phase] = {
    "compute_ms": Phase.COMPUTE,
    "queue_ms": Phase.QUEUE,
    "lock_wait_ms": Phase.LOCK,
    "preprocess_ms": Phase.CPU,
    "postprocess_ms": Phase.CPU,
    "h2d_ms": Phase.TRANSFER,
    "d2h_ms": Phase.TRANSFER,
    "other_ms": Phase.OTHER,
}

ORDER: tuple[Phase, ...] = (
    Phase.COMPUTE,
    Phase.QUEUE,
    Phase.LOCK,
    Phase.CPU,
    Phase.TRANSFER,
    Phase.OTHER,
)
"""The order phases are apportioned in: compute first (lost queue capacity follows it)."""


class Stage(IntEnum):
    FIRST = 0
    SHARED = 1
    RESIDUAL = 2
    LEFTOVER = 3


@dataclass
class Claim:
    """What one cause explains of one phase's excess (ms per request; ``inf``: all that is
    left at its stage). ``cand`` None: queue time lost to slower service, which follows the
    compute causes. ``alone``: only when no claim naming another actor than the victim takes
    anything, in any phase."""

    cand: Candidate | None
    phase: Phase
    stage: Stage
    ms: float
    confidence: float = 0.3
    evidence: dict[str, Any] = field(default_factory=dict)
    alone: bool = False


@dataclass
class Context:
    """One incident as the explainers see it: the victim's windows and masks, each phase's
    excess (ms per request), what the co-tenants' demand did, the host CPU risers and
    frequency, the victim's locks and token / work mix. Explainers add ``notes``."""

    w: GpuWindows
    victim: str
    before: np.ndarray
    during: np.ndarray
    near: np.ndarray  # during, widened for per-process samples stamped after the work
    excess: dict[Phase, float]
    has_phases: bool
    flat: set[str]  # co-tenant models whose own demand did not rise
    demands: dict[str, Demand]
    host_cpu: Mapping[str, np.ndarray]
    risers: list[CpuRiser]
    frequency: HostFrequency | None
    own_surge: bool
    locks: list[tuple[str, str, float]]
    mix: MixExcess | None
    work: WorkSeries | None = None  # work per request, where the requests say (analysis.mix)
    notes: list[str] = field(default_factory=list)

    @property
    def v(self) -> dict[str, np.ndarray]:
        return self.w.models[self.victim]

    @property
    def total(self) -> float:
        return sum(self.excess.values())

    @cached_property
    def compute_before(self) -> float:
        """The victim's compute time per request over the normal windows (ms); the compute
        excess when unknown (a prediction relative to it is then its own excess)."""
        v = self.v
        comp = self.excess.get(Phase.COMPUTE, 0.0)
        b = wmean_over(v["compute_ms"], v["count"], self.before)
        return b if np.isfinite(b) and b > 0 else comp

    @cached_property
    def mix_ms(self) -> float:
        """What the victim's token counts or work units explain of the compute excess."""
        comp = self.excess.get(Phase.COMPUTE, 0.0)
        return min(self.mix.ms, comp) if self.mix is not None else 0.0


class Explainer(Protocol):
    """One cause kind's explanation of an incident (see the module doc)."""

    @property
    def kind(self) -> CauseKind: ...

    def claims(self, ctx: Context) -> list[Claim]:
        """What this kind explains of each phase's excess; empty when its evidence is not
        enriched in the slow windows. May add to ``ctx.notes``."""
        ...
