"""The service's listening sockets and the uvicorn server that serves them."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn


@dataclass(frozen=True)
class Endpoints:
    """Where the running service listens (ports resolved when 0 was configured)."""

    api: str
    otlp_http: str | None
    otlp_grpc: str | None


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Server(uvicorn.Server):
    """uvicorn without its own signal capture (the service installs its handlers), and
    without its 10 Hz tick: uvicorn's :meth:`main_loop` wakes the event loop every 0.1 s to
    see whether ``should_exit`` was set, a quarter of an idle agent's event-loop CPU. Here it
    wakes once a second (when uvicorn refreshes its ``date`` header anyway) or as soon as
    ``should_exit`` is set, from any thread."""

    _wake: asyncio.Future[None] | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _exit = False

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit = value
        loop, wake = self._loop, self._wake
        if value and loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(_resolve, wake)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def main_loop(self) -> None:
        """uvicorn's loop, ticking at 1 Hz: each tick counts as 10 of uvicorn's 0.1 s ones,
        so :meth:`on_tick` refreshes the ``date`` header on every tick, as it would every
        tenth; ``should_exit`` ends the wait at once."""
        loop = self._loop = asyncio.get_running_loop()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000
            wake = self._wake = loop.create_future()
            if self._exit:  # set before this future existed
                _resolve(wake)
            timer = loop.call_later(1.0, _resolve, wake)
            await wake
            timer.cancel()
            should_exit = await self.on_tick(counter)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto given explicitly: asyncio sets TCP_NODELAY on accepted sockets only when proto is
    # IPPROTO_TCP, and without it every keep-alive response waits ~40 ms for a delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(
            f"cannot listen on {host}:{port}: {exc.strerror} (is another "
            f"cotenant running? change the port in the config)"
        ) from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def url(sock: socket.socket, path: str = "", *, scheme: str = "http") -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}{path}"
