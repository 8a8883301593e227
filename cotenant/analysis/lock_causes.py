"""The ``lock`` explainer: the victim waited longer on a lock.

The growth of the victim's lock wait goes to the lock most waited on during the incident, its
holder in the evidence (the five most waited-on locks and holders with it). With no lock named
by the spans, the culprit is ``unknown lock``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cotenant.analysis.candidates import Candidate
from cotenant.analysis.change import confidence
from cotenant.analysis.change import evidence as change_evidence
from cotenant.analysis.claims import Claim, Context, Phase, Stage
from cotenant.core.cause_kinds import CauseKind

UNNAMED = "unknown lock"


@dataclass(frozen=True)
class LockExplainer:
    kind: CauseKind = CauseKind.LOCK

    def claims(self, ctx: Context) -> list[Claim]:
        if ctx.excess.get(Phase.LOCK, 0.0) <= 0:
            return []
        locks = ctx.locks
        name, holder = (locks[0][0], locks[0][1]) if locks else (UNNAMED, "")
        wait = ctx.v["lock_wait_ms"]
        ev = change_evidence(wait, ctx.before, ctx.during, f"{ctx.victim} lock wait", "ms")
        ev["holder"] = holder
        if locks:
            ev["holders"] = [
                {"lock": n, "holder": h, "wait_ms": round(ms, 1)} for n, h, ms in locks[:5]
            ]
        return [
            Claim(
                Candidate(CauseKind.LOCK, name),
                Phase.LOCK,
                Stage.FIRST,
                np.inf,
                confidence(wait, ctx.before, ctx.during),
                ev,
            )
        ]
