"""What ``cotenant serve`` runs beyond the agent's collectors and store: the analysis (loop and
on demand), the HTTP API, actuators, the alerts webhook, weekly reports and the dashboard.

They read windows from the store, or with ``[prometheus] url`` through Prometheus
(:mod:`cotenant.app.fleet`). :func:`build_central` wires them; :class:`Central` starts and stops
their threads in the order the service needs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from cotenant.actuators.api import actions_router
from cotenant.actuators.build import build_controller
from cotenant.actuators.controller import ActionController
from cotenant.alerts.slo_metric import SloMetric
from cotenant.alerts.webhook import AlertReceiver, alerts_router
from cotenant.analysis.analyzer import Analyzer
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.loop import AnalysisLoop, OnIncident
from cotenant.app.api import create_api
from cotenant.app.config import Config
from cotenant.app.report_builder import report_builder
from cotenant.core.errors import ConfigError
from cotenant.core.readers import MetricSource
from cotenant.reports.api import reports_router
from cotenant.reports.job import ReportJob
from cotenant.reports.schedule import ReportScheduler, parse_schedule
from cotenant.reports.writer import parse_formats
from cotenant.store.db import Store
from cotenant.store.source import StoreSource


@dataclass
class Central:
    """The parts of ``cotenant serve`` that the agent does not run; None where disabled."""

    api: FastAPI  # with every route mounted
    analyzer: Analyzer
    analysis: AnalysisLoop | None
    actions: ActionController | None
    alerts: AlertReceiver | None
    reports: ReportScheduler | None
    dashboard: Any | None  # dashboard.data.DashboardData
    fleet: Any | None  # cotenant.app.fleet.Fleet

    def start(self) -> None:
        """Start the analysis loop, the report schedule, the actuators' loop and the fleet's
        wiring check."""
        for part in (self.analysis, self.reports, self.actions, self.fleet):
            if part is not None:
                part.start()

    def stop(self) -> None:
        """Stop those threads (before the collectors and the store close)."""
        for part in (self.analysis, self.reports, self.actions, self.fleet):
            if part is not None:
                part.stop()

    def close(self) -> None:
        """Release the alert queue (alerts still queued stay pending: diagnosed at the next
        start) and the fleet's Prometheus client."""
        if self.alerts is not None:
            self.alerts.close()
        if self.fleet is not None:
            self.fleet.close()


def build_central(
    config: Config,
    store: Store,
    registry: CollectorRegistry,
    *,
    clock_ns: Callable[[], int],
    not_ready: Callable[[], str | None],
    on_incident: OnIncident | None,
    read_token: str = "",
) -> Central:
    """Analysis, API, actuators, alerts, reports and dashboard over ``store`` (or Prometheus).
    ``not_ready`` answers the readiness probe; ``on_incident`` hears the loop's incidents;
    ``read_token``: what the fleet's drill-down sends the agents ([auth] token)."""
    ac = config.analysis
    slos = config.slos()  # the one SLO value every part below judges against
    source: MetricSource = StoreSource(store)
    fleet = None
    check_prometheus_url(config)
    if config.prometheus.url:
        from cotenant.app.fleet import Fleet

        fleet = Fleet(config, registry, clock_ns, token=read_token)
        source = fleet.source
    book = IncidentBook(
        store,
        gap_ns=int(ac.step_s * 1e9) * 10,
        cooldown_ns=int(ac.cooldown_s * 1e9),
        degradation_s=ac.degradation_s,
    )
    analyzer = Analyzer(
        source,
        book,
        slos=slos,
        step_s=ac.step_s,
        max_range_s=ac.max_range_h * 3600,
        params=ac.detector_params(),
    )
    analysis = (
        AnalysisLoop(
            source,
            book,
            slos=slos,
            interval_s=ac.interval_s,
            horizon_s=ac.horizon_s,
            step_s=ac.step_s,
            registry=registry,
            clock_ns=clock_ns,
            on_incident=on_incident,
            reread_s=ac.reread_s,
            params=ac.detector_params(),
            batch_reads=fleet is not None,
            full_read_s=ac.full_read_s,
        )
        if ac.enabled
        else None
    )
    api = create_api(store, registry, not_ready, analyzer)
    if fleet is not None:
        fleet.add_routes(api, analyzer)
    # Routers of actuators/ and alerts/ are included here, before the dashboard's mount.
    actions = build_controller(
        config.actuators,
        store=store,
        incidents=book,
        source=source,
        registry=registry,
        clock_ns=clock_ns,
        slos=slos,
        step_s=ac.step_s,
    )
    if actions is not None:
        api.include_router(actions_router(actions, actions))
    SloMetric(slos.explicit(), registry)  # cotenant_slo_seconds; the rules add the default
    alerts = None
    if config.alerts.enabled:
        alerts = AlertReceiver(
            store,
            analyzer,
            lookback_s=config.alerts.lookback_s,
            lookahead_s=config.alerts.lookahead_s,
            clock_ns=clock_ns,
            registry=registry,
        )
        api.include_router(alerts_router(alerts))
    reports = _reports(config, store, api, fleet, clock_ns)
    central = Central(api, analyzer, analysis, actions, alerts, reports, None, fleet)
    # The dashboard's catch-all mount at "/" comes last (routes match in order).
    if config.dashboard.enabled:
        central.dashboard = _mount_dashboard(config, store, source, central, clock_ns)
    return central


