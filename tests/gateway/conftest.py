"""A real model-server stand-in (Starlette on uvicorn) and the gateway on free ports."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import pytest
import uvicorn
from gateway_thread import RunningGateway
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cotenant.gateway.identify import parse_source
from cotenant.gateway.settings import GatewaySettings

TOKEN = "test-token-0123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ModelServer:
    """What the stand-in model server saw, and the knobs tests turn."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    """JSON bodies in arrival order (``{"path":..., "body":..., "headers":...}``)."""
    stream_gate: threading.Event = field(default_factory=threading.Event)
    """The SSE endpoint sends its first event, then waits for this before the rest."""
    hold: threading.Event = field(default_factory=threading.Event)
    """``/v1/completions`` requests with ``"hold": true`` wait for this."""

    def reset(self) -> None:
        self.bodies.clear()
        self.stream_gate.clear()
        self.hold.clear()


def _model_server_app(rec: ModelServer) -> Starlette:
    async def record(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("latin-1")
        rec.bodies.append(
            {"path": request.url.path, "body": body, "headers": dict(request.headers)}
        )
        return body if isinstance(body, dict) else {}

    async def completions(request: Request) -> Response:
        body = await record(request)
        if body.get("hold"):
            while not rec.hold.is_set():
                await asyncio.sleep(0.005)
        if body.get("sleep"):
            await asyncio.sleep(float(body["sleep"]))
        return JSONResponse(
            {"object": "text_completion", "model": body.get("model"), "choices": [{"text": "hi"}]}
        )

    async def stream(request: Request) -> Response:
        await record(request)

        async def events() -> AsyncIterator[bytes]:
            yield b'data: {"token": "first"}\n\n'
            while not rec.stream_gate.is_set():
                await asyncio.sleep(0.005)
            for i in range(3):
                yield b'data: {"token": "t%d"}\n\n' % i
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def infer(request: Request) -> Response:
        await record(request)
        return JSONResponse({"model_name": request.path_params["model"], "outputs": []})

    async def models(_: Request) -> Response:
        return JSONResponse({"data": [{"id": "llama"}]})

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/stream", stream, methods=["POST"]),
            Route("/v2/models/{model}/infer", infer, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


@pytest.fixture(scope="session")
def model_server() -> Iterator[ModelServer]:
    rec = ModelServer()
    port = free_port()
    config = uvicorn.Config(
        _model_server_app(rec), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("model server did not start")
        time.sleep(0.01)
    rec.url = f"http://127.0.0.1:{port}"
    yield rec
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def start_gateway(model_server: ModelServer) -> Iterator[Callable[..., RunningGateway]]:
    """``start_gateway(**settings)`` runs a gateway in front of the model server."""
    running: list[RunningGateway] = []
    model_server.reset()

    def start(**kw: Any) -> RunningGateway:
        for key in ("model_from", "tenant_from"):
            if isinstance(kw.get(key), str):
                kw[key] = parse_source(kw[key], key)
        base = GatewaySettings(
            upstream=model_server.url,
            token=TOKEN,
            listen=("127.0.0.1", 0),
            control=("127.0.0.1", 0),
        )
        gw = RunningGateway(replace(base, **kw))
        running.append(gw)
        return gw

    yield start
    model_server.hold.set()
    model_server.stream_gate.set()
    for gw in running:
        gw.stop()


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_until(check: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``check`` until it is true (never a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def state(gw: RunningGateway) -> dict[str, Any]:
    r = httpx.get(f"{gw.control}/control/v1/state", headers=auth(), timeout=5)
    assert r.status_code == 200
    return dict(r.json())


@pytest.fixture
def replica_servers() -> Iterator[Any]:
    """Replica stand-ins (:class:`tests.gateway.replicas.ReplicaServers`)."""
    from tests.gateway.replicas import ReplicaServers

    servers = ReplicaServers()
    yield servers
    servers.close()
