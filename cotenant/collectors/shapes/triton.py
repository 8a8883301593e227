"""Triton's convention: an ``InferRequest`` root, a model span under it (attribute
``triton.model_name``) and a ``compute`` span under that, with the timestamps as span events
(``QUEUE_START`` or ``REQUEST_START``, ``COMPUTE_START``, ``COMPUTE_INPUT_END``,
``COMPUTE_OUTPUT_START``, ``COMPUTE_END``).

``queue_ms`` runs from the queue start to ``COMPUTE_START``; with the input/output events,
``h2d_ms`` / ``compute_ms`` / ``d2h_ms`` split the compute, else it is all ``compute_ms``; the
rest of the root's latency is ``other``. The tenant comes from the resource only. A root whose
model span is missing is rejected (``triton_incomplete``).

**Ensembles** (checked on Triton 2.51): the ensemble's model span has no ``compute`` child but
one model span per composing model executed (each with its own ``compute``). Each composing
model gets a row of its own (same trace id, its model span's id, times and phases), and the
ensemble's row sums its steps' queue / transfer / compute, the rest of its latency ``other``
(a step's span ends after it handed its output on, so consecutive steps overlap a little, and
parallel ones a lot: a sum over the latency is scaled down to it).

**BLS** (business logic scripting, checked on Triton 2.51): a Python-backend model whose
``execute`` sends requests of its own (``pb_utils.InferenceRequest(..., trace=request.trace())``)
has its ``compute`` span *and* one model span per child request under its model span, the
children inside its compute. Each child gets a row as an ensemble step does; the BLS model's row
is its own queue / input / output, its own compute less the time its children's model spans
cover (the script's own work), plus its children's phases: nothing is counted twice. Child
requests sent without ``trace=`` are not traced at all: their time is the BLS model's compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cotenant.collectors.otlp.critical_path import OTHER
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
        start, end, model, host, gpu, pid, status = ctx.identity(
            span, resource, (model_span[4] or {}).get("model"), None
        )
        latency = (end - start) / 1e6
        phases = self._model_phases(span, model_span, resource, ctx)
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

    def _model_phases(
        self, root: Any, model_span: Child, resource: Attrs, ctx: RowContext
    ) -> list[float]:
        """The phases (ms, not yet fitted) of one model span: from its and its ``compute``
        child's events, plus, for an ensemble or a BLS model, its child model spans' phases
        (each child also gets a row of its own through ``ctx.add_row``; a BLS model's own
        compute loses the time they cover), its ``other`` left to the caller's fit."""
        trace_id = root.trace_id
        events: dict[str, int] = dict((model_span[4] or {}).get("events") or {})
        steps: list[Child] = []
        for c in ctx.children(trace_id, model_span[3]):
            if c[0] == COMPUTE and c[4]:
                events.update(c[4].get("events") or {})
            elif c[0] == TRITON_MODEL:
                steps.append(c)
        phases = _event_phases(events)
        if not steps:
            return phases
        window = _compute_window(events)
        if window is not None:  # a BLS model: its children ran inside its compute
            covered = _covered_ns(window, [(c[1], c[2]) for c in steps])
            phases[COMPUTE] = max(0.0, phases[COMPUTE] - covered / 1e6)
        for step in sorted(steps, key=lambda c: c[1]):
            own = self._model_phases(root, step, resource, ctx)
            as_span = _Step(trace_id, step[3], step[1], step[2], root.status)
            s0, s1, model, host, gpu, pid, status = ctx.identity(
                as_span, resource, (step[4] or {}).get("model"), None
            )
            fit_phases(own, (s1 - s0) / 1e6)
            ctx.add_row(
                request_row(
                    ts_start_ns=s0,
                    ts_end_ns=s1,
                    trace_id=trace_id.hex(),
                    span_id=step[3].hex(),
                    model=model,
                    tenant=as_str(resource.get("cotenant.tenant")),
                    host=host,
                    pid=pid,
                    gpu=gpu,
                    status=status,
                    source=self.source,
                    phases_ms=own,
                    replica=replica_of({}, resource),
                )
            )
            for k, ms in enumerate(own):
                if k != OTHER:
                    phases[k] += ms
        return phases


@dataclass(frozen=True)
class _Step:
    """A composing model's span as :meth:`RowContext.identity` reads a span (its ids, times
    and the status of the request it served)."""

    trace_id: bytes
    span_id: bytes
    start_time_unix_nano: int
    end_time_unix_nano: int
    status: Any
    name: str = "ensemble step"


def _event_phases(ev: dict[str, int]) -> list[float]:
    """Queue / h2d / compute / d2h (ms) from a model span's and its compute span's events."""
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
    return phases


def _compute_window(ev: dict[str, int]) -> tuple[int, int] | None:
    """The interval (ns) :func:`_event_phases` books as ``compute``; None without one."""
    c1, c2 = ev.get("COMPUTE_INPUT_END"), ev.get("COMPUTE_OUTPUT_START")
    if c1 is None or c2 is None:
        c1, c2 = ev.get("COMPUTE_START"), ev.get("COMPUTE_END")
    return None if c1 is None or c2 is None else (c1, c2)


def _covered_ns(window: tuple[int, int], spans: list[tuple[int, int]]) -> int:
    """How much of ``window`` (ns) the union of ``spans`` covers (children sent in parallel
    with ``async_exec`` overlap: each instant counts once)."""
    lo, hi = window
    covered, reach = 0, lo
    for s0, s1 in sorted(spans):
        s0, s1 = max(s0, reach), min(s1, hi)
        if s1 > s0:
            covered += s1 - s0
            reach = s1
    return covered
