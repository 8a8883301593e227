"""Fellow victims: a model slowed by a cause another model's open incident already names.

A cause found once — a CPU hog pushing a voice model over its SLO — is more likely than not
behind a smaller slowdown of the models beside it at the same time. The live loop looks for
those with a lower evidence ratio (:attr:`analysis.evidence.EvidenceParams.shared_ratio`)
and keeps what this module says is a fellow victim (issue 25: an image model slowed 1.12x at
its median by the CPU hog that broke the voice model's SLO went unfound).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cotenant.analysis.diagnose import Diagnosis
from cotenant.analysis.episodes import DEGRADATION
from cotenant.analysis.incident_record import OPEN, Incident

FELLOW_OF = "fellow_of"
"""The key of :attr:`Diagnosis.judged_on` naming the model whose incident corroborated it."""


@dataclass(frozen=True)
class Named:
    """An open incident's first cause: its victim and the cause's kind and culprit."""

    victim: str
    kind: str
    culprit: str


def named_causes(incidents: Iterable[Incident]) -> dict[str, list[Named]]:
    """Per GPU, the first causes of its open (attributed) incidents."""
    out: dict[str, list[Named]] = {}
    for inc in incidents:
        top = inc.top
        if inc.state == OPEN and top is not None:
            out.setdefault(inc.gpu, []).append(
                Named(inc.model, str(top["kind"]), str(top["culprit"]))
            )
    return out


def fellow_of(d: Diagnosis, named: list[Named], mine: Incident | None) -> str | None:
    """The model whose open incident makes ``d`` (a slowdown of another model on its GPU,
    found at the lower ratio) a fellow victim; None when none does. ``d``'s first cause must
    be that incident's, not ``d``'s model itself (its own burst slows it, it is not
    slowed beside another). While ``mine``, ``d``'s model's live incident, was found so,
    what continues it stays a fellow victim whatever it names now (its cause may move on as
    attribution sees more)."""
    if d.severity != DEGRADATION or not d.incident or d.judged_on is None:
        return None  # the p99 rules and breaches ask the same of both detectors
    top = d.top
    if top is not None and top.culprit != d.model:
        for n in named:
            if n.victim != d.model and (n.kind, n.culprit) == (top.kind, top.culprit):
                return n.victim
    own = fellow(mine)
    if own and mine is not None and d.start_ns <= mine.end_ns and d.end_ns >= mine.start_ns:
        return own
    return None


def fellow(inc: Incident | None) -> str | None:
    """Whose open incident made ``inc`` a fellow victim; None when none did."""
    judged = (inc.detail.get("judged_on") if inc is not None else None) or {}
    own = judged.get(FELLOW_OF)
    return str(own) if own else None
