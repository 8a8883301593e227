"""How the diagnoses of one event become one incident's story (:mod:`analysis.incidents`):
which indicator leads, what each indicator shows, the merged diagnosis of the episodes that
continue an incident."""

from __future__ import annotations

from dataclasses import replace

from cotenant.analysis.attribution import Cause
from cotenant.analysis.diagnosis import Diagnosis, rounded
from cotenant.analysis.incident_record import IndicatorEntry
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.slos import BREACH

REOPEN_COOLDOWNS = 4
"""A slowdown naming the same cause as an incident, starting within this many cool-downs after
it ended, continues it: model loads or memory pressure that hold a model every minute or so,
with a normal stretch between, are one incident, not one page each. (Within one cool-down a
slowdown that names no cause yet continues it as well; a breach after a degradation is news of
its own.)"""


def continues(
    end_ns: int,
    severity: str,
    top: Cause | None,
    d: Diagnosis,
    cooldown_ns: int,
    any_cause: bool = False,
) -> bool:
    """Whether ``d`` (starting after an incident that ended at ``end_ns``, whose top cause is
    ``top``) continues it: no breach after a degradation, starting within one cool-down naming
    no cause or ``top``'s, or within :data:`REOPEN_COOLDOWNS` naming ``top``'s; with
    ``any_cause``, within one cool-down whatever it names."""
    gap = d.start_ns - end_ns
    if any_cause and gap <= cooldown_ns:
        return True
    if severity != BREACH and d.severity == BREACH:
        return False
    mine = _tops([] if d.top is None else [d.top])
    if mine is None:
        return gap <= cooldown_ns
    return mine == _tops([] if top is None else [top]) and gap <= REOPEN_COOLDOWNS * cooldown_ns


def lead(ds: list[Diagnosis], current: str | None) -> str:
    """The indicator an incident is told by: the first to breach its SLO, else the one it
    already had, else the first found."""
    breached = sorted((d for d in ds if d.severity == BREACH), key=lambda d: d.start_ns)
    if current is not None and any(d.indicator == current for d in breached):
        return current
    if breached:
        return breached[0].indicator
    if current is not None and any(d.indicator == current for d in ds):
        return current
    return min(ds, key=lambda d: d.start_ns).indicator


def indicator_entry(d: Diagnosis, frozen: IndicatorEntry | None) -> IndicatorEntry:
    """What an incident shows of one indicator, from its merged diagnosis ``d``: extent,
    severity, before / during, SLO. With ``frozen`` (its entry so far) the baseline and how it
    was judged stay as they were when the indicator joined (unless an earlier detector judged
    it: then ``d``'s), it starts at the earlier start, peaks at the higher peak, and stays a
    breach once it was one."""
    out = IndicatorEntry(
        start_ns=d.start_ns,
        end_ns=d.end_ns,
        open=d.open,
        severity=d.severity,
        baseline_p99_ms=rounded(d.baseline_p99_ms),
        peak_p99_ms=rounded(d.peak_p99_ms),
        slo_ms=d.slo_ms,
        judged=d.judged,
        carried=d.carried,
    )
    if frozen is None:
        return out
    peaks = [x for x in (frozen.peak_p99_ms, out.peak_p99_ms) if x is not None]
    return replace(
        out,
        start_ns=min(d.start_ns, frozen.start_ns),
        severity=BREACH if frozen.severity == BREACH else out.severity,
        baseline_p99_ms=frozen.baseline_p99_ms,
        peak_p99_ms=max(peaks) if peaks else None,
        judged=frozen.judged if frozen.judged is not None else d.judged,
    )


def merged(ds: list[Diagnosis]) -> Diagnosis:
    """One diagnosis for the episodes (in start order) that continue one incident: its
    extent, open when the newest is, a breach when any was; causes from the newest episode
    unless it is too short to say, then from the longest."""
    newest = ds[-1]
    src = newest
    if len(ds) > 1 and newest.open and newest.during_windows < 5:
        src = max(ds, key=lambda d: d.during_windows)
    peaks = [d.peak_p99_ms for d in ds if d.peak_p99_ms == d.peak_p99_ms]
    return replace(
        src,
        start_ns=min(d.start_ns for d in ds),
        end_ns=max(d.end_ns for d in ds),
        open=newest.open,
        severity=BREACH if any(d.severity == BREACH for d in ds) else newest.severity,
        peak_p99_ms=max(peaks) if peaks else src.peak_p99_ms,
        after_p99_ms=newest.after_p99_ms,
        during_windows=max(d.during_windows for d in ds),
        during_requests=max(d.during_requests for d in ds),
    )


def events(diags: list[Diagnosis], gap_ns: int) -> list[Diagnosis]:
    """The diagnoses of one model as one per event, as the incident book tells them: on the
    same GPU, those of any indicator that overlap, or start within ``gap_ns`` (the cool-down)
    after another ended, or later but naming the same cause (:func:`continues`), are one
    incident told by its lead indicator (:func:`lead`), a breach when any is, open while any
    is. Ordinary contention joins an incident it overlaps; quiet ranges (``incident`` False)
    are kept as they are."""
    quiet = [d for d in diags if not d.incident]
    rest = sorted((d for d in diags if d.incident), key=lambda d: (d.gpu, d.start_ns))
    groups: list[list[Diagnosis]] = []
    for d in rest:
        last = groups[-1] if groups else None
        if last and last[0].gpu == d.gpu and _joins(last, d, gap_ns):
            last.append(d)
        else:
            groups.append([d])
    out = []
    for group in groups:
        told = [d for d in group if d.is_incident] or group
        head = _head(group)
        early = min(told, key=lambda d: d.detected_ns)
        first = early.first_causes if early.first_causes is not None else early.causes
        out.append(
            replace(
                head,
                first_causes=None if _tops(first) == _tops(head.causes) else first,
                start_ns=min(d.start_ns for d in group),
                end_ns=max(d.end_ns for d in group),
                open=any(d.open for d in group),
                severity=BREACH if any(d.severity == BREACH for d in group) else head.severity,
                detected_ns=min(d.detected_ns for d in told),
            )
        )
    return out + quiet


def _joins(group: list[Diagnosis], d: Diagnosis, gap_ns: int) -> bool:
    """Whether ``d`` continues the incident of ``group`` (diagnoses in start order); ordinary
    contention only joins one it overlaps."""
    end = max(x.end_ns for x in group)
    if not d.is_incident:
        return d.start_ns <= end
    head = _head(group)
    severity = BREACH if any(x.severity == BREACH for x in group) else head.severity
    return continues(end, severity, head.top, d, gap_ns, any_cause=True)


def _head(group: list[Diagnosis]) -> Diagnosis:
    """The diagnosis a group is told by: its lead indicator's, merged (:func:`merged`)."""
    told = [d for d in group if d.is_incident] or group
    per: dict[str, list[Diagnosis]] = {}
    for d in told:
        per.setdefault(d.indicator, []).append(d)
    merged_ = {ind: merged(ds) for ind, ds in per.items()}
    return merged_[lead(list(merged_.values()), None)]


def _tops(causes: list[Cause]) -> tuple[str, str] | None:
    """The top named cause of a list, as (kind, culprit)."""
    top = next((c for c in causes if c.kind != CauseKind.UNKNOWN), None)
    return None if top is None else (str(top.kind), top.culprit)
