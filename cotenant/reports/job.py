"""One report run: build a week's summary from the store and write it in the asked formats."""

from __future__ import annotations

import logging
from pathlib import Path

from cotenant.reports.compute import ReportBuilder
from cotenant.reports.isoweek import IsoWeek
from cotenant.reports.pdf import ChromiumPrinter
from cotenant.reports.settings import ReportSettings
from cotenant.reports.summary import WeekSummary
from cotenant.reports.writer import parse_formats, write_report

log = logging.getLogger(__name__)


def dashboard_base(settings: ReportSettings, host: str, port: int) -> str:
    """The dashboard base URL reports link to: ``[report] dashboard_url``, else the server's
    own address (``host``, ``port``: ``[server]``; a wildcard host is shown as 127.0.0.1)."""
    url = settings.dashboard_url
    if url:
        return url.rstrip("/")
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    return f"http://{host}:{port}"


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
