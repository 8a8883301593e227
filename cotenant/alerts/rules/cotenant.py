"""``cotenant.rules.yml``: recording and alerting rules over cotenant's own ``/metrics``.

Recording rules (label sets in braces):

* ``cotenant:request_latency_seconds:p50_1m|p99_1m|p50_5m|p99_5m {model,gpu}`` — from
  ``cotenant_request_duration_seconds{phase="total"}``;
* ``cotenant:request_phase_seconds:mean_1m|mean_5m {model,gpu,phase}`` — mean time per request
  in each critical-path phase;
* ``cotenant:request_lock_wait:ratio_5m {model,gpu}`` — share of latency spent on lock waits;
* ``cotenant:gpu_sm_utilization:avg_1m|avg_5m``, ``cotenant:gpu_memory_bandwidth_utilization:…``
  (ratios 0-1) and ``cotenant:gpu_pcie_bytes_per_second:…`` (TX + RX) ``{host,gpu}``;
* ``cotenant:slo_seconds {model}`` — see :mod:`alerts.rules.render`;
* TTFT / TPOT of generative models: :mod:`alerts.rules.tokens`.
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

HIST = "cotenant_request_duration_seconds"
COLLECTOR_JOB_RE = "cotenant.*"
"""Scrape jobs whose ``up`` CotenantCollectorDown watches (name yours ``cotenant…``)."""
THROTTLE_REASONS = (
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
)
"""Clock event reasons that mean thermal or power throttling (not idle, not a setting)."""
INCIDENT_HOLD = "2m"
"""NoisyNeighbor looks at incidents open at any scrape in this window: the analysis loop
re-decides every pass whether an incident is still open, and one pass calling it resolved
must not restart the alert's ``for``. It resolves this long after the incident."""
INGEST_REJECTED_RATIO = 0.01
"""Share of received spans rejected over 5 minutes that OTLPIngestRejecting fires on."""


def _recording() -> list[Record]:
    out: list[Record] = []
    for w in ("1m", "5m"):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            out.append(
                Record(
                    f"cotenant:request_latency_seconds:{name}_{w}",
                    f"histogram_quantile({q}, sum by (model, gpu, le) "
                    f'(rate({HIST}_bucket{{phase="total"}}[{w}])))',
                )
            )
        out.append(
            Record(
                f"cotenant:request_phase_seconds:mean_{w}",
                f"sum by (model, gpu, phase) (rate({HIST}_sum[{w}]))\n"
                f"/\nsum by (model, gpu, phase) (rate({HIST}_count[{w}]))",
            )
        )
    out.append(
        Record(
            "cotenant:request_lock_wait:ratio_5m",
            f'sum by (model, gpu) (rate({HIST}_sum{{phase="lock_wait"}}[5m]))\n'
            f'/\nsum by (model, gpu) (rate({HIST}_sum{{phase="total"}}[5m]))',
        )
    )
    for w in ("1m", "5m"):
        out += [
            Record(
                f"cotenant:gpu_sm_utilization:avg_{w}",
                f"avg by (host, gpu) (avg_over_time(cotenant_gpu_sm_utilization_ratio[{w}]))",
            ),
            Record(
                f"cotenant:gpu_memory_bandwidth_utilization:avg_{w}",
                f"avg by (host, gpu) (avg_over_time(cotenant_gpu_memory_utilization_ratio[{w}]))",
            ),
            Record(
                f"cotenant:gpu_pcie_bytes_per_second:avg_{w}",
                "avg by (host, gpu) "
                f"(avg_over_time(cotenant_gpu_pcie_transmit_bytes_per_second[{w}]))\n+\n"
                "avg by (host, gpu) "
                f"(avg_over_time(cotenant_gpu_pcie_receive_bytes_per_second[{w}]))",
            ),
        ]
    return out


