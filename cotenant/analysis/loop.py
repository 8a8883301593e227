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
from dataclasses import replace

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from cotenant.analysis.diagnose import Diagnosis, diagnose_windows, history_range
from cotenant.analysis.episodes import DEGRADATION, Carry
from cotenant.analysis.fellows import (
    FirstCause,
    corroborator,
    fellow_victims,
    incident_causes,
    shared_params,
)
from cotenant.analysis.incident_record import Incident, IncidentEvent
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.pass_reads import PassReads
from cotenant.analysis.replicas import annotate_replicas
from cotenant.analysis.settings import AnalysisSettings
from cotenant.analysis.spikes import SpikeParams
from cotenant.analysis.windows import GpuWindows, WindowCache, gpus_of
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
        params: SpikeParams | None = None,
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
        # a slowdown first found this long after its detector fired is not news (the book)
        self._late_ns = int(2 * max(reread_s, interval_s) * 1e9)
        self._first: int | None = None  # the first pass's time: what came before is news
        self._full_read_s = full_read_s
        self._book = book
        self._slos = slos or Slos()
        self._horizon_ns = int(horizon_s * 1e9)
        self._step_s = step_s
        self._step_ns = int(step_s * 1e9)
        self._params = params or SpikeParams()
        # the detector with its ordinary-contention bar off, for the sweep (none without the
        # bar: every degradation is news then)
        self._bare = (
            replace(self._params, ordinary_margin=0.0) if self._params.seen_windows > 0 else None
        )
        self._swept_ns: int | None = None  # the last sweep's time
        # the detector asking less evidence of a fellow victim of an open incident's cause
        self._shared = shared_params(self._params)
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
        if self._first is None:
            self._first = now
        lo = now - self._horizon_ns
        rng = TimeRange(lo, now)
        events: list[IncidentEvent] = []
        full, first = history_range(rng, self._step_s, self._params)
        # every full_read_s, the slowdowns the ordinary-contention bar kept from the
        # detector are looked for too: recorded as such, never incidents (_sweep)
        sweep = self._bare is not None and (
            self._swept_ns is None or now - self._swept_ns >= self._full_read_s * 1e9
        )
        swept = first
        if sweep and self._swept_ns is not None:
            swept = max(first, first + int((self._swept_ns - lo) // self._step_ns))
        read: dict[str, GpuWindows] = {}
        found: list[tuple[list[Diagnosis], str, str]] = []
        # the live incidents once per pass, newest per (model, GPU) (not per model: at
        # fleet scale, thousands of models each asking the book was most of a pass)
        live: dict[tuple[str, str], Incident] = {}
        unresolved = sorted(self._book.live(), key=lambda i: i.start_ns)
        for inc in unresolved:
            if inc.live:
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
                slos = self._slos.token_slos(model)
                mine = live.get((model, gpu))
                carries = {
                    ind: c
                    for ind in (TTFT, TPOT)
                    if (c := self._carry(mine, since, ind)) is not None
                }
                diags = self._diagnose(
                    w, model, first, self._params, slos, self._carry(mine, since, E2E), carries
                )
                if diags is None:
                    continue
                # a fellow victim of another model's incident; a model with a live incident
                # of its own is told already, unless that one was found so too
                others = [x for x in causes.get(gpu, []) if x.victim != model]
                if self._shared is not None and (
                    (others and mine is None) or corroborator(mine) is not None
                ):
                    diags += self._fellow_victims(w, model, first, slos, diags, others, mine)
                if sweep:
                    diags += self._sweep(w, model, swept, slos, diags)
                if not diags and (model, gpu) not in live:
                    continue  # healthy, nothing live to resolve or dismiss: nothing changes
                found.append((diags, model, gpu))
        incidents = [d for diags, _, _ in found for d in diags if d.incident and not d.seen]
        if incidents:  # replicas and their siblings: only read when something is slow
            annotate_replicas(incidents, read, self._source.replicas(full))
        for diags, model, gpu in found:
            events += self._book.update(
                diags, model, gpu, lo, now, late_ns=self._late_ns, watched_from_ns=self._first
            )
        if sweep:
            self._swept_ns = now
        self._active = self._book.live()
        events.sort(key=lambda e: (e.at_ns, e.incident.start_ns))
        if self._on_incident is not None:
            for e in events:
                self._on_incident(e)
        self.passes += 1
        return events

    def _diagnose(
        self,
        w: GpuWindows,
        model: str,
        first: int,
        params: SpikeParams,
        slos: dict[str, float | None],
        carry: Carry | None = None,
        carries: dict[str, Carry] | None = None,
    ) -> list[Diagnosis] | None:
        """The diagnoses of ``model`` on ``w``'s GPU ending at or after window ``first``;
        None when it cannot be diagnosed (logged)."""
        try:
            return diagnose_windows(
                self._source,
                w,
                model,
                first,
                slo_ms=self._slos.of(model),
                params=params,
                lag_windows=int(self._reread_s / self._step_s),
                carry=carry,
                slos=slos,
                carries=carries,
            )
        except CotenantError as exc:
            log.debug("no diagnosis for %s on %s: %s", model, w.gpu, exc)
            return None

    def _sweep(
        self,
        w: GpuWindows,
        model: str,
        first: int,
        slos: dict[str, float | None],
        found: list[Diagnosis],
    ) -> list[Diagnosis]:
        """The degradations of ``model`` ending at or after window ``first``, apart from the
        slowdowns ``found``, that the detector finds with its ordinary-contention bar off
        (:attr:`Diagnosis.seen`): no higher than slowdowns the model had in the recent
        history, so its ordinary contention, which the incident book records for the weekly
        report and opens nothing for (issue 25: a voice model's neighbour slowed by three
        image campaigns in a row was not recorded from the second). A breach found so is
        left to the detector (an SLO crossing it missed is not made an incident a minute
        late)."""
        assert self._bare is not None
        diags = self._diagnose(w, model, first, self._bare, slos) or []
        out = [
            d
            for d in diags
            if d.severity == DEGRADATION
            and d.incident
            and not any(f.start_ns <= d.end_ns and f.end_ns >= d.start_ns for f in found)
        ]
        for d in out:
            d.seen = True
        return out

    def _fellow_victims(
        self,
        w: GpuWindows,
        model: str,
        first: int,
        slos: dict[str, float | None],
        found: list[Diagnosis],
        causes: list[FirstCause],
        mine: Incident | None,
    ) -> list[Diagnosis]:
        """The degradations of ``model`` ending at or after window ``first``, apart from the
        slowdowns ``found``, that the detector finds asking a fellow victim's evidence and
        that are fellow victims of another model's open incident on the GPU (``causes``) or
        continue ``mine`` (:mod:`analysis.fellows`)."""
        assert self._shared is not None
        candidates = self._diagnose(w, model, first, self._shared, slos) or []
        return fellow_victims(candidates, found, causes, self._params, mine)

    def _carry(self, inc: Incident | None, since_ns: int, indicator: str) -> Carry | None:
        """A live incident's episode on ``indicator`` when it began before the windows read
        and is still open: the detector continues it with its frozen baseline instead of
        learning a new one."""
        if inc is None:
            return None
        entry = (inc.detail.get("indicators") or {}).get(indicator)
        if entry is None:
            if indicator != inc.indicator:
                return None
            entry = {**inc.detail, "start_ns": inc.start_ns, "open": True}
        start = entry.get("start_ns")
        base = entry.get("baseline_p99_ms")
        thr = entry.get("threshold_ms")
        if start is None or start >= since_ns or base is None or thr is None:
            return None
        if not entry.get("open", True):
            return None
        judged = entry.get("judged_on") or {}
        return Carry(
            start=int((start - since_ns) // self._step_ns),
            baseline_ms=float(judged.get("baseline_ms") or base),
            threshold_ms=float(thr),
            severity=str(entry.get("severity", inc.severity)),
            rule=str(judged.get("rule", "p99")),
            span=int(judged.get("span_windows", 0)),
        )

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
            if inc.state != "open":
                continue  # diagnosing: not published until attribution has its data
            top = inc.top
            active.add_metric(
                [
                    inc.model,
                    inc.gpu,
                    top["kind"] if top else "unknown",
                    top["culprit"] if top else "—",
                    inc.severity,
                    inc.indicator,
                ],
                1.0,
            )
            for c in inc.detail.get("causes", []):
                share.add_metric(
                    [inc.model, inc.gpu, c["kind"], c["culprit"], inc.indicator], float(c["share"])
                )
        yield active
        yield share

    def start(self) -> None:
        """Run :meth:`run_once` every ``interval_s`` on its own thread."""
        self._worker.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._worker.stop(timeout_s)
