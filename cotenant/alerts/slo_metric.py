"""``cotenant_slo_seconds{model}``: the configured p99 SLOs, for the rules to compare against.

``rules/cotenant.rules.yml`` reads it through ``cotenant:slo_seconds``, so SLOs set in serve's
``[analysis] slo_ms`` alert without re-rendering the rules.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric


class SloMetric:
    """A collector exporting one sample per model with an SLO (milliseconds in, seconds out)."""

    def __init__(self, slo_ms: Mapping[str, float], registry: CollectorRegistry) -> None:
        self._slo_s = {m: ms / 1000.0 for m, ms in sorted(slo_ms.items())}
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        fam = GaugeMetricFamily(
            "cotenant_slo_seconds",
            "p99 latency SLO per model ([analysis] slo_ms)",
            labels=["model"],
        )
        for model, s in self._slo_s.items():
            fam.add_metric([model], s)
        yield fam
