"""Configuration: one TOML file, every key with a default and a ``COTENANT_…`` override.

The table of keys is the set of dataclass fields below; each section is a TOML table and each
field a key. The environment variable for ``[section] key`` is ``COTENANT_SECTION_KEY``
(upper case). Precedence: default < file < environment. Every value is cast and checked once,
here; a bad key or value raises :class:`store.errors.ConfigError` naming both.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from store.errors import ConfigError

ENV_PREFIX = "COTENANT_"


def _key(
    default: Any,
    help: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A config key: its default, a one-line help and its bounds."""
    meta = {"help": help, "min": min, "max": max, "choices": choices}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ServerConfig:
    host: str = _key("127.0.0.1", "address the HTTP API, /metrics and dashboard listen on")
    port: int = _key(8050, "port of the HTTP API, /metrics and dashboard", min=0, max=65535)


@dataclass(frozen=True)
class OtlpConfig:
    host: str = _key("127.0.0.1", "address the OTLP receivers listen on (0.0.0.0 for all)")
    http_port: int = _key(
        4318, "OTLP/HTTP port (POST /v1/traces); 0 picks a free port", min=0, max=65535
    )
    grpc_port: int = _key(4317, "OTLP/gRPC port; 0 picks a free port", min=0, max=65535)
    http_enabled: bool = _key(True, "run the OTLP/HTTP receiver")
    grpc_enabled: bool = _key(True, "run the OTLP/gRPC receiver")
    max_body_bytes: int = _key(
        16 * 1024 * 1024, "largest accepted body, after gzip inflation", min=1024
    )
    retry_after_s: float = _key(
        1.0, "Retry-After given to clients when the writer queue is full", min=0.0, max=300.0
    )
    pending_ttl_s: float = _key(30.0, "how long child spans wait for their root span", min=0.1)
    grpc_workers: int = _key(4, "threads serving OTLP/gRPC calls", min=1, max=64)


@dataclass(frozen=True)
class StoreConfig:
    path: str = _key("./.cotenant/cotenant.duckdb", "the embedded DuckDB file")
    queue_max_rows: int = _key(
        500_000, "rows the writer queue holds before ingest answers 429", min=1
    )
    batch_rows: int = _key(50_000, "rows the writer appends in one Arrow batch", min=1)
    flush_interval_s: float = _key(0.5, "longest time a row waits in the queue", min=0.01)
    memory_limit: str = _key(
        "128MB",
        "DuckDB memory_limit: its buffer pool (queries spill to disk past it); 128MB keeps "
        "the service under 300 MB resident with 1M requests stored, see docs/performance.md",
    )
    threads: int = _key(1, "DuckDB worker threads", min=1, max=256)
    raw_retention_h: float = _key(24.0, "hours raw requests and samples are kept", min=0.01)
    rollup_retention_days: float = _key(35.0, "days per-minute rollups are kept", min=0.01)
    incident_retention_days: float = _key(
        90.0, "days incidents, actions and audit are kept", min=0.01
    )
    rollup_interval_s: float = _key(10.0, "how often per-minute rollups are refreshed", min=0.1)
    retention_interval_s: float = _key(300.0, "how often expired rows are deleted", min=1.0)


@dataclass(frozen=True)
class GpuConfig:
    model_gpu: dict[str, str] = _key(
        {},
        "model -> GPU used when a span names no GPU and its "
        "pid is not in NVML's process list (env: 'm1=0,m2=1')",
    )
    default_gpu: str = _key("", "GPU recorded when nothing else resolves it ('' = unknown)")


@dataclass(frozen=True)
class NvmlConfig:
    enabled: bool = _key(True, "poll GPU and per-process counters through NVML when available")
    poll_interval_s: float = _key(1.0, "NVML poll period", min=0.05, max=3600.0)
    process_interval_s: float = _key(
        1.0,
        "read per-process samples at most this often (NVML makes them every 1/6-1 s; every "
        "sample since the last read is averaged, none is lost; never faster than the poll)",
        min=0.05,
        max=3600.0,
    )
    backoff_max_s: float = _key(
        30.0, "longest wait between retries of a lost GPU or driver", min=0.1
    )
    host: str = _key("", "host name recorded on samples ('' = this machine's host name)")


@dataclass(frozen=True)
class ProcfsConfig:
    enabled: bool = _key(
        True,
        "sample host CPU per process from procfs (Linux), so CPU hogs that emit no spans "
        "can be named as a cpu cause",
    )
    interval_s: float = _key(1.0, "procfs sample period", min=0.1, max=3600.0)
    top_n: int = _key(
        10,
        "processes recorded per sample by CPU use (those that served spans are always recorded)",
        min=0,
        max=1000,
    )
    root: str = _key(
        "/proc", "procfs mount to read (in a container: the host's /proc mounted, e.g. /host/proc)"
    )


