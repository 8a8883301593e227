"""Caps on the client connections the gateway holds open: in all, and per client IP address.

::

    caps = ConnectionCaps(max_total=4096, max_per_client=512, gauge=metrics.connections)
    reason = caps.admit("10.0.0.7")     # None: admitted and counted; else "total"/"per_client"
    caps.release("10.0.0.7")            # once an admitted connection closes

A connection over a cap is answered 503 by :class:`actuators.gateway.proxy.ClientConnection`
and counted there; only admitted connections are counted here.
"""

from __future__ import annotations

import logging
import resource
from typing import Literal, Protocol

log = logging.getLogger(__name__)

Refusal = Literal["total", "per_client"]


class Gauge(Protocol):
    """What the caps update as connections open and close (a Prometheus gauge)."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


class ConnectionCaps:
    """Counts open client connections by peer address; ``0`` turns a cap off."""

    __slots__ = ("_gauge", "max_per_client", "max_total", "per_client", "total")

    def __init__(self, max_total: int, max_per_client: int, gauge: Gauge) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self._gauge = gauge
        self.per_client: dict[str, int] = {}
        """Open connections by peer IP address (no entry at 0)."""
        self.total = 0

    def admit(self, peer: str) -> Refusal | None:
        """Count a new connection from ``peer`` and return None, or return which cap it is
        over (and count nothing)."""
        if self.max_total and self.total >= self.max_total:
            return "total"
        n = self.per_client.get(peer, 0)
        if self.max_per_client and n >= self.max_per_client:
            return "per_client"
        self.per_client[peer] = n + 1
        self.total += 1
        self._gauge.inc()
        return None

    def release(self, peer: str) -> None:
        """An admitted connection from ``peer`` closed."""
        n = self.per_client.get(peer, 0) - 1
        if n > 0:
            self.per_client[peer] = n
        else:
            self.per_client.pop(peer, None)
        self.total -= 1
        self._gauge.dec()


def ensure_file_limit(needed: int) -> int:
    """Raise this process's soft limit on open files (``RLIMIT_NOFILE``) towards ``needed``,
    up to the hard limit, so the connection cap, not the file limit, is what refuses
    connections; returns the soft limit now. A limit still below ``needed`` is logged (past
    it, new connections wait in the listen backlog instead of getting 503)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed if soft == resource.RLIM_INFINITY else soft
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError):
        pass
    if soft < needed:
        log.warning(
            "gateway: the open-file limit (%d) is below what --max-connections needs (%d); "
            "raise it (ulimit -n) or lower --max-connections",
            soft,
            needed,
        )
    return soft
