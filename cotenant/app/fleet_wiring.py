"""Central serve's check that Prometheus is wired to the fleet: that it holds series of the
cotenant agents at all.

A Prometheus that answers but scrapes no agent (the agents' ServiceMonitor not selected by its
``serviceMonitorSelector``, another namespace than its ``serviceMonitorNamespaceSelector``
allows, a scrape job missing) gives central empty windows: no incident, no error, nothing.
:class:`AgentSeriesWatch` asks Prometheus how many agents it has seen
(``cotenant_build_info{role="agent"}`` over the last 5 minutes) once a minute; when the answer
has been none for ``missing_after_s`` (from start, or since the last agent was seen) it logs
an error naming what to check, once, and ``cotenant_fleet_agents_missing`` becomes 1 until an
agent's series appear. Prometheus being down is not this check's business
(:class:`core.source_watch.WatchedSource` and ``cotenant_prometheus_up`` say it): a failed
query leaves the state as it was.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from cotenant.core.errors import CotenantError

log = logging.getLogger(__name__)

AGENTS_QUERY = 'count(last_over_time(cotenant_build_info{role="agent"}[5m]))'


class AgentSeriesWatch:
    """See the module docstring. ``count()`` runs :data:`AGENTS_QUERY` and returns its value
    (0 when the answer is empty); ``where`` names the Prometheus in the log."""

    def __init__(
        self,
        count: Callable[[], float],
        *,
        missing_after_s: float,
        where: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._count = count
        self._after = missing_after_s
        self._where = where
        self._clock = clock
        self._since = clock()  # none seen since (start counts as none seen)
        self.agents = math.nan  # how many the last answer counted; NaN before one
        self.missing = False

    def check(self) -> None:
        """Ask once; update :attr:`agents` and :attr:`missing`, logging a change."""
        try:
            n = self._count()
        except CotenantError:
            return  # Prometheus unreachable: its watch logs that
        now = self._clock()
        self.agents = n
        if n > 0:
            if self.missing:
                log.info("%s holds series of %d cotenant agent(s) again", self._where, int(n))
            self.missing = False
            self._since = now
            return
        if not self.missing and now - self._since >= self._after:
            self.missing = True
            log.error(
                "%s has held no series of any cotenant agent for %.0f min: central sees no "
                "request and no GPU. Check that Prometheus scrapes the agents (its "
                "serviceMonitorSelector matches the labels of the agents' ServiceMonitor and "
                "its serviceMonitorNamespaceSelector their namespace; or a scrape job lists "
                'them: docs/fleet-install.md, "Wiring checked at start"); '
                "cotenant_fleet_agents_missing is 1",
                self._where,
                (now - self._since) / 60,
            )