@dataclass(frozen=True)
class PrometheusConfig:
    url: str = _key("", "Prometheus-compatible query URL for the fleet path ('' = not used)")
    timeout_s: float = _key(10.0, "timeout of one PromQL query", min=0.1, max=600.0)
    scrape_interval_s: float = _key(
        15.0,
        "scrape interval of the exporters' series (rate windows are at least 4x this)",
        min=0.1,
        max=3600.0,
    )


@dataclass(frozen=True)
class AnalysisConfig:
    enabled: bool = _key(True, "run spike detection and attribution continuously in serve")
    interval_s: float = _key(5.0, "how often the continuous loop re-diagnoses", min=0.1)
    horizon_s: float = _key(600.0, "how far back each pass looks for incidents", min=10.0)
    step_s: float = _key(1.0, "window width", min=0.1, max=3600.0)
    slo_ms: dict[str, float] = _key({}, "p99 latency SLO per model in ms (env: 'tts=100,chat=400')")
    max_range_h: float = _key(24.0, "longest range one on-demand diagnosis may cover", min=0.01)
    season_s: float = _key(
        86400.0,
        "latency cycle learned by on-demand diagnoses (API, CLI, alerts) that read 2 cycles of "
        "history, when one cycle is at most 10,080 windows of their step (a day needs a step "
        ">= 8.6 s); the live loop does not use it (0 = no seasonal baseline)",
        min=0.0,
    )
    reread_s: float = _key(
        30.0,
        "how far back each pass re-reads (must exceed ingest lag: late rows older than "
        "this are not seen by the continuous loop)",
        min=1.0,
    )


@dataclass(frozen=True)
class ActuatorsConfig:
    mode: str = _key(
        "dry-run",
        "off: no proposals; dry-run: proposals recorded, nothing applied; manual: a person "
        "approves; auto: applied by the loop",
        choices=("off", "dry-run", "manual", "auto"),
    )
    token: str = _key(
        "", "bearer token the mutating actions API requires ('' = mutating calls refused)"
    )
    token_file: str = _key("", "file holding the bearer token (used when token is '')")
    policy: str = _key(
        "", "policy file mapping causes to actions ('' = the bundled rules/policy.yaml)"
    )
    backend: str = _key(
        "gateway",
        "where actions are applied",
        choices=("gateway", "rayserve", "triton", "webhook"),
    )
    backend_url: str = _key(
        "", "base URL of the backend (gateway control API, Ray, Triton, webhook)"
    )
    webhook_secret: str = _key("", "HMAC-SHA256 key signing webhook bodies")
    backend_token_file: str = _key(
        "",
        "file holding the bearer token of the backend's control API (gateway; '' = "
        "COTENANT_GATEWAY_TOKEN, or none)",
    )
    interval_s: float = _key(5.0, "how often the control loop advances actions", min=0.1)
    max_actions_per_hour: int = _key(10, "most actions applied per hour overall", min=0)
    max_actions_per_target_per_hour: int = _key(3, "most actions per target per hour", min=0)
    cooldown_s: float = _key(300.0, "quiet time per target after a change ends", min=0.0)
    settle_s: float = _key(30.0, "wait after applying before verifying", min=0.0)
    ttl_s: float = _key(1800.0, "an applied change is reverted after this long", min=1.0)
    min_rate_rps: float = _key(1.0, "floor under any rate limit set on a model", min=0.0)
    backend_timeout_s: float = _key(5.0, "timeout of one backend call", min=0.1, max=300.0)
    backend_retries: int = _key(3, "retries of a failed backend call (with backoff)", min=0)


@dataclass(frozen=True)
class AlertsConfig:
    enabled: bool = _key(True, "accept Alertmanager webhooks at POST /api/v1/alerts")
    lookback_s: float = _key(
        600.0, "how far before an alert's startsAt its diagnosis looks", min=10.0
    )
    lookahead_s: float = _key(
        120.0, "how far after startsAt its diagnosis looks (capped at now)", min=0.0
    )


