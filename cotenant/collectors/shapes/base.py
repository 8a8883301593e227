"""The span-shape contract: which spans a shape claims, and how its request root becomes a row.

A *span shape* is one exporter's convention for a served request (ours, vLLM, Triton; see
DESIGN.md, "Span conventions"). :class:`collectors.otlp.normalize.Normalizer` takes a tuple of
shapes (:data:`collectors.shapes.SHAPES` by default) and sorts every span of an export so:

1. A span named after a phase (:data:`PHASE_SPANS`) is a **phase child**, held for its parent
   whatever shape the parent turns out to be: children end, and are exported, before their
   root, so their shape is not known when they arrive. The normalizer keeps what any root reads
   of them (lock name and holder of ``lock.wait``, span events of ``compute``).
2. A span whose name is in a shape's :attr:`SpanShape.root_names` is that shape's request root
   (a name outranks attributes: names are checked before any :meth:`SpanShape.claim`).
3. Otherwise each shape's :meth:`SpanShape.claim` is asked in tuple order with the span's
   attributes and its resource's; the first answer other than :attr:`Claim.NONE` wins: a root,
   or a :data:`Child` of the shape's own to hold for its parent (e.g. Triton's model span, or
   Ray Serve's replica span, which carries the replica process's ``process.pid`` from another
   resource than its root's).
4. A span nobody claims is ignored and counted as ``unrecognized``.

Then :meth:`SpanShape.build_row` turns each root into one ``requests`` row, taking its
children from the :class:`RowContext` (this export's and those still pending from earlier
exports). A root that cannot be used raises :class:`Rejected`, counted by its reason.

A root whose row needs a child that *another process* exports (Ray Serve's replica span: the
proxy's batch may be sent before the replica's) says so with :meth:`SpanShape.awaits`; the
normalizer then holds the root, for up to its ``root_wait_s``, until that child has arrived,
and builds the row without it only after that.

Adding a shape: one module under ``collectors/shapes/`` implementing :class:`SpanShape`, listed
in :data:`collectors.shapes.SHAPES`, and a case in ``tests/test_span_shapes.py``; no other
shape and not the normalizer change.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Protocol

from cotenant.collectors.otlp.critical_path import OTHER
from cotenant.core.phases import PHASES

Attrs = dict[str, Any]
"""Decoded OTLP attributes (``key -> str | bool | int | float | bytes | None``)."""

Child = tuple[int, int, int, bytes, dict[str, Any] | None]
"""A held child span: ``(phase index, start ns, end ns, own span id, extra or None)``.

