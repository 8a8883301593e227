"""OTLP/gRPC trace receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

Same semantics as the HTTP receiver: partial success for rejected spans; when the writer
queue is full, ``UNAVAILABLE`` with a ``google.rpc.RetryInfo`` both in the standard status
details and under ``google.rpc.retryinfo-bin`` (what OpenTelemetry's exporters read), so
exporters back off and retry.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from cotenant.collectors.otlp.ingest import IngestPipeline
from cotenant.collectors.settings import OtlpSettings
from cotenant.core.errors import Overloaded

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Status(grpc.Status):  # type: ignore[misc]
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes], ...]


def overloaded_status(message: str, retry_after_s: float) -> _Status:
    secs = int(retry_after_s)
    retry = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=secs, nanos=int((retry_after_s - secs) * 1e9))
    )
    detail = any_pb2.Any()
    detail.Pack(retry)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message, details=[detail])
    return _Status(
        grpc.StatusCode.UNAVAILABLE,
        message,
        (
            ("grpc-status-details-bin", status.SerializeToString()),
            ("google.rpc.retryinfo-bin", retry.SerializeToString()),
        ),
    )


class TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, pipeline: IngestPipeline) -> None:
        self._pipeline = pipeline

    def Export(
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        try:
            # the message is already read: holding its size still bounds what the workers
            # decode and normalize at once, and refuses the next ones while they do
            with self._pipeline.admit(request.ByteSize(), "grpc"):
                outcome = self._pipeline.export(request, "grpc", "protobuf")
        except Overloaded as exc:
            context.abort_with_status(overloaded_status(str(exc), exc.retry_after_s))
            raise  # abort_with_status raises; this line is not reached
        except Exception as exc:  # the data path never crashes: answer INTERNAL, keep serving
            log.exception("OTLP/gRPC export failed")
            context.abort(grpc.StatusCode.INTERNAL, f"export failed: {exc}")
            raise
        resp = ExportTraceServiceResponse()
        if outcome.rejected:
            resp.partial_success.CopyFrom(
                ExportTracePartialSuccess(
                    rejected_spans=outcome.rejected, error_message=outcome.message
                )
            )
        return resp


class OtlpGrpcServer:
    """A gRPC server on ``host:port`` (0 picks a free port: see :attr:`port`)."""

    def __init__(
        self,
        pipeline: IngestPipeline,
        *,
        host: str,
        port: int,
        max_message_bytes: int,
        workers: int = OtlpSettings.grpc_workers,
        interceptors: Sequence[Any] = (),
        credentials: Any | None = None,
    ) -> None:
        """``interceptors``: gRPC server interceptors run before each call (the ingest
        token's check); ``credentials``: ``grpc.ssl_server_credentials`` to serve TLS with
        (None: plaintext)."""
        self._server: Any = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="otlp-grpc"),
            interceptors=list(interceptors),
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            TraceServicer(pipeline), self._server
        )
        addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if credentials is None:
            self.port: int = self._server.add_insecure_port(addr)
        else:
            self.port = self._server.add_secure_port(addr, credentials)
        if self.port == 0:
            raise OSError(f"cannot listen for OTLP/gRPC on {addr} (port in use?)")

    def start(self) -> None:
        self._server.start()

    def stop(self, grace_s: float = 5.0) -> Any:
        """Stop accepting; in-flight calls get ``grace_s``. Returns an event set when done."""
        return self._server.stop(grace_s)