def check_prometheus_url(config: Config) -> None:
    """ConfigError when ``[prometheus] url`` is required but unset, or is not an HTTP(S) URL."""
    pc = config.prometheus
    if not pc.url:
        if pc.required:
            raise ConfigError(
                "config key prometheus.url: empty, but prometheus.required is true: set it to "
                "your Prometheus' query URL (COTENANT_PROMETHEUS_URL; on Kubernetes "
                "deploy/k8s/wiring.env), e.g. http://prometheus-operated.monitoring:9090"
            )
        return
    if not pc.url.startswith(("http://", "https://")) or pc.url[-3:] == "://":
        raise ConfigError(
            f"config key prometheus.url: bad value {pc.url!r}: expected an http:// or https:// "
            "URL of a Prometheus-compatible query API"
        )


def _reports(
    config: Config, store: Store, api: FastAPI, fleet: Any | None, clock_ns: Callable[[], int]
) -> ReportScheduler | None:
    """``/api/v1/reports/{week}/summary``, and the weekly scheduler when ``[report] schedule``
    is set (None otherwise)."""
    # fleet mode: the report's rollups come from Prometheus' recording rules
    rollups = None if fleet is None else fleet.week_rollups
    builder = report_builder(config, store, rollups)
    api.include_router(reports_router(builder))
    at = parse_schedule(config.report.schedule)
    if at is None:
        return None
    formats = parse_formats(config.report.formats, "report.formats")
    job = ReportJob(builder, config.report.dir, formats)
    return ReportScheduler(at, job.run, clock_ns=clock_ns)


def _mount_dashboard(
    config: Config,
    store: Store,
    source: MetricSource,
    central: Central,
    clock_ns: Callable[[], int],
) -> Any:
    """The Dash app (``dashboard.data.DashboardData``, Flask under WSGI) mounted at "/" after
    every other route, so the API, /metrics and the probes keep matching first."""
    from a2wsgi import WSGIMiddleware

    from cotenant.dashboard.app import create_app
    from cotenant.dashboard.data import DashboardData

    dc = config.dashboard
    data = DashboardData(
        store,
        source=source,
        drill=central.fleet.drill if central.fleet is not None else None,
        book=central.analyzer.book,
        slos=central.analyzer.slos,
        clock_ns=clock_ns,
    )
    app = create_app(
        data,
        actions_control=central.actions,
        report_dir=config.report.dir,
        refresh_s=dc.refresh_s,
        default_range=dc.default_range,
    )
    central.api.mount("/", WSGIMiddleware(app.server))  # type: ignore[arg-type]
    return data
