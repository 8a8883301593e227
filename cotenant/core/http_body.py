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


def declared_length(headers: Mapping[str, str]) -> int | None:
    """The Content-Length header as an int, or None when absent or not a plain decimal
    (``isdigit`` alone lets ``²`` through, and ``int`` refuses 5,000-digit strings)."""
    v = headers.get("content-length")
    if v is None or not (0 < len(v) <= 18 and v.isascii() and v.isdigit()):
        return None
    return int(v)


async def read_body(
    request: BodyRequest,
    limit: int,
    too_large: Callable[[str], Exception],
    hint: str = "",
    on_chunk: Callable[[int], None] | None = None,
) -> bytes:
    """The whole body, or ``too_large(message)`` raised once it is over ``limit`` bytes;
    ``hint`` ends the message (what the client should do instead). ``on_chunk(n)`` is called
    with each chunk's size before it is kept (it may raise to stop reading: a memory budget
    for bodies of undeclared length)."""
    declared = declared_length(request.headers)
    if declared is not None and declared > limit:
        raise too_large(f"body of {declared} bytes exceeds the {limit}-byte limit{hint}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(f"body exceeds the {limit}-byte limit{hint}")
        if on_chunk is not None:
            on_chunk(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)
