"""Span shapes: one module per exporter convention, behind :class:`base.SpanShape`.

:data:`SHAPES` is the tuple :class:`collectors.otlp.normalize.Normalizer` uses by default. Order
matters only for spans claimed by attributes: the first shape whose ``claim`` answers wins.
"""

from __future__ import annotations

from cotenant.collectors.shapes.base import SpanShape
from cotenant.collectors.shapes.ours import OursShape
from cotenant.collectors.shapes.rayserve import RayServeShape
from cotenant.collectors.shapes.triton import TritonShape
from cotenant.collectors.shapes.vllm import VllmShape

SHAPES: tuple[SpanShape, ...] = (OursShape(), VllmShape(), TritonShape(), RayServeShape())
"""The shapes cotenant understands (DESIGN.md, "Span conventions"); ``cotenant.model`` is
tried before ``triton.model_name`` on a span that carries both."""
