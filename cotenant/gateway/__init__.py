"""The bundled admission gateway: a reverse proxy with per-model and per-tenant token buckets,
a priority queue and routing across replicas, driven through its control API. See
docs/gateway.md.

Modules: ``request_parser`` (client requests: llhttp through httptools, or ``http1``),
``http1`` (the builtin HTTP/1.1 parser; upstream responses), ``upstream`` (pooled upstream
connections), ``proxy`` (client connections), ``conn_caps`` (connection caps), ``request``
(one request's way through), ``admission`` and ``tickets`` (limits and queue, on
:mod:`core.token_bucket`), ``routing``, ``routing_config``, ``balance`` (on
:mod:`core.balancing`), ``replica`` and ``health`` (replicas, routes, policies, reservations,
passive health), ``identify`` (model, tenant, priority
injection), ``control`` (control API), ``telemetry`` (metrics and the span sink),
``otlp_spans`` and ``span_export`` (the builtin OTLP exporter), ``settings``, ``server`` (the
process).
"""
