"""The control loop's Prometheus series (contract 4; the rules task alerts on them).

``cotenant_action_transitions_total{kind,target,state}`` counts every state an action enters;
``cotenant_actions_active{target}`` is the number of changes in effect (applied or verified, not
yet reverted) per target.
"""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge


class ActionMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.transitions = Counter(
            "cotenant_action_transitions",
            "Action state transitions, by the state entered",
            ["kind", "target", "state"],
            registry=registry,
        )
        self.active = Gauge(
            "cotenant_actions_active",
            "Changes in effect (applied, not yet reverted), per target",
            ["target"],
            registry=registry,
        )
        self._targets: set[str] = set()

    def entered(self, kind: str, target: str, state: str) -> None:
        self.transitions.labels(kind, target, state).inc()

    def set_active(self, targets: list[str]) -> None:
        """Set the gauge from the targets of every change in effect (one entry per change)."""
        tally = Tally(targets)
        for t in self._targets | set(tally):
            self.active.labels(t).set(tally.get(t, 0))
        self._targets |= set(tally)
