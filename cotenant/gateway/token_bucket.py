"""A token bucket: ``rate_rps`` tokens per second, at most ``burst`` banked."""

from __future__ import annotations


class TokenBucket:
    """Refills continuously at ``rate_rps`` tokens/s up to ``burst`` tokens.

    Times are seconds on a monotonic clock given by the caller. A request costs one token;
    :meth:`take` may drive the balance negative, which reserves a future token for a caller
    that chose to wait (the bounded-wait mode) so later callers queue behind it.
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
