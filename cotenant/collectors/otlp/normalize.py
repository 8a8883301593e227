"""Turn OTLP spans into ``requests`` rows.

The span conventions understood are the shapes of :mod:`collectors.shapes` (ours, vLLM,
Triton; DESIGN.md, "Span conventions"); how a span is sorted into phase child, root of a shape,
a shape's own child or unrecognized is the contract in :mod:`collectors.shapes.base`.

Children usually arrive before their root (they end first); a child whose root is not in the
same export waits in :class:`collectors.otlp.pending_children.PendingChildren` for up to
``pending_ttl_s``. A root whose shape *awaits* a child another process exports (Ray Serve's
replica span) is held for up to ``root_wait_s``, its row built as soon as that child arrives
(or, after the wait, without it; :meth:`Normalizer.flush` builds what is held at shutdown).
Spans of no shape are ignored and counted by reason; spans that look like
requests but cannot be used (no model, bad ids or times, an attribute of the wrong type) are
*rejected* and reported back to the client as an OTLP partial success.

Rejection is per request, never per export: every value is range-checked where it is read
(:mod:`collectors.shapes.attributes`, :meth:`_ExportContext.identity`), and the rows are checked
once more against their columns when the Arrow table is built (integers that fit, finite
floats, encodable strings), so a value no check foresaw rejects its own row
(``out_of_range``), never the 99 others of its export.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cotenant.collectors.gpu_resolve import GpuResolver
from cotenant.collectors.otlp.pending_children import Key, PendingChildren
from cotenant.collectors.procfs.pod_identity import pod_ref_of_resource
from cotenant.collectors.shapes import SHAPES
from cotenant.collectors.shapes.attributes import (
    INT64_MAX,
    SCALAR_KINDS,
    as_int,
    as_str,
    attributes,
)
from cotenant.collectors.shapes.base import (
    ATTR_MODEL,
    COMPUTE,
    LOCK,
    PHASE_SPANS,
    Attrs,
    Child,
    Claim,
    Identity,
    Rejected,
    Row,
    SpanShape,
)
from cotenant.core.errors import UsageError
from cotenant.store.schema import arrow_schema

_STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR

REQUEST_SCHEMA = arrow_schema("requests")
_EMPTY = REQUEST_SCHEMA.empty_table()
_Waiting = tuple[float, SpanShape, Any, Attrs, Attrs]
"""A held root: ``(first seen, monotonic s; its shape, span, attributes, resource's)``."""
"""The result of an export without rows: built once (``Schema.empty_table`` takes ~0.4 ms,
more than the rest of a 40-request export's table); Arrow tables are immutable."""


@dataclass
class NormalizeResult:
    """Rows produced from one export, and what was rejected or ignored (by reason)."""

    requests: pa.Table
    spans: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)
    first_error: str = ""

    @property
    def rejected_count(self) -> int:
        return sum(self.rejected.values())


