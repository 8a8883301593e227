"""Service wiring for ``cotenant serve``: store, writer, OTLP receivers, HTTP API.

One process, one asyncio loop serving the API port and the OTLP/HTTP port through uvicorn
(requests are routed by the local port they arrived on), a gRPC server on its own threads,
the store's writer thread, the NVML poller's thread when ``nvml.enabled`` and NVML is
available (otherwise one warning, and no GPU counters), and the procfs sampler's thread (host
CPU per process) when ``procfs.enabled``. SIGTERM/SIGINT stop accepting, let in-flight
exports finish, stop the NVML poller and the procfs sampler, write everything acknowledged,
save child spans still waiting for their root, and close the store.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TextIO

import uvicorn
from prometheus_client import CollectorRegistry

from cotenant.analysis.loop import OnIncident
from cotenant.app.agent_api import create_agent_api
from cotenant.app.auth import GrpcTokenInterceptor, protect_api, protect_otlp
from cotenant.app.banner import startup_banner
from cotenant.app.build_info import register_process_series
from cotenant.app.central import Central, build_central
from cotenant.app.config import Config
from cotenant.app.credentials import grpc_credentials, load_tokens, tls_files
from cotenant.app.listen import Endpoints, Server, bind, url
from cotenant.collectors.fleet_histogram import FleetHistogram
from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.ingest_metrics import IngestMetrics
from cotenant.collectors.nvml.api import load_pynvml
from cotenant.collectors.nvml.collector import NvmlCollector
from cotenant.collectors.nvml.metrics import NvmlMetrics
from cotenant.collectors.otlp.admission import InflightBytes
from cotenant.collectors.otlp.grpc import OtlpGrpcServer
from cotenant.collectors.otlp.http import OtlpHttpReceiver
from cotenant.collectors.otlp.ingest import IngestPipeline
from cotenant.collectors.otlp.normalize import Normalizer
from cotenant.collectors.procfs.collector import ProcfsCollector, ProcfsMetrics
from cotenant.collectors.procfs.metrics import HostCpuGauge
from cotenant.collectors.procfs.pod_identity import KubeletPods, PodIdentity
from cotenant.core.errors import NvmlUnavailable
from cotenant.core.http_json import SafeJSONResponse
from cotenant.store.db import Store
from cotenant.store.maintenance import Maintenance
from cotenant.store.queries import pending_spans, replace_pending_spans
from cotenant.store.settings import StoreSettings
from cotenant.store.slo_record import record_slos
from cotenant.store.spool import Spool
from cotenant.store.writer import Writer

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]


Role = Literal["serve", "agent"]


class Service:
    """Everything ``cotenant serve`` runs. Construct, then :meth:`run` (blocks).

    ``role="agent"`` is ``cotenant agent``: the same collectors, store and receivers, with the
    agent's series on ``/metrics`` (:mod:`collectors.fleet_histogram`, GPU counters under DCGM
    names, host CPU per process) and its drill-down API (:mod:`cotenant.app.agent_api`), and no
    analysis, actuators, alerts, reports or dashboard. With ``[prometheus] url`` set, serve
    reads its windows through Prometheus (:mod:`cotenant.app.fleet`).
    """

    def __init__(
        self,
        config: Config,
        *,
        store: Store | None = None,
        registry: CollectorRegistry | None = None,
        nvml: Any | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        on_incident: OnIncident | None = None,
        role: Role = "serve",
    ) -> None:
        """``nvml``: the NVML surface to poll (default: ``pynvml``, imported only when
        ``nvml.enabled``); tests pass a :class:`collectors.nvml.fake.FakeNvml`.
        ``clock_ns``: the time NVML samples are stamped with and the analysis loop runs at
        (the demo passes the simulation's clock). ``on_incident`` hears every incident
        the analysis loop opens, updates or resolves."""
        self.config = config
        self.clock_ns = clock_ns
        self.tokens = load_tokens(config)
        self.tls = tls_files(config)
        sc = config.store
        self.store = store or Store(sc.path, memory_limit=sc.memory_limit, threads=sc.threads)
        # readers of this file after us (report, diagnose --store) see the SLOs we ran with
        record_slos(self.store, config.analysis.slo_ms)
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.role = role
        register_process_series(self.registry, role)
        self.node = config.agent.node or config.nvml.host or socket.gethostname()
        agent = role == "agent"
        self.fleet_histogram = FleetHistogram(self.node) if agent else None
        if self.fleet_histogram is not None:
            self.registry.register(self.fleet_histogram)  # its lock-wait counters
        self.metrics = IngestMetrics(self.registry, durations=self.fleet_histogram)
        self.host_cpu = HostCpuGauge() if agent else None
        if self.host_cpu is not None:
            self.registry.register(self.host_cpu)
        self.maintenance = Maintenance(
            self.store,
            rollup_interval_s=sc.rollup_interval_s,
            retention_interval_s=sc.retention_interval_s,
            raw_retention_h=sc.raw_retention_h,
            rollup_retention_days=sc.rollup_retention_days,
            incident_retention_days=sc.incident_retention_days,
        )
        self.writer = Writer(
            self.store,
            max_rows=sc.queue_max_rows,
            max_bytes=sc.queue_max_bytes,
            batch_rows=sc.batch_rows,
            flush_interval_s=sc.flush_interval_s,
            group_commit_s=sc.group_commit_s,
            retry_after_s=config.otlp.retry_after_s,
            maintenance=self.maintenance,
            observer=self.metrics,
            spool=self._open_spool(sc),
        )
        self.resolver = GpuResolver(config.gpu.model_gpu, config.gpu.default_gpu)
        self.normalizer = Normalizer(
            self.resolver,
            pending_ttl_s=config.otlp.pending_ttl_s,
            root_wait_s=config.otlp.root_wait_s,
        )
        restored = self.normalizer.import_pending(pending_spans(self.store))
        if restored:
            log.info("restored %d child spans waiting for their root", restored)
        self.pipeline = IngestPipeline(
            self.normalizer,
            self.writer,
            self.metrics,
            ack=sc.ack,
            ack_timeout_s=sc.ack_timeout_s,
            inflight=InflightBytes(config.otlp.max_inflight_bytes, config.otlp.retry_after_s),
        )
        self.metrics.bind_queue(
            lambda: self.writer.queued_rows,
            sc.queue_max_rows,
            lambda: self.normalizer.pending_spans,
            lambda: self.normalizer.waiting_roots,
        )
        self.metrics.bind_memory(
            lambda: self.writer.queued_bytes, lambda: self.pipeline.inflight_bytes
        )
        self.pods = self._open_pods()
        self._nvml_missing: str | None = None  # why NVML, enabled, could not be opened
        self.nvml = self._open_nvml(nvml) if config.nvml.enabled else None
        self.procfs = self._open_procfs() if config.procfs.enabled else None
        # decode + ingest of OTLP/HTTP exports: a pool of their own (threads start on demand),
        # a cheaper hand-off than anyio's; 40 as anyio's default, as each waits for its ack
        self._otlp_pool = ThreadPoolExecutor(40, thread_name_prefix="cotenant-otlp-http")
        self.otlp_http = OtlpHttpReceiver(
            self.pipeline, max_body_bytes=config.otlp.max_body_bytes, executor=self._otlp_pool
        )
        self._server: Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grpc: OtlpGrpcServer | None = None
        self._stopping = False
        self._otlp_port: int | None = None
        self.started = threading.Event()
        self.endpoints: Endpoints | None = None
        self.central: Central | None = None
        self._otlp_app: ASGIApp = protect_otlp(self.otlp_http.app, self.tokens)
        if agent:
            self.api = create_agent_api(
                self.store,
                self.registry,
                self._not_ready_reason,
                node=self.node,
                max_range_s=config.agent.drill_max_range_h * 3600,
                histogram=self.fleet_histogram,
                before_read=lambda: self.writer.flush(timeout_s=sc.ack_timeout_s),
            )
        else:
            self.central = build_central(
                config,
                self.store,
                self.registry,
                clock_ns=clock_ns,
                not_ready=self._not_ready_reason,
                on_incident=on_incident,
                read_token=self.tokens.read,
            )
            self.api = self.central.api
        self._api_app: ASGIApp = protect_api(self.api, self.tokens)

    def _open_spool(self, sc: StoreSettings) -> Spool | None:
        """The durable-ack spool beside the store file (``store.spool`` under ``ack =
        durable``; none for an in-memory store, whose rows do not outlive the process)."""
        if not sc.spool or sc.ack != "durable" or self.store.path == ":memory:":
            return None
        return Spool(Path(self.store.path + ".spool"))

    def _open_nvml(self, api: Any | None) -> NvmlCollector | None:
        """The NVML collector, opened; None (after one warning) where NVML is unavailable."""
        nc = self.config.nvml
        metrics = NvmlMetrics(self.registry, dcgm_names=self.role == "agent")
        try:
            collector = NvmlCollector(
                api if api is not None else load_pynvml(),
                sink=self.writer.submit,
                resolver=self.resolver,
                host=nc.host or socket.gethostname(),
                metrics=metrics,
                poll_interval_s=nc.poll_interval_s,
                process_interval_s=nc.process_interval_s,
                clock=self.clock_ns,
                backoff_max_s=nc.backoff_max_s,
                pods=self.pods,
            )
            collector.open()
        except NvmlUnavailable as exc:
            metrics.available.set(0)
            if self.role == "agent":
                self._nvml_missing = (
                    f"NVML is enabled but unavailable ({exc}): set nvml.enabled = false "
                    "to run the agent on spans only"
                )
                log.error("%s", self._nvml_missing)
            else:
                log.warning("%s. Running without GPU counters.", exc)
            return None
        return collector

    def _stop_collectors(self) -> None:
        if self.nvml is not None:
            self.nvml.stop()
        if self.procfs is not None:
            self.procfs.stop()

    def _open_procfs(self) -> ProcfsCollector | None:
        """The host CPU sampler; None (after one warning) where procfs cannot be read."""
        pc = self.config.procfs
        if not (Path(pc.root) / "self" / "stat").is_file():
            log.warning(
                "procfs.root %s is not a readable procfs: running without host CPU per "
                "process (set procfs.enabled = false to silence this)",
                pc.root,
            )
            return None
        gauge = self.host_cpu  # the agent exposes the rows it writes as a gauge
        return ProcfsCollector(
            sink=self.writer.submit if gauge is None else gauge.tee(self.writer.submit),
            resolver=self.resolver,
            host=self.config.nvml.host or socket.gethostname(),
            proc=pc.root,
            metrics=ProcfsMetrics(self.registry),
            clock=self.clock_ns,
            interval_s=pc.interval_s,
            top_n=pc.top_n,
            pods=self.pods,
        )

    def _open_pods(self) -> PodIdentity | None:
        """Names of processes in Kubernetes pods, from ``procfs.root``'s cgroups and the
        kubelet's pod list at ``procfs.kubelet_pods``; None when that is ''."""
        pc = self.config.procfs
        if not pc.kubelet_pods:
            return None
        return PodIdentity(KubeletPods(pc.kubelet_pods), proc=pc.root)

    def _not_ready_reason(self) -> str | None:
        if self._stopping:
            return "shutting down"
        if not self.writer.alive:
            return "store writer is not running"
        if self.writer.full:
            return "writer queue is full"
        return self._nvml_missing

    async def _dispatch(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and ".." in str(scope.get("path", "")).split("/"):
            # no route takes a parent segment; the dashboard's asset routes would 500 on one
            refusal = SafeJSONResponse({"error": "path: '..' segments are not allowed"}, 400)
            await refusal(scope, receive, send)
            return
        server = scope.get("server")
        if server is not None and self._otlp_port is not None and server[1] == self._otlp_port:
            await self._otlp_app(scope, receive, send)
        else:
            await self._api_app(scope, receive, send)

    def run(self, banner: TextIO | None = sys.stdout) -> None:
        """Serve until :meth:`stop`, SIGTERM or SIGINT; then shut down cleanly."""
        asyncio.run(self._serve(banner))

    def stop(self) -> None:
        """Ask the running service to shut down (thread-safe)."""
        self._stopping = True
        loop, server = self._loop, self._server
        if loop is not None and server is not None:
            loop.call_soon_threadsafe(setattr, server, "should_exit", True)

    async def _serve(self, banner: TextIO | None) -> None:
        cfg = self.config
        socks = [bind(cfg.server.host, cfg.server.port)]
        try:
            if cfg.otlp.http_enabled:
                socks.append(bind(cfg.otlp.host, cfg.otlp.http_port))
                self._otlp_port = socks[1].getsockname()[1]
            if cfg.otlp.grpc_enabled:
                self._grpc = OtlpGrpcServer(
                    self.pipeline,
                    host=cfg.otlp.host,
                    port=cfg.otlp.grpc_port,
                    max_message_bytes=cfg.otlp.max_body_bytes,
                    workers=cfg.otlp.grpc_workers,
                    interceptors=[
                        GrpcTokenInterceptor(self.tokens.ingest, self.tokens.others("ingest"))
                    ]
                    if self.tokens.ingest
                    else [],
                    credentials=None if self.tls is None else grpc_credentials(*self.tls),
                )
                self._grpc.start()
        except OSError:
            for s in socks:
                s.close()
            self._stop_collectors()
            self._shutdown_store()
            raise
        ucfg = uvicorn.Config(
            self._dispatch,
            interface="asgi3",
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=10,
            log_level=cfg.log.level,
            ssl_certfile=None if self.tls is None else self.tls[0],
            ssl_keyfile=None if self.tls is None else self.tls[1],
        )
        self._server = Server(ucfg)
        self._loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self.stop)
        grpc_addr = None if self._grpc is None else f"{cfg.otlp.host}:{self._grpc.port}"
        scheme = "http" if self.tls is None else "https"
        self.endpoints = Endpoints(
            url(socks[0], scheme=scheme),
            url(socks[1], "/v1/traces", scheme=scheme) if len(socks) > 1 else None,
            grpc_addr,
        )
        central = self.central
        if central is not None and central.dashboard is not None and self.endpoints.otlp_http:
            central.dashboard.otlp_hint = self.endpoints.otlp_http
        if self.nvml is not None:
            self.nvml.start()
        if self.procfs is not None:
            self.procfs.start()
        if central is not None:
            central.start()
        if banner is not None:
            banner.write(
                startup_banner(
                    self.config,
                    self.endpoints,
                    role=self.role,
                    node=self.node,
                    store_path=self.store.path,
                    central=self.central,
                    nvml=self.nvml,
                    nvml_missing=self._nvml_missing,
                    procfs=self.procfs,
                )
            )
            banner.flush()
        self.started.set()
        try:
            if self._stopping:
                self._server.should_exit = True
            await self._server.serve(sockets=socks)
        finally:
            self._stopping = True
            for s in socks:
                s.close()
            await asyncio.get_running_loop().run_in_executor(None, self._shutdown)

    def _shutdown(self) -> None:
        t0 = time.monotonic()
        # the server has answered (or given up on) every export: idle workers exit now, one
        # still waiting for an acknowledgement when it is done
        self._otlp_pool.shutdown(wait=False, cancel_futures=True)
        if self._grpc is not None:
            self._grpc.stop(grace_s=5.0).wait(10.0)
        if self.central is not None:
            self.central.stop()
        self._stop_collectors()  # its last rows go to the writer before it closes
        if self.central is not None:
            self.central.close()
        self._shutdown_store()
        log.info("cotenant stopped in %.1f s", time.monotonic() - t0)

    def _shutdown_store(self) -> None:
        self.pipeline.flush()  # the rows of roots still waiting for another process's child
        self.writer.close()
        try:
            replace_pending_spans(self.store, self.normalizer.export_pending(), time.time_ns())
        except Exception as exc:  # losing pending children must not lose the rest
            log.error("could not save pending child spans: %s", exc)
        self.store.close()
