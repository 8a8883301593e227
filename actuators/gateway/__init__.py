"""The bundled admission gateway: a reverse proxy with per-model and per-tenant token buckets
and a priority queue, driven through its control API. See docs/gateway.md.

Modules: ``http1`` (HTTP/1.1 parsing), ``upstream`` (pooled upstream connections), ``proxy``
(client connections), ``request`` (one request's way through), ``admission`` and
``token_bucket`` (limits and queue), ``identify`` (model, tenant, priority injection),
``control`` (control API), ``telemetry`` (metrics and spans), ``settings``, ``server`` (the
process).
"""