def _alerts(s: RuleSettings) -> list[Alert]:
    on_gpu = "on GPU {{ $labels.gpu }} ({{ $labels.host }})"
    slo_breach = Alert(
        "ModelLatencySLOBreach",
        slo_alert_expr("cotenant:request_latency_seconds:p99_1m", "cotenant:slo_seconds", s),
        "critical",
        "{{ $labels.model }} p99 latency is over its SLO",
        "p99 latency of {{ $labels.model }} on GPU {{ $labels.gpu }} over the last minute is "
        "{{ $value | humanizeDuration }}, above the model's SLO. Open the incident in the "
        "dashboard to see which phase grew and why.",
    )
    return [
        slo_breach,
        Alert(
            "NoisyNeighbor",
            "max by (victim, gpu, culprit) "
            "(max_over_time(cotenant_incident_active"
            f'{{cause="cotenant",severity="breach"}}[{INCIDENT_HOLD}])) > 0',
            "warning",
            "{{ $labels.culprit }} is slowing {{ $labels.victim }} on GPU {{ $labels.gpu }}",
            "cotenant has an open incident on GPU {{ $labels.gpu }}: the top cause of "
            "{{ $labels.victim }}'s latency spike is co-located work of {{ $labels.culprit }}.",
        ),
        Alert(
            "ModelLoadSlowing",
            "max by (victim, gpu) "
            "(max_over_time(cotenant_incident_active"
            f'{{cause="model_load",severity="breach"}}[{INCIDENT_HOLD}])) > 0',
            "warning",
            "Model and adapter loads are slowing {{ $labels.victim }} on GPU {{ $labels.gpu }}",
            "cotenant has an open incident on GPU {{ $labels.gpu }}: the top cause of "
            "{{ $labels.victim }}'s latency spike is its own replica loading models or adapters "
            "more slowly or more often than usual.",
        ),
        Alert(
            "GPUMemoryBandwidthSaturated",
            "cotenant:gpu_memory_bandwidth_utilization:avg_1m > " + number(s.dram_saturated),
            "warning",
            "GPU memory bandwidth saturated on {{ $labels.gpu }}",
            "Device memory was busy {{ $value | humanizePercentage }} of the last minute "
            + on_gpu
            + f" (threshold {s.dram_saturated:.0%}); memory-bound models on it slow down.",
        ),
        Alert(
            "PCIeSaturated",
            "cotenant:gpu_pcie_bytes_per_second:avg_1m > " + number(s.pcie_saturated_bps),
            "warning",
            "PCIe link saturated on {{ $labels.gpu }}",
            "PCIe traffic (TX + RX) averaged {{ $value | humanize }}B/s over the last minute "
            + on_gpu
            + f" (threshold {s.pcie_saturated_bps / 1e9:g} GB/s); host-device copies queue.",
        ),
        Alert(
            "LockContention",
            "cotenant:request_lock_wait:ratio_5m > " + number(s.lock_wait_share),
            "warning",
            "{{ $labels.model }} spends much of its latency waiting on locks",
            "{{ $value | humanizePercentage }} of {{ $labels.model }}'s latency on GPU "
            "{{ $labels.gpu }} over 5 minutes was lock wait "
            f"(threshold {s.lock_wait_share:.0%}).",
        ),
        Alert(
            "GPUClockThrottled",
            "max by (host, gpu, reason) (cotenant_gpu_clock_event_active{reason=~"
            + '"'
            + "|".join(THROTTLE_REASONS)
            + '"}) > 0',
            "warning",
            "GPU {{ $labels.gpu }} clocks throttled ({{ $labels.reason }})",
            "NVML reports clock event reason {{ $labels.reason }} " + on_gpu + ": the SM clock "
            "is held below its maximum for thermal or power reasons, so every model on the GPU "
            "computes slower.",
        ),
        Alert(
            "GPUMemoryPressure",
            "max by (host, gpu) "
            "(cotenant_gpu_memory_used_bytes / cotenant_gpu_memory_total_bytes) > "
            + number(s.memory_pressure),
            "warning",
            "GPU {{ $labels.gpu }} memory nearly full",
            "{{ $value | humanizePercentage }} of device memory is in use "
            + on_gpu
            + f" (threshold {s.memory_pressure:.0%}); KV caches get preempted and "
            "allocations fail.",
        ),
        Alert(
            "CotenantCollectorDown",
            f'up{{job=~"{COLLECTOR_JOB_RE}"}} == 0',
            "critical",
            "cotenant target {{ $labels.instance }} is down",
            "Prometheus cannot scrape {{ $labels.instance }} (job {{ $labels.job }}): no "
            "latency, GPU or incident series from it, so other alerts cannot fire.",
            labels=(("component", "scrape"),),
        ),
        Alert(
            "CotenantCollectorDown",
            "cotenant_nvml_available == 0",
            "warning",
            "cotenant on {{ $labels.instance }} collects no GPU counters",
            "NVML is not available to cotenant on {{ $labels.instance }} (no driver, library "
            "or permission): latency is still recorded but GPU causes cannot be attributed.",
            labels=(("component", "nvml"),),
        ),
        Alert(
            "CotenantCollectorDown",
            "cotenant_gpu_up == 0",
            "critical",
            "GPU {{ $labels.gpu }} does not answer NVML",
            "GPU {{ $labels.gpu }} on {{ $labels.host }} is lost to NVML (fallen off the bus "
            "or driver gone); its counters are missing.",
            labels=(("component", "gpu"),),
        ),
        Alert(
            "OTLPIngestRejecting",
            "sum by (instance, job) (rate(cotenant_otlp_spans_rejected_total[5m]))\n/\n"
            "sum by (instance, job) (rate(cotenant_otlp_spans_received_total[5m]))\n> "
            + number(INGEST_REJECTED_RATIO),
            "warning",
            "cotenant on {{ $labels.instance }} rejects spans",
            "{{ $value | humanizePercentage }} of the spans sent to {{ $labels.instance }} over "
            "5 minutes were rejected (malformed, too large, or the writer queue full); see "
            "cotenant_otlp_spans_rejected_total by reason.",
            labels=(("kind", "spans"),),
        ),
        Alert(
            "OTLPIngestRejecting",
            "sum by (instance, job) "
            '(rate(cotenant_otlp_exports_total{outcome!~"ok|partial"}[5m]))\n/\n'
            "sum by (instance, job) (rate(cotenant_otlp_exports_total[5m]))\n> "
            + number(INGEST_REJECTED_RATIO),
            "warning",
            "cotenant on {{ $labels.instance }} refuses OTLP exports",
            "{{ $value | humanizePercentage }} of the OTLP export calls to {{ $labels.instance }} "
            "over 5 minutes were refused whole (writer queue full, body too large or not OTLP); "
            "see cotenant_otlp_exports_total by outcome.",
            labels=(("kind", "exports"),),
        ),
        Alert(
            "ActuationRolledBack",
            "sum by (kind, target) "
            '(increase(cotenant_action_transitions_total{state="rolled_back"}[15m])) > 0',
            "warning",
            "cotenant rolled back a {{ $labels.kind }} change on {{ $labels.target }}",
            "{{ $value | humanize }} {{ $labels.kind }} change(s) on {{ $labels.target }} were "
            "rolled back in the last 15 minutes: the change did not help the victim or hurt "
            "the target.",
            for_s=0,
        ),
    ]


def cotenant_groups(s: RuleSettings) -> list[dict[str, Any]]:
    return [
        group(
            "cotenant.recording",
            [
                Record("cotenant:slo_seconds", slo_expr(s)).to_dict(),
                *(r.to_dict() for r in _recording()),
                *(r.to_dict() for r in token_records(s, "cotenant")),
            ],
        ),
        group(
            "cotenant.alerts",
            [a.to_dict(s) for a in [*_alerts(s), *token_alerts(s, "cotenant")]],
        ),
    ]
