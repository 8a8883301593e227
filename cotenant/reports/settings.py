"""The ``[report]`` configuration keys: where weekly reports go, when, and in which formats."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.core.config_key import key


@dataclass(frozen=True)
class ReportSettings:
    """``[report]``: read by ``cotenant report`` and by serve's weekly
    :class:`reports.schedule.ReportScheduler`; ``dashboard_url`` by
    :func:`reports.job.dashboard_base`."""

    dir: str = key("./.cotenant/reports", "where weekly reports are written")
    schedule: str = key("", "weekly run inside serve, e.g. 'mon 06:00' (UTC; '' = not scheduled)")
    formats: str = key("html,md", "formats written by the schedule (html, md, pdf)")
    dashboard_url: str = key(
        "", "dashboard base URL linked from reports ('' = the server's own address)"
    )
