"""A co-tenant's recurring bursts among a slowdown's causes (issue 25, item 2).

:func:`mark_recurring` adds ``recurring`` to the evidence of each cause naming a co-tenant
whose burst is like the ones it had lately (:mod:`analysis.recurring`): ordinary contention,
which the incident book does not raise within the SLO (:mod:`analysis.ordinary`).

:func:`beyond_recurring` then asks what differs between this burst and those earlier ones.
Attribution compares the slowdown with the windows just before it; when something else began
in between (a training job started a minute before the neighbour's next burst, which now
hurts three times as much), those windows already hold it, and the recurring burst is all
that changed. Compared with the earlier bursts instead, the burst cancels out and what is new
shows: it is named, with the part of the excess beyond what the earlier bursts made, and the
slowdown is news.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from cotenant.analysis.attribution import Attribution, Cause
from cotenant.analysis.recurring import Bursts, earlier_bursts
from cotenant.analysis.windows import GpuWindows

MIN_PAST = 10
"""Windows with requests of the victim during the earlier bursts a comparison needs."""

Attribute = Callable[[np.ndarray], Attribution]
"""Attribution of the slowdown against the given "before" windows."""


def mark_recurring(
    causes: list[Cause], w: GpuWindows, model: str, start: int, end: int, notes: list[str]
) -> dict[str, Bursts]:
    """Adds ``recurring`` to the evidence of each cause naming a co-tenant model that was in
    a burst during windows ``[start, end]`` like the ones it had already had lately; returns
    those co-tenants' bursts (for :func:`beyond_recurring`)."""
    top = next((x for x in causes if x.kind != "unknown"), None)
    out: dict[str, Bursts] = {}
    for c in causes:
        other = w.models.get(c.culprit)
        if c.culprit == model or other is None or "arrival_rps" not in other:
            continue
        got = earlier_bursts(other["arrival_rps"], start, end, w.step_ns / 1e9)
        if got is None:
            continue
        out[c.culprit] = got
        seen = got.evidence
        c.evidence = {**c.evidence, "recurring": seen}
        if c is top:
            notes.append(
                f"{c.culprit}'s burst ({seen['peak_rps']:g} req/s) is like "
                f"{seen['earlier_bursts']} it had in the last {seen['memory_s'] // 60} min: "
                "its ordinary contention"
            )
    return out


def beyond_recurring(
    causes: list[Cause],
    bursts: Mapping[str, Bursts],
    model: str,
    p99: np.ndarray,
    count: np.ndarray,
    before: np.ndarray,
    during: np.ndarray,
    again: Attribute,
    notes: list[str],
) -> list[Cause]:
    """``causes`` (:func:`mark_recurring` applied, which gave ``bursts``), with what made
    this burst of a recurring co-tenant hurt more than its earlier ones put first: ``again``
    attributes the slowdown against the victim's windows during those bursts, and the
    causes it names that are neither the recurring co-tenants nor the victim itself take the
    excess over what the earlier bursts made (the victim's median ``p99`` during them
    against ``before``, and during this burst's windows of the slowdown), the rest staying
    with ``causes``. Unchanged when nothing recurs, when this burst hurt no more than the
    earlier ones, or when nothing else is named."""
    if not bursts:
        return causes
    served = np.nan_to_num(count) > 0
    past = np.zeros(len(p99), dtype=bool)  # the earlier bursts
    cur = np.zeros(len(p99), dtype=bool)  # ... and this one, as far as the slowdown holds it
    for got in bursts.values():
        for lo, hi in got.earlier:
            past[lo:hi] = True
        cur[got.current[0] : got.current[1]] = True
    past &= served & ~during
    cur &= served & during
    if np.count_nonzero(past) < MIN_PAST or not cur.any():
        return causes
    with np.errstate(all="ignore"):
        base, now, usual = (float(np.nanmedian(p99[m])) for m in (before, cur, past))
    if not all(np.isfinite((base, now, usual))) or now <= max(base, usual):
        return causes
    rest = min(1.0, max(0.0, (usual - base) / (now - base)))  # what the bursts usually make
    skip = {*bursts, model}
    new = [c for c in again(past).causes if c.kind != "unknown" and c.culprit not in skip]
    if not new:
        return causes
    rank = [
        replace(
            c,
            share=c.share * (1.0 - rest),
            evidence={**c.evidence, "beyond_recurring": round(now / usual, 3)},
        )
        for c in new
    ]
    kept = [replace(c, share=c.share * rest) for c in causes]
    top = rank[0]
    notes.append(
        f"{model} was {now / usual:.2f}x as slow as in {', '.join(sorted(skip - {model}))}'s "
        f"earlier bursts; against those, {top.kind}: {top.culprit} is what changed"
    )
    return sorted([*rank, *kept], key=lambda c: (c.kind == "unknown", -c.share))
