"""Triton's convention: an ``InferRequest`` root, a model span under it (attribute
``triton.model_name``) and a ``compute`` span under that, with the timestamps as span events
(``QUEUE_START`` or ``REQUEST_START``, ``COMPUTE_START``, ``COMPUTE_INPUT_END``,
``COMPUTE_OUTPUT_START``, ``COMPUTE_END``).

``queue_ms`` runs from the queue start to ``COMPUTE_START``; with the input/output events,
``h2d_ms`` / ``compute_ms`` / ``d2h_ms`` split the compute, else it is all ``compute_ms``; the
rest of the root's latency is ``other``. The tenant comes from the resource only. A root whose
model span is missing is rejected (``triton_incomplete``).
"""

from __future__ import annotations

from typing import Any

from cotenant.collectors.shapes.attributes import as_str, replica_of
from cotenant.collectors.shapes.base import (
    COMPUTE,
    D2H,
    H2D,
    QUEUE,
    Attrs,
    Child,
    Claim,
    Rejected,
    Row,
    RowContext,
    fit_phases,
    request_row,
)
from cotenant.core.phases import PHASES

TRITON_ROOT = "InferRequest"
TRITON_MODEL_ATTR = "triton.model_name"
TRITON_MODEL = -1
"""Pseudo phase of a held model span (negative: never on a critical path)."""


class TritonShape:
    """:class:`collectors.shapes.base.SpanShape` of Triton's OpenTelemetry trace mode."""

    source = "triton"
    root_names = frozenset({TRITON_ROOT})

    def claim(self, span: Any, attrs: Attrs, resource: Attrs) -> Claim | Child:
        if TRITON_MODEL_ATTR not in attrs:
            return Claim.NONE
        events = {e.name: e.time_unix_nano for e in span.events}
        return (
            TRITON_MODEL,
            span.start_time_unix_nano,
            span.end_time_unix_nano,
            span.span_id,
            {"model": as_str(attrs[TRITON_MODEL_ATTR]), "events": events},
        )

    def awaits(self, span: Any, attrs: Attrs, ctx: RowContext) -> bool:
        return False  # every child comes from the root's own process

    def build_row(self, span: Any, attrs: Attrs, resource: Attrs, ctx: RowContext) -> Row:
        kids = ctx.children(span.trace_id, span.span_id)
        model_span = next((c for c in kids if c[0] == TRITON_MODEL), None)
        if model_span is None:
            raise Rejected(
                "triton_incomplete",
                "InferRequest span arrived without its model span (triton.model_name)",
            )
        mx = model_span[4] or {}
        compute_kids = ctx.children(span.trace_id, model_span[3])
        ev: dict[str, int] = dict(mx.get("events") or {})
        for c in compute_kids:
            if c[0] == COMPUTE and c[4]:
                ev.update(c[4].get("events") or {})
        start, end, model, host, gpu, pid, status = ctx.identity(
            span, resource, mx.get("model"), None
        )
        latency = (end - start) / 1e6
        phases = [0.0] * len(PHASES)
        q0 = ev.get("QUEUE_START", ev.get("REQUEST_START"))
        c0, c1 = ev.get("COMPUTE_START"), ev.get("COMPUTE_INPUT_END")
        c2, c3 = ev.get("COMPUTE_OUTPUT_START"), ev.get("COMPUTE_END")
        if q0 is not None and c0 is not None:
            phases[QUEUE] = max(0, c0 - q0) / 1e6
        if c0 is not None and c3 is not None:
            if c1 is not None and c2 is not None:
                phases[H2D] = max(0, c1 - c0) / 1e6
                phases[COMPUTE] = max(0, c2 - c1) / 1e6
                phases[D2H] = max(0, c3 - c2) / 1e6
            else:
                phases[COMPUTE] = max(0, c3 - c0) / 1e6
        fit_phases(phases, latency)
        return request_row(
            ts_start_ns=start,
            ts_end_ns=end,
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            model=model,
            tenant=as_str(resource.get("cotenant.tenant")),
            host=host,
            pid=pid,
            gpu=gpu,
            status=status,
            source=self.source,
            phases_ms=phases,
            replica=replica_of(attrs, resource),
        )
