"""Diagnoses built by hand for the incident book's tests: one slowdown of a model on
``gpu0``, times in seconds after :data:`cotenant.evaluation.live.START_NS`."""

from __future__ import annotations

from cotenant.analysis.attribution import Cause
from cotenant.analysis.diagnosis import Diagnosis
from cotenant.core.slos import E2E
from cotenant.evaluation.live import START_NS

S = 1_000_000_000


def diagnosis(
    model: str,
    severity: str,
    causes: list[Cause],
    start_s: int,
    end_s: int,
    *,
    indicator: str = E2E,
    slo: float | None = None,
    peak: float = 900.0,
    base: float = 500.0,
    open: bool = True,
    phases: dict[str, float] | None = None,
) -> Diagnosis:
    """A slowdown over ``[start_s, end_s)``, found 30 s after it began."""
    return Diagnosis(
        model=model,
        gpu="gpu0",
        start_ns=START_NS + start_s * S,
        end_ns=START_NS + end_s * S,
        open=open,
        detected_ns=START_NS + (start_s + 30) * S,
        peak_p99_ms=peak,
        baseline_p99_ms=base,
        slo_ms=slo,
        phases_ms=phases if phases is not None else {"compute_ms": peak - base},
        causes=causes,
        severity=severity,
        during_windows=end_s - start_s,
        indicator=indicator,
    )
