"""The continuous analysis loop inside ``cotenant serve``.

Every ``interval_s`` it re-diagnoses the last ``horizon_s`` of every model seen in that horizon,
merges the results into incidents (:class:`analysis.incidents.IncidentBook`) and publishes
``cotenant_incident_active{victim,gpu,cause,culprit,severity,indicator}`` and
``cotenant_cause_share{victim,gpu,cause,culprit,indicator}`` (one series per open incident:
a model's e2e, TTFT and TPOT incidents are separate, :mod:`analysis.indicators`). A failing
pass is logged and counted; the loop keeps going.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from cotenant.analysis.detector.detect import DetectorParams
from cotenant.analysis.detector.episode import Carry
from cotenant.analysis.detector.verdicts import FirstCause, fellow_incident, incident_causes
from cotenant.analysis.diagnose import diagnose_windows, history_range
from cotenant.analysis.diagnosis import Diagnosis
from cotenant.analysis.incident_record import NO_CULPRIT, OPEN, Incident, IncidentEvent
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.pass_reads import PassReads
from cotenant.analysis.replicas import annotate_replicas
from cotenant.analysis.settings import AnalysisSettings
from cotenant.analysis.windows import GpuWindows, WindowCache, gpus_of
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.errors import CotenantError, SourceError
from cotenant.core.periodic import Periodic
from cotenant.core.readers import MetricSource
from cotenant.core.slos import E2E, TPOT, TTFT, Slos
from cotenant.core.timerange import TimeRange

log = logging.getLogger(__name__)

OnIncident = Callable[[IncidentEvent], None]
"""Called with each change to an incident, in the order a person should read them."""


class AnalysisLoop:
    def __init__(
        self,
        source: MetricSource,
        book: IncidentBook,
        *,
        slos: Slos | None = None,
        interval_s: float = AnalysisSettings.interval_s,
        horizon_s: float = AnalysisSettings.horizon_s,
        step_s: float = AnalysisSettings.step_s,
        registry: CollectorRegistry | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        on_incident: OnIncident | None = None,
        reread_s: float = AnalysisSettings.reread_s,
        params: DetectorParams | None = None,
        batch_reads: bool = False,
        full_read_s: float = AnalysisSettings.full_read_s,
    ) -> None:
        """``reread_s``: each pass re-reads this much of the newest data (in the loop's clock),
        so rows that land late — up to that lag — are still seen. ``slos``: every model's SLOs
        on every indicator (:class:`cotenant.core.slos.Slos`). ``batch_reads``: read each frame
        of a pass once for the whole fleet and split it by GPU (:class:`PassReads`;
        fleet mode, where a read is HTTP queries). ``full_read_s``: how often (of the loop's
        clock) each GPU's windows are read in full rather than from ``reread_s`` back
        (:class:`analysis.windows.WindowCache`)."""
        self._reads = PassReads(source) if batch_reads else None
        self._source: MetricSource = self._reads if self._reads is not None else source
        self._reread_s = reread_s
        self._full_read_s = full_read_s
        self._book = book
        self._slos = slos or Slos()
        self._horizon_ns = int(horizon_s * 1e9)
        self._step_s = step_s
        self._step_ns = int(step_s * 1e9)
        self._params = params or DetectorParams()
        self._caches: dict[str, WindowCache] = {}
        self._clock = clock_ns
        self._on_incident = on_incident
        self._active: list[Incident] = []
        self.passes = 0
        self._failures = (
            Counter("cotenant_analysis_failures", "Analysis passes that failed", registry=registry)
            if registry is not None
            else None
        )
        if registry is not None:
            registry.register(self)
        self._worker = Periodic(
            "cotenant-analysis",
            interval_s,
            self._pass,
            what="analysis pass",
            on_error=self._failures.inc if self._failures is not None else None,
        )

    def _pass(self) -> None:
        """A pass of the worker thread. A source that cannot be read (Prometheus down) skips
        the pass, counted: the source has logged why (``store.source_watch``), and the next
        pass tries again. Open incidents stay as they were."""
        try:
            self.run_once()
        except SourceError:
            if self._failures is not None:
                self._failures.inc()

    def run_once(self) -> list[IncidentEvent]:
        """One pass over every model; returns what changed, in reading order."""
        if self._reads is not None:
            self._reads.new_pass()
        now = self._clock()
        now -= now % self._step_ns
        lo = now - self._horizon_ns
        rng = TimeRange(lo, now)
        events: list[IncidentEvent] = []
        full, first = history_range(rng, self._step_s, self._params)
        read: dict[str, GpuWindows] = {}
        found: list[tuple[list[Diagnosis], str, str]] = []
        # the live incidents once per pass, newest per (model, GPU) (not per model: at
        # fleet scale, thousands of models each asking the book was most of a pass)
        live: dict[tuple[str, str], Incident] = {}
        unresolved = sorted(self._book.live(), key=lambda i: i.start_ns)
        for inc in unresolved:
            live[(inc.model, inc.gpu)] = inc
        causes: dict[str, list[FirstCause]] = {}  # per GPU, its open incidents' first causes
        for cause in incident_causes(unresolved, now):
            causes.setdefault(cause.gpu, []).append(cause)
        for gpu, models in gpus_of(self._source, rng, self._step_s).items():
            # one read of the GPU's windows serves every model on it
            cache = self._caches.get(gpu)
            if cache is None:
                cache = self._caches[gpu] = WindowCache(
                    self._source,
                    gpu,
                    self._step_s,
                    overlap_s=self._reread_s,
                    refresh_s=self._full_read_s,
                )
            w = read[gpu] = cache.get(full)
            for model in models:
                if model not in w.models:
                    continue
                since = full.since_ns or 0
                mine = live.get((model, gpu))
                carries = {
                    ind: c
                    for ind in (E2E, TTFT, TPOT)
                    if (c := self._carry(mine, since, ind)) is not None
                }
                try:
                    diags = diagnose_windows(
                        self._source,
                        w,
                        model,
                        first,
                        slo_ms=self._slos.of(model),
                        params=self._params,
                        lag_windows=int(self._reread_s / self._step_s),
                        carry=carries.pop(E2E, None),
                        slos=self._slos.token_slos(model),
                        carries=carries,
                        causes=causes.get(gpu, []),
                        fellow=fellow_incident(mine),
                        young=True,
                    )
                except CotenantError as exc:
                    log.debug("no diagnosis for %s on %s: %s", model, gpu, exc)
                    continue
                if not diags and (model, gpu) not in live:
                    continue  # healthy, nothing live to resolve or dismiss: nothing changes
                found.append((diags, model, gpu))
        incidents = [d for diags, _, _ in found for d in diags if d.is_incident]
        if incidents:  # replicas and their siblings: only read when something is slow
            annotate_replicas(incidents, read, self._source.replicas(full))
        for diags, model, gpu in found:
            events += self._book.update(diags, model, gpu, lo, now)
        self._active = self._book.live()
        events.sort(key=lambda e: (e.at_ns, e.incident.start_ns))
        if self._on_incident is not None:
            for e in events:
                self._on_incident(e)
        self.passes += 1
        return events

    def _carry(self, inc: Incident | None, since_ns: int, indicator: str) -> Carry | None:
        """A live incident's episode on ``indicator`` when it began before the windows read
        and is still open: the detector continues it against its frozen normal instead of
        learning a new one."""
        if inc is None:
            return None
        entry = inc.by_indicator.get(indicator)
        if entry is not None:
            start, judged, still, severity = (
                entry.start_ns,
                entry.judged,
                entry.open,
                entry.severity,
            )
        elif indicator == inc.indicator:  # stored before it listed its indicators
            start, judged, still, severity = inc.start_ns, inc.told.judged, True, inc.severity
        else:
            return None
        if start >= since_ns or judged is None or not still:
            return None
        return judged.carry(int((start - since_ns) // self._step_ns), severity)

    def collect(self) -> Iterator[Metric]:
        active = GaugeMetricFamily(
            "cotenant_incident_active",
            "1 while an incident is open, by its top cause",
            labels=["victim", "gpu", "cause", "culprit", "severity", "indicator"],
        )
        share = GaugeMetricFamily(
            "cotenant_cause_share",
            "Share of an open incident's excess latency per cause",
            labels=["victim", "gpu", "cause", "culprit", "indicator"],
        )
        for inc in self._active:
            if inc.state != OPEN:
                continue  # diagnosing: not published until attribution has its data
            top = inc.top
            active.add_metric(
                [
                    inc.model,
                    inc.gpu,
                    str(top.kind if top else CauseKind.UNKNOWN),
                    top.culprit if top else NO_CULPRIT,
                    inc.severity,
                    inc.indicator,
                ],
                1.0,
            )
            for c in inc.causes:
                share.add_metric(
                    [inc.model, inc.gpu, str(c.kind), c.culprit, inc.indicator], c.share
                )
        yield active
        yield share

    def start(self) -> None:
        """Run :meth:`run_once` every ``interval_s`` on its own thread."""
        self._worker.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._worker.stop(timeout_s)
