"""Instrument Python serving code with cotenant's span conventions.

Uses only the OpenTelemetry API: configure a ``TracerProvider`` with an OTLP exporter as usual
(see docs/instrumenting.md) and wrap each request::

    from cotenant.collectors.instrument import request

    with request(model="llama-8b", tenant="acme", gpu="0", batch_size=8) as req:
        with req.phase("queue"):
            item = queue.get()
        with req.lock_wait("kv-cache", holder="sdxl"):
            kv_lock.acquire()
        with req.phase("compute"):
            out = model(item)

``req.phase`` parents the phase on the request span explicitly, so it also works from another
thread. Module-level :func:`phase` and :func:`lock_wait` parent on the *current* span instead.

A wrong call (an unknown phase name, no model, a phase ending before it starts) raises
``ValueError`` at once, so a typo never silently disappears.

This module is imported into serving processes: it imports the OpenTelemetry API and the
standard library only, nothing else of cotenant (``tests/test_instrument.py`` checks),
hence plain ``ValueError`` rather than a class of ``store.errors``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode, Tracer

PHASE_NAMES = ("queue", "preprocess", "transfer.h2d", "compute", "transfer.d2h", "postprocess")
"""Phase span names besides ``lock.wait`` (use :meth:`RequestSpan.lock_wait` for that)."""
LOAD_KINDS = ("base", "lora", "controlnet", "pipeline", "adapter")
"""``cotenant.load.kind`` values of a ``model.load`` span (:meth:`RequestSpan.model_load`)."""

_TRACER_NAME = "cotenant.instrument"


def _tracer(tracer: Tracer | None) -> Tracer:
    return tracer if tracer is not None else trace.get_tracer(_TRACER_NAME)


def _check_phase(name: str) -> None:
    if name not in PHASE_NAMES:
        raise ValueError(
            f"unknown phase {name!r}: use one of {', '.join(PHASE_NAMES)} "
            "(or lock_wait for lock.wait)"
        )


class RequestSpan:
    """The root span of one request; open phases under it with :meth:`phase`."""

    def __init__(self, span: Span, tracer: Tracer) -> None:
        self.span = span
        self._tracer = tracer
        self._ctx = trace.set_span_in_context(span)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[Span]:
        """A child span named ``name`` (one of :data:`PHASE_NAMES`) under this request."""
        _check_phase(name)
        with self._tracer.start_as_current_span(name, context=self._ctx) as s:
            yield s

    @contextlib.contextmanager
    def lock_wait(self, lock: str, holder: str | None = None) -> Iterator[Span]:
        """Time spent waiting for ``lock``; ``holder`` names who held it, when known."""
        attrs: dict[str, Any] = {"cotenant.lock.name": lock}
        if holder is not None:
            attrs["cotenant.lock.holder"] = holder
        with self._tracer.start_as_current_span(
            "lock.wait", context=self._ctx, attributes=attrs
        ) as s:
            yield s

    @contextlib.contextmanager
    def model_load(self, kind: str, name: str) -> Iterator[Span]:
        """Time this request waited for a load (its own, or one already in flight on its
        replica): ``kind`` one of :data:`LOAD_KINDS`, ``name`` what was loaded."""
        if kind not in LOAD_KINDS:
            raise ValueError(f"unknown load kind {kind!r}: use one of {', '.join(LOAD_KINDS)}")
        attrs = {"cotenant.load.kind": kind, "cotenant.load.name": name}
        with self._tracer.start_as_current_span(
            "model.load", context=self._ctx, attributes=attrs
        ) as s:
            yield s

    def record_phase(self, name: str, start_ns: int, end_ns: int) -> None:
        """Record a phase measured elsewhere (e.g. queue time from timestamps), in ns."""
        if name != "lock.wait":
            _check_phase(name)
        if end_ns < start_ns:
            raise ValueError(f"phase {name!r} ends ({end_ns}) before it starts ({start_ns})")
        s = self._tracer.start_span(name, context=self._ctx, start_time=start_ns)
        s.end(end_time=end_ns)

    def set(self, **attrs: int | str) -> None:
        """Set request attributes known only later, e.g. ``batch_size=8``."""
        for k, v in attrs.items():
            self.span.set_attribute(f"cotenant.{k}", v)


@contextlib.contextmanager
def request(
    model: str,
    *,
    tenant: str | None = None,
    gpu: str | int | None = None,
    batch_size: int | None = None,
    priority: int | None = None,
    name: str = "request",
    tracer: Tracer | None = None,
    **extra: int | str | float,
) -> Iterator[RequestSpan]:
    """The root span of one served request, carrying ``cotenant.*`` attributes.

    ``extra`` keys are added verbatim (e.g. ``**{"gen_ai.usage.prompt_tokens": 128}``).
    An exception leaving the block marks the request as an error and is re-raised.
    """
    if not model:
        raise ValueError("request() needs a model name")
    attrs: dict[str, Any] = {"cotenant.model": model}
    for key, val in (
        ("tenant", tenant),
        ("gpu", gpu),
        ("batch_size", batch_size),
        ("priority", priority),
    ):
        if val is not None:
            attrs[f"cotenant.{key}"] = str(val) if key == "gpu" else val
    attrs.update(extra)
    t = _tracer(tracer)
    with t.start_as_current_span(
        name, attributes=attrs, record_exception=True, set_status_on_exception=True
    ) as span:
        try:
            yield RequestSpan(span, t)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise


@contextlib.contextmanager
def phase(name: str, *, tracer: Tracer | None = None) -> Iterator[Span]:
    """A phase span under the current span (the request, when inside :func:`request`)."""
    _check_phase(name)
    with _tracer(tracer).start_as_current_span(name) as s:
        yield s


@contextlib.contextmanager
def lock_wait(
    lock: str, holder: str | None = None, *, tracer: Tracer | None = None
) -> Iterator[Span]:
    """A ``lock.wait`` span under the current span."""
    attrs: dict[str, Any] = {"cotenant.lock.name": lock}
    if holder is not None:
        attrs["cotenant.lock.holder"] = holder
    with _tracer(tracer).start_as_current_span("lock.wait", attributes=attrs) as s:
        yield s
