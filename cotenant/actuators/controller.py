"""The control loop: incidents in, guarded changes out, each verified and rolled back if needed.

:class:`ActionController` implements :class:`actuators.contract.ActionControl`. It is
clock-injected and steppable: :meth:`ActionController.step` does one pass at ``now_ns`` —
propose an action for each open incident that has none, approve it (``auto``), apply what is
approved and allowed by the guardrails, verify applied changes after ``settle_s``, revert
changes at their TTL, expire proposals whose incident resolved — and :meth:`start` /
:meth:`stop` run it on a thread every ``interval_s`` for ``cotenant serve``.

State machine (every step is one ``actions`` row rewrite plus one ``audit`` row)::

    proposed -> approved -> applied -> verified -> expired (TTL revert)
                                       '-> rolled_back (by a person, through the API)
        |           |          |-> rolled_back (did not help / hurt more / by a person)
        |           |          '-> expired (TTL reached before verification)
        |           '-> failed (the backend refused or was down; nothing was changed)
        '-----------'-> expired (incident resolved, or TTL, before the change was applied)

Modes: ``dry-run`` records proposals only; ``manual`` applies what a person approves;
``auto`` approves its own proposals. ``notify`` actions change nothing: they are recorded
(and sent to a notifier when one is given and the mode is manual or auto) and expire with
their incident.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from cotenant.actuators.backend import Backend, Change
from cotenant.actuators.guardrails import Guardrails, Limits
from cotenant.actuators.metrics import ActionMetrics
from cotenant.actuators.policy import Policy
from cotenant.actuators.proposals import IncidentSource, propose
from cotenant.actuators.records import IN_EFFECT, OPEN_STATES, ActionLog, ActionRecord, moved
from cotenant.actuators.reroute_steps import CONTROLLER, RerouteSteps
from cotenant.actuators.settings import ActuatorSettings
from cotenant.actuators.verify import verify
from cotenant.analysis.incident_record import Incident
from cotenant.analysis.settings import AnalysisSettings
from cotenant.core.errors import ActionError, BackendError, CotenantError, Forbidden, Unauthorized
from cotenant.core.periodic import Periodic
from cotenant.core.readers import MetricSource
from cotenant.store.db import Store

log = logging.getLogger(__name__)


class Notifier(Protocol):
    """Somewhere ``notify`` actions are sent (the webhook backend)."""

    def notify(self, payload: dict[str, Any]) -> None: ...


class ActionController:
    """Proposes, applies, verifies and reverts actions. Thread-safe."""

    def __init__(
        self,
        *,
        settings: ActuatorSettings,
        policy: Policy,
        incidents: IncidentSource,
        source: MetricSource,
        backend: Backend,
        store: Store,
        token: str = "",
        registry: CollectorRegistry | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        slo_ms: Mapping[str, float] | None = None,
        step_s: float = AnalysisSettings.step_s,
        notifier: Notifier | None = None,
        horizon_s: float = 3600.0,
    ) -> None:
        """``settings``: the ``[actuators]`` keys (the mode, ``interval_s``, the guardrails,
        ``settle_s``, ``ttl_s``). ``token``: the bearer token mutating API calls need ('' refuses
        them all). ``slo_ms``: p99 SLO per model, used to judge whether a change hurt its
        target (``Slos.lookup()``: the default applies to models not named). ``horizon_s``:
        how far back each pass reads incidents."""
        self.settings = settings
        self.policy = policy
        self._incidents = incidents
        self._source = source
        self.backend = backend
        self.log = ActionLog(store)
        self._token = token
        self._clock = clock_ns
        self._slo: Mapping[str, float] = slo_ms if slo_ms is not None else {}
        self._step_s = step_s
        self._reroute = RerouteSteps(self, self, source, slo_ms=self._slo, step_s=step_s)
        self._notifier = notifier
        self._horizon_s = horizon_s
        self.metrics = ActionMetrics(registry)
        self.guardrails = Guardrails(
            self.log,
            Limits(
                settings.max_actions_per_hour,
                settings.max_actions_per_target_per_hour,
                settings.cooldown_s,
                settings.min_rate_rps,
            ),
        )
        self._lock = threading.RLock()
        self._worker = Periodic(
            "cotenant-actions",
            settings.interval_s,
            lambda: self.step(self._clock()),
            what="action control pass",
        )
        self._errors: dict[str, str] = {}  # action id -> last revert error noted
        self.passes = 0

    # -- ActionControl -------------------------------------------------------------------

    @property
    def mode(self) -> str:
        return self.settings.mode

    def authorize(self, token: str | None) -> None:
        if not token:
            raise Unauthorized(
                "this call needs 'Authorization: Bearer <token>' ([actuators] token)"
            )
        if not self._token or not hmac.compare_digest(token.encode(), self._token.encode()):
            raise Forbidden(
                "the bearer token is not the configured one"
                if self._token
                else "no token is configured ([actuators] token or token_file): mutating calls "
                "are refused"
            )

    def list_actions(
        self,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        incident_id: str | None = None,
        limit: int = 200,
    ) -> list[dict[str, Any]]:
        rows = self.log.find(
            since_ns=since_ns, until_ns=until_ns, incident_id=incident_id, limit=limit
        )
        return [a.to_dict() for a in rows]

    def action(self, action_id: str) -> dict[str, Any]:
        """One action with its audit trail (``audit``, oldest first); NotFoundError."""
        return {**self.log.get(action_id).to_dict(), "audit": self.log.audit(action_id)}

    def approve(self, action_id: str, *, actor: str) -> dict[str, Any]:
        with self._lock:
            a = self.log.get(action_id)
            if a.kind == "notify":
                raise ActionError(f"action {action_id} only notifies: there is nothing to approve")
            if a.state != "proposed":
                raise ActionError(
                    f"action {action_id} is {a.state}, only a proposed action can be approved"
                )
            if self.mode not in ("manual", "auto"):
                raise ActionError(
                    f"actuators.mode is {self.mode}: nothing is applied "
                    "(set it to manual to approve)"
                )
            now = self._clock()
            a = self.enter(a, "approved", now, actor, reason=f"approved by {actor}")
            self._try_apply(a, now)
            self._publish()
            return self.log.get(action_id).to_dict()

    def rollback(self, action_id: str, *, actor: str, reason: str) -> dict[str, Any]:
        with self._lock:
            a = self.log.get(action_id)
            if a.state not in IN_EFFECT:
                raise ActionError(
                    f"action {action_id} is {a.state}: only an applied change can be rolled back"
                )
            now = self._clock()
            self.revert(
                a, "rolled_back", now, actor, f"rolled back by {actor}: {reason}", raise_errors=True
            )
            self._publish()
            return self.log.get(action_id).to_dict()

    # -- the loop ------------------------------------------------------------------------

    def step(self, now_ns: int) -> None:
        """One pass at ``now_ns``: propose, approve (auto), apply, verify, revert, expire."""
        with self._lock:
            since = now_ns - int(self._horizon_s * 1e9)
            incidents = {i.id: i for i in self._incidents.find(since_ns=since, limit=1000)}
            if self.mode != "off":
                # breaches only: a degradation within the SLO is listed, not acted on
                live = sorted(
                    (i for i in incidents.values() if i.state == "open" and i.severity == "breach"),
                    key=lambda i: (i.start_ns, i.id),  # oldest first: the guardrails favour it
                )
                known = self.log.by_incident([i.id for i in live])
                for inc in live:
                    try:
                        self._maybe_propose(inc, known[inc.id], now_ns)
                    except CotenantError as exc:  # e.g. the metric source is down
                        log.warning("no proposal for incident %s: %s", inc.id, exc)
            pending = self.log.find(states=OPEN_STATES, limit=10_000)
            for a in sorted(pending, key=lambda a: (a.created_ns, a.incident_id, a.id)):
                try:
                    self._advance(a, incidents, now_ns)
                except CotenantError as exc:  # one action's trouble must not stop the others
                    log.warning("action %s: %s", a.id, exc)
            self._publish()
            self.passes += 1

    def start(self) -> None:
        """Run :meth:`step` every ``interval_s`` on its own thread (``cotenant serve``)."""
        self._worker.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._worker.stop(timeout_s)

    # -- steps ---------------------------------------------------------------------------

    def _maybe_propose(self, inc: Incident, existing: list[ActionRecord], now: int) -> None:
        open_now = [a for a in existing if a.state in OPEN_STATES]
        if any(a.kind != "notify" for a in open_now):
            return
        p = propose(
            inc,
            self.policy,
            self._source,
            floor_rps=self.settings.min_rate_rps,
            step_s=self._step_s,
            now_ns=now,
        )
        p = self._reroute.maybe_reroute(inc, p, existing, now)
        if p.kind == "notify" and open_now:
            return  # one notification per incident
        if any(a.kind == p.kind and a.target == p.target for a in existing):
            return  # already tried on this incident: never oscillate
        busy = self.log.find(target=p.target, states=OPEN_STATES, limit=1000)
        if p.kind != "notify" and any(a.kind != "notify" for a in busy):
            return  # the target is already being acted on for another incident
        a = ActionRecord(
            id=ActionRecord.new_id(),
            incident_id=inc.id,
            kind=p.kind,
            target=p.target,
            backend=self.backend.name,
            state="proposed",
            created_ns=now,
            updated_ns=now,
            params=p.params,
            reason=p.reason,
        )
        for n in open_now:  # the diagnosis firmed up: a change replaces the notification
            self.enter(n, "expired", now, CONTROLLER, reason=f"superseded by {a.id}")
        self.write(a, CONTROLLER, "proposed", now)
        if p.kind == "notify" and self._notifier is not None and self.mode in ("manual", "auto"):
            try:
                self._notifier.notify({"event": "notify", "action": a.to_dict()})
                self.log.note(a.id, actor=CONTROLLER, event="notified", now_ns=now, detail={})
            except BackendError as exc:
                self.log.note(
                    a.id,
                    actor=CONTROLLER,
                    event="notify_failed",
                    now_ns=now,
                    detail={"error": str(exc)},
                )

    def _advance(self, a: ActionRecord, incidents: dict[str, Incident], now: int) -> None:
        ttl = int(self.settings.ttl_s * 1e9)
        if a.state in ("proposed", "approved"):
            inc = incidents.get(a.incident_id) or self._incidents.get(a.incident_id)
            if inc is None or inc.state != "open":
                self.enter(
                    a,
                    "expired",
                    now,
                    CONTROLLER,
                    reason=f"incident {a.incident_id} resolved before the change was applied",
                )
            elif now - a.created_ns >= ttl:
                self.enter(a, "expired", now, CONTROLLER, reason="not applied within ttl_s")
            elif a.state == "proposed" and self.mode == "auto" and a.kind != "notify":
                a = self.enter(a, "approved", now, CONTROLLER, reason="approved by the auto mode")
                self._try_apply(a, now)
            elif a.state == "approved":
                self._try_apply(a, now)
            return
        applied_ns = int(a.params.get("applied_ns", a.updated_ns))
        if now - applied_ns >= ttl:
            self.revert(
                a, "expired", now, CONTROLLER, f"ttl_s={self.settings.ttl_s:g} reached: reverted"
            )
            return
        if a.state == "applied" and a.kind == "reroute":
            self._reroute.advance(a, applied_ns, now)
            return
        if a.state == "applied" and now - applied_ns >= int(self.settings.settle_s * 1e9):
            out = verify(
                a.context,
                a.target,
                applied_ns,
                now,
                self._source,
                self.policy.verify,
                slo_ms=self._slo,
                settle_ns=int(self.settings.settle_s * 1e9),
                step_s=self._step_s,
            )
            if out.verdict == "wait":
                return
            params = {**a.params, "verification": out.numbers}
            a = moved(a, a.state, a.updated_ns, params=params)
            if out.verdict == "verified":
                self.enter(a, "verified", now, CONTROLLER, reason=out.reason)
            else:
                self.revert(a, "rolled_back", now, CONTROLLER, out.reason)

    def _try_apply(self, a: ActionRecord, now: int) -> None:
        why = self.guardrails.blocked(a, self.mode, now)
        if why is not None:
            held = f"held: {why}"
            if a.reason != held:
                a = moved(a, a.state, now, reason=held)
                self.log.write(a, actor=CONTROLLER, event="held", now_ns=now)
            return
        try:
            before = self.backend.current(a.target)
            after = self.backend.apply(Change(a.kind, a.target, a.change_params))  # type: ignore[arg-type]
        except BackendError as exc:
            self.enter(a, "failed", now, CONTROLLER, reason=f"apply failed: {exc}")
            return
        params = {**a.params, "applied_ns": now}
        self.enter(
            a,
            "applied",
            now,
            CONTROLLER,
            reason=f"applied through {self.backend.name}",
            params=params,
            before=before,
            after=after,
        )

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
        try:
            restored = self.backend.revert(a.target, a.before or {})
        except BackendError as exc:
            msg = str(exc)
            if self._errors.get(a.id) != msg:  # one audit row per distinct error, not per pass
                self._errors[a.id] = msg
                self.log.note(
                    a.id,
                    actor=actor,
                    event="revert_failed",
                    now_ns=now,
                    detail={"error": msg, "wanted": state, "why": reason},
                )
            if raise_errors:
                raise
            return
        self._errors.pop(a.id, None)
        self.enter(a, state, now, actor, reason=reason, detail={"restored": restored})

    # -- bookkeeping ---------------------------------------------------------------------

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
        new = moved(a, state, now, **changes)
        self.write(new, actor, state, now, detail)
        return new

    def write(
        self,
        a: ActionRecord,
        actor: str,
        event: str,
        now: int,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self.log.write(a, actor=actor, event=event, now_ns=now, detail=detail)
        self.metrics.entered(a.kind, a.target, a.state)
        log.info("action %s %s %s on %s: %s", a.id, a.state, a.kind, a.target, a.reason)

    def _publish(self) -> None:
        self.metrics.set_active([a.target for a in self.log.find(states=IN_EFFECT, limit=10_000)])
