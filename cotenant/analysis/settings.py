"""The ``[analysis]`` configuration keys: the continuous loop and on-demand diagnoses."""

from __future__ import annotations

from dataclasses import dataclass

from cotenant.analysis.spikes import SpikeParams
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
    season_s: float = key(
        86400.0,
        "latency cycle learned by on-demand diagnoses (API, CLI, alerts) that read 2 cycles of "
        "history, when one cycle is at most 10,080 windows of their step (a day needs a step "
        ">= 8.6 s); the live loop does not use it (0 = no seasonal baseline)",
        min=0.0,
    )
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
        "the loop's reads), and the range is swept for the ordinary contention the detector "
        "kept out (recorded, not raised)",
        min=1.0,
    )
    cooldown_s: float = key(
        30.0,
        "a slowdown of the same model and GPU starting this soon after its incident resolved "
        "re-opens that incident instead of opening another",
        min=0.0,
    )
    degradation_ratio: float = key(
        1.3,
        "a degradation (slower than its baseline, within its SLO or without one): the median "
        "p99 at least this many times the baseline frozen before it ...",
        min=1.0,
    )
    degradation_margin_ms: float = key(2.0, "... and at least this much over it (ms) ...", min=0.0)
    degradation_s: float = key(
        30.0, "... for at least this long (0 = no degradations, breaches only)", min=0.0
    )

    ordinary_s: float = key(
        600.0,
        "a degradation no worse than a slowdown of the model in this much recent history is its "
        "ordinary contention (a co-tenant's recurring bursts), not an incident, and so is one "
        "a co-tenant's burst like two it had in the last 30 min explains; both are recorded for "
        "the weekly report; SLO breaches always are incidents (0 = every degradation is news)",
        min=0.0,
    )

    def spike_params(self) -> SpikeParams:
        """The detector's parameters these keys set (the rest keep their defaults)."""
        return SpikeParams(
            seen_windows=round(self.ordinary_s / self.step_s),
            degrade_ratio=self.degradation_ratio,
            degrade_abs_ms=self.degradation_margin_ms,
            degrade_windows=(
                max(1, round(self.degradation_s / self.step_s)) if self.degradation_s > 0 else 0
            ),
        )
