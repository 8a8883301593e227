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


class VirtualTokenBucket:
    """``rate_rps`` > 0 tokens per second, at most ``burst`` (>= 1) banked; starts full at
    time ``t`` (seconds of virtual time). ``max_wait_s`` >= 0: the longest a request waits
    for a token before it is refused. Raises UsageError for values out of range."""

    __slots__ = ("burst", "last", "max_wait_s", "rate_rps", "tokens")

    def __init__(self, rate_rps: float, burst: int, *, max_wait_s: float = 0.0, t: float = 0.0):
        if not rate_rps > 0:
            raise UsageError(f"rate_rps {rate_rps!r} must be > 0")
        if int(burst) != burst or burst < 1:
            raise UsageError(f"burst {burst!r} must be an integer >= 1")
        if not max_wait_s >= 0:
            raise UsageError(f"max_wait_s {max_wait_s!r} must be >= 0")
        self.rate_rps = float(rate_rps)
        self.burst = int(burst)
        self.max_wait_s = float(max_wait_s)
        self.tokens = float(burst)
        self.last = t

    def admit(self, t: float, *, must_wait: bool = False) -> float | None:
        """A request arriving at ``t``: the seconds it waits for its token (0 when one is
        banked), or None when it is refused. ``must_wait``: it cannot be refused (a
        closed-loop client blocks instead), so it waits however long it takes."""
        if t > self.last:
            self.tokens = min(float(self.burst), self.tokens + (t - self.last) * self.rate_rps)
            self.last = t
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        # tokens may go negative: each waiting request has reserved the next free token
        wait = (1.0 - self.tokens) / self.rate_rps
        if must_wait or wait <= self.max_wait_s:
            self.tokens -= 1.0
            return wait
        return None


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
