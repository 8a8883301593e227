"""Turn OTLP spans into ``requests`` rows.

Three shapes are recognised (DESIGN.md, "Span conventions"):

* **ours** — a root span carrying ``cotenant.model`` with children named ``queue``,
  ``lock.wait``, ``preprocess``, ``transfer.h2d``, ``compute``, ``transfer.d2h``,
  ``postprocess``; the phases are the critical path of the root over its children.
* **vLLM** — one ``llm_request`` span with ``gen_ai.latency.*`` attributes in seconds.
* **Triton** — an ``InferRequest`` root, a model span (``triton.model_name``) and a ``compute``
  span, with ``QUEUE_START``/``COMPUTE_*`` events.

Children usually arrive before their root (they end first); a child whose root is not in the
same export waits in a pending buffer for up to ``pending_ttl_s``. Spans of other shapes are
ignored and counted by reason; spans that look like requests but cannot be used (no model, bad
ids or times, an attribute of the wrong type) are *rejected* and reported back to the client as
an OTLP partial success.
"""

from __future__ import annotations

import json
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from collectors.critical_path import OTHER, critical_path
from collectors.gpu_resolve import GpuResolver
from store.schema import PHASES, arrow_schema

PHASE_SPANS: dict[str, int] = {
    "queue": PHASES.index("queue"),
    "lock.wait": PHASES.index("lock_wait"),
    "preprocess": PHASES.index("preprocess"),
    "transfer.h2d": PHASES.index("h2d"),
    "compute": PHASES.index("compute"),
    "transfer.d2h": PHASES.index("d2h"),
    "postprocess": PHASES.index("postprocess"),
}
TRITON_MODEL = -1  # pseudo phase index of a Triton model span
_LOCK = PHASES.index("lock_wait")
_COMPUTE = PHASES.index("compute")
_QUEUE = PHASES.index("queue")
_H2D = PHASES.index("h2d")
_D2H = PHASES.index("d2h")

VLLM_SPAN = "llm_request"
TRITON_ROOT = "InferRequest"
ATTR_MODEL = "cotenant.model"
TRITON_MODEL_ATTR = "triton.model_name"
_STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR

REQUEST_SCHEMA = arrow_schema("requests")

# A pending child: (phase index, start ns, end ns, own span id, extra or None).
Child = tuple[int, int, int, bytes, dict[str, Any] | None]
Row = tuple[Any, ...]


