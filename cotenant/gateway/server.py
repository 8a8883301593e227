"""The gateway process: the proxy listener and the control API on one event loop.

::

    gw = Gateway(settings, registry=CollectorRegistry(), spans=span_sink_or_none)
    await gw.start()          # binds both ports (port 0 picks a free one)
    print(gw.listen_url, gw.control_url)
    await gw.stop()           # stops accepting, closes idle upstream connections
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator

import uvicorn
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry

from cotenant.gateway.admission import Admission
from cotenant.gateway.conn_caps import ConnectionCaps, ensure_file_limit
from cotenant.gateway.control import create_control_app
from cotenant.gateway.identify import Identifier
from cotenant.gateway.proxy import ClientConnection
from cotenant.gateway.request import ProxyCore
from cotenant.gateway.routing import Router
from cotenant.gateway.settings import GatewaySettings
from cotenant.gateway.telemetry import GatewayMetrics, ReplicaCollector, SpanEmitter, SpanSink
from cotenant.gateway.upstream import UpstreamPool


class _ControlServer(uvicorn.Server):
    """uvicorn without its signal handling: the gateway's owner decides when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Gateway:
    """See the module docstring. ``registry`` receives the metrics; ``spans`` (optional)
    receives every finished request, as does ``tracer`` (an OTel SDK tracer, wrapped in a
    :class:`SpanEmitter`) when ``spans`` is not given."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        registry: CollectorRegistry,
        tracer: Tracer | None = None,
        spans: SpanSink | None = None,
    ) -> None:
        s = settings
        self.settings = s
        self.registry = registry
        self.router = Router(s.routing_spec())
        self.admission = Admission(
            router=self.router,
            max_concurrency=s.max_concurrency,
            max_queue=s.max_queue,
            queue_timeout_s=s.queue_timeout_s,
            rate_wait_s=s.rate_wait_s,
            default_priority=s.default_priority,
        )
        init = s.initial
        for name, (rate, burst) in init.model_limits.items():
            self.admission.set_limit("models", name, rate, burst)
        for name, (rate, burst) in init.tenant_limits.items():
            self.admission.set_limit("tenants", name, rate, burst)
        for name, prio in init.model_priorities.items():
            self.admission.set_priority("models", name, prio)
        for name, prio in init.tenant_priorities.items():
            self.admission.set_priority("tenants", name, prio)
        self.metrics = GatewayMetrics(registry)
        registry.register(ReplicaCollector(self.router))
        self._spans = spans if spans is not None or tracer is None else SpanEmitter(tracer)
        self._proxy: asyncio.Server | None = None
        self._control: _ControlServer | None = None
        self._control_task: asyncio.Task[None] | None = None
        self._core: ProxyCore | None = None
        self.listen_url = ""
        self.control_url = ""

    async def start(self) -> None:
        """Bind both ports and start serving. Raises OSError when a port is taken."""
        s = self.settings
        loop = asyncio.get_running_loop()
        if s.max_connections:
            # one file per client connection and per upstream connection, and a reserve
            upstream = sum(
                r.max_in_flight or s.max_concurrency for r in self.router.replicas.values()
            )
            ensure_file_limit(s.max_connections + upstream + 64)
        for replica in self.router.replicas.values():
            replica.pool = UpstreamPool(
                replica.url,
                loop,
                connect_timeout_s=s.connect_timeout_s,
                max_idle=replica.max_in_flight or s.max_concurrency,
            )
        self._core = core = ProxyCore(
            admission=self.admission,
            identifier=Identifier(s.model_from, s.tenant_from),
            metrics=self.metrics,
            spans=self._spans,
            priority_field=s.priority_field,
            read_timeout_s=s.read_timeout_s,
            max_body_bytes=s.max_body_bytes,
            idle_timeout_s=s.idle_timeout_s,
            parser=s.http_parser,
            caps=ConnectionCaps(
                s.max_connections, s.max_connections_per_client, self.metrics.connections
            ),
        )
        proxy_sock = _bind(*s.listen)
        try:
            control_sock = _bind(*s.control)
        except OSError:
            proxy_sock.close()
            raise
        self._proxy = await loop.create_server(
            lambda: ClientConnection(core, loop), sock=proxy_sock
        )
        app = create_control_app(self.admission, s.token, self.registry)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", http="h11"
        )
        self._control = _ControlServer(config)
        self._control_task = loop.create_task(self._control.serve(sockets=[control_sock]))
        while not self._control.started:
            if self._control_task.done():
                self._control_task.result()  # raises what stopped it
                raise OSError("the control server stopped while starting")
            await asyncio.sleep(0.01)
        self.listen_url = _url(proxy_sock)
        self.control_url = _url(control_sock)

    async def stop(self, drain_s: float = 0.0) -> None:
        """Stop accepting connections, let the requests in progress finish for up to
        ``drain_s`` seconds, then drop every connection and close the upstream ones."""
        if self._proxy is not None:
            self._proxy.close()
        core = self._core
        if core is not None:
            deadline = asyncio.get_running_loop().time() + drain_s
            while any(c.busy for c in core.connections):
                if asyncio.get_running_loop().time() >= deadline:
                    break
                await asyncio.sleep(0.02)
            for conn in list(core.connections):
                conn.abort()
        if self._control is not None and self._control_task is not None:
            self._control.should_exit = True
            await self._control_task
        for replica in self.router.replicas.values():
            if replica.pool is not None:
                replica.pool.close()
        await asyncio.sleep(0)  # let the aborted transports finish closing