@dataclass(frozen=True)
class RulesConfig:
    slo_default_ms: float = _key(
        0.0, "p99 SLO for models not in analysis.slo_ms (0 = no SLO alert for them)", min=0.0
    )
    dram_saturated: float = _key(
        0.9, "DRAM (memory-bandwidth) utilisation counted as saturated (0-1)", min=0.0, max=1.0
    )
    pcie_saturated_bps: float = _key(
        20e9, "PCIe throughput (TX+RX bytes/s) counted as saturated", min=0.0
    )
    lock_wait_share: float = _key(
        0.3, "share of a model's latency spent waiting on locks that alerts", min=0.0, max=1.0
    )
    memory_pressure: float = _key(
        0.95, "GPU memory used / total that counts as pressure", min=0.0, max=1.0
    )
    for_s: float = _key(60.0, "how long a condition must hold before its alert fires", min=0.0)
    runbook_base_url: str = _key(
        "https://github.com/cotenant/cotenant/blob/main/docs/runbooks.md",
        "base of the runbook_url annotations",
    )


@dataclass(frozen=True)
class DashboardConfig:
    enabled: bool = _key(True, "serve the Dash dashboard on the API port")
    refresh_s: float = _key(5.0, "how often live pages refresh", min=0.5, max=3600.0)
    default_range: str = _key("1h", "time range pages open with (e.g. 15m, 1h, 6h, 24h, 7d)")


@dataclass(frozen=True)
class ReportConfig:
    dir: str = _key("./.cotenant/reports", "where weekly reports are written")
    schedule: str = _key("", "weekly run inside serve, e.g. 'mon 06:00' (UTC; '' = not scheduled)")
    formats: str = _key("html,md", "formats written by the schedule (html, md, pdf)")
    dashboard_url: str = _key(
        "", "dashboard base URL linked from reports ('' = the server's own address)"
    )


@dataclass(frozen=True)
class LogConfig:
    level: str = _key("info", "log level", choices=("debug", "info", "warning", "error"))


