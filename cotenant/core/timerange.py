"""A time range of the reads: half-open, in integer nanoseconds UTC."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.core.errors import QueryError


@dataclass(frozen=True)
class TimeRange:
    """Half-open ``[since_ns, until_ns)``; either end may be open (None)."""

    since_ns: int | None = None
    until_ns: int | None = None

    def __post_init__(self) -> None:
        if (
            self.since_ns is not None
            and self.until_ns is not None
            and self.until_ns < self.since_ns
        ):
            raise QueryError("until is before since")
