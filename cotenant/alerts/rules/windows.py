"""The ``cotenant-fleet-windows`` group of ``fleet.rules.yml``: what central serve's continuous
loop reads every pass, precomputed by Prometheus at the scrape interval.

Without these rules, every loop pass makes Prometheus compute ``histogram_quantile`` over every
bucket of every (model, GPU) of the fleet for each window it re-reads (at 64 nodes x 8 GPUs x 4
models: 49 buckets x 2,048 pairs, a dozen windows a pass). With them, Prometheus computes each
quantile once per evaluation, and the loop reads a few series per (model, GPU):

* ``cotenant:window_latency_seconds:p50_rate<R>`` and ``…:p99_rate<R>``
  ``{model,gpu,namespace,pod}`` — latency quantiles of the requests of the last ``R``;
* ``cotenant:window_phase_seconds:rate<R>`` ``{model,gpu,namespace,pod,phase}`` — seconds
  spent per second in each phase (``phase="total"``: the whole latency);
* ``cotenant:window_phase_requests:rate<R>`` (same labels) — requests per second that
  reached each phase (``phase="total"``: the request rate).

``R`` is the loop's rate window in fleet mode, 4 x ``[prometheus] scrape_interval_s`` (``1m``
at 15 s; a rate needs two samples, :mod:`collectors.prometheus.source`), and the group is evaluated
every scrape interval. The labels are the raw query's, so :class:`PrometheusSource` places the
recorded series on GPUs exactly as it places the raw ones (:mod:`collectors.prometheus.recorded`
holds the reading side of these names; tests/e2e/test_recorded_windows.py checks both agree).
"""

from __future__ import annotations

from typing import Any

from cotenant.alerts.rules.blocks import Record, RuleSettings, duration

HIST = "cotenant_request_duration_seconds"
BY = "model, gpu, namespace, pod"
GROUP = "cotenant-fleet-windows"


def window_records(scrape_interval_s: float) -> list[Record]:
    """The group's rules for agents scraped every ``scrape_interval_s`` seconds."""
    r = duration(4 * scrape_interval_s)
    out = [
        Record(
            f"cotenant:window_latency_seconds:{name}_rate{r}",
            f"histogram_quantile({q}, sum by ({BY}, le) "
            f'(rate({HIST}_bucket{{phase="total"}}[{r}])))',
        )
        for name, q in (("p50", 0.5), ("p99", 0.99))
    ]
    out += [
        Record(
            f"cotenant:window_phase_{what}:rate{r}",
            f"sum by ({BY}, phase) (rate({HIST}_{part}[{r}]))",
        )
        for what, part in (("seconds", "sum"), ("requests", "count"))
    ]
    return out


def window_group(s: RuleSettings) -> dict[str, Any]:
    """The group, evaluated every ``s.scrape_interval_s``."""
    return {
        "name": GROUP,
        "interval": duration(s.scrape_interval_s),
        "rules": [r.to_dict() for r in window_records(s.scrape_interval_s)],
    }
