"""Ordinary contention: slowdowns within the SLO that are no news (issue 25, item 2).

A degradation (no SLO crossed) is ordinary when the model's own traffic explains it (its
arrival surge: :func:`own_load`), when every cause named is a co-tenant's burst like the
ones it has lately had (:mod:`analysis.recurring`), with the model's own traffic
(:func:`recurring`), or when it is no higher than the model's own slowdowns of the recent
history (the detector's ordinary-contention bar: ``seen``, found by the live loop's sweep).
The incident book opens no incident for it and records it in the ``contention`` table
(:func:`contention_row`), which the weekly report counts beside the incidents. A breach
always is an incident.
"""

from __future__ import annotations

from cotenant.analysis.diagnose import Diagnosis
from cotenant.analysis.episodes import DEGRADATION
from cotenant.store.contention_rows import Contention

OWN_LOAD_SHARE = 0.5
"""A degradation whose own arrivals explain at least this share of its excess is its load."""


def own_load(d: Diagnosis) -> bool:
    """A degradation (no SLO crossed) whose first named cause is the model's own arrival
    surge, explaining at least :data:`OWN_LOAD_SHARE` of its excess: a bursty tenant slowed
    by its own bursts. Not an incident (a breach always is): a tool that paged on every burst
    of a bursty trace's own traffic was silenced (issue 25, the Azure code trace)."""
    if d.severity != DEGRADATION:
        return False
    top = d.top
    return (
        top is not None
        and top.kind == "load"
        and top.culprit == d.model
        and top.share >= OWN_LOAD_SHARE
    )


RECURRING_SHARE = 1 / 3
"""... and co-tenants' recurring bursts (with its own load) at least this share."""


def recurring(d: Diagnosis) -> bool:
    """A degradation whose every named cause is a co-tenant model's burst like the ones it
    had lately (:mod:`analysis.recurring`) or the model's own traffic (its load, its request
    mix), together explaining at least :data:`RECURRING_SHARE` of its excess (the rest
    unexplained): a bursty neighbour's ordinary contention, not an incident (issue 25: the
    Azure code trace's bursts paged for its chat neighbour time after time)."""
    if d.severity != DEGRADATION:
        return False
    named = [c for c in d.causes if c.kind != "unknown"]
    mine = [c for c in named if c.culprit == d.model]  # its own load or request mix
    bursts = [c for c in named if "recurring" in c.evidence]
    return (
        bool(bursts)
        and len(mine) + len(bursts) == len(named)
        and sum(c.share for c in named) >= RECURRING_SHARE
    )


def ordinary(d: Diagnosis) -> str | None:
    """Why a slowdown is ordinary contention rather than an incident — ``own_load``,
    ``recurring`` or ``seen`` (:attr:`Diagnosis.seen`) — or None when it is news."""
    if own_load(d):
        return "own_load"
    if recurring(d):
        return "recurring"
    if d.seen and d.severity == DEGRADATION:
        return "seen"
    return None


def contention_row(
    d: Diagnosis, known: list[Contention], now_ns: int, cooldown_ns: int
) -> Contention | None:
    """The ``contention`` row of ``d`` when it is ordinary contention (:func:`ordinary`), or
    when it names no cause and continues a slowdown already recorded as such (``known``,
    within ``cooldown_ns``: its row is extended; attribution that loses the burst for a pass
    does not make it news); None otherwise (a breach never is)."""
    if d.severity != DEGRADATION:
        return None
    near = [
        k
        for k in known
        if k.start_ns <= d.end_ns + cooldown_ns and k.end_ns >= d.start_ns - cooldown_ns
    ]
    # (a slowdown the detector found over the bar is news, even where the sweep had
    # recorded its start as no higher than the model's recent ones)
    sticky = bool(near) and d.top is None and near[0].reason != "seen" and not d.seen
    why = ordinary(d) or (near[0].reason if sticky else None)
    if why is None:
        return None
    top = d.top
    was = near[0] if near else None
    return Contention(
        id=was.id if was is not None else "ctn-" + d.id.removeprefix("inc-"),
        model=d.model,
        gpu=d.gpu,
        indicator=d.indicator,
        start_ns=min(d.start_ns, was.start_ns) if was is not None else d.start_ns,
        end_ns=max(d.end_ns, was.end_ns) if was is not None else d.end_ns,
        updated_ns=now_ns,
        reason=why,
        top_cause=top.kind if top is not None else (was.top_cause if was else None),
        top_culprit=top.culprit if top is not None else (was.top_culprit if was else None),
        causes=([c.to_dict() for c in d.causes] if top is not None or was is None else was.causes),
    )
