"""What ``cotenant serve`` and ``cotenant agent`` print once they listen: where each endpoint
is, what runs and what does not, and how to point an OpenTelemetry exporter at it. The last
line (``listening api=... otlp_http=... otlp_grpc=...``) is for scripts and tests to parse."""

from __future__ import annotations

from cotenant.app.central import Central
from cotenant.app.config import Config
from cotenant.app.listen import Endpoints
from cotenant.collectors.nvml.collector import NvmlCollector
from cotenant.collectors.procfs.collector import ProcfsCollector


def startup_banner(
    config: Config,
    ep: Endpoints,
    *,
    role: str,
    node: str,
    store_path: str,
    central: Central | None,
    nvml: NvmlCollector | None,
    nvml_missing: str | None,
    procfs: ProcfsCollector | None,
) -> str:
    """The banner's lines, each ending in a newline."""
    if role == "agent":
        lines = [
            f"cotenant agent: node {node}, store {store_path}",
            f"  metrics    {ep.api}/metrics (drill-down {ep.api}/api/v1/slowest)",
        ]
    else:
        lines = [
            f"cotenant serve: store {store_path}",
            f"  HTTP API   {ep.api}/api/v1 (OpenAPI {ep.api}/docs, metrics {ep.api}/metrics)",
        ]
    if central is not None and central.fleet is not None:
        url = central.fleet.prometheus.url
        lines.append(f"  Prometheus {url} (fleet mode: windows read through PromQL)")
    if ep.otlp_http:
        lines.append(f"  OTLP/HTTP  {ep.otlp_http}")
    if ep.otlp_grpc:
        lines.append(f"  OTLP/gRPC  {ep.otlp_grpc}")
    if central is not None and central.dashboard is not None:
        lines.append(f"  Dashboard  {ep.api}/")
    if role == "agent" and not config.nvml.enabled:
        lines.append("  NVML       off (nvml.enabled = false): spans only, no GPU counters")
    elif nvml_missing is not None:
        lines.append(f"  NVML       NOT READY: {nvml_missing}")
    if nvml is not None:
        n = len(nvml.devices())
        lines.append(
            f"  NVML       {n} GPUs, polled every {nvml.poll_interval_s:g} s "
            f"(processes every {nvml.process_interval_s:g} s)"
        )
    if procfs is not None:
        p = procfs
        lines.append(
            f"  procfs     host CPU of the top {p.top_n} processes and every span-emitting "
            f"process, every {p.interval_s:g} s"
        )
    if central is not None and central.actions is not None:
        ac = config.actuators
        where = ac.backend_url or "no backend_url: proposals only"
        lines.append(f"  Actuators  mode {ac.mode}, backend {ac.backend} ({where})")
    if ep.otlp_http:
        base = ep.otlp_http.removesuffix("/v1/traces")
        lines.append("Point your OpenTelemetry exporter here, e.g.:")
        lines.append(f"  export OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={ep.otlp_http}")
        lines.append(
            f"  (or OTEL_EXPORTER_OTLP_ENDPOINT={base} OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"
        )
    lines.append(
        f"listening api={ep.api} otlp_http={ep.otlp_http or '-'} otlp_grpc={ep.otlp_grpc or '-'}"
    )
    return "\n".join(lines) + "\n"
