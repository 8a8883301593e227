"""Property-based fuzzing of every input of a running service (OTLP/HTTP, OTLP/gRPC, the HTTP
API, the Alertmanager webhook, reports, actions, dashboard paths): every answer is one of the
endpoint's documented statuses, never a 500, and the service is healthy afterwards.

``make test`` runs a small fixed budget per test; ``make reliability`` a large one
(``COTENANT_FUZZ_EXAMPLES``). Every status seen is tallied in ``STATUSES`` and, at the end of
the module, written to ``tests/artifacts/fuzz-statuses.json`` (the figure in
docs/reliability.md)."""

from __future__ import annotations

import base64
import gzip
import json
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from cotenant.app.service import Service

from .conftest import healthy
from .strategies import exports, json_values, path_segments, time_args, weeks

OTLP_STATUSES = {200, 400, 413, 415, 503}
API_STATUSES = {200, 202, 400, 401, 403, 404, 405, 409, 422, 503}
STATUSES: Counter[str] = Counter()
ARTIFACT = Path(__file__).resolve().parents[1] / "artifacts" / "fuzz-statuses.json"


@pytest.fixture(scope="module")
def client(live: Service) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as c:
        yield c
    assert healthy(live)  # whatever was sent, the service is still up and ready
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(ARTIFACT.read_text()) if ARTIFACT.exists() else {}
    for k, v in STATUSES.items():
        old[k] = old.get(k, 0) + v
    ARTIFACT.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")


def _seen(kind: str, status: int, allowed: set[int], detail: Any = "") -> None:
    STATUSES[f"{kind} {status}"] += 1
    assert status != 500, f"{kind}: 500 for {detail!r:.300}"
    assert status in allowed, f"{kind}: undocumented {status} for {detail!r:.300}"


def _otlp(live: Service) -> str:
    assert live.endpoints is not None and live.endpoints.otlp_http
    return live.endpoints.otlp_http


def _api(live: Service) -> str:
    assert live.endpoints is not None
    return live.endpoints.api


def _otlp_json(msg: Any) -> bytes:
    """OTLP JSON: protobuf's JSON with hex ids."""
    doc = json_format.MessageToDict(msg)
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for sp in ss.get("spans", []):
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64decode(sp[k]).hex()
    return json.dumps(doc).encode()


@given(msg=exports(), as_json=st.booleans(), gz=st.booleans())
def test_otlp_http_exports(
    live: Service, client: httpx.Client, msg: Any, as_json: bool, gz: bool
) -> None:
    body = _otlp_json(msg) if as_json else msg.SerializeToString()
    headers = {"Content-Type": "application/json" if as_json else "application/x-protobuf"}
    if gz:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    r = client.post(_otlp(live), content=body, headers=headers)
    _seen("otlp_http", r.status_code, OTLP_STATUSES, msg)
    if r.status_code == 200 and not as_json:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceResponse,
        )

        resp = ExportTraceServiceResponse.FromString(r.content)
        spans = sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
        assert 0 <= resp.partial_success.rejected_spans <= spans


