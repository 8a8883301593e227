"""One upstream replica at run time: its capacity, its reservation, its health, its counters.

Capacity: ``max_in_flight`` requests at once (None: only the gateway's own
``--max-concurrency`` bounds it). A **reservation** keeps ``slots`` of them for requests whose
priority is at most ``priority`` (lower is served first): the other requests may hold at most
``max_in_flight - slots`` at once, so a burst of low-priority traffic cannot take the reserved
slots, while the priority class may use every slot. A replica ejected by an operator
(:meth:`Replica.eject`) gets no new requests until restored or until its ejection time is over;
one ejected by :class:`~actuators.gateway.health.PassiveHealth` is probed back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from cotenant.gateway.health import PassiveHealth

if TYPE_CHECKING:
    from cotenant.gateway.upstream import UpstreamPool


class Reservation(NamedTuple):
    """``slots`` of a replica's ``max_in_flight`` kept for priorities <= ``priority``."""

    slots: int
    priority: int


class Replica:
    """See the module docstring. Every method runs on the event loop thread."""

    __slots__ = (
        "failed_total",
        "health",
        "in_flight",
        "in_flight_reserved",
        "manual",
        "manual_until",
        "max_in_flight",
        "name",
        "pool",
        "reservation",
        "sent_total",
        "url",
    )

    def __init__(
        self,
        name: str,
        url: str,
        *,
        max_in_flight: int | None = None,
        reservation: Reservation | None = None,
        health: PassiveHealth | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.max_in_flight = max_in_flight
        self.reservation = reservation
        self.health = health or PassiveHealth()
        self.in_flight = 0
        self.in_flight_reserved = 0
        """Requests in flight that were admitted as the reservation's priority class."""
        self.manual = False
        self.manual_until: float | None = None
        self.sent_total = 0
        self.failed_total = 0
        self.pool: UpstreamPool | None = None
        """Its keep-alive connections (set when the gateway starts)."""

    # -- may it take a request? -----------------------------------------------------------

    def usable(self, now: float) -> bool:
        """False while an operator has it ejected (an ejection with a time ends by itself)."""
        if self.manual:
            if self.manual_until is None or now < self.manual_until:
                return False
            self.manual = False
            self.manual_until = None
        return True

    def has_room(self, priority: int) -> bool:
        """Whether a request of ``priority`` fits under ``max_in_flight`` and the reservation."""
        limit = self.max_in_flight
        if limit is None:
            return True
        if self.in_flight >= limit:
            return False
        r = self.reservation
        if r is None or priority <= r.priority:
            return True
        return self.in_flight - self.in_flight_reserved < limit - r.slots

    # -- a request's way through ----------------------------------------------------------

    def take(self, priority: int) -> tuple[bool, bool]:
        """Count a request sent here; returns ``(reserved, probe)``: whether it counts in the
        reservation's class, and whether it is the health probe."""
        self.in_flight += 1
        self.sent_total += 1
        r = self.reservation
        reserved = r is not None and priority <= r.priority
        if reserved:
            self.in_flight_reserved += 1
        return reserved, self.health.sent()

    def give_back(self, reserved: bool) -> None:
        self.in_flight -= 1
        if reserved:
            self.in_flight_reserved -= 1

    # -- control --------------------------------------------------------------------------

    def eject(self, now: float, duration_s: float | None) -> None:
        """No new requests until :meth:`restore` (or for ``duration_s`` seconds)."""
        self.manual = True
        self.manual_until = None if duration_s is None else now + duration_s

    def restore(self) -> None:
        """Back in rotation: the operator's ejection and any passive ejection end now."""
        self.manual = False
        self.manual_until = None
        self.health.reset()

    def state(self, now: float) -> dict[str, Any]:
        """This replica in the control API's state (contract 4)."""
        usable = self.usable(now)
        if not usable:
            left = None if self.manual_until is None else max(0.0, self.manual_until - now)
        else:
            self.health.available(now)  # moves an ejection that is over to probing
            left = self.health.ejected_for_s(now)
        r = self.reservation
        return {
            "url": self.url,
            "state": "ejected" if not usable else self.health.state,
            "ejected_by": "operator" if not usable else "health" if left is not None else None,
            "ejected_for_s": None if left is None else round(left, 3),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "reservation": None if r is None else {"slots": r.slots, "priority": r.priority},
            "sent_total": self.sent_total,
            "failed_total": self.failed_total,
            "ejections_total": self.health.ejections_total,
        }
