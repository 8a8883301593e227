"""The ``load`` explainer: the victim's own arrivals or batches surged.

* **Compute**: bigger batches, when its arrivals surged beyond Poisson noise
  (:func:`analysis.demand.arrival_surge`; bigger batches from a queue alone are a symptom),
  predict ``compute_before x (batch ratio - 1) / 2``.
* **Queue**: its growth is split between own load and lost capacity in proportion to the
  arrival-rate ratio - 1 (only when arrivals surged) and the per-item service-time ratio - 1;
  the lost-capacity part follows the compute causes (:mod:`analysis.apportion`). Where the
  queue alone grew (no other phase, the service time held) and more requests arrived than
  Poisson noise allows (:data:`MORE_Z`, a lower bar than the surge's), its own requests
  queued behind each other: own load (a bursty model's bunched requests). With neither, the
  queue growth is left unexplained (a model load's backlog, or unknown).

Host CPU the victim itself took when its arrivals surged is its load too; that claim is made
by :class:`analysis.cpu_causes.CpuExplainer`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cotenant.analysis.candidates import Candidate
from cotenant.analysis.change import confidence, wmean_over
from cotenant.analysis.change import evidence as change_evidence
from cotenant.analysis.claims import Claim, Context, Phase, Stage
from cotenant.analysis.demand import arrival_rates, arrival_span, arrival_z
from cotenant.core.cause_kinds import CauseKind

BATCH_RISE = 1.1
"""Mean batch size over its before level by this factor, with surging arrivals: more work."""


MORE_Z = 1.64
"""A queue that alone grew, with arrivals this many standard errors over before (one-sided
95 %): the model's own bunched requests queued behind each other."""


@dataclass(frozen=True)
class LoadExplainer:
    kind: CauseKind = CauseKind.LOAD

    def claims(self, ctx: Context) -> list[Claim]:
        return self._batches(ctx) + self._queue(ctx)

    def _batches(self, ctx: Context) -> list[Claim]:
        v, before, during = ctx.v, ctx.before, ctx.during
        if ctx.excess.get(Phase.COMPUTE, 0.0) <= 0:
            return []
        cnt = v["count"]
        bb = wmean_over(v["batch_size_mean"], cnt, before)
        bd = wmean_over(v["batch_size_mean"], cnt, during)
        if not (
            ctx.own_surge
            and np.isfinite(bb)
            and np.isfinite(bd)
            and bb > 0
            and bd > BATCH_RISE * bb
        ):
            return []
        ev = change_evidence(
            v["batch_size_mean"], before, during, f"{ctx.victim} batch size", "requests"
        )
        return [
            Claim(
                Candidate(CauseKind.LOAD, ctx.victim),
                Phase.COMPUTE,
                Stage.SHARED,
                ctx.compute_before * (bd / bb - 1) / 2,
                confidence(v["batch_size_mean"], before, during),
                ev,
            )
        ]

    def _queue(self, ctx: Context) -> list[Claim]:
        q = ctx.excess.get(Phase.QUEUE, 0.0)
        if q <= 0:
            return []
        v, before, during = ctx.v, ctx.before, ctx.during
        cnt = v["count"]
        rate_b, rate_d = arrival_rates(v, before, during)
        item = (
            np.nan_to_num(v["compute_ms"]) + np.nan_to_num(v["h2d_ms"]) + np.nan_to_num(v["d2h_ms"])
        ) / np.fmax(np.nan_to_num(v["batch_size_mean"], nan=1.0), 1.0)
        svc_b, svc_d = wmean_over(item, cnt, before), wmean_over(item, cnt, during)
        lw = max(0.0, rate_d / rate_b - 1) if ctx.own_surge else 0.0
        cw = max(0.0, svc_d / svc_b - 1) if svc_b > 0 else 0.0
        if lw + cw <= 0 and not any(ms > 0 for p, ms in ctx.excess.items() if p != Phase.QUEUE):
            # only its queue grew: its own requests bunched, if more arrived than noise allows
            z, _, _ = arrival_z(v, before, during, ctx.w.step_ns)
            if z > MORE_Z:
                lw = rate_d / rate_b - 1
        if lw + cw <= 0:
            return []
        span = arrival_span(v, before, during)
        ev = change_evidence(v["arrival_rps"], span, during, f"{ctx.victim} arrival rate", "req/s")
        own = Claim(
            Candidate(CauseKind.LOAD, ctx.victim),
            Phase.QUEUE,
            Stage.FIRST,
            q * lw / (lw + cw),
            confidence(v["arrival_rps"], span, during),
            ev,
        )
        lost = Claim(None, Phase.QUEUE, Stage.FIRST, q * cw / (lw + cw))
        return [own, lost]