class Rejected(Exception):
    """A request-shaped span that cannot be used; ``reason`` is the counter label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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


def any_value(v: Any) -> Any:
    """The Python value of an OTLP ``AnyValue`` (None for arrays, maps and empty values)."""
    kind = v.WhichOneof("value")
    if kind is None or kind in ("array_value", "kvlist_value"):
        return None
    return getattr(v, kind)


_SCALARS = frozenset({"string_value", "bool_value", "int_value", "double_value", "bytes_value"})


def attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    """Attributes as a dict (any_value inlined: this runs for every request span)."""
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = getattr(v, kind) if kind in _SCALARS else None
    return out


def _as_int(attrs: dict[str, Any], key: str) -> int | None:
    v = attrs.get(key)
    if v is None:
        return None
    if isinstance(v, bool):
        raise Rejected("bad_attribute", f"attribute {key} must be an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
    raise Rejected("bad_attribute", f"attribute {key} must be an integer, got {v!r}")


def _as_seconds_ms(attrs: dict[str, Any], key: str) -> float | None:
    v = attrs.get(key)
    if v is None:
        return None
    if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0:
        return float(v) * 1000.0
    if isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            f = -1.0
        if f >= 0:
            return f * 1000.0
    raise Rejected("bad_attribute", f"attribute {key} must be seconds >= 0, got {v!r}")


def _as_str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


class Normalizer:
    """Stateful (pending children) span normalizer. Not thread-safe: callers serialise."""

    def __init__(
        self,
        resolver: GpuResolver,
        *,
        pending_ttl_s: float = 30.0,
        max_pending: int = 1_000_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._resolver = resolver
        self._ttl = pending_ttl_s
        self._max_pending = max_pending
        self._clock = clock
        # (trace_id, parent_span_id) -> (first seen, children)
        self._pending: OrderedDict[tuple[bytes, bytes], tuple[float, list[Child]]] = OrderedDict()
        self._pending_count = 0
        self.expired: Counter[str] = Counter()

    @property
    def pending_spans(self) -> int:
        return self._pending_count

    # -- main entry -------------------------------------------------------------------------

    def normalize(self, request: Any) -> NormalizeResult:
        """Normalize an ``ExportTraceServiceRequest``; never raises for bad spans."""
        now = self._clock()
        res = NormalizeResult(requests=REQUEST_SCHEMA.empty_table())
        children: dict[tuple[bytes, bytes], list[Child]] = {}
        roots: list[tuple[str, Any, dict[str, Any], dict[str, Any]]] = []
        n = 0
        for rs in request.resource_spans:
            rattrs = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    n += 1
                    name = span.name
                    phase = PHASE_SPANS.get(name)
                    if phase is not None:
                        extra: dict[str, Any] | None = None
                        if phase == _LOCK:
                            a = attributes(span.attributes)
                            extra = {
                                "lock": _as_str(a.get("cotenant.lock.name")),
                                "holder": _as_str(a.get("cotenant.lock.holder")),
                            }
                        elif phase == _COMPUTE and len(span.events):
                            extra = {"events": {e.name: e.time_unix_nano for e in span.events}}
                        c_start = span.start_time_unix_nano
                        c_end = span.end_time_unix_nano
                        if c_end < c_start:
                            res.rejected["bad_time"] += 1
                            res.first_error = res.first_error or (
                                f"span {name!r} ends before it starts"
                            )
                            continue
                        key = (span.trace_id, span.parent_span_id)
                        lst = children.get(key)
                        child = (
                            phase,
                            c_start,
                            c_end,
                            span.span_id,
                            extra,
                        )
                        if lst is None:
                            children[key] = [child]
                        else:
                            lst.append(child)
                        continue
                    if name == VLLM_SPAN:
                        roots.append(("vllm", span, attributes(span.attributes), rattrs))
                        continue
                    if name == TRITON_ROOT:
                        roots.append(("triton", span, {}, rattrs))
                        continue
                    a = attributes(span.attributes)
                    if ATTR_MODEL in a:
                        roots.append(("ours", span, a, rattrs))
                    elif TRITON_MODEL_ATTR in a:
                        key = (span.trace_id, span.parent_span_id)
                        events = {e.name: e.time_unix_nano for e in span.events}
                        child = (
                            TRITON_MODEL,
                            span.start_time_unix_nano,
                            span.end_time_unix_nano,
                            span.span_id,
                            {"model": _as_str(a[TRITON_MODEL_ATTR]), "events": events},
                        )
                        children.setdefault(key, []).append(child)
                    else:
                        res.ignored["unrecognized"] += 1
        res.spans = n
        rows: list[Row] = []
        for kind, span, a, rattrs in roots:
            try:
                if kind == "ours":
                    row = self._ours(span, a, rattrs, children)
                elif kind == "vllm":
                    row = self._vllm(span, a, rattrs)
                else:
                    row = self._triton(span, rattrs, children)
            except Rejected as exc:
                res.rejected[exc.reason] += 1
                res.first_error = res.first_error or str(exc)
                continue
            rows.append(row)
        self._keep_pending(children, now)
        self._expire(now)
        if rows:
            cols = list(zip(*rows, strict=True))
            res.requests = pa.Table.from_arrays(
                [pa.array(c, type=f.type) for c, f in zip(cols, REQUEST_SCHEMA, strict=True)],
                schema=REQUEST_SCHEMA,
            )
        return res

    # -- pending children -------------------------------------------------------------------

    def _take_children(
        self, key: tuple[bytes, bytes], batch: dict[tuple[bytes, bytes], list[Child]]
    ) -> list[Child]:
        got = batch.pop(key, None) or []
        if self._pending:
            held = self._pending.pop(key, None)
            if held is not None:
                self._pending_count -= len(held[1])
                got = held[1] + got
        return got

    def _keep_pending(self, children: dict[tuple[bytes, bytes], list[Child]], now: float) -> None:
        for key, lst in children.items():
            held = self._pending.get(key)
            if held is None:
                self._pending[key] = (now, lst)
            else:
                held[1].extend(lst)
            self._pending_count += len(lst)
        while self._pending_count > self._max_pending and self._pending:
            _, (_, lst) = self._pending.popitem(last=False)
            self._pending_count -= len(lst)
            self.expired["pending_overflow"] += len(lst)

    def _expire(self, now: float) -> None:
        cutoff = now - self._ttl
        while self._pending:
            key = next(iter(self._pending))
            seen, lst = self._pending[key]
            if seen >= cutoff:
                break
            del self._pending[key]
            self._pending_count -= len(lst)
            self.expired["orphan_child"] += len(lst)

    def export_pending(self) -> list[tuple[str, bytes]]:
        """Pending children as ``(trace_id hex, JSON bytes)`` to persist at shutdown."""
        out = []
        for (trace, parent), (_, lst) in self._pending.items():
            payload = json.dumps(
                {
                    "parent": parent.hex(),
                    "children": [[p, s, e, sid.hex(), x] for p, s, e, sid, x in lst],
                }
            ).encode()
            out.append((trace.hex(), payload))
        return out

    def import_pending(self, items: Iterable[tuple[str, bytes]]) -> int:
        """Restore children saved by :meth:`export_pending`; returns how many."""
        now = self._clock()
        restored: dict[tuple[bytes, bytes], list[Child]] = {}
        for trace_hex, payload in items:
            d = json.loads(payload)
            key = (bytes.fromhex(trace_hex), bytes.fromhex(d["parent"]))
            restored.setdefault(key, []).extend(
                (int(p), int(s), int(e), bytes.fromhex(sid), x) for p, s, e, sid, x in d["children"]
            )
        self._keep_pending(restored, now)
        return sum(len(v) for v in restored.values())

    # -- the three shapes -------------------------------------------------------------------

    def _common(
        self,
        span: Any,
        rattrs: dict[str, Any],
        model: Any,
        span_gpu: Any,
    ) -> tuple[int, int, str, str, str, int | None, str]:
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
        if model is None:
            model = rattrs.get(ATTR_MODEL)
        if model is None or model == "":
            raise Rejected("missing_model", f"span {span.name!r} names no model")
        model = _as_str(model) or ""
        host = _as_str(rattrs.get("host.name")) or ""
        pid = _as_int(rattrs, "process.pid")
        if pid is not None:
            self._resolver.note_model(host, pid, model)
        if span_gpu is None:
            span_gpu = rattrs.get("cotenant.gpu")
        gpu = self._resolver.resolve(_as_str(span_gpu), host, pid, model)
        status = "error" if span.status.code == _STATUS_ERROR else "ok"
        return start, end, model, host, gpu, pid, status

    def _ours(
        self,
        span: Any,
        a: dict[str, Any],
        rattrs: dict[str, Any],
        batch: dict[tuple[bytes, bytes], list[Child]],
    ) -> Row:
        kids = self._take_children((span.trace_id, span.span_id), batch)
        start, end, model, host, gpu, pid, status = self._common(
            span, rattrs, a.get(ATTR_MODEL), a.get("cotenant.gpu")
        )
        ns = critical_path(start, end, [c for c in kids if c[0] >= 0])
        lock_name = lock_holder = None
        longest = -1
        for p, s, e, _, x in kids:
            if p == _LOCK and x is not None and e - s > longest:
                longest = e - s
                lock_name, lock_holder = x.get("lock"), x.get("holder")
        tenant = _as_str(a.get("cotenant.tenant", rattrs.get("cotenant.tenant")))
        return (
            start,
            end,
            (end - start) / 1e6,
            span.trace_id.hex(),
            span.span_id.hex(),
            model,
            tenant,
            host,
            pid,
            gpu,
            _as_int(a, "cotenant.priority"),
            _as_int(a, "cotenant.batch_size"),
            _as_int(a, "gen_ai.usage.prompt_tokens"),
            _as_int(a, "gen_ai.usage.completion_tokens"),
            status,
            "ours",
            *[v / 1e6 for v in ns],
            lock_name,
            lock_holder,
            _as_seconds_ms(a, "gen_ai.latency.time_to_first_token"),
        )

    def _vllm(self, span: Any, a: dict[str, Any], rattrs: dict[str, Any]) -> Row:
        model = (
            a.get("gen_ai.response.model")
            or a.get("gen_ai.request.model")
            or a.get(ATTR_MODEL)
            or rattrs.get(ATTR_MODEL)
        )
        if not model:
            service = _as_str(rattrs.get("service.name")) or ""
            model = None if service.startswith("unknown_service") else service
        start, end, model, host, gpu, pid, status = self._common(
            span, rattrs, model, a.get("cotenant.gpu")
        )
        latency = (end - start) / 1e6
        queue = _as_seconds_ms(a, "gen_ai.latency.time_in_queue") or 0.0
        compute = _as_seconds_ms(a, "gen_ai.latency.time_in_model_inference")
        if compute is None:
            compute = (_as_seconds_ms(a, "gen_ai.latency.time_in_model_prefill") or 0.0) + (
                _as_seconds_ms(a, "gen_ai.latency.time_in_model_decode") or 0.0
            )
        phases = [0.0] * len(PHASES)
        phases[_QUEUE], phases[_COMPUTE] = queue, compute
        _fit(phases, latency)
        return (
            start,
            end,
            latency,
            span.trace_id.hex(),
            span.span_id.hex(),
            model,
            _as_str(a.get("cotenant.tenant", rattrs.get("cotenant.tenant"))),
            host,
            pid,
            gpu,
            None,
            None,
            _as_int(a, "gen_ai.usage.prompt_tokens"),
            _as_int(a, "gen_ai.usage.completion_tokens"),
            status,
            "vllm",
            *phases,
            None,
            None,
            _as_seconds_ms(a, "gen_ai.latency.time_to_first_token"),
        )

    def _triton(
        self, span: Any, rattrs: dict[str, Any], batch: dict[tuple[bytes, bytes], list[Child]]
    ) -> Row:
        kids = self._take_children((span.trace_id, span.span_id), batch)
        model_span = next((c for c in kids if c[0] == TRITON_MODEL), None)
        if model_span is None:
            raise Rejected(
                "triton_incomplete",
                "InferRequest span arrived without its model span (triton.model_name)",
            )
        mx = model_span[4] or {}
        compute_kids = self._take_children((span.trace_id, model_span[3]), batch)
        ev: dict[str, int] = dict(mx.get("events") or {})
        for c in compute_kids:
            if c[0] == _COMPUTE and c[4]:
                ev.update(c[4].get("events") or {})
        start, end, model, host, gpu, pid, status = self._common(
            span, rattrs, mx.get("model"), None
        )
        latency = (end - start) / 1e6
        phases = [0.0] * len(PHASES)
        q0 = ev.get("QUEUE_START", ev.get("REQUEST_START"))
        c0, c1 = ev.get("COMPUTE_START"), ev.get("COMPUTE_INPUT_END")
        c2, c3 = ev.get("COMPUTE_OUTPUT_START"), ev.get("COMPUTE_END")
        if q0 is not None and c0 is not None:
            phases[_QUEUE] = max(0, c0 - q0) / 1e6
        if c0 is not None and c3 is not None:
            if c1 is not None and c2 is not None:
                phases[_H2D] = max(0, c1 - c0) / 1e6
                phases[_COMPUTE] = max(0, c2 - c1) / 1e6
                phases[_D2H] = max(0, c3 - c2) / 1e6
            else:
                phases[_COMPUTE] = max(0, c3 - c0) / 1e6
        _fit(phases, latency)
        return (
            start,
            end,
            latency,
            span.trace_id.hex(),
            span.span_id.hex(),
            model,
            _as_str(rattrs.get("cotenant.tenant")),
            host,
            pid,
            gpu,
            None,
            None,
            None,
            None,
            status,
            "triton",
            *phases,
            None,
            None,
            None,
        )


def _fit(phases: list[float], latency: float) -> None:
    """Make the phases sum to ``latency``: the rest is ``other``; if the reported phases
    overshoot (clock skew between timers), scale them down proportionally."""
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
