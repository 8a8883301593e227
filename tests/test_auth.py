"""Bearer tokens on a running ``cotenant serve`` and agent (cotenant/app/auth.py): every endpoint
but the probes answers 401 without the read token, a token of another scope 403, the act and
ingest scopes stay apart from the read one, and no token ever reaches the log."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from conftest import Served, start_serve
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from spans import MS, SpanFactory

from cotenant.app.auth import presented
from cotenant.app.config import load_config
from cotenant.app.service import Service
from cotenant.collectors.nvml.fake import FakeNvml

READ = "read-token-7f3a9c"
ACT = "act-token-51d2e8"
INGEST = "ingest-token-c04b77"

READS = [
    ("GET", "/metrics"),
    ("GET", "/api/v1/requests"),
    ("GET", "/api/v1/incidents"),
    ("GET", "/api/v1/actions"),
    ("GET", "/api/v1/alerts"),
    ("GET", "/docs"),
    ("GET", "/openapi.json"),
    ("GET", "/"),  # the dashboard
    ("GET", "/_dash-layout"),
    ("POST", "/api/v1/diagnose"),
    ("POST", "/api/v1/alerts"),  # Alertmanager's webhook
]


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _call(api: str, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    body = {"model": "chat", "start": "10m", "end": "now"} if path.endswith("diagnose") else None
    if path == "/api/v1/alerts" and method == "POST":
        body = {"version": "4", "status": "firing", "alerts": []}
    return httpx.request(method, api + path, headers=headers, json=body, timeout=30)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("auth")
    (tmp / "act").write_text(ACT + "\n")
    s = start_serve(
        tmp,
        tmp / "store.duckdb",
        {
            "COTENANT_AUTH_TOKEN": READ,
            "COTENANT_AUTH_OTLP_TOKEN": INGEST,
            "COTENANT_ACTUATORS_TOKEN_FILE": str(tmp / "act"),
            "COTENANT_LOG_LEVEL": "debug",
            "COTENANT_NVML_ENABLED": "false",
            "COTENANT_PROCFS_ENABLED": "false",
        },
    )
    yield s
    s.stop()


def test_the_probes_answer_anyone(served: Served) -> None:
    for path in ("/healthz", "/readyz"):
        assert httpx.get(served.api + path, timeout=10).status_code == 200


@pytest.mark.parametrize("method,path", READS)
def test_every_other_endpoint_needs_the_read_token(served: Served, method: str, path: str) -> None:
    r = _call(served.api, method, path, {})
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert "read scope" in r.json()["error"]
    assert _call(served.api, method, path, _bearer("not-the-token")).status_code == 401
    # a token of another scope is known, and refused for this one
    for other in (ACT, INGEST):
        forbidden = _call(served.api, method, path, _bearer(other))
        assert forbidden.status_code == 403, forbidden.text
    ok = _call(served.api, method, path, _bearer(READ))
    assert ok.status_code not in (401, 403), ok.text
    assert ok.status_code < 500, ok.text


def test_a_browser_sends_the_read_token_as_its_basic_password(served: Served) -> None:
    r = httpx.get(served.api + "/", timeout=30)
    assert r.status_code == 401 and "Basic" in r.headers["www-authenticate"]
    basic = base64.b64encode(f"anyone:{READ}".encode()).decode()
    page = httpx.get(served.api + "/", headers={"Authorization": f"Basic {basic}"}, timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()


def test_the_act_scope_is_the_action_controllers_and_the_read_token_cannot_act(
    served: Served,
) -> None:
    url = served.api + "/api/v1/actions/act-unknown/approve"
    assert httpx.post(url, timeout=10).status_code == 401
    # the read token passes the API's door but is not the act token
    assert httpx.post(url, headers=_bearer(READ), timeout=10).status_code == 403
    # the act token is: the call reaches the controller, which knows no such action
    assert httpx.post(url, headers=_bearer(ACT), timeout=10).status_code == 404
    # and reading the action log is the read scope's
    assert httpx.get(served.api + "/api/v1/actions", headers=_bearer(ACT)).status_code == 403


def test_otlp_http_and_grpc_need_the_ingest_token(served: Served) -> None:
    f = SpanFactory({"service.name": "chat"})
    now = time.time_ns()
    f.ours("chat", now - 1000 * MS, 20.0, [("compute", 0, 20.0)], attrs={"cotenant.gpu": "g0"})
    spans = f.take()
    for headers, want in (
        (None, "FAILURE"),
        (_bearer(READ), "FAILURE"),
        (_bearer(INGEST), "SUCCESS"),
    ):
        exporter = OTLPSpanExporter(endpoint=served.otlp_http, headers=headers, timeout=10)
        assert exporter.export(spans).name == want, headers
        exporter.shutdown()
    r = httpx.post(served.otlp_http, content=b"", timeout=10)
    assert r.status_code == 401 and "ingest scope" in r.json()["error"]
    assert httpx.post(served.otlp_http, content=b"", headers=_bearer(READ)).status_code == 403

    with grpc.insecure_channel(served.otlp_grpc) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        req = trace_service_pb2.ExportTraceServiceRequest()
        for metadata, code in (
            ((), grpc.StatusCode.UNAUTHENTICATED),
            ((("authorization", f"Bearer {ACT}"),), grpc.StatusCode.PERMISSION_DENIED),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(req, metadata=metadata, timeout=10)
            assert err.value.code() == code
        stub.Export(req, metadata=(("authorization", f"Bearer {INGEST}"),), timeout=10)
    exporter = GrpcSpanExporter(
        endpoint=served.otlp_grpc, insecure=True, headers={"authorization": f"Bearer {INGEST}"}
    )
    assert exporter.export(spans).name == "SUCCESS"
    exporter.shutdown()


def test_no_token_reaches_the_log(served: Served) -> None:
    test_every_other_endpoint_needs_the_read_token(served, "GET", "/api/v1/incidents")
    test_otlp_http_and_grpc_need_the_ingest_token(served)
    log = served.log.read_text()
    assert "DEBUG" in log  # the log was written, at its most verbose
    for token in (READ, ACT, INGEST):
        assert token not in log


def test_config_show_hides_the_tokens() -> None:
    from cotenant.app.config import load_config

    text = load_config(env={"COTENANT_AUTH_TOKEN": READ, "COTENANT_AUTH_OTLP_TOKEN": INGEST})
    shown = text.to_toml()
    assert READ not in shown and INGEST not in shown
    assert 'token = "<hidden>"' in shown and 'otlp_token = "<hidden>"' in shown


def test_the_authorization_header_forms() -> None:
    def h(v: str) -> list[tuple[bytes, bytes]]:
        return [(b"authorization", v.encode())]

    assert presented(h("Bearer abc")) == "abc"
    assert presented(h("bearer  abc ")) == "abc"
    assert presented(h("Basic " + base64.b64encode(b"u:p:w").decode())) == "p:w"
    assert presented(h("Basic " + base64.b64encode(b"u:").decode())) is None
    assert presented(h("Basic !!!")) is None
    assert presented(h("Token abc")) is None
    assert presented([]) is None


def _agent(tmp: Path, env: dict[str, str], nvml: FakeNvml | None) -> tuple[Service, str]:
    cfg = load_config(
        env={
            "COTENANT_SERVER_PORT": "0",
            "COTENANT_OTLP_HTTP_PORT": "0",
            "COTENANT_OTLP_GRPC_ENABLED": "false",
            "COTENANT_STORE_PATH": str(tmp / "agent.duckdb"),
            "COTENANT_PROCFS_ENABLED": "false",
            **env,
        }
    )
    svc = Service(cfg, nvml=nvml, role="agent")
    threading.Thread(target=svc.run, kwargs={"banner": None}, daemon=True).start()
    assert svc.started.wait(30) and svc.endpoints is not None
    return svc, svc.endpoints.api


def test_the_agents_metrics_and_drill_down_need_the_read_token(tmp_path: Path) -> None:
    svc, api = _agent(
        tmp_path, {"COTENANT_AUTH_TOKEN": READ, "COTENANT_NVML_ENABLED": "false"}, None
    )
    try:
        assert httpx.get(api + "/readyz", timeout=10).status_code == 200
        slowest = "/api/v1/slowest?model=m&since=10m&until=now"
        for path in ("/metrics", slowest):
            assert httpx.get(api + path, timeout=10).status_code == 401
            assert httpx.get(api + path, headers=_bearer(READ), timeout=10).status_code == 200
    finally:
        svc.stop()


def test_an_agent_without_the_nvml_it_is_configured_for_is_not_ready(tmp_path: Path) -> None:
    svc, api = _agent(tmp_path, {}, FakeNvml(library_found=False))
    try:
        r = httpx.get(api + "/readyz", timeout=10)
        assert r.status_code == 503
        assert "NVML is enabled but unavailable" in r.json()["error"]
        assert "nvml.enabled = false" in r.json()["error"]  # how to run on spans only
        assert httpx.get(api + "/healthz", timeout=10).status_code == 200  # alive all the same
    finally:
        svc.stop()
    spans_only, api = _agent(tmp_path / "b", {"COTENANT_NVML_ENABLED": "false"}, None)
    try:
        assert httpx.get(api + "/readyz", timeout=10).json()["status"] == "ready"
    finally:
        spans_only.stop()