The phase indexes :data:`store.schema.PHASES`; a negative phase marks a shape's own child
(e.g. Triton's model span, -1), never booked on a critical path. ``extra`` must be
JSON-serialisable: pending children are persisted at shutdown."""

Row = tuple[Any, ...]
"""One ``requests`` row, in the column order of ``store.schema.REQUESTS``; shapes build it by
name with :func:`request_row` (a tuple: the normalizer turns a batch of them into one Arrow
struct array)."""


def request_row(
    *,
    ts_start_ns: int,
    ts_end_ns: int,
    trace_id: str,
    span_id: str,
    model: Any,
    host: Any,
    pid: Any,
    gpu: Any,
    status: str,
    source: str,
    phases_ms: Sequence[float],
    tenant: Any = None,
    priority: Any = None,
    batch_size: Any = None,
    prompt_tokens: Any = None,
    output_tokens: Any = None,
    lock_name: Any = None,
    lock_holder: Any = None,
    ttft_ms: Any = None,
    replica: Any = None,
) -> Row:
    """A ``requests`` row from its columns by name: ``latency_ms`` is ``ts_end_ns -
    ts_start_ns`` in ms and ``phases_ms`` the phase columns in :data:`PHASES` order (they sum
    to it, see :func:`fit_phases`). ``tests/test_span_shapes.py`` checks the order against
    ``store.schema.REQUESTS``."""
    return (
        ts_start_ns,
        ts_end_ns,
        (ts_end_ns - ts_start_ns) / 1e6,
        trace_id,
        span_id,
        model,
        tenant,
        host,
        pid,
        gpu,
        priority,
        batch_size,
        prompt_tokens,
        output_tokens,
        status,
        source,
        *phases_ms,
        lock_name,
        lock_holder,
        ttft_ms,
        replica,
    )


Identity = tuple[int, int, str, str, str, int | None, str]
"""``(start ns, end ns, model, host, gpu, pid or None, status "ok" | "error")``."""

PHASE_SPANS: dict[str, int] = {
    "queue": PHASES.index("queue"),
    "lock.wait": PHASES.index("lock_wait"),
    "preprocess": PHASES.index("preprocess"),
    "transfer.h2d": PHASES.index("h2d"),
    "compute": PHASES.index("compute"),
    "transfer.d2h": PHASES.index("d2h"),
    "postprocess": PHASES.index("postprocess"),
    "model.load": PHASES.index("other"),
}
"""Span name -> phase index of the phase children (step 1 of the module docstring).

``model.load`` (a model, adapter or pipeline load the request waited for; attributes
``cotenant.load.kind`` and ``cotenant.load.name``) has no phase of its own: its time on the
critical path is ``other``, like time no child covers (docs/instrumenting.md, "Model loads")."""

LOCK = PHASES.index("lock_wait")
COMPUTE = PHASES.index("compute")
QUEUE = PHASES.index("queue")
H2D = PHASES.index("h2d")
D2H = PHASES.index("d2h")

ATTR_MODEL = "cotenant.model"


class Claim(enum.Enum):
    """What :meth:`SpanShape.claim` says of a span besides handing back a :data:`Child`."""

    ROOT = "root"
    """A request root of this shape: :meth:`SpanShape.build_row` will be called for it."""
    NONE = "none"
    """Not this shape's span: ask the next shape."""


class Rejected(Exception):
    """A request-shaped span that cannot be used; ``reason`` is the counter label
    (``bad_ids``, ``bad_time``, ``missing_model``, ``bad_attribute``, ``out_of_range`` (a
    value its column cannot hold: an integer past 32 or 64 bits, a time past 2262, a duration
    that is not finite), or a shape's own, e.g. ``triton_incomplete``). The message goes back
    to the client as an OTLP partial success."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RowContext(Protocol):
    """What a shape may ask of the normalizer while it builds a row."""

    def children(self, trace_id: bytes, span_id: bytes) -> list[Child]:
        """Take the children held for span ``span_id`` of ``trace_id`` (this export's and
        pending ones, oldest first); they are forgotten once taken. ``[]`` when none."""
        ...

    def peek(self, trace_id: bytes, span_id: bytes) -> list[Child]:
        """Like :meth:`children`, but the children stay held."""
        ...

    def add_row(self, row: Row) -> None:
        """A further row the root being built gives besides its own (a Triton ensemble's
        composing models); dropped with the root's if the root is rejected."""
        ...

    def identity(self, span: Any, resource: Attrs, model: Any, span_gpu: Any) -> Identity:
        """Check ``span``'s ids and times and resolve who served it: ``model`` and
        ``span_gpu`` are what the span says (None: fall back to the resource's
        ``cotenant.*`` attributes); the GPU goes through the normalizer's ``GpuResolver``,
        which also learns the model of the resource's ``process.pid`` (else vLLM's
        ``vllm.process_id``) and Kubernetes pod (``k8s.*``).
        Raises :class:`Rejected` (``bad_ids``, ``bad_time``, ``missing_model``,
        ``bad_attribute``)."""
        ...


class SpanShape(Protocol):
    """One exporter's convention for a served request (see the module docstring)."""

    @property
    def source(self) -> str:
        """The ``requests.source`` value of this shape's rows (``ours``, ``vllm``, …)."""
        ...

    @property
    def root_names(self) -> frozenset[str]:
        """Span names that are this shape's roots whatever their attributes (may be empty)."""
        ...

    def claim(self, span: Any, attrs: Attrs, resource: Attrs) -> Claim | Child:
        """Sort a span that neither a phase name nor any shape's ``root_names`` claimed.

        ``span`` is an OTLP ``Span`` message, ``attrs`` its decoded attributes and
        ``resource`` its resource's (read it only for what a root cannot see: a child from
        another process; it is not copied, so keep only the values you need). Returns
        :attr:`Claim.ROOT`, a :data:`Child` to hold for the span's parent, or
        :attr:`Claim.NONE`. Runs for every such span: keep it to a lookup or two."""
        ...

    def awaits(self, span: Any, attrs: Attrs, ctx: RowContext) -> bool:
        """True while a root this shape claimed lacks a child another process exports, so
        its row should wait (read children with :meth:`RowContext.peek` only). Shapes whose
        children come from the root's own process answer False."""
        ...

    def build_row(self, span: Any, attrs: Attrs, resource: Attrs, ctx: RowContext) -> Row:
        """The ``requests`` row of a root this shape claimed; ``resource`` holds the decoded
        resource attributes. The phase columns sum to ``latency_ms`` (see
        :func:`fit_phases`). Raises :class:`Rejected` when the span cannot be used."""
        ...


def fit_phases(phases: list[float], latency: float) -> None:
    """Make ``phases`` (ms, indexed like ``PHASES``) sum to ``latency`` (ms), in place: the
    rest is ``other``; if the reported phases overshoot (clock skew between timers), they are
    scaled down proportionally; a latency <= 0 zeroes them all."""
    known = sum(phases)
    if known > latency > 0:
        k = latency / known
        for i in range(len(phases)):
            phases[i] *= k
        phases[OTHER] = 0.0
    elif latency <= 0:
        for i in range(len(phases)):
            phases[i] = 0.0
    else:
        phases[OTHER] = latency - known
