"""One proxied request once its answer is complete: what the gateway's span sinks encode."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request the gateway answered. Times are Unix nanoseconds: arrival (``start_ns``),
    admission past the limits and queues (``admit_ns``), last byte out (``end_ns``) and, for
    an event stream, its first byte (``ttft_ns``, else None); ``path`` without the query
    string, at most 512 characters."""

    model: str
    replica: str
    tenant: str
    priority: int
    method: str
    path: str
    status: int
    start_ns: int
    admit_ns: int
    end_ns: int
    ttft_ns: int | None
