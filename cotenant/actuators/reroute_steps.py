"""The control loop's half that moves traffic: proposing a ``reroute`` and stepping it.

:class:`RerouteSteps` is a part of :class:`actuators.controller.ActionController`, which
owns the state machine, the store and the backend and hands itself in as the
:class:`StepBook` the steps write through; the planning and judging are in
:mod:`actuators.reroute`. A reroute is one action: its first apply records the weights to
restore, each later step rewrites it in state ``applied`` with an audit row ``stepped``, and
verification, rollback and TTL expiry work as for any action.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol

from cotenant.actuators.backend import Backend, Change
from cotenant.actuators.policy import Policy
from cotenant.actuators.proposals import Proposal
from cotenant.actuators.records import ActionRecord, moved
from cotenant.actuators.reroute import Plan, judge_step, propose_reroute
from cotenant.analysis.incident_record import Incident
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.errors import BackendError
from cotenant.core.readers import MetricSource

log = logging.getLogger(__name__)

CONTROLLER = "controller"
"""The actor recorded in the audit for the loop's own steps."""


class PolicyAndBackend(Protocol):
    """Whose policy and backend the steps use (the controller's attributes)."""

    policy: Policy
    backend: Backend


class StepBook(Protocol):
    """The controller's bookkeeping the reroute steps write through."""

    def revert(
        self,
        a: ActionRecord,
        state: str,
        now: int,
        actor: str,
        reason: str,
        *,
        raise_errors: bool = False,
    ) -> None:
        """Restore ``a.before`` through the backend and enter ``state`` (audited)."""
        ...

    def enter(
        self,
        a: ActionRecord,
        state: str,
        now: int,
        actor: str,
        *,
        detail: dict[str, Any] | None = None,
        **changes: Any,
    ) -> ActionRecord:
        """``a`` moved to ``state`` with ``changes``, written with an audit row."""
        ...

    def write(
        self,
        a: ActionRecord,
        actor: str,
        event: str,
        now: int,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Write ``a`` as it is, with an audit row ``event``."""
        ...


class RerouteSteps:
    """Reroute proposals and steps of one controller: ``book`` is its bookkeeping, the rest
    what it reads (its policy and backend are read through ``owner`` each time: they are
    the controller's, and a test may swap them)."""

    def __init__(
        self,
        book: StepBook,
        owner: PolicyAndBackend,
        source: MetricSource,
        *,
        slo_ms: Mapping[str, float],
        step_s: float,
    ) -> None:
        self._book = book
        self._owner = owner
        self._source = source
        self._slo = slo_ms
        self._step_s = step_s

    def maybe_reroute(
        self, inc: Incident, p: Proposal, existing: list[ActionRecord], now: int
    ) -> Proposal:
        """``p``, or a ``reroute`` of the victim's traffic where the policy says so: its
        cause's rule is ``reroute``, or the cause is a ``fallback`` kind and ``p`` cannot act
        (notify) or the same change was already rolled back on this incident."""
        top = inc.top
        kind = str(top.kind) if top is not None else CauseKind.UNKNOWN.value
        rule = self._owner.policy.reroute
        if rule is None or not self._owner.policy.reroutes(kind):
            return p
        failed = any(
            a.kind == p.kind and a.target == p.target and a.state == "rolled_back" for a in existing
        )
        if not (self._owner.policy.rule(kind).action == "reroute" or p.kind == "notify" or failed):
            return p
        if any(a.kind == "reroute" for a in existing):
            return p  # one reroute per incident: never oscillate
        try:
            weights = self._owner.backend.current(inc.model).get("weights")
        except BackendError as exc:
            weights = None
            log.info("no reroute for %s: %s", inc.model, exc)
        plan = propose_reroute(
            inc, rule, weights, self._source, slo_ms=self._slo, now_ns=now, step_s=self._step_s
        )
        if not isinstance(plan, Plan):
            if p.kind == "notify":
                return Proposal(p.kind, p.target, p.params, f"{p.reason}; no reroute: {plan}")
            return p
        context = {**p.params.get("context", {}), "replica": plan.contended}
        params = {
            "weights": plan.steps[0],
            "steps": plan.steps,
            "step": 0,
            "from": plan.contended,
            "to": plan.to,
            "context": context,
        }
        return Proposal("reroute", inc.model, params, plan.reason)

    def advance(self, a: ActionRecord, applied_ns: int, now: int) -> None:
        """Judge the latest step of an applied reroute; verify, take the next step, or roll
        back (every step is one audit row, ``stepped``)."""
        rule = self._owner.policy.reroute
        if rule is None:  # the policy lost its reroute section across a restart
            self._book.revert(a, "rolled_back", now, CONTROLLER, "the policy no longer reroutes")
            return
        step_ns = int(a.params.get("step_applied_ns", applied_ns))
        if now - step_ns < int(rule.step_settle_s * 1e9):
            return
        out = judge_step(
            a.params,
            a.context,
            step_ns,
            now,
            self._source,
            rule,
            self._owner.policy.verify,
            slo_ms=self._slo,
            step_s=self._step_s,
        )
        if out.verdict == "wait":
            return
        params = {**a.params, "verification": out.numbers}
        if out.verdict == "verified":
            self._book.enter(a, "verified", now, CONTROLLER, reason=out.reason, params=params)
            return
        if out.verdict == "rolled_back":
            a = moved(a, a.state, a.updated_ns, params=params)
            self._book.revert(a, "rolled_back", now, CONTROLLER, out.reason)
            return
        weights = out.numbers["next_weights"]
        try:
            after = self._owner.backend.apply(Change("reroute", a.target, {"weights": weights}))
        except BackendError as exc:
            a = moved(a, a.state, a.updated_ns, params=params)
            self._book.revert(a, "rolled_back", now, CONTROLLER, f"next step failed: {exc}")
            return
        params.update(weights=weights, step=int(a.params.get("step", 0)) + 1, step_applied_ns=now)
        # still "applied" (one change, its first "before" restores it), audited as a step
        a = moved(a, "applied", now, reason=out.reason, params=params, after=after)
        self._book.write(a, CONTROLLER, "stepped", now, {"weights": weights})
