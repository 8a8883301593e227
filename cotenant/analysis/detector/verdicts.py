"""Verdicts: what an attributed slowdown is to the people who would be paged.

The decision (:mod:`.decision`) says a model is slower than its normal; this stage, once
attribution has named causes, says what that slowdown *is* — one answer per diagnosis, the
same for the live loop, on-demand diagnosis, the alert receiver, fleet mode and the benches:

* **news** (an incident): every strong slowdown that crossed its SLO, and every other one not
  below;
* **own load** (ordinary contention, recorded for the weekly report, not raised): its first
  cause is its own arrival surge explaining at least :data:`OWN_LOAD_SHARE` of the excess — a
  bursty tenant is not paged for its own bursts, within its SLO or over it (its SLO alert
  rule still fires: what that page needs is capacity, not a culprit); but a surge held for
  :data:`SURGE_NEWS_S` by a model whose traffic was steady before is news (its demand
  changed: the page needs to know it is its own);
* **recurring** (ordinary contention): within its SLO, and slowed as much at least
  :data:`MIN_LIKE` times before within its baseline's memory, or every named cause is a
  co-tenant's burst like at least two it had lately (:mod:`analysis.recurring`) or the
  model's own traffic, together at least :data:`RECURRING_SHARE` of the excess. A capacity
  the GPU lost (:data:`CAPACITY_KINDS`) is never a burst's doing, whoever was bursting at
  the time (:func:`mark_recurring`);
* **fellow victim** (an incident): a *weak* slowdown — evidence enough only at the fellow
  threshold — whose first cause is the first cause of another model's incident on the same GPU
  at the time (not its own doing); only an incident found on full evidence corroborates. A
  weak slowdown whose first cause is a capacity the GPU lost (a clock that fell, memory grown
  into a full GPU: :data:`CAPACITY_KINDS`, at least :data:`CAPACITY_SHARE` of the excess) is
  news: ordinary traffic never does that. Any other weak slowdown is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from cotenant.analysis.attribution import Cause
from cotenant.analysis.diagnosis import FELLOW, NEWS, OWN_LOAD, RECURRING, Diagnosis
from cotenant.analysis.incident_record import OPEN, RESOLVED, Incident
from cotenant.analysis.recurring import earlier_bursts
from cotenant.analysis.windows import GpuWindows
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.slos import BREACH

OWN_LOAD_SHARE = 0.5
"""A slowdown whose own arrivals explain at least this share of its excess is its load."""
RECURRING_SHARE = 1 / 3
"""... and co-tenants' recurring bursts (with its own load) at least this share."""
CAPACITY_KINDS = (CauseKind.THROTTLE, CauseKind.MEMORY)
"""Causes that are a capacity the GPU lost: evidence enough for a weak slowdown."""
CAPACITY_SHARE = 0.5
"""... when it explains at least this share of the excess."""
SURGE_NEWS_S = 60.0
"""A model's own surge held this long (s) ..."""
STEADY_SWING = 0.1
"""... after traffic whose rate swung by at most this (squared coefficient of variation beyond
Poisson noise: :func:`analysis.demand.arrival_swing`) is news, not its ordinary load."""
MIN_LIKE = 2
"""Earlier slowdowns as high that make one within the SLO the model's ordinary contention."""


@dataclass(frozen=True)
class FirstCause:
    """An incident's first cause: its victim, GPU, the cause's kind and culprit, its span."""

    victim: str
    gpu: str
    kind: str
    culprit: str
    start_ns: int
    end_ns: int


def diagnosis_causes(diags: Iterable[Diagnosis]) -> list[FirstCause]:
    """The first causes of the incidents among ``diags`` found on full evidence: what can
    corroborate a fellow victim."""
    return [
        FirstCause(d.model, d.gpu, top.kind, top.culprit, d.start_ns, d.end_ns)
        for d in diags
        if d.verdict == NEWS and d.incident and (top := d.top) is not None
    ]


def fellow_of(d: Diagnosis, causes: Iterable[FirstCause]) -> str | None:
    """The model whose incident makes ``d`` a fellow victim: another model on ``d``'s GPU
    whose incident overlaps ``d`` and names ``d``'s first cause (kind and culprit), which is
    not ``d``'s model itself; None when none does."""
    top = d.top
    if top is None or top.culprit == d.model:
        return None
    for c in causes:
        if (
            c.victim != d.model
            and c.gpu == d.gpu
            and (c.kind, c.culprit) == (top.kind, top.culprit)
            and c.start_ns <= d.end_ns
            and c.end_ns >= d.start_ns
        ):
            return c.victim
    return None


def _capacity_lost(d: Diagnosis) -> str | None:
    """A weak slowdown whose first cause is the GPU losing a capacity (its clock fell, or
    memory grew into a full GPU) for at least :data:`CAPACITY_SHARE` of the excess is news:
    that evidence corroborates it as another victim's incident would, and ordinary traffic
    never produces it. None otherwise (nothing to record)."""
    top = d.top
    if top is None or top.kind not in CAPACITY_KINDS or top.share < CAPACITY_SHARE:
        return None
    d.notes.append(
        f"Found on the evidence asked of a fellow victim, corroborated by its cause: "
        f"{top.kind} ({top.culprit}), which ordinary contention does not cause."
    )
    return NEWS


