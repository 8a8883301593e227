"""What admission hands out and counts: a model's or tenant's :class:`Entry` (limit, priority,
counters), the :class:`Ticket` of an admitted request with the replica it was given, and
:class:`Rejected` (the 429/503 a refused request gets)."""

from __future__ import annotations

import math
from typing import Any, Literal

from cotenant.core.token_bucket import TokenBucket
from cotenant.gateway.balance import Route
from cotenant.gateway.replica import Replica

Kind = Literal["models", "tenants"]
OTHER = "(other)"
Grant = tuple[Replica, bool, bool]
"""A replica given to a request: ``(replica, reserved, probe)`` (see :meth:`Replica.take`)."""


MAX_RETRY_AFTER_S = 3600
"""The longest Retry-After the gateway gives, in seconds."""


class Rejected(Exception):
    """A request is refused: ``status`` (429 or 503), ``reason`` (a metric label), and the
    ``retry_after_s`` the client is told."""

    def __init__(self, status: int, reason: str, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` in whole seconds, at least 1 and at most an hour."""
        return str(min(MAX_RETRY_AFTER_S, max(1, math.ceil(self.retry_after_s))))


class Entry:
    """The limit, priority and counters of one model or tenant."""

    __slots__ = ("admitted", "bucket", "in_flight", "name", "priority", "queued", "rejected")

    def __init__(self, name: str) -> None:
        self.name = name
        self.bucket: TokenBucket | None = None
        self.priority: int | None = None
        self.in_flight = 0
        self.queued = 0
        self.admitted = 0
        self.rejected = 0

    def state(self) -> dict[str, Any]:
        """This entry as the control API's state (contract 4)."""
        b = self.bucket
        return {
            "rate_rps": None if b is None else b.rate_rps,
            "burst": None if b is None else b.burst,
            "priority": self.priority,
            "in_flight": self.in_flight,
            "queued": self.queued,
            "admitted_total": self.admitted,
            "rejected_total": self.rejected,
        }


class Ticket:
    """An admitted request and the replica it was given: release it with
    :meth:`Admission.release` when it is done."""

    __slots__ = (
        "explicit_priority",
        "model",
        "outcome",
        "priority",
        "probe",
        "replica",
        "reserved",
        "route",
        "tenant",
    )

    def __init__(
        self,
        model: Entry,
        tenant: Entry,
        priority: int,
        explicit: bool,
        route: Route,
        grant: Grant,
    ) -> None:
        self.model = model
        self.tenant = tenant
        self.priority = priority
        self.explicit_priority = explicit
        """True when the priority was set for the model or tenant (not the default)."""
        self.route = route
        self.replica: Replica | None = grant[0]
        self.reserved = grant[1]
        self.probe = grant[2]
        self.outcome = False
        """True once the replica's health heard how the exchange went."""
