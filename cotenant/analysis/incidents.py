"""Incidents: what a victim lived through, from the first slow window to the last.

The detector decides what is slow and what each slowdown is (its verdict,
:mod:`analysis.detector.verdicts`); the book only keeps the story. The continuous loop
re-diagnoses a sliding horizon; :meth:`IncidentBook.update` merges each pass's diagnoses of one
(model, GPU) into its incidents and says what changed, as :class:`IncidentEvent` s in the order
a person should read them:

* **one incident per (model, GPU, event)**: the diagnoses of every indicator (``e2e``, and for
  generative models ``ttft`` and ``tpot``) that overlap an incident, or start within
  ``cooldown_ns`` after it ended naming no other cause, or within
  :data:`~analysis.incident_merge.REOPEN_COOLDOWNS` cool-downs naming the same cause, continue
  it (re-opening a resolved incident instead of opening a new one). The incident lists
  every indicator affected (``Incident.by_indicator``); its ``indicator`` is the *lead* one —
  the first that breached its SLO, else the first found — whose attribution gives the causes;
* ``state``: ``diagnosing`` until attribution has ``publish_windows`` windows of the slowdown
  (and a named cause, or a minute of windows), then ``open``, then ``resolved`` when every
  indicator's slowdown has ended and stayed over for ``cooldown_ns``; a diagnosing incident
  no diagnosis holds any more (rows landed late) is withdrawn, never published;
* ``severity``: ``breach`` or ``degradation``; a degradation that crosses an SLO on any
  indicator is escalated; each indicator's normal is frozen when it joins the incident, and the
  top cause's history is kept (``Incident.cause_history``);
* a diagnosis whose verdict is ordinary contention (own load, recurring bursts) opens no
  incident: it is recorded in the ``contention`` table for the weekly report, or continues a
  published incident that already holds its windows. An incident still ``diagnosing`` that
  it would continue is withdrawn, never published, when nothing else holds it: the
  slowdown's own verdict changed as its windows came in (as on-demand diagnosis of the same
  range would say).
"""

from __future__ import annotations

import math
import threading
from dataclasses import replace

from cotenant.analysis import incident_merge
from cotenant.analysis.attribution import Cause
from cotenant.analysis.detector.episode import needs_s
from cotenant.analysis.diagnosis import ORDINARY_VERDICTS, Diagnosis, rounded
from cotenant.analysis.incident_merge import indicator_entry
from cotenant.analysis.incident_record import (
    DIAGNOSING,
    DISMISSED,
    OPEN,
    RESOLVED,
    UNNAMED_PUBLISH_WINDOWS,
    CauseStep,
    Incident,
    IncidentEvent,
    IndicatorEntry,
    from_stored,
    to_stored,
)
from cotenant.core.slos import BREACH, DEGRADATION
from cotenant.store.contention_rows import Contention, find_contention, upsert_contention
from cotenant.store.db import Store
from cotenant.store.incident_rows import (
    delete_incidents,
    find_incidents,
    get_incident,
    upsert_incidents,
)


def _cause_key(c: Cause | None) -> tuple[str, str] | None:
    """A named cause's (kind, culprit); None for none (``top`` is never ``unknown``)."""
    return None if c is None else (c.kind, c.culprit)


def _overlaps(lo: int, hi: int, d: Diagnosis) -> bool:
    return d.start_ns <= hi and d.end_ns >= lo


