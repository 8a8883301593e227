"""The analysis facade the HTTP API and the CLI use: on-demand diagnosis and incidents."""

from __future__ import annotations

from typing import Any

from cotenant.analysis.detector.detect import DetectorParams
from cotenant.analysis.detector.verdicts import incident_causes
from cotenant.analysis.diagnose import diagnose
from cotenant.analysis.incident_record import STATES
from cotenant.analysis.incidents import IncidentBook
from cotenant.analysis.settings import AnalysisSettings
from cotenant.analysis.windows import gpus_of
from cotenant.core.errors import NotFoundError, QueryError
from cotenant.core.readers import MetricSource
from cotenant.core.slos import INDICATORS, SEVERITIES, Slos
from cotenant.core.timerange import TimeRange

NO_SPAN_LIMITS = (
    "no spans: request windows come from the serving stack's exporter series (vLLM or "
    "Triton), so only the phases they report (queue, compute and, for Triton, transfers) "
    "can be decomposed; lock wait, preprocess and postprocess are not seen",
    "GPU counters come from the DCGM exporter per GPU (a pod's series carry its GPU's "
    "values), so co-tenants are told apart by their request rates, not per-process SM use",
)
"""What a diagnosis without spans cannot see; returned as ``limits`` with every result."""


class Analyzer:
    def __init__(
        self,
        source: MetricSource,
        book: IncidentBook,
        *,
        slos: Slos | None = None,
        step_s: float = AnalysisSettings.step_s,
        max_range_s: float = AnalysisSettings.max_range_h * 3600,
        params: DetectorParams | None = None,
    ) -> None:
        """``params``: the detector's (``AnalysisSettings.detector_params()``). ``slos``:
        every model's SLOs (:class:`cotenant.core.slos.Slos`; none when absent)."""
        self.source = source
        self.params = params or DetectorParams()
        self.book = book
        self.slos = slos or Slos()
        self.step_s = step_s
        self.max_range_s = max_range_s

    def diagnose(self, model: str, start_ns: int, end_ns: int) -> dict[str, Any]:
        """Diagnose ``model`` over ``[start, end)``: its incidents there, or — when none — the
        range as a whole against the windows before it. Raises QueryError for a bad range and
        NotFoundError for a model with no requests in it."""
        if not model:
            raise QueryError("model is required")
        rng = TimeRange(start_ns, end_ns)
        length = (end_ns - start_ns) / 1e9
        if length <= 0:
            raise QueryError("end must be after start")
        if length > self.max_range_s:
            raise QueryError(
                f"range of {length:.0f} s is longer than the {self.max_range_s:.0f} s "
                "allowed (analysis.max_range_h): diagnose a shorter range"
            )
        gpus = [g for g, ms in gpus_of(self.source, rng, self.step_s).items() if model in ms]
        if not gpus:
            raise NotFoundError(f"model {model!r} served no requests between start and end")
        # other models' incidents stored over the range on its GPUs (under ``cotenant
        # serve``, the live loop's) may make a smaller slowdown a fellow victim
        stored = self.book.find(since_ns=start_ns, until_ns=end_ns)
        causes = [c for c in incident_causes(stored) if c.victim != model and c.gpu in gpus]
        diags = diagnose(
            self.source,
            model,
            rng,
            slo_ms=self.slos.of(model),
            step_s=self.step_s,
            params=self.params,
            on_demand=True,
            slos=self.slos.token_slos(model),
            causes=causes,
        )
        return {
            "model": model,
            "start_ns": start_ns,
            "end_ns": end_ns,
            "spans": self.source.has_spans,
            "limits": [] if self.source.has_spans else list(NO_SPAN_LIMITS),
            "diagnoses": [d.to_dict() for d in diags],
        }

    def incidents(
        self,
        since_ns: int | None = None,
        model: str | None = None,
        state: str | None = None,
        limit: int = 500,
        severity: str | None = None,
        indicator: str | None = None,
    ) -> list[dict[str, Any]]:
        if state is not None and state not in STATES:
            raise QueryError(f"state {state!r} must be one of {', '.join(STATES)}")
        if severity is not None and severity not in SEVERITIES:
            raise QueryError(f"severity {severity!r} must be one of {', '.join(SEVERITIES)}")
        if indicator is not None and indicator not in INDICATORS:
            raise QueryError(f"indicator {indicator!r} must be one of {', '.join(INDICATORS)}")
        found = self.book.find(
            since_ns=since_ns,
            model=model,
            state=state,
            severity=severity,
            limit=limit,
            indicator=indicator,
        )
        return [i.to_dict() for i in found]

    def incident(self, incident_id: str) -> dict[str, Any]:
        inc = self.book.get(incident_id)
        if inc is None:
            raise NotFoundError(f"no incident {incident_id!r}")
        return inc.to_dict()
