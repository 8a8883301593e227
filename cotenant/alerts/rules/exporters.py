"""``exporters.rules.yml``: the same signals from exporters alone (no cotenant agent).

Series used: NVIDIA's DCGM exporter (``DCGM_FI_PROF_DRAM_ACTIVE`` 0-1,
``DCGM_FI_PROF_PCIE_TX_BYTES`` / ``_RX_BYTES`` bytes per second, ``DCGM_FI_DEV_FB_USED`` /
``_FREE`` MiB, ``DCGM_FI_DEV_GPU_UTIL`` %, ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` or its older
name ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``, a bitmask of ``nvmlClocksEventReason*``), vLLM
(``vllm:e2e_request_latency_seconds`` and ``vllm:request_queue_time_seconds`` histograms,
label ``model_name``) and Triton (``nv_inference_request_duration_us`` /
``nv_inference_queue_duration_us`` cumulative microseconds, ``nv_inference_request_success``,
and the request-latency summary ``nv_inference_request_summary_us{quantile}`` where Triton runs
with ``--metrics-config=summary_latencies=true``; label ``model``). GPUs are keyed by DCGM's
``Hostname``, ``UUID`` and ``gpu`` labels (and
``hostname``, as dcgm-exporter's releases after 4.8 name the host, and ``uuid``, as its
``--use-old-namespace`` names the UUID: whichever a series has). Where a GPU has no reasons
bitmask, the throttle alerts read dcgm-exporter's ``DCGM_EXP_CLOCK_EVENTS_COUNT{clock_event}``
(samples with the reason in its window, 5 min by default) above 0.

Recording rules: ``exporter:request_latency_seconds:p50_1m|p99_1m {model}`` (vLLM),
``exporter:request_latency_seconds:mean_1m {model}`` (Triton: it exports no quantiles by
default), ``exporter:triton_request_latency_seconds:p99 {model}`` (Triton's summary, over its
own sliding window: the p99 SLO alert reads it where it exists, the mean elsewhere),
``exporter:request_queue_seconds:p99_1m`` (vLLM) / ``:mean_1m`` (Triton),
``exporter:gpu_utilization:avg_1m``, ``exporter:gpu_dram_active:avg_1m``,
``exporter:gpu_pcie_bytes_per_second:avg_1m``, ``exporter:gpu_memory_used:ratio`` and
``exporter:slo_seconds {model}``; vLLM's TTFT and TPOT (``vllm:time_to_first_token_seconds``;
``vllm:time_per_output_token_seconds`` or, on current vLLM, ``vllm:inter_token_latency_seconds``
/ ``vllm:request_time_per_output_token_seconds``): :mod:`alerts.rules.tokens`.
"""

from __future__ import annotations

from typing import Any

from cotenant.alerts.rules.blocks import (
    Alert,
    Record,
    RuleSettings,
    group,
    number,
    slo_alert_expr,
    slo_expr,
)
from cotenant.alerts.rules.tokens import token_alerts, token_records

GPU_BY = "Hostname, hostname, UUID, uuid, gpu"
REASONS = "(DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)"
THROTTLE_BITS: tuple[tuple[str, int, str], ...] = (
    ("sw_power_cap", 0x4, "power_cap"),
    ("hw_slowdown", 0x8, "hw_slowdown"),
    ("sw_thermal_slowdown", 0x20, "sw_thermal"),
    ("hw_thermal_slowdown", 0x40, "hw_thermal"),
    ("hw_power_brake_slowdown", 0x80, "hw_power_brake"),
)
"""Bits of the clock event reasons mask that mean thermal or power throttling, with the
``clock_event`` label dcgm-exporter's ``DCGM_EXP_CLOCK_EVENTS_COUNT`` gives each."""
EVENTS_COUNT = "DCGM_EXP_CLOCK_EVENTS_COUNT"
EXPORTER_JOB_RE = "(?i).*(dcgm|vllm|triton).*"
"""Scrape jobs whose ``up`` ExporterDown watches."""


def _vllm_quantile(q: float, hist: str) -> str:
    return (
        f"label_replace(histogram_quantile({q}, sum by (model_name, le) "
        f'(rate({hist}_bucket[1m]))), "model", "$1", "model_name", "(.*)")'
    )


def _triton_mean(counter: str) -> str:
    return (
        f"sum by (model) (rate({counter}[1m])) / 1e6\n"
        "/\nsum by (model) (rate(nv_inference_request_success[1m]))"
    )


TRITON_P99 = "exporter:triton_request_latency_seconds:p99"


