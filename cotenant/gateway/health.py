"""Passive health of one replica: ejected after repeated failures, probed back one request at a
time.

States::

    healthy --(eject_after failures in a row)--> ejected --(eject time over)--> probing
    probing --(the probe succeeds)--> healthy
    probing --(the probe fails)--> ejected (for twice as long, up to max_eject_s)

A failure is what the gateway sees of the exchange: the connection refused, a timeout, the
upstream closing the connection or sending something that is not HTTP (not a 5xx answer: that
is the server's own reply and is passed on). While *probing*, one request at a time is let
through; its outcome decides. ``eject_after = 0`` turns passive health off (never ejected).
Times are seconds on the monotonic clock the caller passes in.
"""

from __future__ import annotations

from typing import Literal

HealthState = Literal["healthy", "ejected", "probing"]


class PassiveHealth:
    """See the module docstring."""

    __slots__ = (
        "eject_after",
        "eject_s",
        "ejected_until",
        "ejections",
        "ejections_total",
        "failures",
        "max_eject_s",
        "probe_in_flight",
        "state",
    )

    def __init__(self, eject_after: int = 5, eject_s: float = 30.0, max_eject_s: float = 300.0):
        self.eject_after = eject_after
        self.eject_s = eject_s
        self.max_eject_s = max(max_eject_s, eject_s)
        self.state: HealthState = "healthy"
        self.failures = 0
        """Failures in a row (reset by a success)."""
        self.ejections = 0
        """Ejections since the replica was last healthy (each doubles the next eject time)."""
        self.ejections_total = 0
        self.ejected_until = 0.0
        self.probe_in_flight = False

    def available(self, now: float) -> bool:
        """Whether a new request may go to the replica now (moves *ejected* to *probing* once
        its time is over; *probing* admits one request at a time)."""
        state = self.state
        if state == "healthy":
            return True
        if state == "ejected":
            if now < self.ejected_until:
                return False
            self.state = "probing"
            self.probe_in_flight = False
        return not self.probe_in_flight

    def sent(self) -> bool:
        """A request was sent; returns True when it is the probe (its outcome decides)."""
        if self.state == "probing" and not self.probe_in_flight:
            self.probe_in_flight = True
            return True
        return False

    def succeeded(self, probe: bool) -> None:
        self.failures = 0
        if self.state != "healthy" and (probe or self.state == "probing"):
            self.state = "healthy"
            self.ejections = 0
            self.probe_in_flight = False

    def failed(self, now: float, probe: bool) -> bool:
        """Count a failure; returns True when it ejects the replica."""
        self.failures += 1
        if self.eject_after <= 0:
            return False
        if self.state == "probing" and probe:
            return self._eject(now)
        if self.state == "healthy" and self.failures >= self.eject_after:
            return self._eject(now)
        return False

    def finished_probe(self) -> None:
        """The probe ended without an outcome (the client went away): let another through."""
        self.probe_in_flight = False

    def reset(self) -> None:
        """Back to healthy (an operator restored the replica)."""
        self.state = "healthy"
        self.failures = 0
        self.ejections = 0
        self.probe_in_flight = False

    def ejected_for_s(self, now: float) -> float | None:
        """Seconds left of the current ejection, or None when not ejected."""
        return max(0.0, self.ejected_until - now) if self.state == "ejected" else None

    def _eject(self, now: float) -> bool:
        self.ejections += 1
        self.ejections_total += 1
        self.ejected_until = now + min(
            self.max_eject_s, self.eject_s * 2 ** min(self.ejections - 1, 30)
        )
        self.state = "ejected"
        self.probe_in_flight = False
        return True
