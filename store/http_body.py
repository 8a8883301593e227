"""Reading an HTTP request body under a size limit, for every receiver (OTLP/HTTP, the
Alertmanager webhook): a declared Content-Length over the limit is refused before anything is
read, and a streamed body is refused as soon as it passes the limit, so no client can make a
receiver hold more than ``limit`` bytes of one request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol


class BodyRequest(Protocol):
    """What is read of the request (Starlette's ``Request`` has it)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


async def read_body(
    request: BodyRequest, limit: int, too_large: Callable[[str], Exception], hint: str = ""
) -> bytes:
    """The whole body, or ``too_large(message)`` raised once it is over ``limit`` bytes;
    ``hint`` ends the message (what the client should do instead)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(f"body of {declared} bytes exceeds the {limit}-byte limit{hint}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"body exceeds the {limit}-byte limit{hint}")
        chunks.append(chunk)
    return b"".join(chunks)