@dataclass(frozen=True)
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    otlp: OtlpConfig = field(default_factory=OtlpConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    nvml: NvmlConfig = field(default_factory=NvmlConfig)
    procfs: ProcfsConfig = field(default_factory=ProcfsConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    actuators: ActuatorsConfig = field(default_factory=ActuatorsConfig)
    alerts: AlertsConfig = field(default_factory=AlertsConfig)
    rules: RulesConfig = field(default_factory=RulesConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {s.name: dataclasses.asdict(getattr(self, s.name)) for s in dataclasses.fields(self)}

    def to_toml(self) -> str:
        """The effective configuration as TOML, with each key's help as a comment."""
        lines: list[str] = []
        for section in dataclasses.fields(self):
            lines.append(f"[{section.name}]")
            sub = getattr(self, section.name)
            for f in dataclasses.fields(sub):
                lines.append(f"# {f.metadata['help']}")
                lines.append(f"{f.name} = {_toml_value(getattr(sub, f.name))}")
            lines.append("")
        return "\n".join(lines)


def keys_markdown() -> str:
    """A Markdown table of every key, its environment variable, default and meaning."""
    rows = ["| key | environment | default | meaning |", "|---|---|---|---|"]
    defaults = Config()
    for section in dataclasses.fields(defaults):
        sub = getattr(defaults, section.name)
        for f in dataclasses.fields(sub):
            env = f"{ENV_PREFIX}{section.name.upper()}_{f.name.upper()}"
            default = _toml_value(getattr(sub, f.name))
            rows.append(
                f"| `{section.name}.{f.name}` | `{env}` | `{default}` | {f.metadata['help']} |"
            )
    return "\n".join(rows) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_str(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return _toml_str(str(v))


def _toml_str(s: str) -> str:
    # TOML basic strings may not hold raw control characters (a tab or newline in a path
    # would make `config show` print TOML that does not parse): escape them as \uXXXX.
    out = s.replace("\\", "\\\\").replace('"', '\\"')
    out = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c for c in out)
    return '"' + out + '"'


def _section_types() -> dict[str, type]:
    return {f.name: f.default_factory for f in dataclasses.fields(Config)}  # type: ignore[misc]


def _cast(name: str, f: dataclasses.Field[Any], raw: Any, from_env: bool) -> Any:
    """Cast ``raw`` to the field's type and check its bounds, or raise ConfigError."""
    typ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    shown = repr(raw)
    try:
        if typ == "bool":
            if isinstance(raw, bool):
                value: Any = raw
            elif from_env and str(raw).lower() in ("1", "true", "yes", "on"):
                value = True
            elif from_env and str(raw).lower() in ("0", "false", "no", "off"):
                value = False
            else:
                raise ValueError("expected true or false")
        elif typ == "int":
            if isinstance(raw, bool) or not (isinstance(raw, int) or from_env):
                raise ValueError("expected an integer")
            value = int(raw)
        elif typ == "float":
            if isinstance(raw, bool) or not (isinstance(raw, int | float) or from_env):
                raise ValueError("expected a number")
            value = float(raw)
            # NaN slips past every bound check and inf overflows the int conversions later.
            if not math.isfinite(value):
                raise ValueError("expected a finite number")
        elif typ == "str":
            if not isinstance(raw, str):
                raise ValueError("expected a string")
            value = raw
        elif typ == "dict[str, float]":
            value = _float_map(_cast_map(raw, from_env, numbers=True))
        elif typ.startswith("dict"):
            value = _cast_map(raw, from_env)
        else:  # pragma: no cover - a new field type must be added here
            raise ValueError(f"unsupported config type {typ}")
    except ValueError as exc:
        raise ConfigError(f"config key {name}: bad value {shown}: {exc}") from exc
    meta = f.metadata
    if meta.get("min") is not None and value < meta["min"]:
        raise ConfigError(f"config key {name}: bad value {shown}: must be >= {meta['min']}")
    if meta.get("max") is not None and value > meta["max"]:
        raise ConfigError(f"config key {name}: bad value {shown}: must be <= {meta['max']}")
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(
            f"config key {name}: bad value {shown}: must be one of {', '.join(meta['choices'])}"
        )
    return value


def _float_map(m: dict[str, str]) -> dict[str, float]:
    out = {}
    for k, v in m.items():
        try:
            f = float(v)
        except ValueError:
            f = math.nan
        if not (math.isfinite(f) and f > 0):
            raise ValueError(f"value for {k!r} must be a positive number, got {v!r}")
        out[k] = f
    return out


def _cast_map(raw: Any, from_env: bool, numbers: bool = False) -> dict[str, str]:
    if from_env and isinstance(raw, str):
        out: dict[str, str] = {}
        for item in filter(None, (p.strip() for p in raw.split(","))):
            k, sep, v = item.partition("=")
            if not sep or not k.strip() or not v.strip():
                raise ValueError(f"expected 'key=value,…', got item {item!r}")
            out[k.strip()] = v.strip()
        return out
    if not isinstance(raw, Mapping):
        raise ValueError("expected a table of key = value")
    for k, v in raw.items():
        allowed = (str, int, float) if numbers else (str, int)
        if not isinstance(v, allowed) or isinstance(v, bool):
            kinds = "a string or a number" if numbers else "a string or an integer"
            raise ValueError(f"value for {k!r} must be {kinds}")
    return {str(k): str(v) for k, v in raw.items()}


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Read defaults, then ``path`` (TOML) if given, then ``COTENANT_…`` variables from ``env``.

    Raises ConfigError for a missing or unparsable file, an unknown section or key, a value of
    the wrong type or out of bounds, and an unknown ``COTENANT_`` variable.
    """
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {p} does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {p} cannot be read: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc
    sections = _section_types()
    for name, value in data.items():
        if name not in sections:
            raise ConfigError(f"config key {name}: unknown section (known: {', '.join(sections)})")
        if not isinstance(value, dict):
            raise ConfigError(f"config key {name}: bad value {value!r}: expected a [{name}] table")
    env_keys = {k for k in env if k.startswith(ENV_PREFIX)}
    built: dict[str, Any] = {}
    for sname, stype in sections.items():
        fdefs = {f.name: f for f in dataclasses.fields(stype)}
        given = data.get(sname, {})
        for key in given:
            if key not in fdefs:
                raise ConfigError(
                    f"config key {sname}.{key}: unknown key "
                    f"(known in [{sname}]: {', '.join(fdefs)})"
                )
        values: dict[str, Any] = {}
        for fname, f in fdefs.items():
            full = f"{sname}.{fname}"
            env_name = f"{ENV_PREFIX}{sname.upper()}_{fname.upper()}"
            if env_name in env:
                env_keys.discard(env_name)
                values[fname] = _cast(f"{full} (from {env_name})", f, env[env_name], True)
            elif fname in given:
                values[fname] = _cast(full, f, given[fname], False)
        built[sname] = stype(**values)
    for stray in sorted(env_keys):
        if stray in _NON_CONFIG_ENV:
            continue
        raise ConfigError(
            f"environment variable {stray}: not a cotenant config key "
            "(run 'cotenant config show' to list the keys)"
        )
    return Config(**built)


# COTENANT_ variables that are read elsewhere, not config keys.
_NON_CONFIG_ENV = frozenset({"COTENANT_CONFIG", "COTENANT_GATEWAY_TOKEN"})
