"""What every page's callbacks are built with (passed in by :func:`dashboard.app.create_app`),
and :class:`ActionControl`, the contract of the action log the dashboard reads and drives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cotenant.core.actions import ActionControl
from cotenant.dashboard.data import DashboardData
from cotenant.dashboard.settings import DashboardSettings
from cotenant.dashboard.timerange import Range, fit_to_data, parse_range


@dataclass(frozen=True)
class PageContext:
    data: DashboardData
    actions: ActionControl | None
    report_dir: Path
    default_range: str = DashboardSettings.default_range

    def range(self, text: str | None) -> Range:
        """The page's range from its URL value; raises QueryError for a malformed one. Without
        one, the configured default, cut down to the data when all of it is younger (a demo's
        six minutes fill the charts instead of the right edge of "last 1 h")."""
        rng = parse_range(text, self.data.clock_ns(), self.default_range)
        return rng if text else fit_to_data(rng, self.data.earliest_ns())