def _recording(s: RuleSettings) -> list[Record]:
    return [
        Record("exporter:slo_seconds", slo_expr(s)),
        Record(
            "exporter:request_latency_seconds:p50_1m",
            _vllm_quantile(0.5, "vllm:e2e_request_latency_seconds"),
        ),
        Record(
            "exporter:request_latency_seconds:p99_1m",
            _vllm_quantile(0.99, "vllm:e2e_request_latency_seconds"),
        ),
        Record(
            "exporter:request_queue_seconds:p99_1m",
            _vllm_quantile(0.99, "vllm:request_queue_time_seconds"),
        ),
        Record(
            "exporter:request_latency_seconds:mean_1m",
            _triton_mean("nv_inference_request_duration_us"),
        ),
        Record(
            "exporter:request_queue_seconds:mean_1m",
            _triton_mean("nv_inference_queue_duration_us"),
        ),
        Record(
            TRITON_P99,  # the highest of a model's versions, as the fleet path reads it
            'max by (model) (nv_inference_request_summary_us{quantile="0.99"}) / 1e6',
        ),
        Record(
            "exporter:gpu_utilization:avg_1m",
            f"avg by ({GPU_BY}) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[1m])) / 100",
        ),
        Record(
            "exporter:gpu_dram_active:avg_1m",
            f"avg by ({GPU_BY}) (avg_over_time(DCGM_FI_PROF_DRAM_ACTIVE[1m]))",
        ),
        Record(
            "exporter:gpu_pcie_bytes_per_second:avg_1m",
            f"avg by ({GPU_BY}) (avg_over_time(DCGM_FI_PROF_PCIE_TX_BYTES[1m]))\n+\n"
            f"avg by ({GPU_BY}) (avg_over_time(DCGM_FI_PROF_PCIE_RX_BYTES[1m]))",
        ),
        Record(
            "exporter:gpu_memory_used:ratio",
            f"max by ({GPU_BY}) (DCGM_FI_DEV_FB_USED)\n/\n"
            f"max by ({GPU_BY}) (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
        ),
    ]


def _alerts(s: RuleSettings) -> list[Alert]:
    on_gpu = (
        "on GPU {{ $labels.gpu }} ({{ $labels.UUID }}{{ $labels.uuid }}, "
        "{{ $labels.Hostname }}{{ $labels.hostname }})"
    )
    slo_desc = (
        "{} latency of {{{{ $labels.model }}}} over the last minute is "
        "{{{{ $value | humanizeDuration }}}}, above the model's SLO ({} metrics)."
    )
    out = [
        Alert(
            "ModelLatencySLOBreach",
            slo_alert_expr("exporter:request_latency_seconds:p99_1m", "exporter:slo_seconds", s),
            "critical",
            "{{ $labels.model }} p99 latency is over its SLO",
            slo_desc.format("p99", "vLLM"),
            labels=(("source", "vllm"),),
        ),
        Alert(
            "ModelLatencySLOBreach",
            slo_alert_expr(TRITON_P99, "exporter:slo_seconds", s),
            "critical",
            "{{ $labels.model }} p99 latency is over its SLO",
            "p99 latency of {{ $labels.model }} over Triton's summary window is "
            "{{ $value | humanizeDuration }}, above the model's SLO (Triton metrics).",
            labels=(("source", "triton"),),
        ),
        Alert(
            "ModelLatencySLOBreach",
            # Triton without its latency summary: the mean is all there is
            slo_alert_expr(
                f"(exporter:request_latency_seconds:mean_1m unless on (model) {TRITON_P99})",
                "exporter:slo_seconds",
                s,
            ),
            "critical",
            "{{ $labels.model }} mean latency is over its p99 SLO",
            slo_desc.format("Mean", "Triton"),
            labels=(("source", "triton"),),
        ),
        Alert(
            "GPUMemoryBandwidthSaturated",
            "exporter:gpu_dram_active:avg_1m > " + number(s.dram_saturated),
            "warning",
            "GPU memory bandwidth saturated on {{ $labels.gpu }}",
            "DRAM was active {{ $value | humanizePercentage }} of the last minute "
            + on_gpu
            + f" (threshold {s.dram_saturated:.0%}).",
        ),
        Alert(
            "PCIeSaturated",
            "exporter:gpu_pcie_bytes_per_second:avg_1m > " + number(s.pcie_saturated_bps),
            "warning",
            "PCIe link saturated on {{ $labels.gpu }}",
            "PCIe traffic (TX + RX) averaged {{ $value | humanize }}B/s over the last minute "
            + on_gpu
            + f" (threshold {s.pcie_saturated_bps / 1e9:g} GB/s).",
        ),
        Alert(
            "GPUMemoryPressure",
            "exporter:gpu_memory_used:ratio > " + number(s.memory_pressure),
            "warning",
            "GPU {{ $labels.gpu }} memory nearly full",
            "{{ $value | humanizePercentage }} of the framebuffer is in use "
            + on_gpu
            + f" (threshold {s.memory_pressure:.0%}).",
        ),
    ]
    for reason, bit, event in THROTTLE_BITS:
        out.append(
            Alert(
                "GPUClockThrottled",
                f"floor(max by ({GPU_BY}) {REASONS} / {bit}) % 2 == 1\nor\n"
                f'(max by ({GPU_BY}) ({EVENTS_COUNT}{{clock_event="{event}"}}) > 0\n'
                f"unless max by ({GPU_BY}) {REASONS})",
                "warning",
                f"GPU {{{{ $labels.gpu }}}} clocks throttled ({reason})",
                f"DCGM reports clock event reason {reason} "
                + on_gpu
                + ": the SM clock is held below its maximum.",
                labels=(("reason", reason),),
            )
        )
    out.append(
        Alert(
            "ExporterDown",
            f'up{{job=~"{EXPORTER_JOB_RE}"}} == 0',
            "critical",
            "exporter {{ $labels.instance }} is down",
            "Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }}): GPU or "
            "serving series from it are missing, so other alerts cannot fire.",
        )
    )
    return out


def exporter_groups(s: RuleSettings) -> list[dict[str, Any]]:
    return [
        group(
            "exporters.recording",
            [r.to_dict() for r in [*_recording(s), *token_records(s, "exporter")]],
        ),
        group(
            "exporters.alerts",
            [a.to_dict(s) for a in [*_alerts(s), *token_alerts(s, "exporter")]],
        ),
    ]
