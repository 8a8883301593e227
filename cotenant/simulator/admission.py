"""Admission control in virtual time: a per-model token bucket in front of the serving stack.

This is what an admission gateway (``cotenant gateway``) does to a model's requests, modelled
so the actuators can be benchmarked in the simulator: a bucket of ``burst`` tokens refilled at
``rate_rps``; a request takes a token or, when none is left, either waits for the next one (at
most ``max_wait_s``, the gateway's bounded wait — counted as *deferred*) or is refused (the
gateway's 429 — counted as *rejected*; the model server never sees it, so it leaves no request
row). Waiting for a token is part of the request's latency and of its ``queue`` phase.
"""

from __future__ import annotations

from cotenant.core.errors import UsageError
from cotenant.core.token_bucket import TokenBucket


class VirtualTokenBucket(TokenBucket):
    """The gateway's token bucket (:class:`core.token_bucket.TokenBucket`) with its bounded
    wait, in virtual time: ``rate_rps`` > 0 tokens per second, at most ``burst`` (>= 1)
    banked; starts full at time ``t`` (seconds of virtual time). ``max_wait_s`` >= 0: the
    longest a request waits for a token before it is refused. Raises UsageError for values out
    of range."""

    __slots__ = ("max_wait_s",)

    def __init__(self, rate_rps: float, burst: int, *, max_wait_s: float = 0.0, t: float = 0.0):
        if not rate_rps > 0:
            raise UsageError(f"rate_rps {rate_rps!r} must be > 0")
        if int(burst) != burst or burst < 1:
            raise UsageError(f"burst {burst!r} must be an integer >= 1")
        if not max_wait_s >= 0:
            raise UsageError(f"max_wait_s {max_wait_s!r} must be >= 0")
        super().__init__(float(rate_rps), int(burst), t)
        self.max_wait_s = float(max_wait_s)

    def admit(self, t: float, *, must_wait: bool = False) -> float | None:
        """A request arriving at ``t``: the seconds it waits for its token (0 when one is
        banked), or None when it is refused. ``must_wait``: it cannot be refused (a
        closed-loop client blocks instead), so it waits however long it takes."""
        return self.admit_within(t, self.max_wait_s, must_wait=must_wait)


class ModelAdmission:
    """One model's admission state: its bucket (None = unlimited) and what it let through."""

    __slots__ = ("admitted", "bucket", "deferred", "rejected", "rejected_at")

    def __init__(self) -> None:
        self.bucket: VirtualTokenBucket | None = None
        self.admitted = 0
        self.deferred = 0
        self.rejected = 0
        self.rejected_at: list[float] = []  # virtual times of refused requests

    def admit(self, t: float, *, must_wait: bool = False) -> float | None:
        """Seconds the request waits (0: at once), or None when it is refused; counted."""
        if self.bucket is None:
            self.admitted += 1
            return 0.0
        wait = self.bucket.admit(t, must_wait=must_wait)
        if wait is None:
            self.rejected += 1
            self.rejected_at.append(t)
            return None
        self.admitted += 1
        if wait > 0:
            self.deferred += 1
        return wait
