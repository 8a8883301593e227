"""A token bucket: ``rate_rps`` tokens per second, at most ``burst`` banked.

The one implementation of rate limiting: the admission gateway limits models and tenants with
it on the monotonic clock, and the simulator models that gateway with it in virtual time, so a
benchmarked limit behaves as the deployed one.
"""

from __future__ import annotations


class TokenBucket:
    """Refills continuously at ``rate_rps`` tokens/s up to ``burst`` tokens; starts with
    ``tokens`` (capped at ``burst``; default: full) at time ``now``.

    Times are seconds on a clock given by the caller, never going back. A request costs one
    token; :meth:`take` may drive the balance negative, which reserves a future token for a
    caller that chose to wait (the bounded-wait mode) so later callers queue behind it.
    """

    __slots__ = ("_stamp", "burst", "rate_rps", "tokens")

    def __init__(self, rate_rps: float, burst: int, now: float, tokens: float | None = None):
        self.rate_rps = rate_rps
        self.burst = burst
        self.tokens = float(burst) if tokens is None else min(float(burst), tokens)
        self._stamp = now

    def _refill(self, now: float) -> None:
        if now > self._stamp:
            self.tokens = min(float(self.burst), self.tokens + (now - self._stamp) * self.rate_rps)
            self._stamp = now

    def wait_s(self, now: float) -> float:
        """Seconds until one token is available (0.0 when one is available now)."""
        self._refill(now)
        if self.tokens >= 1.0:
            return 0.0
        return (1.0 - self.tokens) / self.rate_rps

    def take(self, now: float) -> None:
        """Spend one token (the balance may go negative: a reservation)."""
        self._refill(now)
        self.tokens -= 1.0

    def admit_within(
        self, now: float, max_wait_s: float, *, must_wait: bool = False
    ) -> float | None:
        """One request at ``now`` through this bucket alone: the seconds it waits for its
        token (0.0 when one is banked), the token taken or reserved; or None, nothing taken,
        when it would wait longer than ``max_wait_s`` (it is refused). ``must_wait``: it cannot
        be refused (a closed-loop client blocks instead), so it waits however long it takes."""
        wait = self.wait_s(now)
        if wait > max_wait_s and not must_wait:
            return None
        self.take(now)
        return wait
