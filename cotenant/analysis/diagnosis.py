"""The diagnosis record: one slowdown of one indicator of a model on one GPU, what it was
judged against, its causes, and the detector's verdict on it. :func:`analysis.diagnose.diagnose`
makes them; the incident book, the API and the benches read them; they become dicts only at
the store's and the API's edge (:meth:`Diagnosis.to_dict`)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cotenant.analysis.attribution import Cause
from cotenant.analysis.detector.episode import Carry
from cotenant.analysis.detector.normal import Normal
from cotenant.core.cause_kinds import CauseKind
from cotenant.core.slos import BREACH, E2E

NEWS = "news"
"""Verdict: an incident."""
FELLOW = "fellow"
"""Verdict: an incident found on less evidence, beside another model's incident with its cause."""
OWN_LOAD = "own_load"
"""Verdict: within its SLO and slowed by its own traffic: ordinary contention, recorded."""
RECURRING = "recurring"
"""Verdict: within its SLO and slowed by a neighbour's burst like the ones it had lately."""
INCIDENT_VERDICTS = (NEWS, FELLOW)
ORDINARY_VERDICTS = (OWN_LOAD, RECURRING)


@dataclass(frozen=True)
class Judged:
    """How the detector judged a slowdown: the channel (``typical`` or ``tail``) and shift
    (calibrated standard deviations) that fired, the long-run deflation of its evidence, the
    normal it was judged against (frozen while it lasts), whether it crossed the incident
    threshold (``strong``), its size (median over normal), how many earlier slowdowns of the
    model in its baseline's memory were as high (``like``), and who corroborated a fellow
    victim."""

    channel: str
    delta: float
    deflate: float
    normal: Normal
    strong: bool = True
    ratio: float = math.nan
    like: int = 0
    fellow_of: str | None = None

    def carry(self, start: int, severity: str) -> Carry:
        """The episode to continue from window ``start`` of the next read."""
        return Carry(
            start, self.channel, self.normal, self.delta, self.deflate, severity, self.strong
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel": self.channel,
            "delta": self.delta,
            "deflate": round(self.deflate, 4),
            "normal": self.normal.to_dict(),
            "strong": self.strong,
            "ratio": None if not math.isfinite(self.ratio) else round(self.ratio, 3),
            "baseline_ms": round(self.normal.baseline_ms, 3),
            "like": self.like,
            "fellow_of": self.fellow_of,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Judged:
        ratio = d.get("ratio")
        return cls(
            str(d["channel"]),
            float(d["delta"]),
            float(d.get("deflate", 1.0)),
            Normal.from_dict(d["normal"]),
            bool(d.get("strong", True)),
            math.nan if ratio is None else float(ratio),
            int(d.get("like", 0)),
            d.get("fellow_of"),
        )


def judged_from_dict(d: Mapping[str, Any] | None) -> Judged | None:
    """:meth:`Judged.from_dict` of a stored ``judged_on``; None for none, or for one an
    earlier detector wrote (without the normal it was judged against)."""
    if not d or "normal" not in d:
        return None
    return Judged.from_dict(dict(d))


@dataclass
class Diagnosis:
    model: str
    gpu: str
    start_ns: int
    end_ns: int
    open: bool  # still slow at the last window judged
    detected_ns: int  # when the decision fired
    peak_p99_ms: float
    baseline_p99_ms: float
    slo_ms: float | None
    phases_ms: dict[str, float]
    causes: list[Cause]
    notes: list[str] = field(default_factory=list)
    incident: bool = True  # False: an on-demand diagnosis of a quiet range
    severity: str = BREACH  # breach (SLO crossed) | degradation (slower than its normal)
    carried: bool = False  # began before the windows read: its "before" is not in them
    during_windows: int = 0  # windows with requests inside it (what attribution had)
    during_requests: int = 0  # requests inside it
    after_p99_ms: float | None = None  # median p99 of the windows after it ended
    replica: str | None = None  # the replica of the model on this GPU, when requests name one
    # its causes on the windows until it was found and had lasted what it needs to be an
    # incident (when the live loop publishes it), where their top differs from the whole's:
    # what the live loop named first (two faults one after the other)
    first_causes: list[Cause] | None = None
    siblings: dict[str, Any] = field(default_factory=dict)  # analysis.replicas.summarise
    indicator: str = E2E  # the series that slowed: e2e | ttft | tpot (analysis.indicators)
    judged: Judged | None = None  # how the detector judged it (None: a quiet range)
    verdict: str = NEWS  # what it is to the people paged (analysis.detector.verdicts)

    @property
    def id(self) -> str:
        raw = f"{self.model}\x00{self.gpu}\x00{self.start_ns}"
        if self.indicator != E2E:
            raw += f"\x00{self.indicator}"
        return "inc-" + hashlib.blake2b(raw.encode(), digest_size=6).hexdigest()

    @property
    def top(self) -> Cause | None:
        return next((c for c in self.causes if c.kind != CauseKind.UNKNOWN), None)

    @property
    def first_top(self) -> Cause | None:
        """The top cause it had when it was found (:attr:`top` unless they differ)."""
        if self.first_causes is None:
            return self.top
        return next((c for c in self.first_causes if c.kind != CauseKind.UNKNOWN), None)

    @property
    def is_incident(self) -> bool:
        """A slowdown people are told of (not a quiet range, not ordinary contention)."""
        return self.incident and self.verdict in INCIDENT_VERDICTS

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "gpu": self.gpu,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "open": self.open,
            "detected_ns": self.detected_ns,
            "incident": self.incident,
            "verdict": self.verdict,
            "peak_p99_ms": rounded(self.peak_p99_ms),
            "baseline_p99_ms": rounded(self.baseline_p99_ms),
            "slo_ms": self.slo_ms,
            "severity": self.severity,
            "indicator": self.indicator,
            "resolved_p99_ms": None if self.after_p99_ms is None else rounded(self.after_p99_ms),
            "phases_ms": {k: round(v, 3) for k, v in self.phases_ms.items()},
            "causes": [c.to_dict() for c in self.causes],
            "notes": self.notes,
            "replica": self.replica,
            "siblings": self.siblings,
            "judged_on": None if self.judged is None else self.judged.to_dict(),
        } | (
            {}
            if self.first_causes is None
            else {"first_causes": [c.to_dict() for c in self.first_causes]}
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Diagnosis:
        """The inverse of :meth:`to_dict` (an incident's diagnosis read back from the store),
        tolerant of what earlier versions stored: a key they did not write takes its default,
        a latency they stored as null is NaN, a ``judged_on`` of an earlier detector is None,
        siblings stored as a plain list become ``{"listed": [...]}``. What ``to_dict`` does not
        write (``carried``, ``during_windows``) takes its default. Raises KeyError without
        ``model``, ``gpu``, ``start_ns`` or ``end_ns``."""
        start = int(d["start_ns"])
        sibs = d.get("siblings") or {}
        after = d.get("resolved_p99_ms")
        return cls(
            model=str(d["model"]),
            gpu=str(d["gpu"]),
            start_ns=start,
            end_ns=int(d["end_ns"]),
            open=bool(d.get("open", True)),
            detected_ns=int(d.get("detected_ns") or start),
            peak_p99_ms=_ms(d.get("peak_p99_ms")),
            baseline_p99_ms=_ms(d.get("baseline_p99_ms")),
            slo_ms=None if d.get("slo_ms") is None else float(d["slo_ms"]),
            phases_ms={str(k): float(v) for k, v in (d.get("phases_ms") or {}).items()},
            causes=[Cause.from_dict(c) for c in d.get("causes") or []],
            notes=[str(n) for n in d.get("notes") or []],
            incident=bool(d.get("incident", True)),
            severity=str(d.get("severity") or BREACH),
            after_p99_ms=None if after is None else float(after),
            replica=d.get("replica"),
            siblings=dict(sibs) if isinstance(sibs, Mapping) else {"listed": list(sibs)},
            indicator=str(d.get("indicator") or E2E),
            judged=judged_from_dict(d.get("judged_on")),
            verdict=str(d.get("verdict") or NEWS),
            first_causes=(
                None
                if d.get("first_causes") is None
                else [Cause.from_dict(c) for c in d["first_causes"]]
            ),
        )


def rounded(x: float) -> float | None:
    return None if not math.isfinite(x) else round(float(x), 3)


def _ms(x: Any) -> float:
    """A stored latency: NaN where it was not finite (stored as null)."""
    return math.nan if x is None else float(x)
