"""vLLM's convention: one ``llm_request`` span per finished request, its phases as
``gen_ai.latency.*`` attributes in float seconds (DESIGN.md, "Span conventions").

The model is ``gen_ai.response.model``, else ``gen_ai.request.model``, else ``cotenant.model``
(span, then resource), else the resource's ``service.name`` (vLLM v1 sets no model attribute)
unless it is the SDK's ``unknown_service…`` default. ``queue_ms`` is ``time_in_queue``,
``compute_ms`` is ``time_in_model_inference`` (else prefill + decode); the rest of the latency is
``other``. The pid is the resource's ``process.pid``, else ``vllm.process_id`` (vLLM 0.32 sets
only that, a string: the API server's pid, not the engine's; see
:mod:`collectors.gpu_resolve` for how its descendants are joined).
"""

from __future__ import annotations

from typing import Any

from cotenant.collectors.shapes.attributes import as_int, as_seconds_ms, as_str, replica_of
from cotenant.collectors.shapes.base import (
    ATTR_MODEL,
    COMPUTE,
    QUEUE,
    Attrs,
    Child,
    Claim,
    Row,
    RowContext,
    fit_phases,
    request_row,
)
from cotenant.core.phases import PHASES

VLLM_SPAN = "llm_request"


class VllmShape:
    """:class:`collectors.shapes.base.SpanShape` of vLLM's ``llm_request`` span."""

    source = "vllm"
    root_names = frozenset({VLLM_SPAN})

    def claim(self, span: Any, attrs: Attrs, resource: Attrs) -> Claim | Child:
        return Claim.NONE  # roots are claimed by name; vLLM emits no child spans

    def awaits(self, span: Any, attrs: Attrs, ctx: RowContext) -> bool:
        return False  # every child comes from the root's own process

    def build_row(self, span: Any, attrs: Attrs, resource: Attrs, ctx: RowContext) -> Row:
        a = attrs
        model = (
            a.get("gen_ai.response.model")
            or a.get("gen_ai.request.model")
            or a.get(ATTR_MODEL)
            or resource.get(ATTR_MODEL)
        )
        if not model:
            service = as_str(resource.get("service.name")) or ""
            model = None if service.startswith("unknown_service") else service
        start, end, model, host, gpu, pid, status = ctx.identity(
            span, resource, model, a.get("cotenant.gpu")
        )
        latency = (end - start) / 1e6
        queue = as_seconds_ms(a, "gen_ai.latency.time_in_queue") or 0.0
        compute = as_seconds_ms(a, "gen_ai.latency.time_in_model_inference")
        if compute is None:
            compute = (as_seconds_ms(a, "gen_ai.latency.time_in_model_prefill") or 0.0) + (
                as_seconds_ms(a, "gen_ai.latency.time_in_model_decode") or 0.0
            )
        phases = [0.0] * len(PHASES)
        phases[QUEUE], phases[COMPUTE] = queue, compute
        fit_phases(phases, latency)
        return request_row(
            ts_start_ns=start,
            ts_end_ns=end,
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            model=model,
            tenant=as_str(a.get("cotenant.tenant", resource.get("cotenant.tenant"))),
            host=host,
            pid=pid,
            gpu=gpu,
            prompt_tokens=as_int(a, "gen_ai.usage.prompt_tokens", 0),
            output_tokens=as_int(a, "gen_ai.usage.completion_tokens", 0),
            status=status,
            source=self.source,
            phases_ms=phases,
            ttft_ms=as_seconds_ms(a, "gen_ai.latency.time_to_first_token"),
            replica=replica_of(a, resource),
        )