@given(
    body=st.one_of(
        st.binary(max_size=300),
        exports().map(lambda m: m.SerializeToString()[: len(m.SerializeToString()) // 2]),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.integers(1, 3000).map(lambda n: b'{"resourceSpans":' + b"[" * n + b"]" * n + b"}"),
    ),
    ctype=st.sampled_from(
        [
            "application/x-protobuf",
            "application/json",
            "text/plain",
            "",
            "application/json; charset=utf-8",
        ]
    ),
    encoding=st.sampled_from(["", "gzip", "br", "identity"]),
)
def test_otlp_http_raw_bodies(
    live: Service, client: httpx.Client, body: bytes, ctype: str, encoding: str
) -> None:
    headers = {"Content-Type": ctype}
    if encoding:
        headers["Content-Encoding"] = encoding
    r = client.post(_otlp(live), content=body, headers=headers)
    _seen("otlp_http_raw", r.status_code, OTLP_STATUSES, body)


@pytest.fixture(scope="module")
def stub(live: Service) -> Iterator[Any]:
    assert live.endpoints is not None and live.endpoints.otlp_grpc
    with grpc.insecure_channel(live.endpoints.otlp_grpc) as ch:
        yield trace_service_pb2_grpc.TraceServiceStub(ch)


@given(msg=exports())
def test_otlp_grpc_exports(stub: Any, msg: Any) -> None:
    try:
        resp = stub.Export(msg, timeout=30)
        STATUSES["otlp_grpc OK"] += 1
    except grpc.RpcError as exc:
        code = exc.code()
        STATUSES[f"otlp_grpc {code.name}"] += 1
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INVALID_ARGUMENT), (
            code,
            exc.details(),
        )
        return
    spans = sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
    assert 0 <= resp.partial_success.rejected_spans <= spans


@given(
    params=st.dictionaries(
        st.sampled_from(["model", "gpu", "since", "until", "limit", "state", "incident"]),
        st.one_of(time_args, st.text(max_size=20), st.integers().map(str)),
        max_size=4,
    ),
    route=st.sampled_from(
        ["/api/v1/requests", "/api/v1/incidents", "/api/v1/alerts", "/api/v1/actions"]
    ),
)
def test_api_queries(
    live: Service, client: httpx.Client, params: dict[str, str], route: str
) -> None:
    r = client.get(f"{_api(live)}{route}", params=params)
    _seen(f"GET {route}", r.status_code, API_STATUSES, params)
    if r.status_code == 200:
        r.json()  # the answer is JSON, whatever is stored


@given(
    body=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {
                "model": st.one_of(st.text(max_size=10), json_values),
                "start": st.one_of(time_args, json_values),
            },
            optional={"end": st.one_of(time_args, json_values)},
        ),
    )
)
def test_diagnose_bodies(live: Service, client: httpx.Client, body: Any) -> None:
    content = json.dumps(body).encode()  # json.dumps writes NaN/Infinity and \ud800 escapes
    r = client.post(
        f"{_api(live)}/api/v1/diagnose",
        content=content,
        headers={"Content-Type": "application/json"},
    )
    _seen("POST /api/v1/diagnose", r.status_code, API_STATUSES, body)


alerts = st.fixed_dictionaries(
    {
        "status": st.one_of(st.sampled_from(["firing", "resolved"]), json_values),
        "labels": st.one_of(
            st.dictionaries(
                st.sampled_from(["alertname", "model", "gpu", "x"]), st.text(max_size=8)
            ),
            json_values,
        ),
        "startsAt": st.one_of(
            time_args, st.from_regex(r"\A\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z\Z")
        ),
        "fingerprint": st.one_of(st.from_regex(r"\A[0-9a-f]{1,16}\Z"), json_values),
    }
)


@given(
    body=st.one_of(
        json_values.map(lambda v: json.dumps(v).encode()),
        st.lists(alerts, max_size=3).map(
            lambda a: json.dumps({"version": "4", "status": "firing", "alerts": a}).encode()
        ),
        st.binary(max_size=100),
    )
)
def test_alert_webhook_bodies(live: Service, client: httpx.Client, body: bytes) -> None:
    r = client.post(f"{_api(live)}/api/v1/alerts", content=body)
    _seen("POST /api/v1/alerts", r.status_code, API_STATUSES, body)


@given(week=weeks)
def test_report_weeks(live: Service, client: httpx.Client, week: str) -> None:
    r = client.get(f"{_api(live)}/api/v1/reports/{quote(week, safe='')}/summary")
    _seen("GET /api/v1/reports/{week}/summary", r.status_code, API_STATUSES, week)


@given(
    segment=st.sampled_from(["incidents", "alerts", "actions"]),
    ident=st.text(max_size=20),
    action=st.sampled_from(["", "/approve", "/rollback"]),
    body=st.one_of(st.none(), json_values),
    token=st.one_of(
        st.none(),
        st.text(
            alphabet=st.characters(codec="ascii", min_codepoint=33, max_codepoint=126), max_size=12
        ),
    ),
)
def test_ids_and_actions(
    live: Service,
    client: httpx.Client,
    segment: str,
    ident: str,
    action: str,
    body: Any,
    token: str | None,
) -> None:
    url = f"{_api(live)}/api/v1/{segment}/{quote(ident, safe='')}{action}"
    headers = {} if token is None else {"Authorization": f"Bearer {token}".strip()}
    if action:
        r = client.post(url, content=json.dumps(body).encode(), headers=headers)
    else:
        r = client.get(url, headers=headers)
    _seen(f"{segment}{action}", r.status_code, API_STATUSES, (ident, body))


@given(segments=st.lists(path_segments, min_size=1, max_size=5))
def test_dashboard_and_asset_paths(live: Service, segments: list[str]) -> None:
    # raw socket: clients normalise '..' away; the path goes to the server as written
    path = "/" + "/".join(segments)
    host, port = _api(live).removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    _seen("GET dashboard path", status, API_STATUSES, path)
