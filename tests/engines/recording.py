"""An httpx transport that records every exchange with a real engine's control API (method, path,
request body, status, response body) to a JSON-lines file: the recorded answers become the
regression fixtures under tests/fixtures/engines (see its PROVENANCE.md)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.conftest import ROOT

RECORDINGS = ROOT / "tests" / "artifacts" / "engines"


class RecordingTransport(httpx.BaseTransport):
    def __init__(self, name: str) -> None:
        RECORDINGS.mkdir(parents=True, exist_ok=True)
        self.path: Path = RECORDINGS / f"{name}.jsonl"
        self.path.write_text("")

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        # a transport per exchange: HttpCaller closes its client (and so the transport) after
        # each call
        with httpx.HTTPTransport() as inner:
            response = inner.handle_request(request)
            body = response.read()
        entry = {
            "method": request.method,
            "path": request.url.path,
            "request": request.content.decode() if request.content else None,
            "status": response.status_code,
            "content_type": response.headers.get("content-type"),
            "response": body.decode(errors="replace"),
        }
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        headers = [
            (k, v)
            for k, v in response.headers.items()
            if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
        ]
        return httpx.Response(response.status_code, headers=headers, content=body, request=request)
