"""Turn the explainers' claims into ms of excess per cause, adding up to at most the excess.

Per phase, in :data:`analysis.claims.ORDER`, the claims are served by stage
(:class:`analysis.claims.Stage`): ``FIRST`` and ``RESIDUAL`` claims take up to their claim, in
the order given; ``SHARED`` claims share what is left in proportion to their predictions, up to
:data:`TRUST` x their sum (physical predictions are trusted within a factor of two: a 1.6x
slowdown predicted as 1.3x is still the co-tenant's); then queue time lost to slower service
(a claim without a candidate) follows the compute causes in proportion to what they took (none: it
stays unexplained); then ``LEFTOVER`` claims take what is left. Claims marked ``alone`` count only
when no claim naming another actor than the victim takes anything, in any phase: they are then
served with the rest.

The first claim that takes something for a candidate gives its confidence and evidence.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from cotenant.analysis.candidates import Candidate
from cotenant.analysis.claims import ORDER, Claim, Phase, Stage

TRUST = 2.0
"""Shared predictions are trusted within this factor: at most TRUST x their sum is allocated."""


@dataclass
class Apportioned:
    """ms per request per candidate, per phase and in all, and the claim that named each."""

    ms: dict[Candidate, float] = field(default_factory=lambda: defaultdict(float))
    by_phase: dict[Phase, dict[Candidate, float]] = field(default_factory=dict)
    named_by: dict[Candidate, Claim] = field(default_factory=dict)
    unexplained: dict[Phase, float] = field(default_factory=dict)

    def take(self, phase: Phase, claim: Claim, cand: Candidate, ms: float) -> None:
        if ms <= 0:
            return
        self.ms[cand] += ms
        got = self.by_phase.setdefault(phase, {})
        got[cand] = got.get(cand, 0.0) + ms
        self.named_by.setdefault(cand, claim)


def apportion(excess: dict[Phase, float], claims: list[Claim], victim: str = "") -> Apportioned:
    """Share each phase's ``excess`` (ms per request) among ``claims`` (see the module doc);
    ``victim``: whose own causes (its load, model loads) do not stop an ``alone`` claim."""
    out = _apportion(excess, [c for c in claims if not c.alone])
    others = any(cand.culprit != victim for cand in out.ms)
    if not others and any(c.alone for c in claims):
        out = _apportion(excess, claims)
    return out


def _apportion(excess: dict[Phase, float], claims: list[Claim]) -> Apportioned:
    out = Apportioned()
    for phase in ORDER:
        left = excess.get(phase, 0.0)
        if left <= 0:
            continue
        mine = [c for c in claims if c.phase == phase]

        def serve(c: Claim, most: float, phase: Phase = phase) -> float:
            if c.cand is None or most <= 0:
                return 0.0
            out.take(phase, c, c.cand, most)
            return most

        for c in (c for c in mine if c.stage == Stage.FIRST):
            left -= serve(c, min(c.ms, left))
        shared = [c for c in mine if c.stage == Stage.SHARED and c.cand is not None and c.ms > 0]
        total = sum(c.ms for c in shared)
        if shared and left > 0 and math.isfinite(total) and total > 0:
            budget = min(left, TRUST * total)
            for c in shared:
                serve(c, budget * c.ms / total)
            left -= budget
        for c in (c for c in mine if c.stage == Stage.RESIDUAL):
            left -= serve(c, min(c.ms, left))
        for c in (c for c in mine if c.cand is None):  # lost capacity follows compute
            left -= _follow(out, phase, c, min(c.ms, left))
        for c in (c for c in mine if c.stage == Stage.LEFTOVER):
            left -= serve(c, min(c.ms, left))
        if left > 1e-12:
            out.unexplained[phase] = left
    return out


def _follow(out: Apportioned, phase: Phase, claim: Claim, ms: float) -> float:
    """Spread ``ms`` over the compute causes in proportion to what each took; 0 if none."""
    comp = out.by_phase.get(Phase.COMPUTE, {})
    total = sum(comp.values())
    if ms <= 0 or total <= 0:
        return 0.0
    for cand, got in list(comp.items()):
        out.take(phase, claim, cand, ms * got / total)
    return ms
