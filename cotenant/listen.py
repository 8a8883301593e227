"""The service's listening sockets and the uvicorn server that serves them."""

from __future__ import annotations

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


class Server(uvicorn.Server):
    """uvicorn without its own signal capture: the service installs its handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


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


def url(sock: socket.socket, path: str = "") -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{path}"
