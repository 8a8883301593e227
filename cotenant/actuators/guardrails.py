"""Guardrails checked before any change is applied.

A change waits (stays ``approved``, with the reason in its row and audit) while any of these
holds: the mode does not apply changes; its target already has a change in effect (never two
changes to one target at once); the target is in its cooldown after its last change ended;
``max_actions_per_hour`` changes were applied in the last hour overall, or
``max_actions_per_target_per_hour`` to this target; a rate limit under the floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from cotenant.actuators.records import IN_EFFECT, ActionLog, ActionRecord

HOUR_NS = 3_600_000_000_000


@dataclass(frozen=True)
class Limits:
    max_actions_per_hour: int = 10
    max_actions_per_target_per_hour: int = 3
    cooldown_s: float = 300.0
    min_rate_rps: float = 1.0


class Guardrails:
    def __init__(self, log: ActionLog, limits: Limits) -> None:
        self._log = log
        self.limits = limits

    def blocked(self, action: ActionRecord, mode: str, now_ns: int) -> str | None:
        """Why ``action`` may not be applied now, or None when it may."""
        lim = self.limits
        if mode not in ("manual", "auto"):
            return f"mode is {mode}: changes are not applied"
        if action.kind == "rate_limit":
            rate = float(action.params.get("rate_rps", 0.0))
            if rate < lim.min_rate_rps:
                return f"rate {rate:g} rps is under the floor min_rate_rps={lim.min_rate_rps:g}"
        busy = [
            a for a in self._log.find(target=action.target, states=IN_EFFECT) if a.id != action.id
        ]
        if busy:
            return f"{action.target} already has change {busy[0].id} in effect"
        ended = self._log.last_ended_ns(action.target)
        if ended is not None and now_ns - ended < lim.cooldown_s * 1e9:
            until = datetime.fromtimestamp((ended + lim.cooldown_s * 1e9) / 1e9, tz=UTC)
            return (
                f"{action.target} is cooling down until {until:%Y-%m-%d %H:%M:%S} UTC "
                f"(cooldown_s={lim.cooldown_s:g})"
            )
        since = now_ns - HOUR_NS
        if self._log.count_events("applied", since) >= lim.max_actions_per_hour:
            return (
                f"{lim.max_actions_per_hour} changes already applied in the last hour "
                "(max_actions_per_hour)"
            )
        if (
            self._log.count_events("applied", since, action.target)
            >= lim.max_actions_per_target_per_hour
        ):
            return (
                f"{lim.max_actions_per_target_per_hour} changes already applied to {action.target} "
                "in the last hour (max_actions_per_target_per_hour)"
            )
        return None
