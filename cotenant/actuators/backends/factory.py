"""Builds the backend the ``[actuators]`` config names."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from cotenant.actuators.backend import Backend
from cotenant.actuators.backends.gateway import GatewayBackend
from cotenant.actuators.backends.haproxy import HaproxyBackend, SocketRuntimeApi
from cotenant.actuators.backends.http import HttpCaller
from cotenant.actuators.backends.rayserve import RayServeBackend
from cotenant.actuators.backends.triton import TritonBackend
from cotenant.actuators.backends.webhook import WebhookBackend
from cotenant.actuators.settings import ActuatorSettings
from cotenant.core.errors import BackendError, ConfigError


def read_secret(value: str, file: str, key: str) -> str:
    """``value`` when set, else the stripped contents of ``file`` (ConfigError naming ``key``
    when it cannot be read), else ''."""
    if value:
        return value
    if not file:
        return ""
    try:
        return Path(file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config key {key}: cannot read {file!r}: {exc}") from exc


def ray_token(env: Mapping[str, str]) -> str:
    """The Ray dashboard's bearer token found the way Ray's own clients find it (Ray 2.60
    turns token authentication on for a cluster ``ray.init`` starts, and for ``ray start``
    once a token exists): ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names,
    else ``$HOME/.ray/auth_token`` when it exists; '' when there is none. ConfigError when
    ``RAY_AUTH_TOKEN_PATH`` names a file that cannot be read."""
    if env.get("RAY_AUTH_TOKEN"):
        return env["RAY_AUTH_TOKEN"].strip()
    if env.get("RAY_AUTH_TOKEN_PATH"):
        return read_secret("", env["RAY_AUTH_TOKEN_PATH"], "RAY_AUTH_TOKEN_PATH (environment)")
    home = env.get("HOME")
    default = Path(home) / ".ray" / "auth_token" if home else None
    if default is not None and default.is_file():
        return read_secret("", str(default), "$HOME/.ray/auth_token")
    return ""


def make_backend(cfg: ActuatorSettings, env: Mapping[str, str] | None = None) -> Backend:
    """The backend ``cfg.backend`` names (``cfg``: the ``[actuators]`` keys).

    Raises ConfigError for a missing ``backend_url`` / ``webhook_secret`` (the simulator
    backend is built by ``cotenant bench --actuate``, not from config)."""
    env = os.environ if env is None else env
    kind = cfg.backend
    if not cfg.backend_url:
        raise ConfigError(
            f"config key actuators.backend_url: bad value '': the {kind} backend needs its URL"
        )
    if kind == "haproxy":
        try:
            api = SocketRuntimeApi(
                cfg.backend_url, timeout_s=cfg.backend_timeout_s, retries=cfg.backend_retries
            )
        except BackendError as exc:
            raise ConfigError(f"config key actuators.backend_url: {exc}") from exc
        return HaproxyBackend(api, backends=cfg.haproxy_backends)
    headers: dict[str, str] = {}
    if kind in ("gateway", "rayserve"):
        token = read_secret("", cfg.backend_token_file, "actuators.backend_token_file") or (
            env.get("COTENANT_GATEWAY_TOKEN", "") if kind == "gateway" else ray_token(env)
        )
        if token:
            headers["Authorization"] = f"Bearer {token}"
    try:
        http = HttpCaller(
            kind,
            cfg.backend_url,
            timeout_s=cfg.backend_timeout_s,
            retries=cfg.backend_retries,
            headers=headers,
        )
    except BackendError as exc:
        raise ConfigError(f"config key actuators.backend_url: {exc}") from exc
    if kind == "gateway":
        return GatewayBackend(http)
    if kind == "rayserve":
        return RayServeBackend(http)
    if kind == "triton":
        return TritonBackend(http)
    if kind == "webhook":
        if not cfg.webhook_secret:
            raise ConfigError(
                "config key actuators.webhook_secret: bad value '': the webhook backend signs "
                "its bodies and needs a secret"
            )
        return WebhookBackend(http, cfg.webhook_secret)
    raise ConfigError(f"config key actuators.backend: bad value {kind!r}: unknown backend")
