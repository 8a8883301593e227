"""The weekly report's builder, configured: what ``cotenant report``, serve's API and its
schedule build reports with."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cotenant.app.config import Config
    from cotenant.core.week_reads import WeekRollups
    from cotenant.reports.compute import ReportBuilder
    from cotenant.store.db import Store


def report_builder(cfg: Config, store: Store, rollups: WeekRollups | None = None) -> ReportBuilder:
    """The weekly report's builder over ``store`` (``cotenant report`` and serve's API and
    schedule): the SLOs recorded in the store (:mod:`store.slo_record`) under
    ``[analysis] slo_ms``, and ``[rules] slo_default_ms`` for the SLOs, the
    saturation thresholds the alerts use (``[rules]``), and the dashboard link
    (``[report] dashboard_url``, else ``[server]``). ``rollups``: see ReportBuilder (fleet
    mode reduces the week in Prometheus)."""
    from cotenant.reports.compute import ReportBuilder
    from cotenant.reports.job import dashboard_base
    from cotenant.reports.summary import Thresholds
    from cotenant.store.slo_record import recorded_slos

    rules = cfg.rules
    return ReportBuilder(
        store,
        # the SLOs the store was analysed with (serve, the demo), overridden by this config
        slos=cfg.slos(recorded_slos(store)),
        dashboard_url=dashboard_base(cfg.report, cfg.server.host, cfg.server.port),
        thresholds=Thresholds(
            dram_saturated=rules.dram_saturated,
            pcie_saturated_bps=rules.pcie_saturated_bps,
            memory_full=rules.memory_pressure,
        ),
        rollups=rollups,
    )
