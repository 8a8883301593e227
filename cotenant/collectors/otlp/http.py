"""OTLP/HTTP trace receiver: ``POST /v1/traces`` as an ASGI (Starlette) app.

Answers (OTLP/HTTP specification):
* 200 ``ExportTraceServiceResponse``, with ``partial_success`` when some spans were rejected;
* 400 ``google.rpc.Status`` for a body that does not decode;
* 413 when the body, or its gzip inflation, exceeds the limit;
* 415 for another content type or encoding;
* 503 with ``Retry-After`` (whole seconds, at least 1) when the receivers already hold their
  budget of in-flight bytes (:mod:`collectors.otlp.admission`; refused before the body is read),
  when the writer queue is full, or when a durable acknowledgement could not be given
  (retried by OTLP exporters).
Responses use the request's encoding (protobuf or JSON).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from concurrent.futures import Executor

from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from cotenant.collectors.otlp.decode import JSON, PROTOBUF, decode, inflate, media_type
from cotenant.collectors.otlp.ingest import ExportOutcome, IngestPipeline
from cotenant.core.errors import (
    DecodeError,
    IngestError,
    Overloaded,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from cotenant.core.http_body import declared_length, read_body

log = logging.getLogger(__name__)


def _encode(msg: Message, mtype: str) -> bytes:
    if mtype == JSON:
        return json.dumps(json_format.MessageToDict(msg)).encode()
    return bytes(msg.SerializeToString())


def _status(
    code: int, message: str, http: int, mtype: str, headers: dict[str, str] | None = None
) -> Response:
    body = _encode(status_pb2.Status(code=code, message=message), mtype)
    return Response(body, status_code=http, media_type=mtype, headers=headers)


class OtlpHttpReceiver:
    """Builds the ASGI app; ``max_body_bytes`` bounds both the raw and the inflated body.
    Each export holds its declared Content-Length of the pipeline's in-flight budget
    (:meth:`IngestPipeline.admit`) from before its body is read until it is answered; one of
    undeclared length (chunked) takes its share chunk by chunk as it is read.

    ``executor``: where an export is decoded and ingested (its thread waits for a durable
    acknowledgement, so size it for the concurrent exports: 40, as anyio's default). Handing
    off with ``loop.run_in_executor`` costs the event loop ~40 us less CPU per export than
    anyio's ``to_thread`` (Starlette's ``run_in_threadpool``), which is used without one."""

    def __init__(
        self,
        pipeline: IngestPipeline,
        *,
        max_body_bytes: int,
        executor: Executor | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._limit = max_body_bytes
        self._executor = executor
        self._routes = Starlette(routes=[Route("/v1/traces", self.traces, methods=["POST"])])

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app. An export goes straight to :meth:`traces`: Starlette's router and
        middleware stack cost ~0.1 ms of the event loop's CPU per request, paid 5 times a
        second by every exporter (bench/agent_metrics.py); anything else (another path or
        method: 404, 405) goes through them."""
        if scope["type"] == "http" and scope["path"] == "/v1/traces" and scope["method"] == "POST":
            response = await self.traces(Request(scope, receive))
            await response(scope, receive, send)
        else:
            await self._routes(scope, receive, send)

    async def traces(self, request: Request) -> Response:
        mtype = PROTOBUF
        try:
            mtype = media_type(request.headers.get("content-type"))
            declared = declared_length(request.headers)
            known = declared is not None
            with self._pipeline.admit(min(declared or 0, self._limit), "http") as grow:
                body = await read_body(
                    request,
                    self._limit,
                    PayloadTooLarge,
                    "; send smaller batches",
                    on_chunk=None if known else grow,
                )
                encoding = request.headers.get("content-encoding")
                if self._executor is None:
                    outcome = await run_in_threadpool(self._ingest, body, encoding, mtype)
                else:
                    outcome = await asyncio.get_running_loop().run_in_executor(
                        self._executor, self._ingest, body, encoding, mtype
                    )
        except UnsupportedMediaType as exc:
            self._pipeline.count_refused("http", "unsupported_media_type")
            return _status(code_pb2.INVALID_ARGUMENT, str(exc), 415, mtype)
        except PayloadTooLarge as exc:
            self._pipeline.count_refused("http", "too_large")
            return _status(code_pb2.INVALID_ARGUMENT, str(exc), 413, mtype)
        except DecodeError as exc:
            self._pipeline.count_refused("http", "bad_body")
            return _status(code_pb2.INVALID_ARGUMENT, str(exc), 400, mtype)
        except Overloaded as exc:
            retry = str(max(1, math.ceil(exc.retry_after_s)))
            return _status(code_pb2.UNAVAILABLE, str(exc), 503, mtype, {"Retry-After": retry})
        except IngestError as exc:  # pragma: no cover - every subclass is handled above
            return _status(code_pb2.INVALID_ARGUMENT, str(exc), 400, mtype)
        resp = ExportTraceServiceResponse()
        if outcome.rejected:
            resp.partial_success.CopyFrom(
                ExportTracePartialSuccess(
                    rejected_spans=outcome.rejected, error_message=outcome.message
                )
            )
        return Response(_encode(resp, mtype), status_code=200, media_type=mtype)

    def _ingest(self, body: bytes, encoding: str | None, mtype: str) -> ExportOutcome:
        raw = inflate(body, encoding, self._limit)
        msg = decode(raw, mtype)
        return self._pipeline.export(msg, "http", "json" if mtype == JSON else "protobuf")