class Normalizer:
    """Stateful (pending children) span normalizer. Not thread-safe: callers serialise.

    ``shapes`` are the span conventions understood, tried in order (see
    :mod:`collectors.shapes.base`); two shapes may not claim one span name, nor a shape a
    phase name (:class:`store.errors.UsageError`).
    """

    def __init__(
        self,
        resolver: GpuResolver,
        *,
        shapes: Sequence[SpanShape] = SHAPES,
        pending_ttl_s: float = 30.0,
        max_pending: int = 1_000_000,
        root_wait_s: float = 10.0,
        max_waiting_roots: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolver = resolver
        self._shapes = tuple(shapes)
        self._by_name: dict[str, SpanShape] = {}
        for shape in self._shapes:
            for name in shape.root_names:
                other = self._by_name.get(name)
                if other is not None:
                    raise UsageError(
                        f"shapes {other.source!r} and {shape.source!r} both claim spans "
                        f"named {name!r}"
                    )
                if name in PHASE_SPANS:
                    raise UsageError(
                        f"shape {shape.source!r} claims spans named {name!r}, a phase child's name"
                    )
                self._by_name[name] = shape
        self._pending = PendingChildren(pending_ttl_s, max_pending)
        self._root_wait_s = root_wait_s
        self._max_waiting = max_waiting_roots
        self._waiting: list[_Waiting] = []
        self._clock = clock
        self.roots_given_up = 0
        """Awaiting roots whose row was built without the awaited child (cumulative)."""

    @property
    def pending_spans(self) -> int:
        """Children held for a root not seen yet."""
        return self._pending.count

    @property
    def waiting_roots(self) -> int:
        """Roots held for a child another process exports (see the module docstring)."""
        return len(self._waiting)

    @property
    def expired(self) -> Counter[str]:
        """Held children dropped so far, by reason (``orphan_child``, ``pending_overflow``)."""
        return self._pending.expired

    def normalize(self, request: Any) -> NormalizeResult:
        """Normalize an ``ExportTraceServiceRequest``; never raises for bad spans."""
        now = self._clock()
        res = NormalizeResult(requests=_EMPTY)
        children: dict[Key, list[Child]] = {}
        roots: list[tuple[SpanShape, Any, Attrs, Attrs]] = []
        by_name, shapes = self._by_name, self._shapes
        not_mine = Claim.NONE  # a local: an enum member lookup costs ~0.1 µs
        phase_of, children_get = PHASE_SPANS.get, children.get
        lock, compute = LOCK, COMPUTE
        n = 0
        for rs in request.resource_spans:
            rattrs = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                spans = ss.spans
                n += len(spans)
                for span in spans:
                    name = span.name
                    phase = phase_of(name)
                    if phase is not None:
                        # inlined: most spans of an export are phase children; each protobuf
                        # field is read once (a read builds a new Python object)
                        c_start = span.start_time_unix_nano
                        c_end = span.end_time_unix_nano
                        if c_end < c_start:
                            res.rejected["bad_time"] += 1
                            res.first_error = res.first_error or (
                                f"span {name!r} ends before it starts"
                            )
                            continue
                        extra: dict[str, Any] | None = None
                        if phase == lock:
                            extra = _lock_of(span.attributes)
                        elif phase == compute:
                            events = span.events
                            if events:
                                extra = {"events": {e.name: e.time_unix_nano for e in events}}
                        key = (span.trace_id, span.parent_span_id)
                        child = (phase, c_start, c_end, span.span_id, extra)
                        lst = children_get(key)
                        if lst is None:
                            children[key] = [child]
                        else:
                            lst.append(child)
                        continue
                    a = attributes(span.attributes)
                    shape = by_name.get(name)
                    if shape is not None:
                        roots.append((shape, span, a, rattrs))
                        continue
                    for shape in shapes:
                        claim = shape.claim(span, a, rattrs)
                        if claim is not_mine:
                            continue
                        if isinstance(claim, tuple):  # a Child of the shape's own
                            key = (span.trace_id, span.parent_span_id)
                            children.setdefault(key, []).append(claim)
                        else:
                            roots.append((shape, span, a, rattrs))
                        break
                    else:
                        res.ignored["unrecognized"] += 1
        res.spans = n
        ctx = _ExportContext(self._pending, children, self._resolver)
        rows: list[Row] = []
        if self._waiting:  # held roots first: this export may hold what they wait for
            waiting, self._waiting = self._waiting, []
            for since, shape, span, a, rattrs in waiting:
                if now - since < self._root_wait_s and shape.awaits(span, a, ctx):
                    self._waiting.append((since, shape, span, a, rattrs))
                else:
                    self._build(shape, span, a, rattrs, ctx, rows, res, since=since)
        for shape, span, a, rattrs in roots:
            if self._root_wait_s > 0 and shape.awaits(span, a, ctx):
                self._wait(now, shape, span, a, rattrs, ctx, rows, res)
            else:
                self._build(shape, span, a, rattrs, ctx, rows, res)
        self._pending.keep(children, now)
        self._pending.expire(now)
        self._finish(rows, res)
        return res

    def flush(self) -> NormalizeResult:
        """The rows of every held root, built now with what has arrived (at shutdown)."""
        res = NormalizeResult(requests=_EMPTY)
        ctx = _ExportContext(self._pending, {}, self._resolver)
        rows: list[Row] = []
        waiting, self._waiting = self._waiting, []
        for since, shape, span, a, rattrs in waiting:
            self._build(shape, span, a, rattrs, ctx, rows, res, since=since)
        self._finish(rows, res)
        return res

    def _wait(
        self,
        now: float,
        shape: SpanShape,
        span: Any,
        a: Attrs,
        rattrs: Attrs,
        ctx: _ExportContext,
        rows: list[Row],
        res: NormalizeResult,
    ) -> None:
        if len(self._waiting) >= self._max_waiting:  # full: the oldest stops waiting
            since, o_shape, o_span, o_a, o_res = self._waiting.pop(0)
            self._build(o_shape, o_span, o_a, o_res, ctx, rows, res, since=since)
        own = type(span)()
        own.CopyFrom(span)  # not a view into the export: that would keep all of it alive
        self._waiting.append((now, shape, own, a, rattrs))

    def _build(
        self,
        shape: SpanShape,
        span: Any,
        a: Attrs,
        rattrs: Attrs,
        ctx: _ExportContext,
        rows: list[Row],
        res: NormalizeResult,
        since: float | None = None,
    ) -> None:
        if since is not None and shape.awaits(span, a, ctx):
            self.roots_given_up += 1
        try:
            rows.append(shape.build_row(span, a, rattrs, ctx))
            rows.extend(ctx.extra)
        except Rejected as exc:
            res.rejected[exc.reason] += 1
            res.first_error = res.first_error or str(exc)
        ctx.extra.clear()

    def _finish(self, rows: list[Row], res: NormalizeResult) -> None:
        if rows:
            try:
                res.requests = _table(rows)
            except (OverflowError, ValueError, TypeError, UnicodeError, pa.ArrowException):
                rows = _usable_rows(rows, res)
                if rows:
                    res.requests = _table(rows, check_finite=False)  # checked row by row

    def export_pending(self) -> list[tuple[str, bytes]]:
        """Pending children as ``(trace_id hex, JSON bytes)`` to persist at shutdown."""
        return self._pending.export()

    def import_pending(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Restore children saved by :meth:`export_pending`; returns how many."""
        return self._pending.restore(items, self._clock())


_LOCK_NAME, _LOCK_HOLDER = "cotenant.lock.name", "cotenant.lock.holder"
_LOCK_KEYS = frozenset({_LOCK_NAME, _LOCK_HOLDER})


def _lock_of(kvs: Iterable[Any]) -> dict[str, Any]:
    """A ``lock.wait`` child's ``extra``: its lock name and holder as
    ``as_str(attributes(kvs).get(key))`` gives them (the last of repeated keys; arrays, maps
    and empty values None), without decoding its other attributes."""
    name = holder = None
    for kv in kvs:
        key = kv.key
        if key in _LOCK_KEYS:
            v = kv.value
            kind = v.WhichOneof("value")
            value = as_str(getattr(v, kind)) if kind in SCALAR_KINDS else None
            if key == _LOCK_NAME:
                name = value
            else:
                holder = value
    return {"lock": name, "holder": holder}


_FLOAT_COLUMNS = tuple(i for i, f in enumerate(REQUEST_SCHEMA) if pa.types.is_floating(f.type))
_INT_BOUNDS = {
    i: (-(2 ** (f.type.bit_width - 1)), 2 ** (f.type.bit_width - 1) - 1)
    for i, f in enumerate(REQUEST_SCHEMA)
    if pa.types.is_integer(f.type)
}
_STRING_COLUMNS = tuple(i for i, f in enumerate(REQUEST_SCHEMA) if pa.types.is_string(f.type))


_ROW_TYPE = pa.struct(list(REQUEST_SCHEMA))


def _table(rows: list[Row], check_finite: bool = True) -> pa.Table:
    """``rows`` as a ``requests`` table; raises (OverflowError, ArrowInvalid, …) when a value
    does not fit its column, or ValueError when a float is not finite."""
    # one conversion of the row tuples as a struct array: a pa.array call per column costs
    # ~5 us of fixed overhead each, 31 of them more than the values
    batch = pa.RecordBatch.from_struct_array(pa.array(rows, type=_ROW_TYPE))
    if check_finite:
        # NaN and ±inf: the sum is finite when every value is (no per-row test); a false
        # alarm (finite values summing past 1.8e308) only costs the row-by-row check. The
        # values are Python numbers already (pa.array took them): summing them is ~1 us a
        # column, a pyarrow compute call ~10 us
        total = sum([v for row in rows for i in _FLOAT_COLUMNS if (v := row[i]) is not None])
        if not math.isfinite(total):
            raise ValueError("a float column holds a non-finite value")
    return pa.Table.from_batches([batch])


def _row_problem(row: Row) -> str | None:
    """Why ``row`` cannot be stored (the first column that cannot hold its value), or None."""
    for i, (lo, hi) in _INT_BOUNDS.items():
        v = row[i]
        if v is not None and not (isinstance(v, int) and lo <= v <= hi):
            return f"{REQUEST_SCHEMA.field(i).name} = {v!r:.60} does not fit its column"
    for i in _FLOAT_COLUMNS:
        v = row[i]
        if v is not None and not (isinstance(v, int | float) and math.isfinite(v)):
            return f"{REQUEST_SCHEMA.field(i).name} = {v!r:.60} is not a finite number"
    for i in _STRING_COLUMNS:
        v = row[i]
        if v is None:
            continue
        try:
            str(v).encode("utf-8")
        except UnicodeError:
            return f"{REQUEST_SCHEMA.field(i).name} is not valid UTF-8 text"
    return None


def _usable_rows(rows: list[Row], res: NormalizeResult) -> list[Row]:
    """The rows that fit their columns; each other one is rejected (``out_of_range``) by
    itself. Runs only when building the whole export's table failed: the fast path checks
    nothing per row."""
    good = []
    for row in rows:
        problem = _row_problem(row)
        if problem is None:
            good.append(row)
            continue
        res.rejected["out_of_range"] += 1
        res.first_error = res.first_error or f"request span {row[4]}: {problem}"
    return good


class _ExportContext:
    """The :class:`collectors.shapes.base.RowContext` of one export: its children by parent
    (what the roots do not take becomes pending), the pending buffer and the GPU resolver."""

    __slots__ = ("_batch", "_pending", "_resolver", "extra")

    def __init__(
        self, pending: PendingChildren, batch: dict[Key, list[Child]], resolver: GpuResolver
    ) -> None:
        self._pending = pending
        self._batch = batch
        self._resolver = resolver
        self.extra: list[Row] = []
        """Rows the root being built added besides its own (:meth:`add_row`)."""

    def children(self, trace_id: bytes, span_id: bytes) -> list[Child]:
        return self._pending.take((trace_id, span_id), self._batch)

    def peek(self, trace_id: bytes, span_id: bytes) -> list[Child]:
        return self._pending.peek((trace_id, span_id), self._batch)

    def add_row(self, row: Row) -> None:
        self.extra.append(row)

    def identity(self, span: Any, resource: Attrs, model: Any, span_gpu: Any) -> Identity:
        if len(span.trace_id) != 16 or len(span.span_id) != 8:
            raise Rejected(
                "bad_ids",
                f"span {span.name!r} has a trace id of "
                f"{len(span.trace_id)} bytes / span id of {len(span.span_id)} bytes "
                "(want 16 / 8)",
            )
        start, end = span.start_time_unix_nano, span.end_time_unix_nano
        if start <= 0 or end < start:
            raise Rejected("bad_time", f"span {span.name!r} has start {start} and end {end}")
        if end > INT64_MAX:
            raise Rejected(
                "out_of_range", f"span {span.name!r} ends at {end} ns, after the year 2262"
            )
        if model is None:
            model = resource.get(ATTR_MODEL)
        if model is None or model == "":
            raise Rejected("missing_model", f"span {span.name!r} names no model")
        model = as_str(model) or ""
        host = as_str(resource.get("host.name")) or ""
        pid = as_int(resource, "process.pid", 0, INT64_MAX)
        if pid is None:  # vLLM's own resource attribute (a string), on every process it runs
            pid = as_int(resource, "vllm.process_id", 0, INT64_MAX)
        pod = pod_ref_of_resource(resource)
        if pid is not None:
            # a pod's pid is in its own PID namespace: no host process tree to lend it to
            self._resolver.note_model(host, pid, model, family=pod is None)
        if pod is not None:
            self._resolver.note_pod(pod, model)
        if span_gpu is None:
            span_gpu = resource.get("cotenant.gpu")
        gpu = self._resolver.resolve(as_str(span_gpu), host, pid, model, pod)
        status = "error" if span.status.code == _STATUS_ERROR else "ok"
        return start, end, model, host, gpu, pid, status
