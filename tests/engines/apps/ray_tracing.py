"""Ray Serve's tracing hook for the engine tests:
``RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH=ray_tracing:processors`` (a zero-argument function
returning span processors), exporting OTLP/HTTP protobuf to ``ENGINES_OTLP_ENDPOINT``."""

from __future__ import annotations

import os

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanProcessor


def processors() -> list[SpanProcessor]:
    endpoint = os.environ["ENGINES_OTLP_ENDPOINT"]
    return [BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=200)]
