"""The collectors' configuration keys: ``[otlp]``, ``[gpu]``, ``[nvml]`` and ``[prometheus]``."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.core.config_key import key


@dataclass(frozen=True)
class OtlpSettings:
    """``[otlp]``: the OTLP/HTTP and OTLP/gRPC receivers and the span normalizer."""

    host: str = key("127.0.0.1", "address the OTLP receivers listen on (0.0.0.0 for all)")
    http_port: int = key(
        4318, "OTLP/HTTP port (POST /v1/traces); 0 picks a free port", min=0, max=65535
    )
    grpc_port: int = key(4317, "OTLP/gRPC port; 0 picks a free port", min=0, max=65535)
    http_enabled: bool = key(True, "run the OTLP/HTTP receiver")
    grpc_enabled: bool = key(True, "run the OTLP/gRPC receiver")
    max_body_bytes: int = key(
        16 * 1024 * 1024, "largest accepted body, after gzip inflation", min=1024
    )
    max_inflight_bytes: int = key(
        4 * 1024 * 1024,
        "bytes of export bodies both receivers work on at once; more answers 503 before the "
        "body is read (one export of any size is taken when none is in flight); 4 MiB keeps "
        "the service under 400 MB under a flood, see docs/performance.md",
        min=1024,
    )
    retry_after_s: float = key(
        1.0,
        "Retry-After given to clients when ingest is overloaded (HTTP sends whole seconds, "
        "at least 1)",
        min=0.0,
        max=300.0,
    )
    pending_ttl_s: float = key(30.0, "how long child spans wait for their root span", min=0.1)
    root_wait_s: float = key(
        10.0,
        "how long a request's root span waits for a child another process exports (Ray "
        "Serve's replica span, sent in the replica's own batches) before its row is written "
        "without it; 0 = never wait",
        min=0.0,
    )
    grpc_workers: int = key(4, "threads serving OTLP/gRPC calls", min=1, max=64)


@dataclass(frozen=True)
class GpuSettings:
    """``[gpu]``: the last resorts of :class:`collectors.gpu_resolve.GpuResolver`."""

    model_gpu: dict[str, str] = key(
        {},
        "model -> GPU used when a span names no GPU and its "
        "pid is not in NVML's process list (env: 'm1=0,m2=1')",
    )
    default_gpu: str = key("", "GPU recorded when nothing else resolves it ('' = unknown)")


@dataclass(frozen=True)
class NvmlSettings:
    """``[nvml]``: the NVML poller (:class:`collectors.nvml.collector.NvmlCollector`)."""

    enabled: bool = key(True, "poll GPU and per-process counters through NVML when available")
    poll_interval_s: float = key(1.0, "NVML poll period", min=0.05, max=3600.0)
    process_interval_s: float = key(
        1.0,
        "read per-process samples at most this often (NVML makes them every 1/6-1 s; every "
        "sample since the last read is averaged, none is lost; never faster than the poll)",
        min=0.05,
        max=3600.0,
    )
    backoff_max_s: float = key(
        30.0, "longest wait between retries of a lost GPU or driver", min=0.1
    )
    host: str = key("", "host name recorded on samples ('' = this machine's host name)")


@dataclass(frozen=True)
class PrometheusSettings:
    """``[prometheus]``: the fleet path (:class:`collectors.prometheus.source.PrometheusSource`)."""

    url: str = key("", "Prometheus-compatible query URL for the fleet path ('' = not used)")
    required: bool = key(
        False,
        "refuse to start without url (central serve on a cluster, whose every series comes "
        "through Prometheus: an unset url is a miswiring, not single-node mode)",
    )
    agents_missing_after_s: float = key(
        600.0,
        "with url set: when Prometheus has held no series of any cotenant agent for this "
        "long, log an error and set cotenant_fleet_agents_missing to 1 (its scrape "
        "configuration or ServiceMonitor is not selected)",
        min=30.0,
    )
    timeout_s: float = key(10.0, "timeout of one PromQL query", min=0.1, max=600.0)
    scrape_interval_s: float = key(
        15.0,
        "scrape interval of the exporters' series (rate windows are at least 4x this)",
        min=0.1,
        max=3600.0,
    )
    agent_url_template: str = key(
        "http://{instance}",
        "URL of the cotenant agent that owns a series, for drill-down: {node} is the series' "
        "node label, {instance} its scrape target (host:port)",
    )
    agent_timeout_s: float = key(
        3.0, "timeout of one drill-down call to an agent", min=0.1, max=60.0
    )
    report_timeout_s: float = key(
        300.0,
        "timeout of one PromQL query of the weekly report (each reduces a day or a week of the "
        "whole fleet's minutes in Prometheus)",
        min=1.0,
        max=3600.0,
    )


@dataclass(frozen=True)
class ProcfsSettings:
    """``[procfs]``: host CPU per process, read by :mod:`collectors.procfs.collector` in serve."""

    enabled: bool = key(
        True,
        "sample host CPU per process from procfs (Linux), so CPU hogs that emit no spans "
        "can be named as a cpu cause",
    )
    interval_s: float = key(1.0, "procfs sample period", min=0.1, max=3600.0)
    top_n: int = key(
        10,
        "processes recorded per sample by CPU use (those that served spans are always recorded)",
        min=0,
        max=1000,
    )
    root: str = key(
        "/proc", "procfs mount to read (in a container: the host's /proc mounted, e.g. /host/proc)"
    )
    kubelet_pods: str = key(
        "",
        "this node's pod list, to name processes (NVML's and procfs') 'namespace/pod "
        "(container)': a URL (the API server's /api/v1/pods?fieldSelector=spec.nodeName=NODE, "
        "the kubelet's https://NODE:10250/pods or http://NODE:10255/pods) or a JSON file "
        "('' = name them by program; docs/fleet-reference.md, 'Culprits named as pods')",
    )
