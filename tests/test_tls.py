"""TLS from certificate files ([server] tls_cert_file / tls_key_file): a running serve answers
HTTPS on its API and OTLP/HTTP ports and TLS on OTLP/gRPC with a self-signed certificate, and
refuses a half or unreadable configuration at start."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import certifi
import grpc
import httpx
import pytest
from conftest import start_serve
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from cotenant.app.config import load_config
from cotenant.app.credentials import tls_files
from cotenant.core.errors import ConfigError

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(OPENSSL is None, reason="openssl not installed")


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            *(str(OPENSSL), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@needs_openssl
@pytest.mark.timeout(120)
def test_serve_answers_https_and_grpc_over_tls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = _self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # httpx trusts it (start_serve polls)
    served = start_serve(
        tmp_path,
        tmp_path / "store.duckdb",
        {
            "COTENANT_SERVER_TLS_CERT_FILE": str(cert),
            "COTENANT_SERVER_TLS_KEY_FILE": str(key),
            "COTENANT_NVML_ENABLED": "false",
            "COTENANT_PROCFS_ENABLED": "false",
        },
    )
    try:
        assert served.api.startswith("https://") and served.otlp_http.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(cert))
        r = httpx.get(served.api + "/api/v1/requests", verify=ctx, timeout=10)
        assert r.status_code == 200 and r.json()["count"] == 0
        # the same port does not speak plain HTTP, and an untrusting client refuses it
        with pytest.raises(httpx.HTTPError):
            httpx.get(served.api.replace("https://", "http://") + "/healthz", timeout=5)
        with pytest.raises(httpx.ConnectError):
            public_cas = ssl.create_default_context(cafile=certifi.where())
            httpx.get(served.api + "/healthz", verify=public_cas, timeout=5)
        otlp = httpx.post(
            served.otlp_http,
            content=trace_service_pb2.ExportTraceServiceRequest().SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
            verify=ctx,
            timeout=10,
        )
        assert otlp.status_code == 200, otlp.text
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(served.otlp_grpc, creds) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=10)
        with grpc.insecure_channel(served.otlp_grpc) as plain:
            stub = trace_service_pb2_grpc.TraceServiceStub(plain)
            with pytest.raises(grpc.RpcError):
                stub.Export(trace_service_pb2.ExportTraceServiceRequest(), timeout=5)
    finally:
        assert served.stop() == 0


def test_a_half_or_unreadable_tls_configuration_is_refused(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("not a certificate\n")
    cases = [
        ({"COTENANT_SERVER_TLS_CERT_FILE": str(tmp_path / "c.pem")}, "server.tls_key_file"),
        (
            {
                "COTENANT_SERVER_TLS_CERT_FILE": str(tmp_path / "none.pem"),
                "COTENANT_SERVER_TLS_KEY_FILE": str(tmp_path / "c.pem"),
            },
            "server.tls_cert_file: cannot read",
        ),
        (
            {
                "COTENANT_SERVER_TLS_CERT_FILE": str(tmp_path / "c.pem"),
                "COTENANT_SERVER_TLS_KEY_FILE": str(tmp_path / "c.pem"),
            },
            "is not a PEM file",
        ),
    ]
    for env, want in cases:
        with pytest.raises(ConfigError, match=want):
            tls_files(load_config(env=env))
    assert tls_files(load_config(env={})) is None
