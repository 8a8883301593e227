"""Rules for generative models: time to first token (TTFT) and time per output token (TPOT).

Both rule files get them: ``cotenant.rules.yml`` over cotenant's own histograms
(``cotenant_time_to_first_token_seconds`` / ``cotenant_time_per_output_token_seconds``
``{model,gpu}``, filled from spans that carry token counts), ``exporters.rules.yml`` over
vLLM's (``vllm:time_to_first_token_seconds``, label ``model_name``; TPOT from
``vllm:time_per_output_token_seconds``, else, on vLLM releases that hid (0.12) and then removed
it, its renamed per-token successor ``vllm:inter_token_latency_seconds``, else the per-request
``vllm:request_time_per_output_token_seconds``: the first name a model's vLLM exports is read,
chosen per model by PromQL ``or``). Recording rules (``<prefix>`` is ``cotenant`` or ``exporter``):

* ``<prefix>:time_to_first_token_seconds:p99_1m`` and
  ``<prefix>:time_per_output_token_seconds:p99_1m`` (cotenant: also ``p99_5m``, by model and
  GPU; exporters: by model);
* ``<prefix>:slo_ttft_seconds {model}`` / ``<prefix>:slo_tpot_seconds {model}`` — the SLOs of
  ``[analysis] slo_ttft_ms`` / ``slo_tpot_ms`` as constants, rendered only when some model has
  one, with the alerts ``ModelTTFTSLOBreach`` / ``ModelTPOTSLOBreach``.
"""

from __future__ import annotations

from cotenant.alerts.rules.blocks import Alert, Record, RuleSettings, slo_constants

OWN = {
    "ttft": "cotenant_time_to_first_token_seconds",
    "tpot": "cotenant_time_per_output_token_seconds",
}
VLLM: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "tpot": (
        "vllm:time_per_output_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
    ),
}
"""vLLM's histograms per indicator, in order of preference (see the module docstring)."""
SERIES = {"ttft": "time_to_first_token_seconds", "tpot": "time_per_output_token_seconds"}
WHAT = {"ttft": "time to first token", "tpot": "time per output token"}


def _slos(s: RuleSettings) -> dict[str, dict[str, float]]:
    return {"ttft": dict(s.slo_ttft_ms), "tpot": dict(s.slo_tpot_ms)}


def token_records(s: RuleSettings, prefix: str) -> list[Record]:
    """The quantile and SLO recording rules of ``prefix`` (``cotenant`` or ``exporter``)."""
    out: list[Record] = []
    for ind in ("ttft", "tpot"):
        if prefix == "cotenant":
            for w in ("1m", "5m"):
                out.append(
                    Record(
                        f"cotenant:{SERIES[ind]}:p99_{w}",
                        f"histogram_quantile(0.99, sum by (model, gpu, le) "
                        f"(rate({OWN[ind]}_bucket[{w}])))",
                    )
                )
        else:
            buckets = " or ".join(
                f"sum by (model_name, le) (rate({name}_bucket[1m]))" for name in VLLM[ind]
            )
            out.append(
                Record(
                    f"exporter:{SERIES[ind]}:p99_1m",
                    f"label_replace(histogram_quantile(0.99, {buckets}), "
                    '"model", "$1", "model_name", "(.*)")',
                )
            )
        const = slo_constants(_slos(s)[ind])
        if const is not None:
            out.append(Record(f"{prefix}:slo_{ind}_seconds", const))
    return out


def token_alerts(s: RuleSettings, prefix: str) -> list[Alert]:
    """``ModelTTFTSLOBreach`` / ``ModelTPOTSLOBreach`` for the models with that SLO."""
    out: list[Alert] = []
    where = "on GPU {{ $labels.gpu }} " if prefix == "cotenant" else ""
    source = "" if prefix == "cotenant" else " (vLLM metrics)"
    for ind, name in (("ttft", "ModelTTFTSLOBreach"), ("tpot", "ModelTPOTSLOBreach")):
        if not _slos(s)[ind]:
            continue
        value = (
            "{{ $value | humanizeDuration }}"
            if ind == "ttft"
            else "{{ $value | humanizeDuration }} per token"
        )
        out.append(
            Alert(
                name,
                f"{prefix}:{SERIES[ind]}:p99_1m\n  > on (model) group_left ()\n"
                f"{prefix}:slo_{ind}_seconds",
                "critical",
                f"{{{{ $labels.model }}}} p99 {WHAT[ind]} is over its SLO",
                f"p99 {WHAT[ind]} of {{{{ $labels.model }}}} {where}over the last minute is "
                f"{value}, above the model's {ind.upper()} SLO{source}. Open the incident "
                f"(indicator {ind}) in the dashboard to see why.",
                labels=() if prefix == "cotenant" else (("source", "vllm"),),
            )
        )
    return out
