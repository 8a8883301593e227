"""Ray Serve's convention (``ray.serve._private.tracing_utils``, checked on Ray 2.60): three
SERVER spans per request, each named after what it does followed by the deployment and method:

* ``proxy_http_request <deployment> <METHOD> <route>`` (or ``proxy_grpc_request …``), the
  **root**, in the proxy actor's process: attributes ``app``, ``deployment``, ``request_id``,
  ``http.status_code`` (int);
* ``route_to_replica <deployment> <method>``, its child in the same process: choosing a
  replica and handing the request over;
* ``replica_handle_request <deployment> <method>``, the route span's child in the **replica's**
  process: attributes ``replica_id`` and ``deployment``, and (only with
  ``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=process``) the replica's ``process.pid`` on its resource.

One row per root: ``model`` is ``app/deployment`` (the target the Ray Serve actuator backend
takes), ``replica`` the ``replica_id``, ``queue_ms`` the time from the route span's start to the
replica span's start, ``compute_ms`` the replica span's duration, the rest of the proxy's
latency ``other``. Who served it (``pid``, ``host.name``, ``cotenant.gpu``) comes from the
replica span's resource, never the proxy's: the proxy serves every deployment, so its pid must
not be joined to the model's GPU. A routed root (its route span is there) *awaits* its replica
span: the proxy and the replica export in separate batches, so with the SDK's usual
``BatchSpanProcessor`` the root often comes first, and the normalizer holds it for up to
``otlp.root_wait_s``. After that (or a root answered by the proxy alone) the row has no
replica, pid or phases; a replica span coming later expires as an orphan child.
"""

from __future__ import annotations

from typing import Any

from cotenant.collectors.shapes.attributes import INT64_MAX, as_int, as_str
from cotenant.collectors.shapes.base import (
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

ROOT_PREFIXES = ("proxy_http_request ", "proxy_grpc_request ")
ROUTE_PREFIX = "route_to_replica "
REPLICA_PREFIX = "replica_handle_request "
RAY_ROUTE = -2
"""Pseudo phase of a held ``route_to_replica`` span (negative: never on a critical path)."""
RAY_REPLICA = -3
"""Pseudo phase of a held ``replica_handle_request`` span."""

_SERVED_BY = ("process.pid", "host.name", "cotenant.gpu")
"""Resource keys that say who served a request: read from the replica span's resource."""

_ROOT, _NONE = Claim.ROOT, Claim.NONE


class RayServeShape:
    """:class:`collectors.shapes.base.SpanShape` of Ray Serve's request tracing."""

    source = "rayserve"
    root_names: frozenset[str] = frozenset()  # names carry the deployment: claimed by prefix

    def claim(self, span: Any, attrs: Attrs, resource: Attrs) -> Claim | Child:
        if "deployment" not in attrs:
            return _NONE
        name = span.name
        if name.startswith(ROOT_PREFIXES):
            return _ROOT
        if name.startswith(ROUTE_PREFIX):
            return (
                RAY_ROUTE,
                span.start_time_unix_nano,
                span.end_time_unix_nano,
                span.span_id,
                None,
            )
        if name.startswith(REPLICA_PREFIX):
            extra: dict[str, Any] = {"replica": as_str(attrs.get("replica_id")) or None}
            for key in _SERVED_BY:
                v = resource.get(key)
                if v is not None and v != "":
                    extra[key] = v if isinstance(v, int | str) else as_str(v)
            return (
                RAY_REPLICA,
                span.start_time_unix_nano,
                span.end_time_unix_nano,
                span.span_id,
                extra,
            )
        return _NONE

    def awaits(self, span: Any, attrs: Attrs, ctx: RowContext) -> bool:
        # routed (the route span comes from the root's own process) but no replica span yet;
        # a request answered by the proxy alone (no route span) has no replica to wait for
        trace_id = span.trace_id
        routes = [r for r in ctx.peek(trace_id, span.span_id) if r[0] == RAY_ROUTE]
        return bool(routes) and not any(
            c[0] == RAY_REPLICA for r in routes for c in ctx.peek(trace_id, r[3])
        )

    def build_row(self, span: Any, attrs: Attrs, resource: Attrs, ctx: RowContext) -> Row:
        trace_id, span_id = span.trace_id, span.span_id
        routes = [c for c in ctx.children(trace_id, span_id) if c[0] == RAY_ROUTE]
        route: Child | None = None
        replica: Child | None = None
        for r in routes:  # a retried route leaves several: the last replica reached served it
            for c in ctx.children(trace_id, r[3]):
                if c[0] == RAY_REPLICA and (replica is None or c[1] >= replica[1]):
                    route, replica = r, c
        served = {k: v for k, v in resource.items() if k not in _SERVED_BY}
        if replica is not None and replica[4]:
            served.update((k, replica[4][k]) for k in _SERVED_BY if k in replica[4])
        app, deployment = as_str(attrs.get("app")), as_str(attrs.get("deployment"))
        model = f"{app}/{deployment}" if app and deployment else deployment
        start, end, model, host, gpu, pid, status = ctx.identity(span, served, model, None)
        code = as_int(attrs, "http.status_code", 0, INT64_MAX)
        if code is not None and code >= 500:
            status = "error"
        latency = (end - start) / 1e6
        phases = [0.0] * len(PHASES)
        if route is not None and replica is not None:
            phases[QUEUE] = max(0, replica[1] - route[1]) / 1e6
            phases[COMPUTE] = max(0, replica[2] - replica[1]) / 1e6
        fit_phases(phases, latency)
        return request_row(
            ts_start_ns=start,
            ts_end_ns=end,
            trace_id=trace_id.hex(),
            span_id=span_id.hex(),
            model=model,
            tenant=as_str(resource.get("cotenant.tenant")),
            host=host,
            pid=pid,
            gpu=gpu,
            status=status,
            source=self.source,
            phases_ms=phases,
            replica=(replica[4] or {}).get("replica") if replica is not None else None,
        )