def _surge_is_news(d: Diagnosis) -> str | None:
    """A slowdown by the model's own traffic is news when that traffic was steady before
    (its rate swung by at most :data:`STEADY_SWING` beyond Poisson noise) and has stayed up
    for :data:`SURGE_NEWS_S`: a change in its demand, unlike anything its history shows. A
    bursty or trace-shaped tenant slowed by its own swings is its ordinary. None otherwise."""
    top = d.top
    if top is None:
        return None
    held, swing = top.evidence.get("surge_s"), top.evidence.get("swing")
    if held is None or swing is None or held < SURGE_NEWS_S or swing > STEADY_SWING:
        return None
    d.notes.append(
        f"Its own traffic, steady before, rose and stayed up for {held:.0f} s: a change in its "
        "demand, not its ordinary swings."
    )
    return NEWS


def own_load(d: Diagnosis) -> bool:
    top = d.top
    return (
        top is not None
        and top.kind == CauseKind.LOAD
        and top.culprit == d.model
        and top.share >= OWN_LOAD_SHARE
    )


def recurring(d: Diagnosis) -> bool:
    if d.judged is not None and d.judged.like >= MIN_LIKE:
        return True
    named = [c for c in d.causes if c.kind != CauseKind.UNKNOWN]
    mine = [c for c in named if c.culprit == d.model]  # its own load or request mix
    bursts = [c for c in named if "recurring" in c.evidence]
    return (
        bool(bursts)
        and len(mine) + len(bursts) == len(named)
        and sum(c.share for c in named) >= RECURRING_SHARE
    )


Fellow = tuple[str, int, int]
"""The model that corroborated a live incident found as a fellow victim, and that incident's
extent (ns): what continues it stays a fellow victim while its cause moves on."""


def verdict(d: Diagnosis, causes: Sequence[FirstCause], fellow: Fellow | None = None) -> str | None:
    """``d``'s verdict (:mod:`analysis.diagnosis`), or None when it is nothing to record (a
    weak slowdown that is no fellow victim). ``causes``: other models' incidents' first
    causes; ``fellow``: ``d``'s model's live incident when it is a fellow victim."""
    strong = d.judged is None or d.judged.strong
    if not strong:
        by = fellow_of(d, causes)
        if by is None and fellow is not None and d.start_ns <= fellow[2] and d.end_ns >= fellow[1]:
            by = fellow[0]
        if by is None:
            return _capacity_lost(d)
        if d.judged is not None:
            d.judged = replace(d.judged, fellow_of=by)
        d.notes.append(
            f"Found on the evidence asked of a fellow victim: {by}, on the same GPU, had an "
            "incident with the same first cause at the time."
        )
        return FELLOW
    if own_load(d):
        return _surge_is_news(d) or OWN_LOAD
    if d.severity == BREACH:
        return NEWS
    if recurring(d):
        return RECURRING
    return NEWS


def judge(
    diags: list[Diagnosis], causes: Sequence[FirstCause], fellow: Fellow | None = None
) -> list[Diagnosis]:
    """Each of ``diags`` with its verdict; those that are nothing to record left out."""
    out = []
    for d in diags:
        got = verdict(d, causes, fellow)
        if got is not None:
            d.verdict = got
            out.append(d)
    return out


def mark_recurring(
    causes: list[Cause], w: GpuWindows, model: str, start: int, end: int, notes: list[str]
) -> None:
    """Add ``recurring`` to the evidence of each cause naming a co-tenant model that was in a
    burst during windows ``[start, end]`` like the ones it had already had lately, but a
    capacity the GPU lost (:data:`CAPACITY_KINDS`): its culprit's rate may be in a usual
    burst, its clock or memory is not (development population: an LLM 1.7x slower for two
    minutes while a bursty neighbour's memory grew into a full GPU was called recurring)."""
    top = next((x for x in causes if x.kind != CauseKind.UNKNOWN), None)
    for c in causes:
        other = w.models.get(c.culprit)
        if c.culprit == model or other is None or "arrival_rps" not in other:
            continue
        if c.kind in CAPACITY_KINDS:
            continue
        got = earlier_bursts(other["arrival_rps"], start, end, w.step_ns / 1e9)
        if got is None:
            continue
        c.evidence = {**c.evidence, "recurring": got}
        if c is top:
            seen = got
            notes.append(
                f"{c.culprit}'s burst ({seen['peak_rps']:g} req/s) is like "
                f"{seen['earlier_bursts']} it had in the last {seen['memory_s'] // 60} min: "
                "its ordinary contention"
            )


def incident_causes(incidents: Iterable[Incident], now_ns: int | None = None) -> list[FirstCause]:
    """The first causes of ``incidents`` found on full evidence (open or resolved; not
    fellow victims). With ``now_ns`` (the live loop), only the open ones, taken to last until
    then while their slowdown does."""
    out = []
    wanted = (OPEN,) if now_ns is not None else (OPEN, RESOLVED)
    for inc in incidents:
        top = inc.top
        if top is None or inc.state not in wanted or corroborator(inc) is not None:
            continue
        end = inc.end_ns
        if now_ns is not None and inc.told.open:
            end = max(end, now_ns)
        out.append(FirstCause(inc.model, inc.gpu, top.kind, top.culprit, inc.start_ns, end))
    return out


def corroborator(inc: Incident | None) -> str | None:
    """Whose incident made ``inc`` a fellow victim; None when none did."""
    judged = inc.told.judged if inc is not None else None
    return None if judged is None else judged.fellow_of or None


def fellow_incident(inc: Incident | None) -> Fellow | None:
    """``inc`` as a :data:`Fellow` when it is a fellow victim (its slowdown taken to last
    while it is open)."""
    by = corroborator(inc)
    if inc is None or by is None:
        return None
    return by, inc.start_ns, inc.end_ns if not inc.told.open else 2**62
