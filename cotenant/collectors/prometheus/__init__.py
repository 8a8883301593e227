"""Prometheus and PromQL: the fleet path's ``PrometheusSource``, its queries, client, joins and
frames, the week reduced in Prometheus, and the backfill of a store's rollups. See
docs/architecture.md."""
