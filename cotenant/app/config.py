"""Configuration: one TOML file, every key with a default and a ``COTENANT_…`` override.

The table of keys is :class:`Config`: each section is a TOML table whose keys are the fields
of one package's settings dataclass (``store.settings.StoreSettings``,
``actuators.settings.ActuatorSettings``, …), each declared once, with its default, help and
bounds, by :func:`store.config_key.key`. ``[server]`` and ``[log]`` belong to the composition
root and are declared here. The environment variable for ``[section] key`` is
``COTENANT_SECTION_KEY`` (upper case). Precedence: default < file < environment. Every value
is cast and checked once, here; a bad key or value raises :class:`store.errors.ConfigError`
naming both.
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

from cotenant.actuators.settings import ActuatorSettings
from cotenant.alerts.settings import AlertSettings, RuleThresholds
from cotenant.analysis.settings import AnalysisSettings
from cotenant.collectors.settings import (
    GpuSettings,
    NvmlSettings,
    OtlpSettings,
    ProcfsSettings,
    PrometheusSettings,
)
from cotenant.core.config_key import key
from cotenant.core.errors import ConfigError
from cotenant.core.slos import Slos
from cotenant.dashboard.settings import DashboardSettings
from cotenant.reports.settings import ReportSettings
from cotenant.store.settings import StoreSettings

ENV_PREFIX = "COTENANT_"


@dataclass(frozen=True)
class ServerSettings:
    """``[server]``: where ``cotenant serve`` listens (read here, in the composition root)."""

    host: str = key("127.0.0.1", "address the HTTP API, /metrics and dashboard listen on")
    port: int = key(8050, "port of the HTTP API, /metrics and dashboard", min=0, max=65535)
    tls_cert_file: str = key(
        "",
        "PEM certificate (chain) to serve HTTPS with, on the API port and the OTLP/HTTP port, "
        "and TLS on OTLP/gRPC ('' = plain HTTP); needs tls_key_file",
    )
    tls_key_file: str = key("", "PEM private key of tls_cert_file")


@dataclass(frozen=True)
class AgentSettings:
    """``[agent]``: ``cotenant agent``, one per GPU node (read here, in the composition root)."""

    node: str = key(
        "",
        "node name on the agent's series and drill-down answers ('' = nvml.host, else "
        "this machine's host name)",
    )
    store: str = key("./.cotenant/agent.duckdb", "the agent's local DuckDB file (raw requests)")
    raw_retention_h: float = key(
        2.0, "hours the agent keeps raw requests and samples for drill-down", min=0.01
    )
    drill_max_range_h: float = key(
        24.0, "longest time range one drill-down query may cover", min=0.01, max=24 * 35
    )
    rollups: bool = key(
        False,
        "refresh per-minute rollups in the agent's store as serve does (central serve reads "
        "Prometheus, so by default the agent refreshes them only hourly, saving CPU)",
    )
    flush_interval_s: float = key(
        5.0,
        "store.flush_interval_s for the agent: how long its NVML and procfs samples, and the "
        "spooled exports (agent.spool), wait to be appended to its store together; samples "
        "are also on /metrics, the store keeps them only for drill-down",
        min=0.01,
    )
    spool: bool = key(
        True,
        "store.spool for the agent: durable exports are acknowledged once spooled to an fsync'd "
        "log and loaded into the store every flush_interval_s (a drill-down flushes first, so "
        "it sees every acknowledged request)",
    )


@dataclass(frozen=True)
class LogSettings:
    """``[log]``: the level the command line configures logging with."""

    level: str = key("info", "log level", choices=("debug", "info", "warning", "error"))
    format: str = key(
        "text",
        "text (one line per record) or json (one JSON object per line: ts, level, logger, "
        "message, and exc_info when there is one)",
        choices=("text", "json"),
    )


@dataclass(frozen=True)
class AuthSettings:
    """``[auth]``: bearer tokens of the HTTP API (read here, in the composition root;
    :mod:`cotenant.app.auth`). The act scope, the mutating actions API, is ``[actuators] token``."""

    token: str = key(
        "",
        "read scope: bearer token every endpoint but /healthz and /readyz requires (dashboard, "
        "/metrics, API reads, diagnose, alert webhook, the agent's drill-down; the browser "
        "sends it as the password of HTTP Basic auth) ('' = they answer anyone)",
        secret=True,
    )
    token_file: str = key("", "file holding the read token (used when token is '')")
    otlp_token: str = key(
        "",
        "ingest scope: bearer token the OTLP/HTTP and OTLP/gRPC receivers require (senders "
        "set OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>) ('' = they accept "
        "any sender)",
        secret=True,
    )
    otlp_token_file: str = key("", "file holding the ingest token (used when otlp_token is '')")


@dataclass(frozen=True)
class Config:
    """The whole configuration: one section per TOML table, each a package's settings."""

    server: ServerSettings = field(default_factory=ServerSettings)
    otlp: OtlpSettings = field(default_factory=OtlpSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    gpu: GpuSettings = field(default_factory=GpuSettings)
    nvml: NvmlSettings = field(default_factory=NvmlSettings)
    procfs: ProcfsSettings = field(default_factory=ProcfsSettings)
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    analysis: AnalysisSettings = field(default_factory=AnalysisSettings)
    actuators: ActuatorSettings = field(default_factory=ActuatorSettings)
    alerts: AlertSettings = field(default_factory=AlertSettings)
    rules: RuleThresholds = field(default_factory=RuleThresholds)
    dashboard: DashboardSettings = field(default_factory=DashboardSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    log: LogSettings = field(default_factory=LogSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)

    def slos(self, recorded: Mapping[str, float] | None = None) -> Slos:
        """Every model's SLOs, built once and handed to every reader of SLOs (detector,
        on-demand diagnosis, alert rules, report, actuators, dashboard): ``[analysis] slo_ms``
        / ``slo_ttft_ms`` / ``slo_tpot_ms``, and ``[rules] slo_default_ms`` for the end to end
        SLO of models not named. ``recorded``: e2e SLOs a store was analysed with
        (:mod:`cotenant.store.slo_record`), under the configured ones."""
        a = self.analysis
        return Slos.of_maps(
            {**(recorded or {}), **a.slo_ms},
            ttft=a.slo_ttft_ms,
            tpot=a.slo_tpot_ms,
            default_ms=self.rules.slo_default_ms,
        )

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {s.name: dataclasses.asdict(getattr(self, s.name)) for s in dataclasses.fields(self)}

    def to_toml(self) -> str:
        """The effective configuration as TOML, with each key's help as a comment; a secret
        that is set (a token, a signing key) is printed as ``"<hidden>"``, never in clear."""
        lines: list[str] = []
        for section in dataclasses.fields(self):
            lines.append(f"[{section.name}]")
            sub = getattr(self, section.name)
            for f in dataclasses.fields(sub):
                lines.append(f"# {f.metadata['help']}")
                value = getattr(sub, f.name)
                if f.metadata.get("secret") and value:
                    value = "<hidden>"
                lines.append(f"{f.name} = {_toml_value(value)}")
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
        for given_key in given:
            if given_key not in fdefs:
                raise ConfigError(
                    f"config key {sname}.{given_key}: unknown key "
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
