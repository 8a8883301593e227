"""What the service authenticates with, read once at start: the bearer token of each scope
(:mod:`cotenant.app.auth`) and the TLS certificate and key of ``[server]``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cotenant.actuators.backends.factory import read_secret
from cotenant.app.auth import Tokens
from cotenant.app.config import Config
from cotenant.core.errors import ConfigError


def load_tokens(config: Config) -> Tokens:
    """The bearer token of each scope (:mod:`cotenant.app.auth`), read once, at start."""
    a, ac = config.auth, config.actuators
    return Tokens(
        read=read_secret(a.token, a.token_file, "auth.token_file"),
        act=read_secret(ac.token, ac.token_file, "actuators.token_file"),
        ingest=read_secret(a.otlp_token, a.otlp_token_file, "auth.otlp_token_file"),
    )


def tls_files(config: Config) -> tuple[str, str] | None:
    """``(certificate, key)`` files of ``[server] tls_cert_file`` / ``tls_key_file``, checked
    readable at start; None when TLS is off. ConfigError naming the key otherwise."""
    cert, key = config.server.tls_cert_file, config.server.tls_key_file
    if not cert and not key:
        return None
    if not cert or not key:
        missing = "server.tls_cert_file" if not cert else "server.tls_key_file"
        raise ConfigError(
            f"config key {missing}: empty, but TLS needs both the certificate and the key"
        )
    for name, path in (("server.tls_cert_file", cert), ("server.tls_key_file", key)):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config key {name}: cannot read {path!r}: {exc}") from exc
        if "-----BEGIN " not in text:
            raise ConfigError(f"config key {name}: {path!r} is not a PEM file")
    return cert, key


def grpc_credentials(cert: str, key: str) -> Any:
    """gRPC server credentials of the PEM files (checked by :func:`tls_files`)."""
    import grpc

    return grpc.ssl_server_credentials([(Path(key).read_bytes(), Path(cert).read_bytes())])
