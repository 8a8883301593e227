"""Central ``cotenant serve`` over Prometheus (``[prometheus] url`` set): the fleet's wiring.

* ``source``: :class:`collectors.prometheus.source.PrometheusSource` behind
  :class:`store.source_watch.WatchedSource`, which the analysis loop, on-demand diagnoses,
  alerts, actuators and the dashboard all read. When Prometheus is down, each reader fails
  its call (the loop skips the pass); serve keeps running, logs the outage once and its end
  once, and ``/api/v1/status`` and ``cotenant_prometheus_up`` say so.
* ``drill``: :class:`cotenant.app.fleet_drill.AgentDrill`, the slowest requests of an incident's
  victim from the agent that owns its GPU: ``GET /api/v1/incidents/{id}/requests`` and the
  dashboard's incident page.
* ``week_rollups``: the weekly report's week, reduced inside Prometheus over the recording
  rules of ``rules/fleet.rules.yml`` (:mod:`collectors.prometheus.week`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI, Query
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from cotenant.analysis.analyzer import Analyzer
from cotenant.app.config import Config
from cotenant.app.fleet_drill import AgentDrill
from cotenant.app.fleet_wiring import AGENTS_QUERY, AgentSeriesWatch
from cotenant.collectors.prometheus.source import PrometheusSource
from cotenant.collectors.prometheus.week import PromQLWeekRollups
from cotenant.core.errors import QueryError
from cotenant.core.http_json import SafeJSONResponse
from cotenant.core.periodic import Periodic
from cotenant.core.source_watch import WatchedSource

DRILL_MAX_LIMIT = 200


class Fleet:
    """What central serve adds when it reads Prometheus (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        registry: CollectorRegistry,
        clock_ns: Callable[[], int] = time.time_ns,
        *,
        token: str = "",
    ) -> None:
        """``token``: the read token sent to the agents' drill-down API ('' = none)."""
        pc = config.prometheus
        self.prometheus = PrometheusSource(
            pc.url,
            pc.timeout_s,
            scrape_interval_s=pc.scrape_interval_s,
            model_gpu=config.gpu.model_gpu,
            default_gpu=config.gpu.default_gpu,
        )
        self.source = WatchedSource(
            self.prometheus, name=f"Prometheus at {self.prometheus.url}", url=self.prometheus.url
        )
        self.drill = AgentDrill(
            self.prometheus, pc.agent_url_template, timeout_s=pc.agent_timeout_s, token=token
        )
        # the report's queries each reduce a day or a week of the fleet: their own timeout
        self._report_source = PrometheusSource(pc.url, pc.report_timeout_s)
        self.week_rollups = PromQLWeekRollups(self._report_source)
        self._clock = clock_ns
        self.agents = AgentSeriesWatch(
            self._count_agents,
            missing_after_s=pc.agents_missing_after_s,
            where=f"Prometheus at {self.prometheus.url}",
        )
        self._wiring = Periodic(
            "cotenant-fleet-wiring",
            min(60.0, pc.agents_missing_after_s / 4),
            self.agents.check,
            what="the fleet wiring check",
            fixed_rate=True,
        )
        registry.register(self)

    def _count_agents(self) -> float:
        rows = self.prometheus.instant(AGENTS_QUERY)
        return float(rows[0][1]) if rows else 0.0

    def start(self) -> None:
        """Start the wiring check (:mod:`cotenant.app.fleet_wiring`)."""
        self._wiring.start()

    def stop(self) -> None:
        self._wiring.stop()

    def close(self) -> None:
        self.drill.close()
        self.prometheus.close()
        self._report_source.close()

    def status(self) -> dict[str, Any]:
        return {"mode": "fleet", "prometheus": self.source.status()}

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "cotenant_prometheus_up",
            "1 while the last PromQL call of central serve succeeded, else 0",
            value=1.0 if self.source.up else 0.0,
        )
        yield GaugeMetricFamily(
            "cotenant_fleet_agents",
            "cotenant agents whose series Prometheus held over the last 5 minutes, at the last "
            "wiring check (NaN before the first answer)",
            value=self.agents.agents,
        )
        yield GaugeMetricFamily(
            "cotenant_fleet_agents_missing",
            "1 when Prometheus has held no agent series for [prometheus] "
            "agents_missing_after_s (a scrape or ServiceMonitor not selected), else 0",
            value=1.0 if self.agents.missing else 0.0,
        )

    def incident_requests(
        self, analyzer: Analyzer, incident_id: str, limit: int = 20
    ) -> dict[str, Any]:
        """The slowest requests of an incident's victim on its GPU during the incident (until
        now while it is open), from the owning agent; NotFoundError for an unknown id."""
        inc = analyzer.incident(incident_id)
        end = inc.get("end_ns") or self._clock()
        out = self.drill.slowest(inc["model"], inc.get("gpu") or None, inc["start_ns"], end, limit)
        out["incident_id"] = incident_id
        return out

    def add_routes(self, app: FastAPI, analyzer: Analyzer) -> None:
        @app.get("/api/v1/status", summary="Where serve reads from, and whether it answers")
        def status() -> SafeJSONResponse:
            return SafeJSONResponse(self.status())

        @app.get(
            "/api/v1/incidents/{incident_id}/requests",
            summary="The victim's slowest requests during an incident, from the owning agent",
        )
        def incident_requests(
            incident_id: str, limit: int = Query(20, description=f"1..{DRILL_MAX_LIMIT}")
        ) -> SafeJSONResponse:
            if not 1 <= limit <= DRILL_MAX_LIMIT:
                raise QueryError(f"limit: {limit} must be between 1 and {DRILL_MAX_LIMIT}")
            return SafeJSONResponse(self.incident_requests(analyzer, incident_id, limit))
