"""One report run: build a week's summary from the store and write it in the asked formats."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reports.compute import ReportBuilder
from reports.isoweek import IsoWeek
from reports.pdf import ChromiumPrinter
from reports.summary import Thresholds, WeekSummary
from reports.writer import parse_formats, write_report
from store.db import Store

log = logging.getLogger(__name__)


def thresholds_from(rules: Any) -> Thresholds:
    """Saturation thresholds from the ``[rules]`` config section (the alerts use the same)."""
    return Thresholds(
        dram_saturated=rules.dram_saturated,
        pcie_saturated_bps=rules.pcie_saturated_bps,
        memory_full=rules.memory_pressure,
    )


def dashboard_base(config: Any) -> str:
    """``[report] dashboard_url``, else the server's own address."""
    url: str = config.report.dashboard_url
    if url:
        return url.rstrip("/")
    host = config.server.host
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{host}:{config.server.port}"


def builder_from(
    config: Any, store: Store, clock_ns: Callable[[], int] | None = None
) -> ReportBuilder:
    """A ReportBuilder with the SLOs, thresholds and dashboard base of ``config``."""
    kw: dict[str, Any] = {} if clock_ns is None else {"clock_ns": clock_ns}
    return ReportBuilder(
        store,
        slo_ms=config.analysis.slo_ms,
        default_slo_ms=config.rules.slo_default_ms,
        dashboard_url=dashboard_base(config),
        thresholds=thresholds_from(config.rules),
        **kw,
    )


class ReportJob:
    """Builds and writes weekly reports into ``out_dir``."""

    def __init__(
        self,
        builder: ReportBuilder,
        out_dir: str | Path,
        formats: str | tuple[str, ...],
        *,
        printer: ChromiumPrinter | None = None,
    ) -> None:
        self._builder = builder
        self._out = Path(out_dir)
        self._formats = parse_formats(formats) if isinstance(formats, str) else formats
        self._printer = printer

    def run(self, week: IsoWeek) -> dict[str, Path]:
        summary = self._builder.build(week)
        return self.write(summary)

    def write(self, summary: WeekSummary) -> dict[str, Path]:
        paths = write_report(summary, self._out, self._formats, printer=self._printer)
        log.info("weekly report %s written to %s", summary.week, self._out / summary.week)
        return paths
