"""The ``[analysis]`` configuration keys: the continuous loop and on-demand diagnoses."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.analysis.detector.detect import DetectorParams
from cotenant.core.config_key import key


@dataclass(frozen=True)
class AnalysisSettings:
    """``[analysis]``: read by :class:`analysis.loop.AnalysisLoop` (the live loop) and
    :class:`analysis.analyzer.Analyzer` (on-demand diagnoses); ``slo_ms`` also by the
    actuators, alerts, dashboard and reports."""

    enabled: bool = key(True, "run spike detection and attribution continuously in serve")
    interval_s: float = key(5.0, "how often the continuous loop re-diagnoses", min=0.1)
    horizon_s: float = key(600.0, "how far back each pass looks for incidents", min=10.0)
    step_s: float = key(1.0, "window width", min=0.1, max=3600.0)
    slo_ms: dict[str, float] = key({}, "p99 latency SLO per model in ms (env: 'tts=100,chat=400')")
    slo_ttft_ms: dict[str, float] = key(
        {}, "p99 time-to-first-token SLO per generative model in ms (env: 'chat=500')"
    )
    slo_tpot_ms: dict[str, float] = key(
        {}, "p99 time-per-output-token SLO per generative model in ms per token (env: 'chat=50')"
    )
    max_range_h: float = key(24.0, "longest range one on-demand diagnosis may cover", min=0.01)
    reread_s: float = key(
        30.0,
        "how far back each pass re-reads (must exceed ingest lag: late rows older than "
        "this are not seen by the continuous loop)",
        min=1.0,
    )
    full_read_s: float = key(
        60.0,
        "how often the continuous loop looks over its whole range, not just the last reread_s: "
        "rows landing later than reread_s are seen within this time (the GPU counters are "
        "re-read, and the requests when some landed late; in fleet mode, where Prometheus "
        "holds each sample from its scrape on and every look is a full read, 600 saves most of "
        "the loop's reads)",
        min=1.0,
    )
    cooldown_s: float = key(
        30.0,
        "a slowdown of the same model and GPU starting this soon after its incident resolved "
        "re-opens that incident instead of opening another (one naming the same cause, up to "
        "four times this long after)",
        min=0.0,
    )
    degradation_s: float = key(
        30.0,
        "a slowdown within its SLO (or of a model without one) up to 2x its normal is an "
        "incident once it has lasted this long, a larger one once its duration times its "
        "excess ratio has (10 s at 4x, a second at 31x: a reload that holds requests for "
        "seconds is no blip); one over sooner is a transient, recorded nowhere (a breach of the "
        "SLO waits at most a third of this)",
        min=0.0,
    )
    false_alarms_per_hour: float = key(
        0.05,
        "false incidents per model-hour accepted on a model that is fine: the detector's one "
        "main knob. Every threshold follows from it and the model's request rate; lower waits "
        "for more evidence (later detection, fewer false alarms), higher pages sooner",
        min=1e-6,
        max=100.0,
    )
    min_slowdown: float = key(
        1.1,
        "the smallest slowdown (ratio to its normal) worth an incident: one under the square "
        "root of it adds no evidence at all, one just above it takes long to prove",
        min=1.0,
        max=10.0,
    )
    min_excess_ms: float = key(
        1.0,
        "... and the smallest excess in ms (half of it adds no evidence): sub-millisecond "
        "wobbles of a fast model are nobody's incident",
        min=0.0,
    )
    baseline_s: float = key(
        1800.0,
        "history a model's normal is learnt from (outside its incidents, and short of the "
        "newest two minutes once what lies before holds enough samples, so a slowdown that "
        "has just begun is judged, not learnt): its typical latency, "
        "how much it varies, and the spread of its ordinary contention (a neighbour's usual "
        "bursts are normal). Longer remembers rarer bursts; the live loop reads this much more "
        "than its horizon",
        min=60.0,
    )
    warmup_windows: int = key(
        60,
        "windows with requests a model's normal needs before it is judged at all (a model at "
        "0.1 req/s is judged after about 10 minutes); and whatever its rate, until a tenth of "
        "baseline_s has passed since its first request (3 minutes) only a breach of its SLO "
        "is judged (a cold start that begins in a burst must not learn the burst as normal)",
        min=8,
    )
    fellow_factor: float = key(
        20.0,
        "a slowdown beside another model's incident that names the same first cause is an "
        "incident (a fellow victim) on the evidence that would give this many times the false "
        "alarms (1 = no lower bar for fellow victims)",
        min=1.0,
    )

    def detector_params(self) -> DetectorParams:
        """The detector's parameters these keys set."""
        return DetectorParams(
            false_per_hour=self.false_alarms_per_hour,
            min_slowdown=self.min_slowdown,
            min_excess_ms=self.min_excess_ms,
            baseline_s=self.baseline_s,
            min_samples=self.warmup_windows,
            fellow=self.fellow_factor,
            quiet_s=self.cooldown_s,
            degradation_s=self.degradation_s,
        )
