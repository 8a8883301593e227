"""The diagnosis record: one slowdown of one indicator of a model on one GPU, what it was
judged against, its causes, and the detector's verdict on it. :func:`analysis.diagnose.diagnose`
makes them; the incident book, the API and the benches read them; they become dicts only at
the store's and the API's edge (:meth:`Diagnosis.to_dict`)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from cotenant.analysis.attribution import Cause
from cotenant.analysis.detector.episode import Carry
from cotenant.analysis.detector.normal import Normal
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
    after_p99_ms: float | None = None  # median p99 of the windows after it ended
    replica: str | None = None  # the replica of the model on this GPU, when requests name one
    siblings: list[dict[str, Any]] = field(default_factory=list)  # analysis.replicas
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
        return next((c for c in self.causes if c.kind != "unknown"), None)

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
        }


def rounded(x: float) -> float | None:
    return None if not math.isfinite(x) else round(float(x), 3)
