"""Recorders of what real engines exchange with cotenant, kept under tests/artifacts/engines: the
recordings become the regression fixtures under tests/fixtures/engines (see its PROVENANCE.md).

:class:`RecordingTransport`: an httpx transport writing every exchange with an engine's control
API (method, path, request body, status, response body) to a JSON-lines file.
:class:`OtlpRecorder`: an OTLP/HTTP relay writing every span export an engine posts."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class OtlpRecorder:
    """An OTLP/HTTP relay on loopback: every ``POST /v1/traces`` body is written to
    ``RECORDINGS/<name>/v1_traces_NNNN.pb`` (``.json`` for a JSON body) byte for byte, then
    forwarded to ``target`` with its content type, and the target's answer is relayed back.
    What an engine sent is then both checked live and kept as a golden fixture."""

    def __init__(self, name: str, target: str) -> None:
        self.dir = RECORDINGS / name
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.target = target
        self.count = 0
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ctype = self.headers.get("Content-Type", "application/x-protobuf")
                recorder.record(body, ctype)
                try:
                    r = httpx.post(
                        recorder.target, content=body, headers={"Content-Type": ctype}, timeout=10
                    )
                except httpx.HTTPError:  # the receiver has stopped (the engine's last flush)
                    r = httpx.Response(503, content=b"")
                self.send_response(r.status_code)
                self.send_header("Content-Type", r.headers.get("content-type", ctype))
                self.send_header("Content-Length", str(len(r.content)))
                self.end_headers()
                self.wfile.write(r.content)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def record(self, body: bytes, ctype: str) -> None:
        with self._lock:
            self.count += 1
            suffix = ".json" if "json" in ctype else ".pb"
            (self.dir / f"v1_traces_{self.count:04d}{suffix}").write_bytes(body)

    def __enter__(self) -> OtlpRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
