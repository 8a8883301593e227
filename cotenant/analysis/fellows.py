"""Fellow victims: a model slowed by a cause another model's incident already names.

A cause found once — a CPU hog pushing a voice model over its SLO — is more likely than not
behind a smaller slowdown of the models beside it at the same time. So such a model is judged
a second time with the evidence rule's ratio at
:attr:`analysis.evidence.EvidenceParams.shared_ratio` (1.08x rather than 1.15x), and what that
finds is kept when this module says it is a fellow victim (issue 25: an image model slowed
1.12x at its median by the CPU hog that broke the voice model's SLO went unfound). The live
loop asks its open incidents, an on-demand diagnosis the incidents stored over its range, the
batch bench the other models' diagnoses. Only an incident found on the usual evidence
corroborates: a fellow victim does not lower the bar for a third model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from cotenant.analysis.diagnose import Diagnosis
from cotenant.analysis.episodes import DEGRADATION
from cotenant.analysis.incident_record import OPEN, RESOLVED, Incident
from cotenant.analysis.spikes import SpikeParams

FELLOW_OF = "fellow_of"
"""The key of :attr:`Diagnosis.judged_on` naming the model whose incident corroborated it."""


@dataclass(frozen=True)
class FirstCause:
    """An incident's first cause: its victim, GPU, the cause's kind and culprit, its span."""

    victim: str
    gpu: str
    kind: str
    culprit: str
    start_ns: int
    end_ns: int


def shared_params(p: SpikeParams) -> SpikeParams | None:
    """``p`` asking a fellow victim's evidence; None when it would ask no less."""
    ev = p.evidence
    if ev is None or ev.shared_ratio >= ev.ratio:
        return None
    return replace(p, evidence=replace(ev, ratio=ev.shared_ratio))


def incident_causes(incidents: Iterable[Incident], now_ns: int | None = None) -> list[FirstCause]:
    """The first causes of ``incidents`` attributed on the usual evidence (open or resolved;
    not fellow victims). With ``now_ns`` (the live loop), only the open ones, taken to last
    until then while their slowdown is (not through the cool-down after it)."""
    out = []
    for inc in incidents:
        top = inc.top
        wanted = (OPEN,) if now_ns is not None else (OPEN, RESOLVED)
        if top is None or inc.state not in wanted or corroborator(inc) is not None:
            continue
        end = inc.end_ns
        if now_ns is not None and inc.detail.get("open", True):
            end = max(end, now_ns)
        out.append(
            FirstCause(inc.model, inc.gpu, str(top["kind"]), str(top["culprit"]), inc.start_ns, end)
        )
    return out


def diagnosis_causes(diags: Iterable[Diagnosis]) -> list[FirstCause]:
    """The first causes of incident diagnoses (the batch path's stand-in for incidents)."""
    return [
        FirstCause(d.model, d.gpu, top.kind, top.culprit, d.start_ns, d.end_ns)
        for d in diags
        if d.incident and (top := d.top) is not None
    ]


def fellow_of(
    d: Diagnosis, causes: Iterable[FirstCause], mine: Incident | None = None
) -> str | None:
    """The model whose incident makes ``d`` (a slowdown found at the lower ratio) a fellow
    victim; None when none does. That incident is another model's on ``d``'s GPU, overlaps
    ``d``, and its first cause is ``d``'s (kind and culprit), not ``d``'s model itself (its
    own burst slows it: it is not slowed beside another). While ``mine``, ``d``'s model's
    live incident, was found so, what continues it stays a fellow victim whatever it names
    now (its cause may move on as attribution sees more)."""
    if d.severity != DEGRADATION or not d.incident or d.judged_on is None:
        return None  # the p99 rules and breaches ask the same of both detectors
    top = d.top
    if top is not None and top.culprit != d.model:
        for c in causes:
            if (
                c.victim != d.model
                and c.gpu == d.gpu
                and (c.kind, c.culprit) == (top.kind, top.culprit)
                and c.start_ns <= d.end_ns
                and c.end_ns >= d.start_ns
            ):
                return c.victim
    own = corroborator(mine)
    if own and mine is not None and d.start_ns <= mine.end_ns and d.end_ns >= mine.start_ns:
        return own
    return None


def corroborator(inc: Incident | None) -> str | None:
    """Whose incident made ``inc`` a fellow victim; None when none did."""
    judged = (inc.detail.get("judged_on") if inc is not None else None) or {}
    own = judged.get(FELLOW_OF)
    return str(own) if own else None


def is_fellow(d: Diagnosis) -> bool:
    return bool((d.judged_on or {}).get(FELLOW_OF))


def fellow_victims(
    candidates: Iterable[Diagnosis],
    found: Iterable[Diagnosis],
    causes: list[FirstCause],
    p: SpikeParams,
    mine: Incident | None = None,
) -> list[Diagnosis]:
    """The ``candidates`` (a model's slowdowns found with :func:`shared_params` of ``p``) that
    overlap none of the slowdowns ``found`` at ``p`` and are fellow victims of ``causes``,
    each marked so (:data:`FELLOW_OF`) with a note that says why less was asked."""
    ev = p.evidence
    if ev is None:  # no evidence rule: nothing was asked less (shared_params is None)
        return []
    spans = [(f.start_ns, f.end_ns) for f in found if f.incident]
    usual, low = ev.ratio, ev.shared_ratio
    out = []
    for d in candidates:
        if any(lo <= d.end_ns and hi >= d.start_ns for lo, hi in spans):
            continue
        by = fellow_of(d, causes, mine)
        if by is None or d.judged_on is None:
            continue
        d.judged_on = {**d.judged_on, FELLOW_OF: by}
        d.notes.append(
            f"Found at {low:g}x its typical latency rather than {usual:g}x: {by}, on the same "
            "GPU, had an incident with the same first cause at the time."
        )
        out.append(d)
    return out