class IncidentBook:
    """Reads and writes incidents. Thread-safe: :meth:`update` reads, merges and writes
    under the book's lock (``cotenant serve`` has one book, shared by the analysis loop, the
    API and the dashboard).

    ``gap_ns``: an open incident no diagnosis continues any more is resolved once its end is
    this far behind the pass. ``cooldown_ns``: a slowdown starting within this time after an
    incident ended continues it. ``publish_windows``: windows of the slowdown attribution
    needs before the incident is published as ``open``; ``degradation_s``: how long a slowdown
    within its SLO must have lasted before it is."""

    def __init__(
        self,
        store: Store,
        gap_ns: int = 10_000_000_000,
        *,
        cooldown_ns: int = 30_000_000_000,
        publish_windows: int = 5,
        degradation_s: float = 30.0,
    ) -> None:
        self._store = store
        self._degradation_ns = int(degradation_s * 1e9)
        self._gap_ns = gap_ns
        self._cooldown_ns = cooldown_ns
        self._publish = publish_windows
        self._lock = threading.Lock()

    def find(
        self,
        *,
        since_ns: int | None = None,
        until_ns: int | None = None,
        model: str | None = None,
        state: str | None = None,
        severity: str | None = None,
        limit: int = 500,
        indicator: str | None = None,
    ) -> list[Incident]:
        """Incidents newest first; with ``since_ns`` / ``until_ns``, those overlapping the range
        (ending at or after ``since_ns``, starting before ``until_ns``)."""
        found = find_incidents(
            self._store,
            since_ns=since_ns,
            until_ns=until_ns,
            model=model,
            state=state,
            severity=severity,
            limit=limit,
            indicator=indicator,
        )
        return [from_stored(r) for r in found]

    def live(self) -> list[Incident]:
        """Incidents not resolved (diagnosing or open)."""
        return self.find(state=OPEN) + self.find(state=DIAGNOSING)

    def get(self, incident_id: str) -> Incident | None:
        r = get_incident(self._store, incident_id)
        return None if r is None else from_stored(r)

    def update(
        self, diags: list[Diagnosis], model: str, gpu: str, horizon_start_ns: int, now_ns: int
    ) -> list[IncidentEvent]:
        """Merge the diagnoses of one (model, gpu) over ``[horizon_start, now)``, of every
        indicator, into its incidents; record its ordinary contention; resolve live incidents
        the horizon no longer shows. Returns what changed, oldest incident first."""
        with self._lock:
            mine = [i for i in self.live() if i.model == model and i.gpu == gpu]
            since = horizon_start_ns - incident_merge.REOPEN_COOLDOWNS * self._cooldown_ns
            mine += [
                i for i in self.find(model=model, since_ns=since, state=RESOLVED) if i.gpu == gpu
            ]
            return self._update(diags, mine, model, gpu, now_ns)

    def _update(
        self, diags: list[Diagnosis], current: list[Incident], model: str, gpu: str, now_ns: int
    ) -> list[IncidentEvent]:
        groups: dict[str, tuple[Incident, list[Diagnosis], bool]] = {}
        extent = {i.id: (i.start_ns, i.end_ns) for i in current}
        ordinary: list[Diagnosis] = []
        for d in sorted((d for d in diags if d.incident), key=lambda d: d.start_ns):
            inc = self._match(current, extent, d)
            if d.verdict in ORDINARY_VERDICTS and (
                inc is None or inc.state == DIAGNOSING or not _overlaps(*extent[inc.id], d)
            ):
                ordinary.append(d)
                continue
            created = inc is None
            if inc is None:
                inc = self._new(d, model, gpu, now_ns)
                current.append(inc)
            lo, hi = extent.get(inc.id, (d.start_ns, d.end_ns))
            extent[inc.id] = (min(lo, d.start_ns), max(hi, d.end_ns))
            _, ds, was_created = groups.get(inc.id, (inc, [], created))
            groups[inc.id] = (inc, [*ds, d], was_created)
        events: list[IncidentEvent] = []
        written: list[Incident] = []
        dismissed: list[Incident] = []
        for inc, ds, created in groups.values():
            got = self._apply(inc, *self._told(inc, ds), now_ns, created)
            events += got
            if got or created or inc.live:
                inc.updated_ns = now_ns
                written.append(inc)
        for inc in current:
            if inc.id in groups or not inc.live:
                continue
            if inc.state == DIAGNOSING:
                # what it held is no slowdown after all (rows landed late): never published
                inc.state = DISMISSED
                dismissed.append(inc)
                events.append(IncidentEvent("dismissed", inc, now_ns))
            elif inc.end_ns < now_ns - self._gap_ns:
                events += self._resolve(inc, now_ns)
                written.append(inc)
        upsert_incidents(self._store, [to_stored(i) for i in written])
        delete_incidents(self._store, [i.id for i in dismissed])
        if ordinary:
            self._record(ordinary, model, gpu, now_ns)
        return events

    def _record(self, diags: list[Diagnosis], model: str, gpu: str, now_ns: int) -> None:
        """Ordinary contention into the ``contention`` table: a row per slowdown, extended
        while it lasts (a row within the cool-down of it is the same slowdown)."""
        known = find_contention(self._store, model, gpu, diags[0].start_ns - self._cooldown_ns)
        rows: dict[str, Contention] = {}
        cool = self._cooldown_ns
        for d in diags:
            near = [
                k for k in known if k.start_ns <= d.end_ns + cool and k.end_ns >= d.start_ns - cool
            ]
            was = near[0] if near else None
            top = d.top
            row = Contention(
                id=was.id if was is not None else "ctn-" + d.id.removeprefix("inc-"),
                model=d.model,
                gpu=d.gpu,
                indicator=d.indicator,
                start_ns=min(d.start_ns, was.start_ns) if was is not None else d.start_ns,
                end_ns=max(d.end_ns, was.end_ns) if was is not None else d.end_ns,
                updated_ns=now_ns,
                reason=d.verdict,
                top_cause=top.kind if top is not None else None,
                top_culprit=top.culprit if top is not None else None,
                causes=[c.to_dict() for c in d.causes],
            )
            rows[row.id] = row
            known = [row, *(k for k in known if k.id != row.id)]
        upsert_contention(self._store, list(rows.values()))

    def _told(
        self, inc: Incident, ds: list[Diagnosis]
    ) -> tuple[Diagnosis, str, dict[str, IndicatorEntry]]:
        """The diagnoses of one incident (any indicators) as one: the lead indicator's
        merged diagnosis (its causes) over the extent of all, open while any is; each
        indicator's own entry (for ``Incident.by_indicator``)."""
        entries = dict(inc.by_indicator)
        per: dict[str, list[Diagnosis]] = {}
        for d in ds:
            per.setdefault(d.indicator, []).append(d)
        merged = {ind: incident_merge.merged(group) for ind, group in per.items()}
        for ind, d in merged.items():
            entries[ind] = indicator_entry(d, entries.get(ind))
        current = inc.indicator if inc.by_indicator else None
        lead = incident_merge.lead(list(merged.values()), current)
        told = replace(
            merged[lead],
            start_ns=min(d.start_ns for d in ds),
            end_ns=max(d.end_ns for d in ds),
            open=any(d.open for d in merged.values()),
            severity=BREACH if any(d.severity == BREACH for d in ds) else DEGRADATION,
        )
        return told, lead, entries

    def _match(
        self, current: list[Incident], extent: dict[str, tuple[int, int]], d: Diagnosis
    ) -> Incident | None:
        """The incident ``d`` continues: overlapping its extent so far, or starting within
        the cool-down after it (the latest such)."""
        cands = [
            i
            for i in current
            if d.end_ns >= extent[i.id][0]
            and (
                d.start_ns <= extent[i.id][1]
                # the same cause back soon after re-opens it; a breach after a degradation is
                # news of its own
                or incident_merge.continues(
                    extent[i.id][1], i.severity, i.top, d, self._cooldown_ns
                )
            )
        ]
        return max(cands, key=lambda i: extent[i.id][1]) if cands else None

    def _new(self, d: Diagnosis, model: str, gpu: str, now_ns: int) -> Incident:
        return Incident(
            d.id,
            model,
            gpu,
            DIAGNOSING,
            d.start_ns,
            d.end_ns,
            now_ns,
            rounded(d.peak_p99_ms),
            rounded(d.baseline_p99_ms),
            d.slo_ms,
            d,
            d.severity,
            d.replica,
            d.indicator,
        )

    def _ready(self, d: Diagnosis, named: bool) -> bool:
        """Whether attribution has seen enough of the slowdown to publish its cause: it is
        over, or it has ``publish_windows`` windows and a named cause (an unknown one after a
        minute of trying: most name their cause once the co-tenants' counters have landed)."""
        ratio = d.judged.ratio if d.judged is not None else math.nan
        breach = d.severity == BREACH
        needs_ns = needs_s(ratio, d.during_requests, self._degradation_ns / 1e9, breach) * 1e9
        if d.end_ns - d.start_ns < needs_ns:
            return False  # not yet longer than a transient
        if d.carried or not d.open:
            return True
        return d.during_windows >= self._publish and (
            named or d.during_windows >= UNNAMED_PUBLISH_WINDOWS
        )

    def _apply(
        self,
        inc: Incident,
        d: Diagnosis,
        lead: str,
        entries: dict[str, IndicatorEntry],
        now_ns: int,
        created: bool,
    ) -> list[IncidentEvent]:
        """Fold the merged diagnosis ``d`` (told by ``lead``; each indicator's ``entries``)
        into ``inc``; the events of what changed."""
        prev_state, prev_top, prev_sev = inc.state, inc.top, inc.severity
        mine = entries[lead]
        if lead != inc.indicator:  # another indicator breached first: the incident follows it
            inc.indicator = lead
            inc.peak_p99_ms = None
            inc.baseline_p99_ms = mine.baseline_p99_ms
            inc.slo_ms = d.slo_ms
        grew = d.end_ns > inc.end_ns
        # a resolved incident is continued by a later slowdown, not by its own episode again
        again = d.open or (grew and d.start_ns >= (inc.resolved_at_end_ns or 0))
        inc.start_ns = min(inc.start_ns, d.start_ns)
        inc.end_ns = max(inc.end_ns, d.end_ns)
        if d.peak_p99_ms == d.peak_p99_ms:  # not NaN
            inc.peak_p99_ms = max(inc.peak_p99_ms or 0.0, d.peak_p99_ms)
        if d.severity == BREACH:
            inc.severity = BREACH
        if d.replica is not None:
            inc.replica = d.replica
        if not d.carried:
            # judged against the lead indicator's normal as frozen when it joined
            inc.told = replace(d, judged=mine.judged)
            inc.resolved_at_end_ns = None  # a fresh diagnosis tells it from here
        else:  # began before the windows read: its causes stay those found when it was seen
            after = inc.told.after_p99_ms if d.after_p99_ms is None else d.after_p99_ms
            inc.told = replace(inc.told, open=d.open, after_p99_ms=after)
        inc.by_indicator = entries
        out: list[IncidentEvent] = []
        if prev_state == DIAGNOSING:
            if self._ready(d, inc.top is not None):
                inc.state = OPEN
                self._note_cause(inc, now_ns)
                out.append(IncidentEvent("opened", inc, now_ns))
            elif created:
                out.append(IncidentEvent("diagnosing", inc, now_ns))
        elif prev_state == RESOLVED:
            if not again:
                return []
            inc.state = OPEN
            out.append(IncidentEvent("reopened", inc, now_ns))
        if inc.state == OPEN and prev_state != DIAGNOSING:
            if _cause_key(inc.top) != _cause_key(prev_top) and self._note_cause(inc, now_ns):
                out.append(IncidentEvent("cause_changed", inc, now_ns, previous=prev_top))
            if prev_sev != BREACH and inc.severity == BREACH:
                out.append(IncidentEvent("escalated", inc, now_ns))
        if inc.state == OPEN and not d.open and now_ns - d.end_ns >= self._cooldown_ns:
            # quiet for a cool-down: a slowdown that comes back within it (a LoRA swapped in
            # every 15 s) continues the incident instead of resolving and re-opening it
            out += self._resolve(inc, now_ns)
        return out

    def _note_cause(self, inc: Incident, now_ns: int) -> bool:
        """Append the top cause to the history when it differs from the last one noted."""
        history = inc.cause_history
        top = inc.top
        if history and history[-1].named == _cause_key(top):
            return False
        history.append(CauseStep.of(now_ns, top))
        return True

    def _resolve(self, inc: Incident, now_ns: int) -> list[IncidentEvent]:
        if inc.state == RESOLVED:
            return []
        if inc.state == DIAGNOSING:
            inc.state = OPEN
            self._note_cause(inc, now_ns)
        inc.state = RESOLVED
        inc.resolved_at_end_ns = inc.end_ns
        inc.updated_ns = now_ns
        return [IncidentEvent("resolved", inc, now_ns)]
